//! `Host::spawn_procs`: procs start as OS processes, report ready, and answer; a spawn
//! fails whole, naming the rank at fault, when a child exits or stays silent (HOST-1).
//!
//! The children are this test binary itself, re-run on one of the ignored `child_*`
//! tests (see `hyperactor_mesh::testing::child_command`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::time::Duration;

use hyperactor::testing::{timed, EchoMsg};
use hyperactor::{ChannelTransport, SendContext};
use hyperactor_mesh::bootstrap::{wait_for_stop, BootInfo, PROC_RANK_ENV};
use hyperactor_mesh::testing::{child_command, echo_child_main, echo_of, process_exists};
use hyperactor_mesh::{Host, HostError, ProcStatus};

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_echo() {
    echo_child_main();
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_rank_1_exits_early() {
    if std::env::var(PROC_RANK_ENV).as_deref() == Ok("1") {
        eprintln!("rank 1 giving up before it reports ready");
        std::process::exit(3);
    }
    echo_child_main();
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_never_reports() {
    BootInfo::from_env().unwrap();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(wait_for_stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_procs_start_report_and_answer() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let procs = timed(host.spawn_procs("echoes", 4, &child_command("child_echo")))
        .await
        .unwrap();

    let ranks: Vec<_> = procs.iter().map(|p| p.rank()).collect();
    assert_eq!(
        ranks,
        [0, 1, 2, 3],
        "HOST-1: one handle per rank, in rank order"
    );
    let ids: HashSet<_> = procs.iter().map(|p| p.proc_id().clone()).collect();
    let pids: HashSet<_> = procs.iter().map(|p| p.pid()).collect();
    assert_eq!(
        (ids.len(), pids.len()),
        (4, 4),
        "distinct procs and processes"
    );
    assert!(!ids.contains(host.proc().proc_id()));

    for proc in &procs {
        assert_eq!(proc.status(), ProcStatus::Running);
        let echo = echo_of(proc.proc_id());
        let payload = vec![proc.rank() as u8; 8];
        let reply = timed(
            host.client()
                .call(&echo.port::<EchoMsg>(), |r| EchoMsg(payload.clone(), r)),
        )
        .await
        .unwrap();
        assert_eq!(
            reply,
            payload,
            "BOOT-1: rank {} answers at once",
            proc.rank()
        );
    }

    timed(host.shutdown(Duration::from_secs(5))).await;
    for proc in &procs {
        assert!(proc.status().exit_status().unwrap().success(), "{proc:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_exiting_before_ready_fails_the_spawn_naming_its_rank() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let err = timed(host.spawn_procs("flaky", 3, &child_command("child_rank_1_exits_early")))
        .await
        .unwrap_err();
    let HostError::ExitedBeforeReady {
        rank,
        pid,
        exit_status,
        ref stderr_tail,
        ..
    } = err
    else {
        panic!("HOST-1: expected ExitedBeforeReady, got {err}");
    };
    assert_eq!(rank, 1, "{err}");
    assert_eq!(exit_status.and_then(|s| s.code()), Some(3), "{err}");
    assert!(stderr_tail.contains("rank 1 giving up"), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("proc flaky rank 1") && message.contains("exit status: 3"),
        "{message}"
    );
    assert!(!process_exists(pid), "the failed child is reaped");
    assert!(
        host.procs().is_empty(),
        "HOST-1: no handle from a failed spawn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_child_fails_the_spawn_after_the_ready_timeout() {
    let host = Host::serve(ChannelTransport::Unix)
        .await
        .unwrap()
        .with_ready_timeout(Duration::from_millis(500));
    let err = timed(host.spawn_procs("silent", 1, &child_command("child_never_reports")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HostError::ReadyTimeout { ranks, .. } if ranks == &[0]),
        "{err}"
    );
    assert!(err.to_string().contains("with_ready_timeout"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_fails_the_spawn_naming_it() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let cmd = hyperactor_mesh::BootstrapCommand::new("/nonexistent/hyperactor-worker");
    let err = timed(host.spawn_procs("missing", 2, &cmd))
        .await
        .unwrap_err();
    assert!(matches!(err, HostError::Spawn { rank: 0, .. }), "{err}");
    assert!(
        err.to_string().contains("/nonexistent/hyperactor-worker"),
        "{err}"
    );
}
