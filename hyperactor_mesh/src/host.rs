//! The host agent: spawns procs as OS processes, reaps them, reports their exit.
//!
//! A [`Host`] runs inside some process — for `this_host()`, the client process itself —
//! and owns the procs it spawns. [`Host::spawn_procs`] starts `count` copies of a
//! [`BootstrapCommand`], one per rank, and returns a [`ProcHandle`] for each once every
//! child has reported ready (see [`crate::bootstrap`]).
//!
//! How children are kept from outliving the host (no orphans):
//!
//! - each child gets its **own process group**, so one signal reaches the child and
//!   anything it started; [`ProcHandle::kill`], [`Host::shutdown`] and dropping the
//!   [`Host`] kill whole groups;
//! - on Linux each child has a **parent-death signal** (`PR_SET_PDEATHSIG` = `SIGKILL`),
//!   set between fork and exec and tied to a thread that lives as long as the host
//!   process, so a host killed with `SIGKILL` still takes its children along;
//! - each child's **stdin** is a pipe from the host; it closes when the host stops the
//!   proc or dies, and [`crate::bootstrap::serve_until_stopped`] exits on that (BOOT-2) —
//!   the portable fallback where no parent-death signal exists.
//!
//! Each child's **stdout and stderr** are pipes the host reads to their end: every byte
//! goes to the child's log file, and every line either onto the host's event stream
//! ([`Host::next_event`], for a spawn that forwards its output to its owner) or,
//! prefixed `[name rank] `, to the host's own stdout or stderr (see [`crate::output`]).
//!
//! Invariants:
//!
//! - HOST-1 (all or nothing): `spawn_procs` returns handles for every rank, or an error
//!   and no running process — children already started are killed.
//! - HOST-2 (prompt exit): see [`proc_handle`].
//! - HOST-3 (no orphans): after [`Host::shutdown`] returns, every proc of the host has
//!   been reaped; dropping the host kills every proc's process group.
//!
//! ```no_run
//! use hyperactor::ChannelTransport;
//! use hyperactor_mesh::bootstrap::BootstrapCommand;
//! use hyperactor_mesh::host::Host;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let host = Host::serve(ChannelTransport::Unix).await?;
//! let cmd = BootstrapCommand::new("/path/to/worker").with_env("RUST_LOG", "info");
//! let procs = host.spawn_procs("workers", 4, &cmd).await?;
//! for proc in &procs {
//!     println!("rank {} is {} (pid {})", proc.rank(), proc.proc_id(), proc.pid());
//! }
//! host.shutdown(std::time::Duration::from_secs(5)).await;
//! # Ok(())
//! # }
//! ```

mod capture;
mod child;
pub mod in_process;
pub mod proc_handle;
mod status;
mod template;

use hyperactor::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use hyperactor::error::RecvError;
use hyperactor::id::validate_name;
use hyperactor::{ChannelTransport, Client, Proc, ProcId, SendContext};
use tokio::sync::mpsc;

use crate::bootstrap::{BootInfo, BootstrapCommand, ProcCommands, ProcReady};
use crate::error::HostError;
use crate::output::OutputOptions;
pub use capture::{HostEvent, ProcOutput};
use child::OutputSetup;
use in_process::{Child, ProcLauncher};
pub use proc_handle::ProcHandle;
pub use status::{ProcExit, ProcStatus};
pub use template::FORK_SERVER_FD_ENV;
use template::{Template, TemplateKey};

/// How long [`Host::spawn_procs`] waits for every child to report ready, unless set with
/// [`Host::with_ready_timeout`].
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed spawn waits for the failed child's stderr to close, to quote it.
const STDERR_CLOSE_LIMIT: Duration = Duration::from_secs(1);

/// How long a proc whose link failed may take to be reaped before the host counts it
/// as lost (see `Host::watch_link`).
pub const LOST_GRACE: Duration = Duration::from_millis(200);

/// How long the host waits, after it reaped a proc, for its output pipes to be read to
/// their end before it publishes the exit (LOG-2) *while nothing arrives on them*: they
/// close at once unless a descendant that left the proc's process group holds them.
/// While output still arrives (a proc that wrote a lot just before it exited, read by a
/// host that load slows down) the host keeps reading, up to [`PIPE_DRAIN_MAX`].
pub const PIPE_DRAIN_LIMIT: Duration = Duration::from_millis(500);

/// The longest the host waits for a reaped proc's pipes, however much still arrives on
/// them (a descendant that holds them and keeps writing).
pub const PIPE_DRAIN_MAX: Duration = Duration::from_secs(30);

/// The host agent: see the [module docs](self).
pub struct Host {
    proc: Proc,
    client: Client,
    ready_timeout: Duration,
    procs: Mutex<Vec<ProcHandle>>,
    events_tx: mpsc::UnboundedSender<HostEvent>,
    events_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<HostEvent>>,
    /// Where the procs' log files go (`None`: nowhere).
    log_dir: Option<std::path::PathBuf>,
    shut_down: AtomicBool,
    /// The fork servers running, by the commands they serve. The procs a template
    /// forked (and a spawn using it) hold it; it exits when the last of them is gone.
    templates: tokio::sync::Mutex<HashMap<TemplateKey, Weak<Template>>>,
    /// Starts the procs in this process instead of as OS processes, if set
    /// ([`Host::with_launcher`]).
    launcher: Option<Arc<dyn ProcLauncher>>,
}

impl Host {
    /// A host with a proc of its own, served on `transport` (Unix or TCP: children must
    /// reach it).
    ///
    /// # Errors
    ///
    /// [`HostError::Serve`] if the proc cannot be served; as [`Host::new`] otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing stays served.
    pub async fn serve(transport: ChannelTransport) -> Result<Self, HostError> {
        Self::new(Proc::serve(transport, "host").await?)
    }

    /// A host whose proc listens where `bind` says (an address, or an inherited
    /// listening TCP socket) and is reached at `advertise` (or the address
    /// [`hyperactor::channel::advertised`] derives: never a loopback address for a TCP
    /// proc bound to every interface).
    ///
    /// # Errors
    ///
    /// As [`Host::serve`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing stays served.
    pub async fn serve_at(
        bind: &hyperactor::channel::Listen,
        advertise: Option<&hyperactor::ChannelAddr>,
    ) -> Result<Self, HostError> {
        use hyperactor::channel::Listen;
        let proc = match bind {
            // A fresh Unix address keeps the unique uid of `serve`.
            Listen::Addr(addr @ hyperactor::ChannelAddr::Unix(_)) if advertise.is_none() => {
                Proc::serve_at(addr, "host").await?
            }
            _ => {
                let uid = format!("host-{}", std::process::id());
                Proc::serve_as(bind, advertise, &uid).await?
            }
        };
        Self::new(proc)
    }

    /// A host that receives its children's reports on `proc`.
    ///
    /// # Errors
    ///
    /// [`HostError::LocalTransport`] if `proc` is served on the in-process transport;
    /// [`HostError::Client`] if `proc` is stopped.
    pub fn new(proc: Proc) -> Result<Self, HostError> {
        if proc.proc_id().addr().transport() == ChannelTransport::Local {
            return Err(HostError::LocalTransport {
                host: proc.proc_id().clone(),
            });
        }
        let client = proc.client("host").map_err(|source| HostError::Client {
            host: proc.proc_id().clone(),
            source,
        })?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Ok(Self {
            proc,
            client,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            procs: Mutex::new(Vec::new()),
            events_tx,
            events_rx: tokio::sync::Mutex::new(events_rx),
            log_dir: Some(crate::output::files::default_dir()),
            shut_down: AtomicBool::new(false),
            templates: tokio::sync::Mutex::new(HashMap::new()),
            launcher: None,
        })
    }

    /// The same host, waiting at most `timeout` for children to report ready.
    #[must_use]
    pub fn with_ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The same host, writing its procs' log files to `dir` (`None`: no log files)
    /// instead of [`crate::output::files::default_dir`].
    #[must_use]
    pub fn with_log_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.log_dir = dir;
        self
    }

    /// The same host, starting its procs in this process with `launcher` instead of as
    /// OS processes (see [`in_process`]): a seam for simulating many hosts on one
    /// machine through the production host code. The procs' commands go to the
    /// launcher; nothing is forked or executed.
    #[must_use]
    pub fn with_launcher(mut self, launcher: Arc<dyn ProcLauncher>) -> Self {
        self.launcher = Some(launcher);
        self
    }

    /// Where the procs' log files go, if anywhere.
    pub fn log_dir(&self) -> Option<&std::path::Path> {
        self.log_dir.as_deref()
    }

    /// The host's proc.
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// The host's client, on its proc: use it to talk to the spawned procs' actors.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Every proc this host spawned, running or not.
    pub fn procs(&self) -> Vec<ProcHandle> {
        self.procs.lock().clone()
    }

    /// Starts `count` procs named `name`, ranks `0..count`, each running `cmd`, and
    /// waits until all of them reported ready (HOST-1). The processes are started
    /// without waiting for one another, then boot concurrently. Their output is printed
    /// by the host and kept in log files ([`OutputOptions::default`]).
    ///
    /// # Errors
    ///
    /// As [`Host::spawn_procs_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: cancelling kills the children started so far.
    pub async fn spawn_procs(
        &self,
        name: &str,
        count: usize,
        cmd: &BootstrapCommand,
    ) -> Result<Vec<ProcHandle>, HostError> {
        self.spawn_procs_with(name, count, cmd, OutputOptions::default())
            .await
    }

    /// Like [`Host::spawn_procs`], with the procs' output handled as `output` says: with
    /// [`OutputOptions::forward_to`] set, their lines come on the host's event stream
    /// ([`Host::next_event`]) instead of being printed.
    ///
    /// # Errors
    ///
    /// - [`HostError::ShutDown`] after [`Host::shutdown`];
    /// - [`HostError::InvalidName`] if `name` cannot be part of a proc id;
    /// - [`HostError::Spawn`] if a process cannot be started;
    /// - [`HostError::ExitedBeforeReady`] if a child exits before every rank is ready,
    ///   naming its rank and status and quoting its stderr;
    /// - [`HostError::ReadyTimeout`] if some ranks are not ready within the ready
    ///   timeout ([`DEFAULT_READY_TIMEOUT`] unless set);
    /// - [`HostError::ReportPortClosed`] if the host's client stopped.
    ///
    /// On error, every child of the call is killed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: cancelling kills the children started so far.
    pub async fn spawn_procs_with(
        &self,
        name: &str,
        count: usize,
        cmd: &BootstrapCommand,
        output: OutputOptions,
    ) -> Result<Vec<ProcHandle>, HostError> {
        self.spawn_commands(name, count, &ProcCommands::Same(cmd.clone()), output)
            .await
    }

    /// Like [`Host::spawn_procs_with`], each rank running its command of `commands`.
    ///
    /// # Errors
    ///
    /// As [`Host::spawn_procs_with`], and [`HostError::CommandCount`] if a per-rank list
    /// does not have `count` commands.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: cancelling kills the children started so far.
    pub async fn spawn_commands(
        &self,
        name: &str,
        count: usize,
        commands: &ProcCommands,
        output: OutputOptions,
    ) -> Result<Vec<ProcHandle>, HostError> {
        let host = self.proc.proc_id();
        if let Some(given) = commands.ranks().filter(|&n| n != count) {
            return Err(HostError::CommandCount {
                host: host.clone(),
                name: name.to_string(),
                count,
                commands: given,
            });
        }
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(HostError::ShutDown {
                host: host.clone(),
                name: name.to_string(),
            });
        }
        validate_name(name).map_err(|source| HostError::InvalidName {
            host: host.clone(),
            name: name.to_string(),
            source,
        })?;
        let (report, mut reports) = self.client.open_port::<ProcReady>();
        let (exited_tx, mut exited_rx) = mpsc::unbounded_channel();
        let output = OutputSetup {
            options: Arc::new(output),
            events: self.events_tx.clone(),
            log_dir: self.log_dir.clone(),
        };
        let batch = self
            .start_children(name, count, commands, &report, &exited_tx, &output)
            .await?;

        let mut ready: Vec<Option<ProcId>> = vec![None; count];
        let mut pending = count;
        let deadline = tokio::time::sleep(self.ready_timeout);
        tokio::pin!(deadline);
        while pending > 0 {
            tokio::select! {
                report = reports.recv() => match report {
                    Ok(report) => {
                        if accept(&batch, &mut ready, report, name) {
                            pending -= 1;
                        }
                    }
                    Err(RecvError::Closed { .. }) => {
                        return Err(HostError::ReportPortClosed {
                            host: host.clone(),
                            name: name.to_string(),
                        });
                    }
                    Err(e) => tracing::warn!(host = %host, "ignoring a corrupt ready report: {e}"),
                },
                Some(rank) = exited_rx.recv() => {
                    return Err(self.exited_before_ready(&batch.0[rank]).await);
                }
                () = &mut deadline => {
                    return Err(HostError::ReadyTimeout {
                        host: host.clone(),
                        name: name.to_string(),
                        ranks: (0..count).filter(|&r| ready[r].is_none()).collect(),
                        timeout: self.ready_timeout,
                    });
                }
            }
        }

        let handles: Vec<ProcHandle> = batch
            .disarm()
            .into_iter()
            .zip(ready.into_iter().flatten())
            .map(|(child, proc_id)| {
                child.promote(proc_id.clone(), self.events_tx.clone());
                self.watch_link(&proc_id, &child);
                ProcHandle::new(proc_id, child)
            })
            .collect();
        self.procs.lock().extend(handles.iter().cloned());
        Ok(handles)
    }

    /// Starts the children of a spawn, ranks `0..count`, each running its command of
    /// `commands`: forked from the command's fork server while that works, else with
    /// `exec`.
    async fn start_children(
        &self,
        name: &str,
        count: usize,
        commands: &ProcCommands,
        report: &hyperactor::PortRef<ProcReady>,
        exited_tx: &mpsc::UnboundedSender<usize>,
        output: &OutputSetup,
    ) -> Result<Batch, HostError> {
        let host = self.proc.proc_id();
        let mut batch = Batch(Vec::with_capacity(count));
        // Each rank's command and boot info, for a child process or an in-process proc.
        let rank_boot = |rank: usize| -> Result<(&BootstrapCommand, BootInfo), HostError> {
            let cmd = commands
                .for_rank(rank)
                .ok_or_else(|| HostError::CommandCount {
                    host: host.clone(),
                    name: name.to_string(),
                    count,
                    commands: commands.ranks().unwrap_or(0),
                })?;
            let info = BootInfo {
                name: name.to_string(),
                rank,
                count,
                report: report.port_id().clone(),
            };
            Ok((cmd, info))
        };
        if let Some(launcher) = &self.launcher {
            for rank in 0..count {
                let (cmd, info) = rank_boot(rank)?;
                let child = in_process::start(&**launcher, cmd, &info, exited_tx.clone()).map_err(
                    |source| HostError::Spawn {
                        host: host.clone(),
                        name: name.to_string(),
                        rank,
                        program: cmd.program.clone(),
                        source,
                    },
                )?;
                batch.0.push(Child::InProcess(child));
            }
            return Ok(batch);
        }
        // One fork server for a shared command; per-rank commands look theirs up (a
        // cached one is found at once).
        let shared = match commands {
            ProcCommands::Same(cmd) => self.template(cmd).await,
            ProcCommands::PerRank(_) => None,
        };
        let mut forking = true;
        for rank in 0..count {
            let (cmd, info) = rank_boot(rank)?;
            let template = match commands {
                _ if !forking => None,
                ProcCommands::Same(_) => shared.clone(),
                ProcCommands::PerRank(_) => self.template(cmd).await,
            };
            if let Some(forker) = &template {
                match child::start_forked(forker, cmd, &info, exited_tx.clone(), output).await {
                    Ok(child) => {
                        batch.0.push(Child::Os(child));
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(
                            host = %host,
                            "the fork server of {} cannot start proc {name} rank {rank} \
                             ({e}); starting the remaining procs with exec",
                            cmd.program.display()
                        );
                        forking = false;
                    }
                }
            }
            let child = child::start(cmd, &info, exited_tx.clone(), output)
                .await
                .map_err(|source| HostError::Spawn {
                    host: host.clone(),
                    name: name.to_string(),
                    rank,
                    program: cmd.program.clone(),
                    source,
                })?;
            batch.0.push(Child::Os(child));
        }
        Ok(batch)
    }

    /// The running fork server for `cmd`, started if needed; `None` if `cmd` has none
    /// or it cannot be started (then procs start with `exec`).
    async fn template(&self, cmd: &BootstrapCommand) -> Option<Arc<Template>> {
        let key = TemplateKey::of(cmd)?;
        let mut templates = self.templates.lock().await;
        templates.retain(|_, t| t.strong_count() > 0);
        if let Some(template) = templates.get(&key).and_then(Weak::upgrade) {
            if template.is_alive() {
                return Some(template);
            }
        }
        match Template::start(cmd).await {
            Ok(template) => {
                let template = Arc::new(template);
                templates.insert(key, Arc::downgrade(&template));
                Some(template)
            }
            Err(e) => {
                tracing::warn!(
                    host = %self.proc.proc_id(),
                    "cannot start the fork server {}: {e}; starting procs with exec",
                    cmd.program.display()
                );
                None
            }
        }
    }

    /// Kills `child` if the host's link to it fails while it still runs: a proc the
    /// host cannot reach is lost (its exit then reports why). A child that is exiting
    /// closes its sockets just before it is reaped, so a failed link counts only if the
    /// child is still running [`LOST_GRACE`] later, and not at all once it was asked to
    /// stop: then the stop's own timeout kills it if it does not exit (many procs
    /// stopping at once on a busy host take longer than the grace to be reaped).
    fn watch_link(&self, proc_id: &ProcId, child: &Child) {
        let proc = self.proc.clone();
        let proc_id = proc_id.clone();
        let child = child.clone();
        tokio::spawn(async move {
            let error = proc.link_failed(&proc_id).await;
            let mut status = child.subscribe();
            let exited = status.wait_for(|s| !s.is_running());
            if tokio::time::timeout(LOST_GRACE, exited).await.is_ok() || child.stop_requested() {
                return;
            }
            let reason = format!("the host lost its connection to it ({error}), and killed it");
            if child.kill_lost(reason) {
                tracing::warn!(proc = %proc_id, "lost the connection to a running proc: {error}");
            }
        });
    }

    async fn exited_before_ready(&self, child: &Child) -> HostError {
        let status = child.status();
        HostError::ExitedBeforeReady {
            host: self.proc.proc_id().clone(),
            name: child.name().to_string(),
            rank: child.rank(),
            pid: child.pid(),
            status: status.to_string(),
            exit_status: status.exit_status(),
            stderr_tail: child.stderr_tail_at_close(STDERR_CLOSE_LIMIT).await,
        }
    }

    /// The next event of this host: output of a proc whose spawn forwards it, or the
    /// exit of a proc (HOST-2), in the order they happened; a proc's exit comes after
    /// its last lines (LOG-2). Waits for ever if nothing happens.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is taken from the stream only when this returns.
    pub async fn next_event(&self) -> HostEvent {
        let mut rx = self.events_rx.lock().await;
        match rx.recv().await {
            Some(event) => event,
            // The host holds a sender, so the stream never ends.
            None => std::future::pending().await,
        }
    }

    /// The next event if one is there already (and no other caller is taking events).
    pub fn try_next_event(&self) -> Option<HostEvent> {
        self.events_rx.try_lock().ok()?.try_recv().ok()
    }

    /// The next exit of a proc of this host, in the order the host reaped them (HOST-2).
    /// Forwarded output met on the way is printed on the host's stdout and stderr.
    /// Waits for ever if no proc exits.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an exit is taken from the stream only when this returns.
    pub async fn next_exit(&self) -> ProcExit {
        loop {
            match self.next_event().await {
                HostEvent::Exit(exit) => return exit,
                HostEvent::Output(output) => output.into_batch().write_to_terminal(),
            }
        }
    }

    /// Stops every proc of this host gracefully, all at once (see
    /// [`ProcHandle::stop_at_end`]: each gets `timeout`, then is killed, which is
    /// expected of a host that ends), and waits until all are reaped (HOST-3).
    /// Later spawns fail with [`HostError::ShutDown`]. The host's own proc keeps running.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: procs already asked to stop go on stopping, and are killed when the
    /// host is dropped.
    pub async fn shutdown(&self, timeout: Duration) {
        self.shut_down.store(true, Ordering::SeqCst);
        let procs = self.procs();
        futures::future::join_all(procs.iter().map(|p| p.stop_at_end(timeout))).await;
    }
}

/// Accepts a ready report if it names a rank of this batch, from that rank's process.
fn accept(batch: &Batch, ready: &mut [Option<ProcId>], report: ProcReady, name: &str) -> bool {
    let expected = batch.0.get(report.rank).map(Child::pid);
    match ready.get_mut(report.rank) {
        Some(slot @ None) if expected == Some(report.pid) => {
            *slot = Some(report.proc_id);
            true
        }
        _ => {
            tracing::warn!(
                "ignoring a ready report for procs {name}: rank {} pid {} ({}) is not an \
                 unreported rank of this spawn",
                report.rank,
                report.pid,
                report.proc_id
            );
            false
        }
    }
}

impl Drop for Host {
    /// Kills the process group of every proc still running (HOST-3).
    fn drop(&mut self) {
        for proc in self.procs.lock().iter() {
            proc.kill();
        }
    }
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("proc", self.proc.proc_id())
            .field("procs", &self.procs.lock().len())
            .field("ready_timeout", &self.ready_timeout)
            .field("in_process", &self.launcher.is_some())
            .finish()
    }
}

/// The children of one `spawn_procs` call: killed on drop unless disarmed (HOST-1).
struct Batch(Vec<Child>);

impl Batch {
    fn disarm(mut self) -> Vec<Child> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        for child in &self.0 {
            child.kill();
        }
    }
}
