//! Ping-pong between two procs in two OS processes.
//!
//! ```text
//! cargo run --release -p hyperactor --example ping_pong -- [unix|tcp] [ROUNDS]
//! ```
//!
//! The program starts a proc, then starts itself again as a child process (`--pong`)
//! that hosts a second proc with a `Ponger` actor. The child reports a reference to its
//! actor back on a port whose id it got on its command line — references carry their
//! address, so that is all it takes to connect. A `Pinger` actor in the parent then
//! plays `ROUNDS` rounds of ping-pong with the `Ponger`, actor to actor, and the parent
//! prints the round-trip time.
//!
//! The child exits when its standard input closes, so it never outlives the parent.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hyperactor::{
    Actor, ActorRef, Binder, BoxError, ChannelTransport, Context, Handler, OncePortRef, PortId,
    PortRef, Proc, SendContext,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

/// Answers every ping with a pong to the pinger named in the ping.
#[derive(Debug)]
struct Ponger;

/// A ping: its number and who to answer.
#[derive(Debug, Serialize, Deserialize)]
struct Ping(u64, ActorRef<Pinger>);

/// A pong: the number of the ping it answers.
#[derive(Debug, Serialize, Deserialize)]
struct Pong(u64);

impl Actor for Ponger {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Ponger)
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Ping>();
    }
}

impl Handler<Ping> for Ponger {
    async fn handle(&mut self, cx: &Context<Self>, Ping(n, pinger): Ping) -> Result<(), BoxError> {
        pinger.send(cx, Pong(n))?;
        Ok(())
    }
}

/// Plays a game of `rounds` pings against a ponger, then reports its duration.
#[derive(Debug, Default)]
struct Pinger {
    game: Option<Game>,
}

#[derive(Debug)]
struct Game {
    ponger: ActorRef<Ponger>,
    rounds: u64,
    started: Instant,
    done: OncePortRef<Duration>,
}

/// Start a game.
#[derive(Debug, Serialize, Deserialize)]
struct Play {
    ponger: ActorRef<Ponger>,
    rounds: u64,
    done: OncePortRef<Duration>,
}

impl Actor for Pinger {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Pinger::default())
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Play>().handle::<Pong>();
    }
}

impl Handler<Play> for Pinger {
    async fn handle(&mut self, cx: &Context<Self>, play: Play) -> Result<(), BoxError> {
        play.ponger.send(cx, Ping(1, cx.self_ref()))?;
        self.game = Some(Game {
            ponger: play.ponger,
            rounds: play.rounds,
            started: Instant::now(),
            done: play.done,
        });
        Ok(())
    }
}

impl Handler<Pong> for Pinger {
    async fn handle(&mut self, cx: &Context<Self>, Pong(n): Pong) -> Result<(), BoxError> {
        let game = self
            .game
            .as_ref()
            .ok_or("a pong arrived with no game in progress")?;
        if n < game.rounds {
            game.ponger.send(cx, Ping(n + 1, cx.self_ref()))?;
        } else if let Some(game) = self.game.take() {
            game.done.send(cx, game.started.elapsed())?;
        }
        Ok(())
    }
}

/// The child process: host the ponger, report it, serve until stdin closes.
async fn pong_main(transport: ChannelTransport, report: &str) -> anyhow::Result<()> {
    let proc = Proc::serve(transport, "ponger").await?;
    let ponger = proc.spawn::<Ponger>("ponger", ())?;
    let client = proc.client("boot")?;
    let report = PortRef::<ActorRef<Ponger>>::attest(report.parse::<PortId>()?);
    report.send(&client, ponger.bind())?;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while stdin.read(&mut buf).await? > 0 {}
    proc.stop(Duration::from_secs(1)).await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--pong") {
        let [_, transport, report] = args.as_slice() else {
            bail!("usage: ping_pong --pong TRANSPORT REPORT_PORT");
        };
        return pong_main(transport.parse()?, report).await;
    }
    let transport: ChannelTransport = args
        .first()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(ChannelTransport::Unix);
    let rounds: u64 = args
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);

    let proc = Proc::serve(transport, "pinger").await?;
    let client = proc.client("main")?;
    println!("parent proc {}", proc.proc_id());

    let (report, mut reports) = client.open_port::<ActorRef<Ponger>>();
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .envs(hyperactor::channel::auth::child_env())
        .args([
            "--pong",
            &transport.to_string(),
            &report.port_id().to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the child process")?;
    let ponger = tokio::time::timeout(Duration::from_secs(30), reports.recv())
        .await
        .context("the child did not report its ponger within 30 s")??;
    println!(
        "child process {} hosts {}",
        child.id().unwrap_or_default(),
        ponger.actor_id()
    );

    let pinger = client.spawn::<Pinger>("pinger", ())?;
    for (label, n) in [("warm-up", rounds.min(1000)), ("measured", rounds)] {
        let elapsed = client
            .call(&pinger.bind().port::<Play>(), |done| Play {
                ponger: ponger.clone(),
                rounds: n,
                done,
            })
            .await?;
        println!(
            "{label}: {n} round trips over {transport} in {elapsed:?}: {:.1} µs per round trip",
            elapsed.as_secs_f64() * 1e6 / n as f64
        );
    }

    drop(child.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
    println!("child exited with {status}");
    proc.stop(Duration::from_secs(1)).await;
    Ok(())
}
