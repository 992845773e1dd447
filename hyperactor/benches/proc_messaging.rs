//! Messaging between two procs in two OS processes, next to a raw Unix-socket
//! ping-pong measured by the same program.
//!
//! ```text
//! cargo bench -p hyperactor --bench proc_messaging
//! ```
//!
//! Reports, for Unix and TCP:
//!
//! - the round trip of a `call` from a client in this process to an actor in the child
//!   process (a request carrying a once port, answered on it);
//! - one-way throughput of 64-byte and 1 MiB messages to an actor in the child (sent with
//!   back-pressure, and closed by a call that ORD-1 orders after them);
//!
//! and the round trip of a blocking 8-byte ping-pong over a raw Unix socket, and over
//! loopback TCP, between the same two processes: the floor any messaging layer pays.
//! Each transport's `call` round trip is reported as a ratio to the raw socket of its
//! own kind. The process is this binary
//! itself, re-run with `--child`.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hyperactor::{
    Actor, ActorRef, Binder, BoxError, ChannelTransport, Client, Context, Handler, OncePortRef,
    PortId, PortRef, Proc, SendContext,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

const RTT_ROUNDS: u32 = 20_000;
const SMALL_MESSAGES: u64 = 200_000;
const LARGE_MESSAGES: u64 = 2_000;

/// The child's actor: answers pings, counts bulk messages.
#[derive(Debug, Default)]
struct Sink {
    received: u64,
    bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Ping(OncePortRef<()>);

#[derive(Debug, Serialize, Deserialize)]
struct Bulk(serde_bytes::ByteBuf);

#[derive(Debug, Serialize, Deserialize)]
struct Drain(OncePortRef<(u64, u64)>);

impl Actor for Sink {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Sink::default())
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Ping>().handle::<Bulk>().handle::<Drain>();
    }
}

impl Handler<Ping> for Sink {
    async fn handle(&mut self, cx: &Context<Self>, Ping(reply): Ping) -> Result<(), BoxError> {
        reply.send(cx, ())?;
        Ok(())
    }
}

impl Handler<Bulk> for Sink {
    async fn handle(&mut self, _cx: &Context<Self>, Bulk(bytes): Bulk) -> Result<(), BoxError> {
        self.received += 1;
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

impl Handler<Drain> for Sink {
    async fn handle(&mut self, cx: &Context<Self>, Drain(reply): Drain) -> Result<(), BoxError> {
        reply.send(cx, (self.received, self.bytes))?;
        self.received = 0;
        self.bytes = 0;
        Ok(())
    }
}

/// The child's end of [`ping_pong`]: echoes 8-byte messages until the stream ends.
fn echo(stream: &mut (impl Read + Write)) -> anyhow::Result<()> {
    let mut buf = [0u8; 8];
    while stream.read_exact(&mut buf).is_ok() {
        stream.write_all(&buf)?;
    }
    Ok(())
}

fn child_main(args: &[String]) -> anyhow::Result<()> {
    match args {
        [mode, path] if mode == "raw" => echo(&mut UnixStream::connect(path)?),
        [mode, addr] if mode == "raw-tcp" => {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_nodelay(true)?;
            echo(&mut stream)
        }
        [mode, path] if mode == "raw-async" => runtime()?.block_on(async {
            use tokio::io::AsyncWriteExt;
            let mut stream = tokio::net::UnixStream::connect(path).await?;
            let mut buf = [0u8; 8];
            while stream.read_exact(&mut buf).await.is_ok() {
                stream.write_all(&buf).await?;
            }
            Ok(())
        }),
        [transport, report] => runtime()?.block_on(async {
            let proc = Proc::serve(transport.parse()?, "bench-child").await?;
            let sink = proc.spawn::<Sink>("sink", ())?;
            let client = proc.client("boot")?;
            PortRef::<ActorRef<Sink>>::attest(report.parse::<PortId>()?)
                .send(&client, sink.bind())?;
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while stdin.read(&mut buf).await? > 0 {}
            Ok(())
        }),
        _ => bail!(
            "usage: proc_messaging --child (raw PATH | raw-tcp ADDR | raw-async PATH | \
             TRANSPORT REPORT_PORT)"
        ),
    }
}

/// The mean round trip of a blocking 8-byte ping-pong on `stream` (after a warm-up).
fn ping_pong(stream: &mut (impl Read + Write)) -> anyhow::Result<Duration> {
    let mut buf = [0u8; 8];
    let mut rtt = |rounds: u32| -> anyhow::Result<Duration> {
        let start = Instant::now();
        for i in 0..rounds {
            stream.write_all(&u64::from(i).to_le_bytes())?;
            stream.read_exact(&mut buf)?;
        }
        Ok(start.elapsed() / rounds)
    };
    rtt(RTT_ROUNDS / 10)?;
    rtt(RTT_ROUNDS)
}

fn raw_unix_rtt() -> anyhow::Result<Duration> {
    let path =
        std::env::temp_dir().join(format!("hyperactor-bench-raw-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .envs(hyperactor::channel::auth::child_env())
        .args(["--child", "raw", &path.to_string_lossy()])
        .spawn()?;
    let (mut stream, _) = listener.accept()?;
    let result = ping_pong(&mut stream)?;
    drop(stream);
    child.wait()?;
    let _ = std::fs::remove_file(&path);
    Ok(result)
}

/// The same blocking ping-pong as [`raw_unix_rtt`], over loopback TCP (`TCP_NODELAY`).
fn raw_tcp_rtt() -> anyhow::Result<Duration> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .envs(hyperactor::channel::auth::child_env())
        .args(["--child", "raw-tcp", &addr])
        .spawn()?;
    let (mut stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let result = ping_pong(&mut stream)?;
    drop(stream);
    child.wait()?;
    Ok(result)
}

/// The same ping-pong as [`raw_unix_rtt`], on tokio sockets in the runtime being
/// measured: the floor for any messaging layer built on that runtime.
async fn raw_async_unix_rtt() -> anyhow::Result<Duration> {
    use tokio::io::AsyncWriteExt;
    let path = std::env::temp_dir().join(format!(
        "hyperactor-bench-raw-async-{}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .envs(hyperactor::channel::auth::child_env())
        .args(["--child", "raw-async", &path.to_string_lossy()])
        .kill_on_drop(true)
        .spawn()?;
    let (mut stream, _) = listener.accept().await?;
    let mut buf = [0u8; 8];
    let mut result = Duration::ZERO;
    for rounds in [RTT_ROUNDS / 10, RTT_ROUNDS] {
        let start = Instant::now();
        for i in 0..rounds {
            stream.write_all(&u64::from(i).to_le_bytes()).await?;
            stream.read_exact(&mut buf).await?;
        }
        result = start.elapsed() / rounds;
    }
    drop(stream);
    child.wait().await?;
    let _ = std::fs::remove_file(&path);
    Ok(result)
}

struct Peer {
    child: tokio::process::Child,
    sink: ActorRef<Sink>,
}

async fn start_peer(client: &Client, transport: ChannelTransport) -> anyhow::Result<Peer> {
    let (report, mut reports) = client.open_port::<ActorRef<Sink>>();
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .envs(hyperactor::channel::auth::child_env())
        .args([
            "--child",
            &transport.to_string(),
            &report.port_id().to_string(),
        ])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let sink = tokio::time::timeout(Duration::from_secs(30), reports.recv())
        .await
        .context("child did not report")??;
    Ok(Peer { child, sink })
}

async fn call_rtt(client: &Client, sink: &ActorRef<Sink>) -> anyhow::Result<Duration> {
    let port = sink.port::<Ping>();
    for _ in 0..RTT_ROUNDS / 10 {
        client.call(&port, Ping).await?;
    }
    let start = Instant::now();
    for _ in 0..RTT_ROUNDS {
        client.call(&port, Ping).await?;
    }
    Ok(start.elapsed() / RTT_ROUNDS)
}

/// Returns (messages per second, bytes per second).
async fn throughput(
    client: &Client,
    sink: &ActorRef<Sink>,
    size: usize,
    count: u64,
) -> anyhow::Result<(f64, f64)> {
    let port = sink.port::<Bulk>();
    let payload = serde_bytes::ByteBuf::from(vec![0xa5u8; size]);
    let start = Instant::now();
    for _ in 0..count {
        port.send_with_backpressure(client, Bulk(payload.clone()))
            .await?;
    }
    let (received, bytes) = client.call(&sink.port::<Drain>(), Drain).await?;
    let elapsed = start.elapsed().as_secs_f64();
    if received != count || bytes != count * size as u64 {
        bail!(
            "sink received {received} messages / {bytes} bytes, expected {count} / {}",
            count * size as u64
        );
    }
    Ok((count as f64 / elapsed, bytes as f64 / elapsed))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child_main(&args[1..]);
    }
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if args.iter().any(|a| a != "--bench") {
        bail!("usage: cargo bench -p hyperactor --bench proc_messaging");
    }
    println!("hyperactor proc messaging, two procs in two processes (release build)");
    let raw = raw_unix_rtt()?;
    println!(
        "{:<52} {:>14}",
        "raw Unix socket ping-pong round trip",
        format!("{:.1} µs", micros(raw))
    );
    let raw_tcp = raw_tcp_rtt()?;
    println!(
        "{:<52} {:>14}",
        "raw TCP socket ping-pong round trip",
        format!("{:.1} µs", micros(raw_tcp))
    );
    // Both processes of a measurement run the same runtime: chosen by
    // HYPERACTOR_BENCH_THREADS, or else each of the two kinds in turn.
    let kinds = match std::env::var("HYPERACTOR_BENCH_THREADS") {
        Ok(threads) => vec![threads],
        Err(_) => vec!["1".to_string(), "2".to_string()],
    };
    for threads in kinds {
        // Set before this measurement's runtime exists; the children inherit
        // it and build the same kind of runtime.
        std::env::set_var("HYPERACTOR_BENCH_THREADS", &threads);
        // Measure on a runtime task, as an actor or a client task would run:
        // a multi-thread runtime's `block_on` future lives on the calling
        // thread, so every reply would pay a cross-thread wake-up to reach it.
        runtime()?.block_on(async move { tokio::spawn(measure(raw, raw_tcp)).await })??;
    }
    Ok(())
}

fn runtime_label() -> String {
    match std::env::var("HYPERACTOR_BENCH_THREADS").as_deref() {
        Ok("1") => "current-thread".to_string(),
        Ok(n) => format!("{n}-worker"),
        Err(_) => "default".to_string(),
    }
}

async fn measure(raw_unix: Duration, raw_tcp: Duration) -> anyhow::Result<()> {
    let label = runtime_label();
    let raw_async = raw_async_unix_rtt().await?;
    println!(
        "{:<52} {:>14}",
        format!("raw tokio Unix socket ping-pong, {label} runtime"),
        format!("{:.1} µs", micros(raw_async))
    );
    for transport in [ChannelTransport::Unix, ChannelTransport::Tcp] {
        // Each transport is compared with a raw socket of its own kind.
        let raw = if transport == ChannelTransport::Tcp {
            raw_tcp
        } else {
            raw_unix
        };
        let transport_label = format!("{transport}, {label} runtime");
        let transport_label = &transport_label;
        let proc = Proc::serve(transport, "bench").await?;
        let client = proc.client("bench")?;
        let mut peer = start_peer(&client, transport).await?;
        let rtt = call_rtt(&client, &peer.sink).await?;
        if std::env::var_os("HYPERACTOR_BENCH_RTT_ONLY").is_some() {
            println!("{transport_label}: call round trip {:.1} µs", micros(rtt));
            drop(peer.child.stdin.take());
            peer.child.wait().await?;
            continue;
        }
        let (small_rate, _) = throughput(&client, &peer.sink, 64, SMALL_MESSAGES).await?;
        let (large_rate, large_bw) =
            throughput(&client, &peer.sink, 1 << 20, LARGE_MESSAGES).await?;
        println!(
            "{:<52} {:>14}   ({:.2}x raw {transport} socket, {:.2}x raw tokio Unix socket)",
            format!("{transport_label}: call round trip"),
            format!("{:.1} µs", micros(rtt)),
            rtt.as_secs_f64() / raw.as_secs_f64(),
            rtt.as_secs_f64() / raw_async.as_secs_f64()
        );
        println!(
            "{:<52} {:>14}",
            format!("{transport_label}: one-way 64 B messages"),
            format!("{:.0} msg/s", small_rate)
        );
        println!(
            "{:<52} {:>14}   ({:.0} msg/s)",
            format!("{transport_label}: one-way 1 MiB messages"),
            format!("{:.2} GB/s", large_bw / 1e9),
            large_rate
        );
        drop(peer.child.stdin.take());
        tokio::time::timeout(Duration::from_secs(10), peer.child.wait()).await??;
        proc.stop(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// The runtime of each benchmark process: `HYPERACTOR_BENCH_THREADS=1` selects a
/// current-thread runtime, another number a multi-thread one of that many workers.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    match std::env::var("HYPERACTOR_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Runtime::new(),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
