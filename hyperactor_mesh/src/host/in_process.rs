//! Procs inside the host's own process: the seam that lets one machine run many hosts'
//! worth of procs through the production host code (the scale harness,
//! `make bench-scale`, uses it; see `docs/benchmarks.md`).
//!
//! A [`Host`](super::Host) given a [`ProcLauncher`] ([`Host::with_launcher`](super::Host::with_launcher))
//! starts each proc of a spawn by asking the launcher instead of starting an OS
//! process. The launcher boots the proc as a child process would — it serves a proc
//! ([`BootInfo::serve`]), starts its agent and reports ready to the host
//! ([`BootInfo::report_ready`]) — but in this process, on a runtime of its choosing,
//! and hands back how to stop and kill it ([`InProcessControl`]) and a future of its
//! end. From then on the host treats the proc as it treats a child process (HOST-1 to
//! HOST-3, [`ProcHandle`](super::ProcHandle)): its graceful stop calls
//! [`InProcessControl::stop`] where a child's stdin would close, a kill calls
//! [`InProcessControl::kill`] where `SIGKILL` would be sent, and its end is published on
//! the host's event stream, so the host agent reports the proc's death to every agent
//! that watches it, through the same messages as for a child process.
//!
//! What differs from a child process: the proc shares this process (its pid, in
//! [`ProcExit`] and in the proc's ready report, is this process's; nothing may signal
//! it), and it has no output of its own (nothing is captured, forwarded or written to
//! log files).
//!
//! ```
//! use std::sync::Arc;
//! use hyperactor::ChannelTransport;
//! use hyperactor_mesh::bootstrap::{BootInfo, BootstrapCommand};
//! use hyperactor_mesh::host::in_process::{InProcessControl, LaunchedProc, ProcLauncher};
//! use hyperactor_mesh::host::{Host, ProcStatus};
//! use tokio::sync::watch;
//!
//! /// Boots each proc on this runtime; a stop or a kill ends it.
//! struct Launcher;
//! struct Control(watch::Sender<bool>);
//! impl InProcessControl for Control {
//!     fn stop(&self) { self.0.send_replace(true); }
//!     fn kill(&self) { self.0.send_replace(true); }
//! }
//! impl ProcLauncher for Launcher {
//!     fn launch(&self, info: &BootInfo, _: &BootstrapCommand) -> std::io::Result<LaunchedProc> {
//!         let (stop, mut stopped) = watch::channel(false);
//!         let info = info.clone();
//!         let exit = tokio::spawn(async move {
//!             let proc = info.serve(ChannelTransport::Unix).await.map_err(|e| e.to_string())?;
//!             info.report_ready(&proc).map_err(|e| e.to_string())?;
//!             let _ = stopped.wait_for(|s| *s).await;
//!             proc.stop(std::time::Duration::from_secs(1)).await;
//!             Ok::<(), String>(())
//!         });
//!         Ok(LaunchedProc {
//!             control: Arc::new(Control(stop)),
//!             exit: Box::pin(async move {
//!                 use std::os::unix::process::ExitStatusExt;
//!                 match exit.await {
//!                     Ok(Ok(())) => ProcStatus::Exited(std::process::ExitStatus::from_raw(0)),
//!                     Ok(Err(reason)) => ProcStatus::Lost { reason },
//!                     Err(e) => ProcStatus::Lost { reason: e.to_string() },
//!                 }
//!             }),
//!         })
//!     }
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let host = Host::serve(ChannelTransport::Unix).await?.with_launcher(Arc::new(Launcher));
//! let procs = host.spawn_procs("sim", 3, &BootstrapCommand::new("in-process")).await?;
//! assert_eq!(procs.len(), 3);
//! assert_eq!(procs[0].pid(), std::process::id());
//! host.shutdown(std::time::Duration::from_secs(5)).await;
//! assert!(procs.iter().all(|p| !p.status().is_running()));
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyperactor::sync::Mutex;
use hyperactor::ProcId;
use tokio::sync::{mpsc, watch};

use crate::bootstrap::{BootInfo, BootstrapCommand};
use crate::host::capture::HostEvent;
use crate::host::child::ChildProc;
use crate::host::status::{ProcExit, ProcStatus};

/// Starts the procs of a host inside its process (see the [module docs](self)).
pub trait ProcLauncher: Send + Sync + 'static {
    /// Starts the proc `info` describes, as a child process started with `command`
    /// would be: it must serve a proc and report it ready to `info.report`
    /// ([`BootInfo::report_ready`]) once its agent runs, without blocking the caller
    /// (the host awaits the report). The returned future must complete once the proc
    /// has ended, however it ends: by itself, after [`InProcessControl::stop`], or
    /// promptly after [`InProcessControl::kill`].
    ///
    /// # Errors
    ///
    /// Why the proc cannot be started; the host fails the spawn with it
    /// ([`crate::error::HostError::Spawn`]), naming the host, the procs and the rank.
    fn launch(&self, info: &BootInfo, command: &BootstrapCommand) -> io::Result<LaunchedProc>;
}

/// How a host stops or kills a proc it started in its own process.
pub trait InProcessControl: Send + Sync + 'static {
    /// Asks the proc to stop gracefully: what closing a child process's stdin does
    /// (BOOT-2). Called at most once. Must not block.
    fn stop(&self);

    /// Ends the proc at once, as `SIGKILL` ends a child process. May be called more
    /// than once. Must not block.
    fn kill(&self);
}

/// A proc a [`ProcLauncher`] started: how to control it, and its end.
pub struct LaunchedProc {
    /// Stops or kills the proc.
    pub control: Arc<dyn InProcessControl>,
    /// Completes with how the proc ended (never [`ProcStatus::Running`]).
    pub exit: Pin<Box<dyn Future<Output = ProcStatus> + Send>>,
}

impl std::fmt::Debug for LaunchedProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LaunchedProc")
    }
}

/// Where an in-process proc's end is reported (as for a child process).
enum Route {
    /// To the spawn still waiting for it to report ready: its rank.
    Spawning(mpsc::UnboundedSender<usize>),
    /// To the host's event stream.
    Host {
        proc_id: ProcId,
        events: mpsc::UnboundedSender<HostEvent>,
    },
}

struct State {
    /// Set once its end is published.
    published: bool,
    /// Whether the graceful stop was asked for.
    stop_asked: bool,
    route: Route,
    /// Why the host killed it as lost, if it did.
    lost: Option<String>,
}

/// The host's side of one in-process proc: what [`ChildProc`] is for a child process.
pub(crate) struct InProcessChild {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) pid: u32,
    state: Mutex<State>,
    status: watch::Sender<ProcStatus>,
    control: Arc<dyn InProcessControl>,
}

impl InProcessChild {
    fn status(&self) -> ProcStatus {
        self.status.borrow().clone()
    }

    fn kill(&self) -> bool {
        let state = self.state.lock();
        if state.published {
            return false;
        }
        self.control.kill();
        true
    }

    fn kill_lost(&self, reason: String) -> bool {
        let mut state = self.state.lock();
        if state.published {
            return false;
        }
        state.lost = Some(reason);
        self.control.kill();
        true
    }

    fn request_stop(&self) {
        let ask = {
            let mut state = self.state.lock();
            let ask = !state.published && !state.stop_asked;
            state.stop_asked = true;
            ask
        };
        if ask {
            self.control.stop();
        }
    }

    fn stop_requested(&self) -> bool {
        self.state.lock().stop_asked
    }

    fn exit_event(&self, proc_id: &ProcId) -> ProcExit {
        ProcExit {
            name: self.name.clone(),
            rank: self.rank,
            proc_id: proc_id.clone(),
            pid: self.pid,
            status: self.status(),
        }
    }

    fn promote(&self, proc_id: ProcId, events: mpsc::UnboundedSender<HostEvent>) {
        let mut state = self.state.lock();
        if state.published {
            let _ = events.send(HostEvent::Exit(self.exit_event(&proc_id)));
        }
        state.route = Route::Host { proc_id, events };
    }

    /// The proc ended with `status`: publish it (HOST-2).
    fn finish(&self, status: ProcStatus) {
        let mut state = self.state.lock();
        state.published = true;
        let status = match state.lost.take() {
            Some(reason) => ProcStatus::Lost { reason },
            None => status,
        };
        self.status.send_replace(status);
        match &state.route {
            Route::Spawning(tx) => {
                let _ = tx.send(self.rank);
            }
            Route::Host { proc_id, events } => {
                let _ = events.send(HostEvent::Exit(self.exit_event(proc_id)));
            }
        }
    }
}

/// Starts proc `info.rank` with `launcher`, reporting its end to `spawning` until it is
/// promoted.
///
/// # Errors
///
/// The launcher's, when it cannot start the proc.
pub(crate) fn start(
    launcher: &dyn ProcLauncher,
    command: &BootstrapCommand,
    info: &BootInfo,
    spawning: mpsc::UnboundedSender<usize>,
) -> io::Result<Arc<InProcessChild>> {
    let LaunchedProc { control, exit } = launcher.launch(info, command)?;
    let child = Arc::new(InProcessChild {
        name: info.name.clone(),
        rank: info.rank,
        pid: std::process::id(),
        state: Mutex::new(State {
            published: false,
            stop_asked: false,
            route: Route::Spawning(spawning),
            lost: None,
        }),
        status: watch::channel(ProcStatus::Running).0,
        control,
    });
    let reaper = Arc::clone(&child);
    tokio::spawn(async move {
        let status = exit.await;
        tracing::debug!(proc = %reaper.name, rank = reaper.rank, "in-process proc {status}");
        reaper.finish(status);
    });
    Ok(child)
}

/// One proc of a host, as the host sees it: a child process or an in-process proc.
#[derive(Clone)]
pub(crate) enum Child {
    /// A child process.
    Os(Arc<ChildProc>),
    /// A proc started by the host's [`ProcLauncher`].
    InProcess(Arc<InProcessChild>),
}

impl Child {
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Os(c) => &c.name,
            Self::InProcess(c) => &c.name,
        }
    }

    pub(crate) fn rank(&self) -> usize {
        match self {
            Self::Os(c) => c.rank,
            Self::InProcess(c) => c.rank,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        match self {
            Self::Os(c) => c.pid,
            Self::InProcess(c) => c.pid,
        }
    }

    pub(crate) fn status(&self) -> ProcStatus {
        match self {
            Self::Os(c) => c.status(),
            Self::InProcess(c) => c.status(),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<ProcStatus> {
        match self {
            Self::Os(c) => c.subscribe(),
            Self::InProcess(c) => c.status.subscribe(),
        }
    }

    /// `SIGKILL` for a child process, [`InProcessControl::kill`] for an in-process
    /// proc; false if it had ended.
    pub(crate) fn kill(&self) -> bool {
        match self {
            Self::Os(c) => c.kill(),
            Self::InProcess(c) => c.kill(),
        }
    }

    /// Kills it as lost (`reason`); false if it had ended.
    pub(crate) fn kill_lost(&self, reason: String) -> bool {
        match self {
            Self::Os(c) => c.kill_lost(reason),
            Self::InProcess(c) => c.kill_lost(reason),
        }
    }

    /// The graceful stop request: a child's stdin closes, an in-process proc is asked
    /// to stop.
    pub(crate) fn close_stdin(&self) {
        match self {
            Self::Os(c) => c.close_stdin(),
            Self::InProcess(c) => c.request_stop(),
        }
    }

    /// Whether the graceful stop request was made.
    pub(crate) fn stop_requested(&self) -> bool {
        match self {
            Self::Os(c) => c.stop_requested(),
            Self::InProcess(c) => c.stop_requested(),
        }
    }

    /// The last lines of its stderr (none for an in-process proc).
    pub(crate) fn stderr_tail(&self) -> String {
        match self {
            Self::Os(c) => c.stderr_tail(),
            Self::InProcess(_) => "(none: the proc runs inside its host's process)".to_string(),
        }
    }

    /// The stderr tail once stderr closed (bounded by `limit`).
    pub(crate) async fn stderr_tail_at_close(&self, limit: Duration) -> String {
        match self {
            Self::Os(c) => c.stderr_tail_at_close(limit).await,
            Self::InProcess(_) => self.stderr_tail(),
        }
    }

    /// Reports its end to the host's stream from now on (at once if it has ended).
    pub(crate) fn promote(&self, proc_id: ProcId, events: mpsc::UnboundedSender<HostEvent>) {
        match self {
            Self::Os(c) => c.promote(proc_id, events),
            Self::InProcess(c) => c.promote(proc_id, events),
        }
    }
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Os(c) => c.fmt(f),
            Self::InProcess(c) => f
                .debug_struct("InProcessChild")
                .field("name", &c.name)
                .field("rank", &c.rank)
                .field("status", &c.status())
                .finish(),
        }
    }
}

/// The scale harness's smoke test (`make bench-scale` runs the full one): simulated
/// hosts whose procs run in this process, through the production spawn, cast, reply
/// reduction, supervision and stop. No time is checked.
#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::os::unix::process::ExitStatusExt;

    use hyperactor::{Actor, BoxError, ChannelTransport, Context, Handler, ProcId};
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::agent::{AgentOptions, ProcAgent};
    use crate::host::Host;
    use crate::host_mesh::HostMesh;
    use crate::shape::Extent;
    use crate::supervision::{FailureCause, MeshFailure};
    use crate::{ActorMesh, Request};

    const HOSTS: usize = 16;
    const PER_HOST: usize = 4;

    #[derive(Debug)]
    struct Answer;

    #[derive(Debug, Serialize, Deserialize)]
    struct Ask(u64);

    impl Request for Ask {
        type Reply = u64;
    }

    impl Actor for Answer {
        type Params = ();
        async fn new((): ()) -> Result<Self, BoxError> {
            Ok(Answer)
        }
        fn bind(binder: &mut hyperactor::Binder<Self>) {
            binder.handle::<Ask>();
        }
    }

    impl Handler<Ask> for Answer {
        async fn handle(&mut self, cx: &Context<Self>, Ask(value): Ask) -> Result<(), BoxError> {
            crate::reply(cx, &value)?;
            Ok(())
        }
    }

    /// Stop and kill, as the harness's launcher has them.
    struct Control(watch::Sender<u8>);

    impl InProcessControl for Control {
        fn stop(&self) {
            self.0
                .send_if_modified(|s| std::mem::replace(s, (*s).max(1)) == 0);
        }
        fn kill(&self) {
            self.0.send_replace(2);
        }
    }

    type Procs = Arc<Mutex<HashMap<usize, Arc<Control>>>>;

    /// Boots each proc of one simulated host on this runtime, as a child would.
    struct Launcher {
        host: ProcId,
        index: usize,
        procs: Procs,
        /// How long a stopped proc lingers, its links closed, before it ends (a child
        /// process that is slow to be reaped).
        linger: Duration,
    }

    impl ProcLauncher for Launcher {
        fn launch(&self, info: &BootInfo, _: &BootstrapCommand) -> io::Result<LaunchedProc> {
            let (signal, mut signals) = watch::channel(0u8);
            let control = Arc::new(Control(signal));
            let rank = self.index * PER_HOST + info.rank;
            self.procs.lock().insert(rank, Arc::clone(&control));
            let (info, host, linger) = (info.clone(), self.host.clone(), self.linger);
            let run = tokio::spawn(async move {
                let proc = info
                    .serve(ChannelTransport::Unix)
                    .await
                    .map_err(|e| e.to_string())?;
                let options = AgentOptions::default()
                    .register::<Answer>()
                    .spawned_by(host);
                let agent = ProcAgent::new(proc.clone(), options).map_err(|e| e.to_string())?;
                info.report_ready(&proc).map_err(|e| e.to_string())?;
                let signal = signals.wait_for(|s| *s != 0).await.map_or(2, |s| *s);
                let grace = if signal == 1 {
                    Duration::from_secs(1)
                } else {
                    Duration::ZERO
                };
                proc.stop(grace).await;
                drop(agent);
                drop(proc);
                if signal == 1 {
                    tokio::time::sleep(linger).await;
                }
                Ok::<i32, String>(if signal == 1 { 0 } else { libc::SIGKILL })
            });
            Ok(LaunchedProc {
                control,
                exit: Box::pin(async move {
                    match run.await {
                        Ok(Ok(raw)) => ProcStatus::Exited(std::process::ExitStatus::from_raw(raw)),
                        Ok(Err(reason)) => ProcStatus::Lost { reason },
                        Err(e) => ProcStatus::Lost {
                            reason: e.to_string(),
                        },
                    }
                }),
            })
        }
    }

    /// Simulated hosts of [`PER_HOST`] procs each, a client, and the proc mesh spawned
    /// on them.
    struct Sim {
        procs: Procs,
        host_agents: Vec<ProcAgent>,
        _agent: ProcAgent,
        client: hyperactor::Client,
        mesh: crate::ProcMesh,
    }

    /// `hosts` simulated hosts whose stopped procs linger for `linger` (see
    /// [`Launcher`]), with the proc mesh `{hosts, procs: PER_HOST}` spawned on them.
    async fn sim(hosts: usize, linger: Duration) -> Sim {
        let procs: Procs = Arc::default();
        let mut ids = Vec::new();
        let mut host_agents = Vec::new();
        for index in 0..hosts {
            let host = Host::serve(ChannelTransport::Unix).await.unwrap();
            let launcher = Launcher {
                host: host.proc().proc_id().clone(),
                index,
                procs: Arc::clone(&procs),
                linger,
            };
            ids.push(host.proc().proc_id().clone());
            let host = host.with_launcher(Arc::new(launcher)).with_log_dir(None);
            let proc = host.proc().clone();
            host_agents.push(ProcAgent::new(proc, AgentOptions::default().host(host)).unwrap());
        }
        let agent = ProcAgent::serve(ChannelTransport::Unix, "client", AgentOptions::default())
            .await
            .unwrap();
        agent.set_fanout(4);
        let client = agent.proc().client("client").unwrap();
        let hosts = HostMesh::new(ids, Extent::new(["hosts"], [hosts]).unwrap()).unwrap();
        let per_host = Extent::new(["procs"], [PER_HOST]).unwrap();
        let command = BootstrapCommand::new("in-process");
        let mesh = hosts
            .spawn_procs(&client, "sim", &per_host, &command)
            .await
            .unwrap();
        Sim {
            procs,
            host_agents,
            _agent: agent,
            client,
            mesh,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn simulated_hosts_answer_every_call_and_report_every_killed_proc_once() {
        let Sim {
            procs,
            host_agents,
            _agent,
            client,
            mesh,
        } = sim(HOSTS, Duration::ZERO).await;
        assert_eq!(mesh.len(), HOSTS * PER_HOST);
        assert!(mesh.procs().iter().all(|p| p.pid == std::process::id()));
        let actors: ActorMesh<Answer> = mesh.spawn(&client, "answer", &()).unwrap();
        for round in 0..3 {
            let values = actors.call(&client, &Ask(round)).await.unwrap();
            assert_eq!(values.len(), HOSTS * PER_HOST);
            assert!((0..values.len()).all(|i| values.get(i) == Some(&round)));
        }

        // Every fourth proc dies at once, as if SIGKILLed: its host reports each death.
        let killed: Vec<usize> = (0..HOSTS * PER_HOST).step_by(4).collect();
        for rank in &killed {
            procs.lock()[rank].kill();
        }
        let mut seen: HashMap<usize, usize> = HashMap::new();
        let mut settle = None;
        loop {
            let limit = settle.unwrap_or(Duration::from_secs(30));
            let Ok(Some(event)) =
                tokio::time::timeout(limit, client.next_supervision_event()).await
            else {
                break;
            };
            let failure = MeshFailure::from_event(&event).unwrap();
            assert_eq!(
                failure.cause,
                FailureCause::ProcSignaled {
                    signal: libc::SIGKILL
                }
            );
            *seen.entry(failure.rank).or_default() += 1;
            if killed.iter().all(|r| seen.contains_key(r)) {
                // Any duplicate would come soon after.
                settle = Some(Duration::from_millis(300));
            }
        }
        let mut ranks: Vec<usize> = seen.keys().copied().collect();
        ranks.sort_unstable();
        assert_eq!(ranks, killed, "every killed proc, and no other, failed");
        assert!(
            seen.values().all(|&n| n == 1),
            "each reported once: {seen:?}"
        );

        // The others still answer; then the mesh stops, every proc reaped.
        let alive = actors.select_range("procs", 1, PER_HOST, 1).unwrap();
        let values = alive.call(&client, &Ask(7)).await.unwrap();
        assert_eq!(values.len(), HOSTS * (PER_HOST - 1));
        mesh.stop(&client, "test done").await.unwrap();
        for agent in &host_agents {
            let host = agent.host().unwrap();
            assert!(host.procs().iter().all(|p| !p.status().is_running()));
        }
    }

    /// A proc asked to stop that closes its links and is then slow to end (as when
    /// hundreds of procs stop at once on a busy host) is stopped, not killed as lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopping_proc_slow_to_end_is_not_killed_as_lost() {
        let Sim {
            host_agents,
            _agent,
            client,
            mesh,
            ..
        } = sim(1, crate::host::LOST_GRACE * 4).await;
        let actors: ActorMesh<Answer> = mesh.spawn(&client, "answer", &()).unwrap();
        let values = actors.call(&client, &Ask(3)).await.unwrap();
        assert_eq!(values.len(), PER_HOST);
        mesh.stop(&client, "test done").await.unwrap();
        let host = host_agents[0].host().unwrap();
        let statuses: Vec<ProcStatus> = host.procs().iter().map(|p| p.status()).collect();
        assert!(
            statuses
                .iter()
                .all(|s| matches!(s, ProcStatus::Exited(e) if e.code() == Some(0))),
            "every proc stopped by its stop request: {statuses:?}"
        );
    }
}
