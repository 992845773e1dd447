//! Proc output reaches the process that spawned the procs (see
//! `hyperactor_mesh::output`): every line, in order per stream (LOG-1), the last lines of
//! a proc that exits before the report of its death (LOG-2), and everything in the
//! per-proc log files.
//!
//! The procs are this test binary itself, re-run on the ignored `child_talker` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;

use hyperactor::testing::timed;
use hyperactor::{Actor, BoxError, ChannelTransport, Context, Handler};
use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
use hyperactor_mesh::host::Host;
use hyperactor_mesh::output::{OutputBatch, OutputStream};
use hyperactor_mesh::testing::{agent_child_main, child_command};
use hyperactor_mesh::{reply, ActorMesh, Extent, HostMesh, MeshFailure, Request};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct Talker;

/// Writes `n` numbered lines to stdout and to stderr, then answers.
#[derive(Debug, Serialize, Deserialize)]
struct Say(usize);
impl Request for Say {
    type Reply = ();
}

/// Writes its last words to both streams and exits with this status.
#[derive(Debug, Serialize, Deserialize)]
struct Die(i32);

impl Actor for Talker {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Talker)
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Say>();
        binder.handle::<Die>();
    }
}

impl Handler<Say> for Talker {
    async fn handle(&mut self, cx: &Context<Self>, Say(n): Say) -> Result<(), BoxError> {
        for i in 0..n {
            // One write per line, as a line-buffered program does: the log file holds
            // both streams in the order the host read them, so a line written in pieces
            // (`eprintln!` writes its parts one by one to unbuffered stderr) could have
            // the other stream's bytes in its middle there.
            let _ = std::io::stdout().write_all(format!("out {i}\n").as_bytes());
            let _ = std::io::stderr().write_all(format!("err {i}\n").as_bytes());
        }
        reply(cx, &())?;
        Ok(())
    }
}

impl Handler<Die> for Talker {
    async fn handle(&mut self, _cx: &Context<Self>, Die(code): Die) -> Result<(), BoxError> {
        // Unflushed writes would be lost: `_exit` skips every destructor.
        let _ = std::io::stdout().write_all(b"last words on stdout\n");
        let _ = std::io::stderr().write_all(b"last words on stderr\n");
        // SAFETY: _exit(2) has no memory-safety preconditions.
        unsafe { libc::_exit(code) }
    }
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_talker() {
    agent_child_main(|| AgentOptions::default().register::<Talker>());
}

/// A host agent (log files in a fresh directory) whose output sink sends every batch
/// it receives to the returned receiver.
async fn host_agent_with_sink(
    test: &str,
) -> (
    ProcAgent,
    hyperactor::Client,
    std_mpsc::Receiver<OutputBatch>,
    std::path::PathBuf,
) {
    let dir = std::env::temp_dir().join(format!("monarch-output-{test}-{}", std::process::id()));
    let host = Host::serve(ChannelTransport::Unix)
        .await
        .unwrap()
        .with_log_dir(Some(dir.clone()));
    let proc = host.proc().clone();
    let agent = ProcAgent::new(proc, AgentOptions::default().host(host)).unwrap();
    let client = agent.proc().client("client").unwrap();
    let (tx, rx) = std_mpsc::channel();
    let tx = hyperactor::sync::Mutex::new(tx);
    agent.set_output_sink(Arc::new(move |batch| {
        let _ = tx.lock().send(batch);
    }));
    (agent, client, rx, dir)
}

/// The lines received so far, per (rank, stream), in order.
fn collect(
    rx: &std_mpsc::Receiver<OutputBatch>,
    lines: &mut BTreeMap<(usize, OutputStream), Vec<String>>,
) {
    while let Ok(batch) = rx.try_recv() {
        assert_eq!(batch.mesh, "talkers");
        for line in batch.lines {
            lines
                .entry((line.rank, line.stream))
                .or_default()
                .push(line.text);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_reaches_the_owner_in_order_per_stream() {
    let (agent, client, rx, dir) = host_agent_with_sink("order").await;
    let hosts = HostMesh::local(&agent).unwrap();
    let per_host = Extent::new(["gpus"], [2]).unwrap();
    let procs = timed(hosts.spawn_procs(
        &client,
        "talkers",
        &per_host,
        &child_command("child_talker"),
    ))
    .await
    .unwrap();
    let talkers: ActorMesh<Talker> = procs.spawn(&client, "talker", &()).unwrap();
    timed(talkers.call(&client, &Say(500))).await.unwrap();
    // LOG-1 and the stop's flush: once the procs are stopped, every line is here.
    timed(procs.stop(&client, "done")).await.unwrap();
    let mut lines = BTreeMap::new();
    collect(&rx, &mut lines);
    let expected =
        |what: &str| -> Vec<String> { (0..500).map(|i| format!("{what} {i}")).collect() };
    for rank in 0..2 {
        // The child's test harness may print around the actor's lines.
        let out: Vec<String> = lines[&(rank, OutputStream::Stdout)]
            .iter()
            .filter(|l| l.starts_with("out "))
            .cloned()
            .collect();
        let err: Vec<String> = lines[&(rank, OutputStream::Stderr)]
            .iter()
            .filter(|l| l.starts_with("err "))
            .cloned()
            .collect();
        assert_eq!(out, expected("out"), "LOG-1: rank {rank}'s stdout in order");
        assert_eq!(err, expected("err"), "LOG-1: rank {rank}'s stderr in order");
    }
    // The log files hold both streams of each proc.
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 2, "one log file per proc: {files:?}");
    for file in files {
        let name = file.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with("talkers-"), "{name}");
        let text = std::fs::read_to_string(file.path()).unwrap();
        assert!(
            text.contains("out 499\n") && text.contains("err 499\n"),
            "{name}: {} bytes, ends {:?}",
            text.len(),
            &text[text.len().saturating_sub(300)..]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dying_procs_last_lines_come_before_its_failure() {
    let (agent, client, rx, dir) = host_agent_with_sink("last").await;
    let hosts = HostMesh::local(&agent).unwrap();
    let per_host = Extent::new(["gpus"], [1]).unwrap();
    let procs = timed(hosts.spawn_procs(
        &client,
        "talkers",
        &per_host,
        &child_command("child_talker"),
    ))
    .await
    .unwrap();
    let talkers: ActorMesh<Talker> = procs.spawn(&client, "talker", &()).unwrap();
    talkers.cast(&client, &Die(3)).unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    let failure = MeshFailure::from_event(&event).unwrap();
    assert_eq!(failure.rank, 0);
    // The sink ran on the delivering task before the death report was handled.
    let mut lines = BTreeMap::new();
    collect(&rx, &mut lines);
    for stream in [OutputStream::Stdout, OutputStream::Stderr] {
        let got = lines.get(&(0, stream)).cloned().unwrap_or_default();
        assert!(
            got.iter().any(|l| l.starts_with("last words")),
            "LOG-2: the last lines on {stream:?} came before the failure: {got:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_not_forwarded_goes_to_files_only_here() {
    let (agent, client, rx, dir) = host_agent_with_sink("local").await;
    let hosts = HostMesh::local(&agent).unwrap();
    let per_host = Extent::new(["gpus"], [1]).unwrap();
    let output = hyperactor_mesh::output::OutputConfig {
        forward: false,
        ..Default::default()
    };
    let procs = timed(hosts.spawn_procs_with(
        &client,
        "talkers",
        &per_host,
        &child_command("child_talker"),
        output,
    ))
    .await
    .unwrap();
    let talkers: ActorMesh<Talker> = procs.spawn(&client, "talker", &()).unwrap();
    timed(talkers.call(&client, &Say(3))).await.unwrap();
    timed(procs.stop(&client, "done")).await.unwrap();
    assert!(rx.try_recv().is_err(), "nothing is forwarded");
    let file = std::fs::read_dir(&dir).unwrap().flatten().next().unwrap();
    let text = std::fs::read_to_string(file.path()).unwrap();
    assert!(
        text.contains("out 2\n") && text.contains("err 2\n"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
