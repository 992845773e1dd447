//! A mesh of native Rust actors, end to end: spawn four procs on this host, spawn an
//! actor on each, cast to all of them and to a view, gather their replies into a
//! `ValueMesh`, then kill one proc and watch its failure reach the owner (the client)
//! while the other ranks keep answering.
//!
//! ```text
//! cargo run --release -p hyperactor_mesh --example mesh_demo
//! ```
//!
//! The procs are this same program: the host starts it with the bootstrap variables
//! set, and `main` then runs the child side instead.

use std::time::Duration;

use hyperactor::{Actor, BoxError, ChannelTransport, Context, Handler};
use hyperactor_mesh::bootstrap::{serve_until_stopped, BootInfo, BOOTSTRAP_ADDR_ENV};
use hyperactor_mesh::host::Host;
use hyperactor_mesh::{
    reply, route, ActorMesh, AgentOptions, BootstrapCommand, Extent, HostMesh, MeshError,
    MeshFailure, ProcAgent, Request, ValueMesh,
};
use serde::{Deserialize, Serialize};

/// A toy trainer: it keeps a weight and takes steps.
#[derive(Debug)]
struct Trainer {
    weight: f64,
}

/// Take one step of size `0.1 * rate` (a cast: no reply).
#[derive(Debug, Serialize, Deserialize)]
struct Step(f64);

/// What is the loss now? (a call: every rank replies, reduced over the cast tree).
#[derive(Debug, Serialize, Deserialize)]
struct Loss;
impl Request for Loss {
    type Reply = (u32, f64);
}

impl Actor for Trainer {
    type Params = f64;
    async fn new(weight: f64) -> Result<Self, BoxError> {
        Ok(Trainer { weight })
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Step>();
        binder.handle::<Loss>();
    }
}

impl Handler<Step> for Trainer {
    async fn handle(&mut self, _cx: &Context<Self>, Step(rate): Step) -> Result<(), BoxError> {
        self.weight -= 0.1 * rate * self.weight;
        Ok(())
    }
}

impl Handler<Loss> for Trainer {
    async fn handle(&mut self, cx: &Context<Self>, _: Loss) -> Result<(), BoxError> {
        // Where in the view this message came to, and the loss.
        let index = route(cx).map_or(0, |r| r.index);
        reply(cx, &(index, self.weight * self.weight))?;
        Ok(())
    }
}

/// The child side: serve a proc with an agent that can spawn `Trainer`s, report ready
/// to the host, and serve until the host stops it.
fn child() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let info = BootInfo::from_env()?;
        let proc = info.serve(ChannelTransport::Unix).await?;
        let _agent = ProcAgent::new(proc.clone(), AgentOptions::default().register::<Trainer>())?;
        info.report_ready(&proc)?;
        serve_until_stopped(&proc, Duration::from_secs(2)).await;
        Ok(())
    })
}

async fn demo() -> Result<(), BoxError> {
    // This process is the host: its agent spawns and reaps procs, and its client owns
    // what the demo spawns (failures are reported to it).
    let host = Host::serve(ChannelTransport::Unix).await?;
    let proc = host.proc().clone();
    let agent = ProcAgent::new(proc, AgentOptions::default().host(host))?;
    let client = agent.proc().client("client")?;

    let per_host = Extent::new(vec!["gpus".to_string()], vec![4])?;
    let program = BootstrapCommand::new(std::env::current_exe()?);
    let procs = HostMesh::local(&agent)?
        .spawn_procs(&client, "workers", &per_host, &program)
        .await?;
    let trainers: ActorMesh<Trainer> = procs.spawn(&client, "trainers", &1.0)?;
    println!(
        "spawned {} trainers over {}",
        trainers.len(),
        trainers.extent()
    );

    // A cast to every rank, then one to a view of the first two.
    trainers.cast(&client, &Step(1.0))?;
    trainers
        .select_range("gpus", 0, 2, 1)?
        .cast(&client, &Step(5.0))?;
    let losses: ValueMesh<(u32, f64)> = trainers.call(&client, &Loss).await?;
    for (point, (index, loss)) in losses.iter() {
        println!(
            "  gpus={} (index {index}): loss {loss:.4}",
            point.coord("gpus")?
        );
    }

    // Kill the proc of rank 3: its failure reaches the owner, with the cause.
    let victim = &procs.procs()[3];
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(victim.pid as libc::pid_t, libc::SIGKILL) };
    let event = client
        .next_supervision_event()
        .await
        .ok_or("the client's supervision stream ended")?;
    let failure = MeshFailure::from_event(&event).ok_or("not a mesh failure")?;
    println!("the owner heard:\n{}", failure.report());

    // A call to the whole mesh names the dead rank; the others still answer.
    match trainers.call(&client, &Loss).await {
        Err(MeshError::Call { rank, .. }) => println!("a call to every rank: rank {rank} failed"),
        other => return Err(format!("expected the dead rank to fail the call: {other:?}").into()),
    }
    let alive = trainers.select_range("gpus", 0, 3, 1)?;
    let values = alive.call(&client, &Loss).await?;
    println!("ranks 0..3 still answer: {} losses", values.len());

    procs.stop(&client, "demo done").await?;
    println!("stopped");
    Ok(())
}

fn main() -> Result<(), BoxError> {
    if std::env::var_os(BOOTSTRAP_ADDR_ENV).is_some() {
        return child();
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(demo())
}
