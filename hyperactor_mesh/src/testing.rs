//! Helpers for tests of this crate and of crates built on it.
//!
//! Compiled only for this crate's tests or with the `testing` feature. Integration tests
//! start their children by re-running their own test binary on one ignored test, the
//! child's entry point: [`child_command`] builds that command, and [`echo_child_main`]
//! is a ready-made entry point hosting a [`hyperactor::testing::Echo`].

#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hyperactor::testing::Echo;
use hyperactor::{ActorRef, ChannelTransport, ProcId};

use crate::bootstrap::{serve_until_stopped, BootInfo, BootstrapCommand};

/// The name of the [`Echo`] actor that [`echo_child_main`] spawns.
pub const ECHO_NAME: &str = "echo";

/// A command re-running the current test binary on the ignored test `entry` alone.
///
/// # Panics
///
/// If the current executable cannot be found.
pub fn child_command(entry: &str) -> BootstrapCommand {
    let exe = std::env::current_exe().expect("the test binary's path");
    BootstrapCommand::new(exe).with_args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
}

/// The entry point of a child hosting an [`Echo`] named [`ECHO_NAME`]: bootstraps
/// over Unix sockets, spawns the echo before reporting ready (BOOT-1), and serves
/// until its host stops it (BOOT-2).
///
/// # Panics
///
/// If the process was not started by a host, or bootstrapping fails.
pub fn echo_child_main() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let info = BootInfo::from_env().expect("started by a host");
        let proc = info.serve(ChannelTransport::Unix).await.expect("serve");
        let _echo = proc.spawn::<Echo>(ECHO_NAME, ()).expect("spawn echo");
        info.report_ready(&proc).expect("report ready");
        serve_until_stopped(&proc, Duration::from_secs(1)).await;
    });
}

/// A reference to the [`Echo`] of a proc started by [`echo_child_main`].
///
/// # Panics
///
/// Never for a valid proc id.
pub fn echo_of(proc_id: &ProcId) -> ActorRef<Echo> {
    ActorRef::attest(proc_id.actor_id(ECHO_NAME, 0).expect("a valid actor name"))
}

/// True while a process `pid` exists (a zombie counts), by `kill(pid, 0)`.
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The entry point of a child proc with a mesh agent made from `options` (its test's
/// actor types registered): bootstraps over Unix sockets, starts the agent, reports
/// ready (BOOT-1) and serves until its host stops it (BOOT-2).
///
/// # Panics
///
/// If the process was not started by a host, or bootstrapping fails.
pub fn agent_child_main(options: impl FnOnce() -> crate::agent::AgentOptions) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let info = BootInfo::from_env().expect("started by a host");
        let proc = info.serve(ChannelTransport::Unix).await.expect("serve");
        let _agent = crate::agent::ProcAgent::new(proc.clone(), options()).expect("an agent");
        info.report_ready(&proc).expect("report ready");
        serve_until_stopped(&proc, Duration::from_secs(2)).await;
    });
}

/// A host agent serving on a fresh Unix proc, and a client on it named `client` (the
/// owner of what the test spawns).
///
/// # Panics
///
/// If the proc cannot be served.
pub async fn host_agent() -> (crate::agent::ProcAgent, hyperactor::Client) {
    let host = crate::host::Host::serve(ChannelTransport::Unix)
        .await
        .expect("a host");
    let options = crate::agent::AgentOptions::default().host(host);
    let proc = options_proc(&options);
    let agent = crate::agent::ProcAgent::new(proc, options).expect("a host agent");
    let client = agent.proc().client("client").expect("a client");
    (agent, client)
}

fn options_proc(options: &crate::agent::AgentOptions) -> hyperactor::Proc {
    options
        .host_ref()
        .expect("options with a host")
        .proc()
        .clone()
}
