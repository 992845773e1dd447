//! A proc whose Unix socket receives bad input: garbage, a frame header
//! claiming a 10 GiB part, frames over the maximum or with too many parts,
//! truncated frames, frames whose envelope header does not decode, many
//! connections. The proc must go on answering a normal client, its memory
//! must stay bounded, and its log lines about the bad input rate-limited.
//!
//! One test in this binary, so that nothing else moves the process's memory
//! figures or its (process-wide) log limits. It runs on a current-thread
//! runtime, so the proc's tasks log to this thread's capturing subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hyperactor::sync::Mutex;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hyperactor::channel::ChannelAddr;
use hyperactor::testing::{timed, Echo, EchoMsg};
use hyperactor::{ChannelTransport, Proc, SendContext};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const MIB: u64 = 1 << 20;

/// Resident and virtual memory of this process, in bytes.
fn memory() -> (u64, u64) {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: Vec<u64> = statm
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    // SAFETY: `sysconf` has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (pages[1] * page, pages[0] * page)
}

/// Log output, captured.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

impl Capture {
    fn lines_with(&self, needle: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock()).into_owned();
        text.lines().filter(|l| l.contains(needle)).count()
    }
}

/// A frame prefix: magic, part count, header length, part lengths.
fn prefix(header_len: u32, parts: &[u64]) -> Vec<u8> {
    let mut wire = b"HYF1".to_vec();
    wire.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    wire.extend_from_slice(&header_len.to_le_bytes());
    for len in parts {
        wire.extend_from_slice(&len.to_le_bytes());
    }
    wire
}

/// Deterministic noise (xorshift), never starting with the frame magic.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    out[0] = b'X';
    out
}

/// Sends `bytes`, closes the sending side, and waits for the proc to close
/// the connection (end of stream or reset), without an acknowledgement.
async fn send_and_expect_close(path: &Path, bytes: &[u8]) {
    let mut stream = UnixStream::connect(path).await.unwrap();
    // The proc may close before reading everything: a failed write is fine.
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    let mut buf = [0u8; 8];
    match timed(stream.read(&mut buf)).await {
        Ok(n) => assert_eq!(n, 0, "expected the connection to be closed"),
        Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}"),
    }
}

fn unix_path(addr: &ChannelAddr) -> PathBuf {
    match addr {
        ChannelAddr::Unix(path) => path.clone(),
        other => panic!("not a unix address: {other}"),
    }
}

#[tokio::test]
async fn a_proc_survives_bad_input_on_its_socket() {
    let logs = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let server = Proc::serve(ChannelTransport::Unix, "server").await.unwrap();
    let echo = server.spawn::<Echo>("echo", ()).unwrap();
    let client_proc = Proc::serve(ChannelTransport::Unix, "client").await.unwrap();
    let client = client_proc.client("c").unwrap();
    let port = echo.bind().port::<EchoMsg>();
    let reply = timed(client.call(&port, |r| EchoMsg(vec![1; 1000], r))).await;
    assert_eq!(reply.unwrap(), vec![1; 1000]);
    let path = unix_path(server.proc_id().addr());
    let (rss_before, vm_before) = memory();
    let start = Instant::now();

    // Garbage, of every length up to a few KiB.
    for i in 0..50u64 {
        send_and_expect_close(&path, &noise(i, 1 + (i as usize * 97) % 4096)).await;
    }
    // Too many parts; a frame over the maximum (two parts of 10 GiB each).
    send_and_expect_close(&path, &prefix(0, &vec![0; 70_000])).await;
    send_and_expect_close(&path, &prefix(0, &[10 << 30, 10 << 30])).await;
    // Truncated frames: a 10 GiB part, and a 1 MiB part, cut short.
    for claim in [10 << 30, MIB] {
        let mut wire = prefix(4, &[claim]);
        wire.extend_from_slice(&[0u8; 1000]);
        for _ in 0..20 {
            send_and_expect_close(&path, &wire).await;
        }
    }

    // Well-formed frames whose envelope header does not decode: dropped by the
    // proc, which acknowledges them (so they were handled) and keeps the link.
    let mut link = UnixStream::connect(&path).await.unwrap();
    let mut frame = prefix(16, &[4]);
    frame.extend_from_slice(&[0xff; 16]);
    frame.extend_from_slice(b"junk");
    for _ in 0..100 {
        link.write_all(&frame).await.unwrap();
    }
    let mut acked = 0;
    while acked < 100 {
        let mut ack = [0u8; 8];
        timed(link.read_exact(&mut ack)).await.unwrap();
        acked = u64::from_le_bytes(ack);
    }

    // Many connections at once: 100 claiming a 10 GiB part and sending 64 KiB
    // of it, held open; 200 more opened and closed.
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut stream = UnixStream::connect(&path).await.unwrap();
        let mut wire = prefix(0, &[10 << 30]);
        wire.extend_from_slice(&[7u8; 64 << 10]);
        timed(stream.write_all(&wire)).await.unwrap();
        held.push(stream);
    }
    for _ in 0..200 {
        drop(UnixStream::connect(&path).await.unwrap());
    }

    // A normal client still gets its answers, large and small.
    for len in [10, 4 << 20] {
        let payload = vec![3u8; len];
        let reply = timed(client.call(&port, |r| EchoMsg(payload.clone(), r))).await;
        assert!(reply.unwrap() == payload, "echo of {len} bytes differs");
    }
    // Memory: resident well under what was claimed; virtual far from it.
    let (rss_after, vm_after) = memory();
    let rss_growth = rss_after.saturating_sub(rss_before);
    let vm_growth = vm_after.saturating_sub(vm_before);
    assert!(
        rss_growth < 64 * MIB,
        "resident memory grew by {rss_growth} bytes"
    );
    assert!(
        vm_growth < 1024 * MIB,
        "virtual memory grew by {vm_growth} bytes"
    );
    drop(held);

    // Logs: at least one line per kind of bad input, one per second at most.
    let seconds = start.elapsed().as_secs() as usize + 1;
    let closing = logs.lines_with("closing an incoming connection");
    let undecodable = logs.lines_with("does not decode");
    assert!(
        (1..=5 * seconds).contains(&closing),
        "{closing} lines in {seconds} s"
    );
    assert!(
        (1..=seconds).contains(&undecodable),
        "{undecodable} lines in {seconds} s"
    );
    assert!(logs.lines_with("suppressed=") >= closing + undecodable);

    timed(client_proc.stop(std::time::Duration::from_secs(5))).await;
    timed(server.stop(std::time::Duration::from_secs(5))).await;
}
