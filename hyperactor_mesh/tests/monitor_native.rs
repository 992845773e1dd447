//! Monitoring with native actors: `ProcAgent::monitor_snapshot` over a host agent's
//! procs (counters per actor and per endpoint, meshes, procs), and a dead proc's
//! failure in the snapshot and the events ring.
//!
//! The procs are this test binary itself, re-run on the ignored `child_agent` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hyperactor::testing::timed;
use hyperactor::{Actor, BoxError, Context, Handler};
use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
use hyperactor_mesh::monitor::{events, Snapshot};
use hyperactor_mesh::testing::{agent_child_main, child_command, host_agent};
use hyperactor_mesh::{reply, ActorMesh, Extent, HostMesh, ProcMesh, Request};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct Worker;

#[derive(Debug, Serialize, Deserialize)]
struct Poke;

#[derive(Debug, Serialize, Deserialize)]
struct Pid;
impl Request for Pid {
    type Reply = u32;
}

impl Actor for Worker {
    type Params = ();
    async fn new((): ()) -> Result<Self, BoxError> {
        Ok(Worker)
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Poke>();
        binder.handle::<Pid>();
    }
}

impl Handler<Poke> for Worker {
    async fn handle(&mut self, _cx: &Context<Self>, _: Poke) -> Result<(), BoxError> {
        Ok(())
    }
}

impl Handler<Pid> for Worker {
    async fn handle(&mut self, cx: &Context<Self>, _: Pid) -> Result<(), BoxError> {
        reply(cx, &std::process::id())?;
        Ok(())
    }
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_agent() {
    agent_child_main(|| AgentOptions::default().register::<Worker>());
}

async fn procs(agent: &ProcAgent, client: &hyperactor::Client) -> ProcMesh {
    let per_host = Extent::new(vec!["gpus".to_string()], vec![2]).unwrap();
    let hosts = HostMesh::local(agent).unwrap();
    timed(hosts.spawn_procs(
        client,
        "monitored",
        &per_host,
        &child_command("child_agent"),
    ))
    .await
    .unwrap()
}

/// Snapshots every 50 ms until `check` holds.
async fn wait_for(agent: &ProcAgent, what: &str, check: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = agent.monitor_snapshot(Duration::from_secs(5)).await;
        if check(&snap) {
            return snap;
        }
        assert!(
            Instant::now() < deadline,
            "not {what} within 30 s: {}",
            serde_json::to_string(&snap).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_counts_native_messages_and_shows_a_dead_proc() {
    let (agent, client) = host_agent().await;
    let procs = procs(&agent, &client).await;
    let workers: ActorMesh<Worker> = procs.spawn(&client, "workers", &()).unwrap();
    for _ in 0..3 {
        workers.cast(&client, &Poke).unwrap();
    }
    let pids = timed(workers.call(&client, &Pid))
        .await
        .unwrap()
        .values()
        .to_vec();
    let counted = |s: &Snapshot| {
        let ours: Vec<_> = s.actors.iter().filter(|a| a.name == "workers").collect();
        ours.len() == 2 && ours.iter().all(|a| a.handled == 4)
    };
    let snap = wait_for(&agent, "counted", counted).await;
    assert_eq!(snap.hosts.len(), 1);
    assert_eq!(snap.hosts[0].status, "alive");
    for actor in snap.actors.iter().filter(|a| a.name == "workers") {
        assert_eq!(actor.endpoints["Poke"].count, 3, "{actor:?}");
        assert_eq!(actor.endpoints["Pid"].count, 1, "{actor:?}");
        assert_eq!(actor.errors, 0);
        assert!(!actor.system);
        let proc = snap.procs.iter().find(|p| p.id == actor.proc).unwrap();
        assert_eq!(proc.status, "running");
        assert!(pids.contains(&proc.pid.unwrap()));
        assert_eq!(proc.mesh.as_deref(), Some("monitored"));
    }
    let kinds: Vec<&str> = snap.meshes.iter().map(|m| m.kind.as_str()).collect();
    assert!(
        kinds.contains(&"proc") && kinds.contains(&"actor"),
        "{kinds:?}"
    );

    let victim = snap
        .procs
        .iter()
        .find(|p| p.mesh.as_deref() == Some("monitored") && p.rank == Some(1))
        .unwrap()
        .clone();
    let since = events::latest_seq();
    // SAFETY: a plain kill of a child process.
    unsafe { libc::kill(victim.pid.unwrap() as i32, libc::SIGKILL) };
    let dead = |s: &Snapshot| {
        let proc_failed = s
            .procs
            .iter()
            .any(|p| p.id == victim.id && p.status == "failed");
        let actor_failed = s
            .actors
            .iter()
            .any(|a| a.proc == victim.id && a.name == "workers" && a.status == "failed");
        proc_failed && actor_failed
    };
    let snap = wait_for(&agent, "showing the dead proc", dead).await;
    let proc = snap.procs.iter().find(|p| p.id == victim.id).unwrap();
    assert_eq!(proc.exit.as_ref().and_then(|e| e.signal), Some(9));
    // The owner hears of the failure after it is recorded.
    let _ = timed(client.next_supervision_event()).await;
    let kinds: Vec<String> = events::since(since, 1000)
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "proc_exited"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "actor_failed"), "{kinds:?}");
    timed(procs.stop(&client, "test done")).await.unwrap();
}
