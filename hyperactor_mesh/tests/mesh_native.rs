//! The Rust mesh API with native actors: spawn procs on a host, spawn actors on them,
//! cast, call (reduced over the tree), views, supervision of failed actors and dead
//! procs, stop.
//!
//! The procs are this test binary itself, re-run on the ignored `child_agent` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hyperactor::testing::timed;
use hyperactor::{Actor, BoxError, Context, Handler, SendContext};
use hyperactor_mesh::agent::{AgentOptions, CallReplies, ProcAgent};
use hyperactor_mesh::cast::codec::{CastKind, ReplyMode};
use hyperactor_mesh::testing::{agent_child_main, child_command, host_agent, process_exists};
use hyperactor_mesh::{
    reply, reply_error, route, ActorMesh, Extent, FailureCause, HostMesh, MeshError, MeshFailure,
    ProcMesh, Request,
};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct Counter {
    total: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Add(u64);

#[derive(Debug, Serialize, Deserialize)]
struct Get;
impl Request for Get {
    type Reply = u64;
}

/// Where the message came from: (index in the view, hops, pid).
#[derive(Debug, Serialize, Deserialize)]
struct WhereAmI;
impl Request for WhereAmI {
    type Reply = (u32, u8, u32);
}

#[derive(Debug, Serialize, Deserialize)]
enum Trouble {
    /// Reply with an error; the actor lives on.
    Error,
    /// The handler fails: the actor fails.
    Fail,
    /// The process exits with this status.
    Exit(i32),
}
impl Request for Trouble {
    type Reply = ();
}

impl Actor for Counter {
    type Params = u64;
    async fn new(start: u64) -> Result<Self, BoxError> {
        if start == 666 {
            return Err("refusing to start from 666".into());
        }
        Ok(Counter { total: start })
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Add>();
        binder.handle::<Get>();
        binder.handle::<WhereAmI>();
        binder.handle::<Trouble>();
    }
}

impl Handler<Add> for Counter {
    async fn handle(&mut self, _cx: &Context<Self>, Add(n): Add) -> Result<(), BoxError> {
        self.total += n;
        Ok(())
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, cx: &Context<Self>, _: Get) -> Result<(), BoxError> {
        reply(cx, &self.total)?;
        Ok(())
    }
}

impl Handler<WhereAmI> for Counter {
    async fn handle(&mut self, cx: &Context<Self>, _: WhereAmI) -> Result<(), BoxError> {
        let route = route(cx).ok_or("a cast carries a route")?;
        reply(cx, &(route.index, route.hops, std::process::id()))?;
        Ok(())
    }
}

impl Handler<Trouble> for Counter {
    async fn handle(&mut self, cx: &Context<Self>, trouble: Trouble) -> Result<(), BoxError> {
        match trouble {
            Trouble::Error => {
                reply_error(cx, "asked to answer with an error")?;
                Ok(())
            }
            Trouble::Fail => Err("asked to fail".into()),
            Trouble::Exit(code) => std::process::exit(code),
        }
    }
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_agent() {
    agent_child_main(|| AgentOptions::default().register::<Counter>());
}

async fn procs(agent: &ProcAgent, client: &hyperactor::Client, sizes: &[usize]) -> ProcMesh {
    let labels: Vec<String> = ["hosts", "gpus"][2 - sizes.len()..]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let per_host = Extent::new(labels, sizes.to_vec()).unwrap();
    let hosts = HostMesh::local(agent).unwrap();
    timed(hosts.spawn_procs(client, "workers", &per_host, &child_command("child_agent")))
        .await
        .unwrap()
}

async fn next_failure(client: &hyperactor::Client) -> MeshFailure {
    let event = timed(client.next_supervision_event()).await.unwrap();
    MeshFailure::from_event(&event).expect("MSUP-1: a mesh failure is attached")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_cast_and_call_gather_a_value_mesh() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client, &[4]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &10).unwrap();
    assert_eq!(counters.len(), 4);
    // Sent right after the spawn: handled after every actor's construction (ORD-1).
    counters.cast(&client, &Add(5)).unwrap();
    let totals = timed(counters.call(&client, &Get)).await.unwrap();
    assert_eq!(totals.values(), [15, 15, 15, 15]);
    let points: Vec<(usize, usize)> = totals
        .iter()
        .map(|(p, _)| (p.rank(), p.coord("gpus").unwrap()))
        .collect();
    assert_eq!(points, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
    // A view: only its actors get the message.
    let middle = counters.select_range("gpus", 1, 3, 1).unwrap();
    middle.cast(&client, &Add(1)).unwrap();
    let totals = timed(counters.call(&client, &Get)).await.unwrap();
    assert_eq!(totals.values(), [15, 16, 16, 15]);
    let one = counters.select("gpus", 3).unwrap();
    assert_eq!(timed(one.call(&client, &Get)).await.unwrap().values(), [15]);
    timed(procs.stop(&client, "test done")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cast1_every_rank_once_and_replies_reduced_per_subtree() {
    let (agent, client) = host_agent().await;
    agent.set_fanout(2);
    let procs = procs(&agent, &client, &[2, 4]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &0).unwrap();
    let places = timed(counters.call(&client, &WhereAmI)).await.unwrap();
    let indices: Vec<u32> = places.values().iter().map(|(i, _, _)| *i).collect();
    assert_eq!(
        indices,
        (0..8).collect::<Vec<_>>(),
        "CAST-1: each rank once, in place"
    );
    let deepest = places
        .values()
        .iter()
        .map(|(_, hops, _)| *hops)
        .max()
        .unwrap();
    assert!(
        deepest >= 3,
        "fan-out 2 over 8 ranks relays: depth {deepest}"
    );
    let pids: std::collections::HashSet<u32> = places.values().iter().map(|v| v.2).collect();
    assert_eq!(pids.len(), 8, "one process per rank");
    // CAST-2: the caller receives one message per top-level chunk.
    let replies = CallReplies::open(&agent, 0..8);
    counters.mesh_ref().cast_parts(
        &agent,
        client.actor_id(),
        CastKind::Message {
            port: hyperactor::message::handler_port::<Get>(),
        },
        ReplyMode::Reduce,
        Some(replies.reply_to().clone()),
        hyperactor::message::Serialized::encode(&Get)
            .unwrap()
            .into_parts(),
    );
    assert_eq!(timed(replies.wait()).await.len(), 8);
    assert_eq!(
        replies.messages(),
        2,
        "CAST-2: one message per top-level subtree"
    );
    timed(procs.stop(&client, "test done")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reply_keeps_the_actor_a_failure_reaches_the_owner() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client, &[2]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &1).unwrap();
    let err = timed(counters.call(&client, &Trouble::Error))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MeshError::Call { failed: false, reason, .. } if reason.contains("asked to answer")),
        "{err}"
    );
    assert_eq!(
        timed(counters.call(&client, &Get)).await.unwrap().values(),
        [1, 1]
    );

    let rank1 = counters.select("gpus", 1).unwrap();
    let err = timed(rank1.call(&client, &Trouble::Fail))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            MeshError::Call {
                failed: true,
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
    let failure = next_failure(&client).await;
    assert_eq!((failure.mesh.name.as_str(), failure.rank), ("counters", 1));
    assert_eq!(failure.pid, Some(procs.procs()[1].pid));
    assert!(
        matches!(&failure.cause, FailureCause::Actor { reason } if reason.contains("asked to fail")),
        "MSUP-2: {failure}"
    );
    // Later calls to the failed rank fail at once; the other rank still answers.
    let err = timed(counters.call(&client, &Get)).await.unwrap_err();
    assert!(err.to_string().contains("asked to fail"), "{err}");
    let rank0 = counters.select("gpus", 0).unwrap();
    assert_eq!(
        timed(rank0.call(&client, &Get)).await.unwrap().values(),
        [1]
    );
    timed(procs.stop(&client, "test done")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_constructor_is_reported_per_rank() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client, &[2]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "bad", &666).unwrap();
    let mut ranks = [next_failure(&client).await, next_failure(&client).await];
    ranks.sort_by_key(|f| f.rank);
    for (i, failure) in ranks.iter().enumerate() {
        assert_eq!(failure.rank, i);
        assert!(
            failure.to_string().contains("refusing to start"),
            "{failure}"
        );
    }
    let err = timed(counters.call(&client, &Get)).await.unwrap_err();
    assert!(matches!(err, MeshError::Call { failed: true, .. }), "{err}");
    timed(procs.stop(&client, "test done")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_proc_fails_pending_calls_and_reaches_the_owner() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client, &[3]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &0).unwrap();
    assert_eq!(timed(counters.call(&client, &Get)).await.unwrap().len(), 3);
    let doomed = counters.select("gpus", 2).unwrap();
    let err = timed(doomed.call(&client, &Trouble::Exit(3)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MeshError::Call { failed: true, reason, .. } if reason.contains("exited with status 3")),
        "CAST-3: {err}"
    );
    let failure = next_failure(&client).await;
    assert_eq!(failure.rank, 2);
    assert_eq!(
        failure.cause,
        FailureCause::ProcExited { code: 3 },
        "MSUP-2"
    );
    // Later calls skip the dead proc and fail at once; the others still answer.
    let err = timed(counters.call(&client, &Get)).await.unwrap_err();
    assert!(matches!(err, MeshError::Call { rank: 2, .. }), "{err}");
    let alive = counters.select_range("gpus", 0, 2, 1).unwrap();
    assert_eq!(
        timed(alive.call(&client, &Get)).await.unwrap().values(),
        [0, 0]
    );
    timed(procs.stop(&client, "test done")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_actors_then_procs() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client, &[2]).await;
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &0).unwrap();
    counters.cast(&client, &Add(1)).unwrap();
    timed(counters.stop(&client, "enough")).await.unwrap();
    let err = timed(counters.call(&client, &Get)).await.unwrap_err();
    assert!(err.to_string().contains("was stopped (enough)"), "{err}");
    let pids: Vec<u32> = procs.procs().iter().map(|p| p.pid).collect();
    timed(procs.stop(&client, "test done")).await.unwrap();
    for pid in pids {
        assert!(!process_exists(pid), "proc {pid} was stopped and reaped");
    }
    // A stop is not a failure: nothing reaches the owner.
    let quiet = tokio::time::timeout(Duration::from_millis(300), client.next_supervision_event());
    assert!(quiet.await.is_err(), "no supervision event after a stop");
    let reference: ProcMesh = bincode::deserialize(&bincode::serialize(&procs).unwrap()).unwrap();
    assert_eq!(reference.len(), 2, "a proc mesh travels as a reference");
}
