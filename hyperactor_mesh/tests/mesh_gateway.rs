//! A client attached to a worker's gateway (`Proc::attach`) drives the worker's procs
//! through it alone: spawn, cast, call gathered over the tree, a proc's death reported
//! to the owner, stop. The worker serves TCP; its procs serve Unix sockets, which the
//! client never dials (every link of an attached proc goes to its gateway).
//!
//! The procs are this test binary itself, re-run on the ignored `child_agent` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hyperactor::testing::timed;
use hyperactor::{Actor, BoxError, Context, Handler, Proc};
use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
use hyperactor_mesh::testing::{agent_child_main, child_command};
use hyperactor_mesh::worker::{serve_worker, WorkerAddress};
use hyperactor_mesh::{reply, ActorMesh, Extent, FailureCause, HostMesh, MeshFailure, Request};
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

#[derive(Debug, Serialize, Deserialize)]
struct Exit(i32);
impl Request for Exit {
    type Reply = ();
}

impl Actor for Counter {
    type Params = u64;
    async fn new(start: u64) -> Result<Self, BoxError> {
        Ok(Counter { total: start })
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Add>();
        binder.handle::<Get>();
        binder.handle::<Exit>();
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

impl Handler<Exit> for Counter {
    async fn handle(&mut self, _cx: &Context<Self>, Exit(code): Exit) -> Result<(), BoxError> {
        std::process::exit(code)
    }
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_agent() {
    agent_child_main(|| AgentOptions::default().register::<Counter>());
}

async fn next_failure(client: &hyperactor::Client) -> MeshFailure {
    let event = timed(client.next_supervision_event()).await.unwrap();
    MeshFailure::from_event(&event).expect("MSUP-1: a mesh failure is attached")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_client_drives_a_worker_through_its_gateway() {
    let address = WorkerAddress::parse("tcp://127.0.0.1:0").unwrap();
    let worker = serve_worker(&address, AgentOptions::default(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(worker.proc().is_gateway(), "every worker is a gateway");
    let gateway = worker.proc().proc_id().addr().clone();

    let proc = timed(Proc::attach(&gateway, "client")).await.unwrap();
    assert_eq!(
        proc.proc_id().addr(),
        &gateway,
        "reached at the gateway's address"
    );
    let agent = ProcAgent::new(proc, AgentOptions::default()).unwrap();
    let client = agent.proc().client("client").unwrap();

    // Spawn on the worker: the request, the children's readiness, the answer.
    let hosts = HostMesh::new(vec![worker.proc().proc_id().clone()], Extent::unity()).unwrap();
    let per_host = Extent::new(vec!["gpus".to_string()], vec![3]).unwrap();
    let procs =
        timed(hosts.spawn_procs(&client, "workers", &per_host, &child_command("child_agent")))
            .await
            .unwrap();
    for p in procs.procs() {
        assert!(
            p.proc_id.addr().to_string().starts_with("unix:"),
            "the procs behind the gateway serve Unix sockets: {}",
            p.proc_id
        );
    }
    agent.set_fanout(2);
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &10).unwrap();
    counters.cast(&client, &Add(5)).unwrap();
    let totals = timed(counters.call(&client, &Get)).await.unwrap();
    assert_eq!(
        totals.values(),
        [15, 15, 15],
        "cast, then call gathered over the tree"
    );

    // A proc dies: its host reports it to the owner, through the gateway.
    let doomed = counters.select("gpus", 2).unwrap();
    let _ = timed(doomed.call(&client, &Exit(7))).await;
    let failure = next_failure(&client).await;
    assert_eq!(failure.rank, 2);
    assert_eq!(
        failure.cause,
        FailureCause::ProcExited { code: 7 },
        "MSUP-2"
    );
    let alive = counters.select_range("gpus", 0, 2, 1).unwrap();
    assert_eq!(
        timed(alive.call(&client, &Get)).await.unwrap().values(),
        [15, 15]
    );

    timed(procs.stop(&client, "test done")).await.unwrap();
    assert_eq!(
        worker.proc().attached_clients(),
        vec![agent.proc().proc_id().clone()]
    );
}
