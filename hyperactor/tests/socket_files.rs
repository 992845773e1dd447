//! Unix socket files: they live in the private per-user socket directory and
//! are not left behind, whether a server is dropped, a proc stopped, or a
//! process exits after `remove_socket_files` without stopping anything.
//!
//! The process-exit case runs this test binary again as a child, with
//! `--ignored --exact child_main`: that ignored test is the child's entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use hyperactor::channel::{
    remove_socket_files, serve_with, socket_dir, ChannelAddr, ChannelTransport, MAX_SOCKET_DIR_LEN,
};
use hyperactor::testing::{timed, Echo, EchoMsg};
use hyperactor::{Proc, SendContext};
use tokio::io::AsyncBufReadExt;

fn unix_path(addr: &ChannelAddr) -> PathBuf {
    match addr {
        ChannelAddr::Unix(path) => path.clone(),
        other => panic!("not a unix address: {other}"),
    }
}

fn euid() -> u32 {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[tokio::test]
async fn sockets_live_in_the_private_socket_dir() {
    let proc = Proc::serve(ChannelTransport::Unix, "p").await.unwrap();
    let path = unix_path(proc.proc_id().addr());
    let dir = socket_dir();
    assert_eq!(path.parent(), Some(dir));
    assert!(dir.as_os_str().len() <= MAX_SOCKET_DIR_LEN);
    assert!(path.as_os_str().len() < 100, "{path:?}");
    let meta = std::fs::symlink_metadata(dir).unwrap();
    assert!(meta.is_dir() && !meta.file_type().is_symlink());
    assert_eq!(meta.uid(), euid());
    assert_eq!(meta.mode() & 0o777, 0o700, "{dir:?}");
    timed(proc.stop(std::time::Duration::from_secs(5))).await;
}

#[tokio::test]
async fn dropping_a_server_removes_its_socket_file() {
    let server = serve_with(&ChannelAddr::any(ChannelTransport::Unix), Arc::new(|_| {}))
        .await
        .unwrap();
    let path = unix_path(server.addr());
    assert!(path.exists());
    drop(server);
    assert!(!path.exists(), "{path:?} left behind");
}

#[tokio::test]
async fn stopping_a_proc_removes_its_socket_file() {
    let proc = Proc::serve(ChannelTransport::Unix, "p").await.unwrap();
    let echo = proc.spawn::<Echo>("echo", ()).unwrap();
    let client = proc.client("c").unwrap();
    timed(client.call(&echo.bind().port::<EchoMsg>(), |r| EchoMsg(vec![1], r)))
        .await
        .unwrap();
    let path = unix_path(proc.proc_id().addr());
    assert!(path.exists());
    timed(proc.stop(std::time::Duration::from_secs(5))).await;
    assert!(!path.exists(), "{path:?} left behind");
}

const CHILD_ENV: &str = "HYPERACTOR_TEST_SOCKET_FILES_CHILD";

/// The child: serves a proc with an actor, optionally removes its socket
/// files (as an exit hook would), prints its socket path and exits without
/// stopping anything.
#[test]
#[ignore = "entry point of the child process started by exiting_after_remove_socket_files"]
fn child_main() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        panic!("child_main is started by exiting_after_remove_socket_files");
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let proc = Proc::serve(ChannelTransport::Unix, "child").await.unwrap();
        let echo = proc.spawn::<Echo>("echo", ()).unwrap();
        let client = proc.client("c").unwrap();
        let call = || client.call(&echo.bind().port::<EchoMsg>(), |r| EchoMsg(vec![2], r));
        timed(call()).await.unwrap();
        let path = unix_path(proc.proc_id().addr());
        assert!(path.exists());
        if mode == "remove" {
            assert_eq!(remove_socket_files(), 1);
            assert!(!path.exists());
            // Nothing stopped: the actor still answers.
            timed(call()).await.unwrap();
        }
        println!("SOCKET {}", path.display());
    });
    // As at exit with live procs: nothing is dropped.
    std::process::exit(0);
}

/// Runs the child in `mode` and returns the socket path it printed.
async fn run_child(mode: &str) -> PathBuf {
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .envs(hyperactor::channel::auth::child_env())
        .args(["--ignored", "--exact", "child_main", "--nocapture"])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut path = None;
    while let Some(line) = timed(lines.next_line()).await.unwrap() {
        if let Some(p) = line.strip_prefix("SOCKET ") {
            path = Some(PathBuf::from(p));
        }
    }
    let status = timed(child.wait()).await.unwrap();
    assert!(status.success(), "child failed: {status}");
    path.expect("the child printed no socket path")
}

#[tokio::test]
async fn exiting_after_remove_socket_files_leaves_no_socket_file() {
    let path = run_child("remove").await;
    assert!(!Path::new(&path).exists(), "{path:?} left behind");
    // Without the call, the file stays: the call is what removes it.
    let path = run_child("keep").await;
    assert!(
        path.exists(),
        "{path:?} should be left behind without the call"
    );
    std::fs::remove_file(&path).unwrap();
}
