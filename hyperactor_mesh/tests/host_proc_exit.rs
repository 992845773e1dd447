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
    if let hyperactor::ChannelAddr::Unix(path) = exit.proc_id.addr() {
        assert!(
            !path.exists(),
            "the killed proc's socket file {} is left behind",
            path.display()
        );
    }
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

/// The variable through which `a_killed_host_takes_its_procs_along` tells its child
/// host where to report its proc's pid.
#[cfg(target_os = "linux")]
const PID_REPORT_ENV: &str = "HYPERACTOR_MESH_TEST_PID_REPORT";

/// A proc that ignores its stdin (BOOT-2) and serves for ever: only the parent-death
/// signal can end it when its host dies.
#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_echo_ignoring_stdin() {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let info = hyperactor_mesh::BootInfo::from_env().unwrap();
        let proc = info.serve(ChannelTransport::Unix).await.unwrap();
        info.report_ready(&proc).unwrap();
        std::future::pending::<()>().await;
    });
}

/// A host process: spawns one `child_echo_ignoring_stdin` proc, reports its pid, and
/// serves until killed.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_host_of_one_proc() {
    use hyperactor::{PortId, PortRef};
    let report: PortId = std::env::var(PID_REPORT_ENV).unwrap().parse().unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let host = Host::serve(ChannelTransport::Unix).await.unwrap();
        let cmd = child_command("child_echo_ignoring_stdin");
        let procs = timed(host.spawn_procs("orphan", 1, &cmd)).await.unwrap();
        PortRef::<u32>::attest(report)
            .send(host.client(), procs[0].pid())
            .unwrap();
        std::future::pending::<()>().await;
    });
}

/// Resolves when process `pid` (not necessarily a child) has exited, through a pidfd.
#[cfg(target_os = "linux")]
fn process_exit(pid: u32) -> impl std::future::Future<Output = ()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        fd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the `AsyncFd` owns the descriptor, which is neither replaced nor closed
    // while registered.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .unwrap();
    async move {
        // A pidfd becomes readable when its process exits.
        let _ready = fd.readable().await.unwrap();
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_host_takes_its_procs_along() {
    let proc = hyperactor::Proc::serve(ChannelTransport::Unix, "test")
        .await
        .unwrap();
    let client = proc.client("test").unwrap();
    let (report, mut pids) = client.open_port::<u32>();
    let mut host = tokio::process::Command::new(std::env::current_exe().unwrap())
        .envs(hyperactor::channel::auth::child_env())
        .args([
            "--ignored",
            "--exact",
            "child_host_of_one_proc",
            "--nocapture",
        ])
        .args(["--quiet"])
        .env(PID_REPORT_ENV, report.port_id().to_string())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = timed(pids.recv()).await.unwrap();
    assert!(process_exists(pid));
    let exited = process_exit(pid);

    host.start_kill().unwrap();
    timed(host.wait()).await.unwrap();
    // The proc ignores its stdin, so only its parent-death signal can end it.
    timed(exited).await;
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_deaf() {
    // Boots like an echo child, then shuts down every socket it has (its host's link
    // included) while its process keeps running: a proc that lost its connection.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (proc, _info) = hyperactor_mesh::bootstrap_proc(ChannelTransport::Unix)
            .await
            .unwrap();
        // Wait for the host's link to be accepted, so there is a connection to lose.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let target = std::fs::read_link(entry.path()).unwrap_or_default();
            if target.to_string_lossy().starts_with("socket:") {
                if let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() {
                    if has_named_end(fd) {
                        // SAFETY: shutting a socket down does not close or free the fd.
                        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    }
                }
            }
        }
        hyperactor_mesh::bootstrap::serve_until_stopped(&proc, Duration::from_secs(1)).await;
    });
}

/// Whether socket `fd` has an address at either end: the proc's listener and its
/// connections do; the runtime's own unnamed socket pairs (its signal pipe) do not.
fn has_named_end(fd: i32) -> bool {
    let family = std::mem::size_of::<libc::sa_family_t>() as libc::socklen_t;
    [libc::getsockname, libc::getpeername].iter().any(|get| {
        // SAFETY: an all-zero sockaddr_storage is a valid value.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `addr` is large enough for any address and `len` says how large.
        let ok = unsafe { get(fd, (&raw mut addr).cast(), &mut len) } == 0;
        ok && len > family
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_proc_that_loses_its_connection_is_killed_and_reported_lost() {
    let host = Host::serve(ChannelTransport::Unix).await.unwrap();
    let procs = timed(host.spawn_procs("deaf", 1, &child_command("child_deaf")))
        .await
        .unwrap();
    let start = std::time::Instant::now();
    let exit = timed(host.next_exit()).await;
    assert_eq!(&exit.proc_id, procs[0].proc_id());
    let text = exit.status.to_string();
    assert!(text.contains("lost its connection"), "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "noticed within the grace period, not by polling: {:?}",
        start.elapsed()
    );
    assert!(!process_exists(procs[0].pid()));
    timed(host.shutdown(Duration::from_secs(5))).await;
}
