//! Proc exits: a killed proc is reported at once while the others keep answering
//! (HOST-2), and neither shutdown nor dropping the host leaves a process behind
//! (HOST-3).
//!
//! The children are this test binary itself, re-run on the ignored `child_echo`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use hyperactor::testing::{timed, EchoMsg};
use hyperactor::{ChannelTransport, SendContext};
use hyperactor_mesh::testing::{child_command, echo_child_main, echo_of, process_exists};
use hyperactor_mesh::{Host, ProcHandle};

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_echo() {
    echo_child_main();
}

async fn spawn_echoes(host: &Host, count: usize) -> Vec<ProcHandle> {
    timed(host.spawn_procs("echoes", count, &child_command("child_echo")))
        .await
        .unwrap()
}

async fn assert_answers(host: &Host, proc: &ProcHandle) {
    let echo = echo_of(proc.proc_id());
    let reply = timed(
        host.client()
            .call(&echo.port::<EchoMsg>(), |r| EchoMsg(vec![7], r)),
    )
    .await
    .unwrap();
    assert_eq!(reply, vec![7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_proc_is_reported_at_once_and_the_others_keep_answering() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let procs = spawn_echoes(&host, 3).await;
    let mut watch = procs[1].watch();

    assert!(procs[1].kill());
    let exit = timed(host.next_exit()).await;
    assert_eq!(
        (exit.rank, &exit.proc_id),
        (1, procs[1].proc_id()),
        "HOST-2: {exit}"
    );
    assert_eq!(
        exit.status.exit_status().unwrap().signal(),
        Some(libc::SIGKILL)
    );
    timed(watch.wait_for(|s| !s.is_running())).await.unwrap();
    assert_eq!(procs[1].status(), exit.status, "HOST-2: the handle agrees");
    assert!(!procs[1].kill(), "a second kill finds it gone");
    assert!(!process_exists(procs[1].pid()));

    for proc in [&procs[0], &procs[2]] {
        assert!(proc.status().is_running());
        assert_answers(&host, proc).await;
    }
    timed(host.shutdown(Duration::from_secs(5))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_proc_and_leaves_no_process() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let procs = spawn_echoes(&host, 2).await;
    timed(host.shutdown(Duration::from_secs(5))).await;
    for proc in &procs {
        let status = proc.status();
        assert!(
            status.exit_status().unwrap().success(),
            "HOST-3: a graceful stop (BOOT-2), got {status}"
        );
        assert!(
            !process_exists(proc.pid()),
            "HOST-3: pid {} is gone",
            proc.pid()
        );
    }
    for _ in &procs {
        let exit = timed(host.next_exit()).await;
        assert!(!exit.status.is_running());
    }
    let err = host
        .spawn_procs("late", 1, &child_command("child_echo"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("shut down"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_host_kills_its_procs() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let procs = spawn_echoes(&host, 2).await;
    drop(host);
    for proc in &procs {
        let status = timed(proc.wait()).await;
        assert_eq!(
            status.exit_status().and_then(|s| s.signal()),
            Some(libc::SIGKILL),
            "HOST-3: {status}"
        );
        assert!(
            !process_exists(proc.pid()),
            "HOST-3: pid {} is gone",
            proc.pid()
        );
    }
}
