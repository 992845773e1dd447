//! The OS side of one proc: starting its process, reaping it, killing its group.
//!
//! - **Start.** The process is forked by one long-lived thread of the host process (the
//!   *spawner thread*), with its own process group and, on Linux, a parent-death
//!   `SIGKILL` (`PR_SET_PDEATHSIG`). Linux ties that signal to the *thread* that forked
//!   the child, not the process; forking from a thread that lives as long as the process
//!   makes it fire exactly when the host process dies, not when some runtime worker or
//!   blocking-pool thread retires.
//! - **Output.** The child's stdout and stderr are pipes the host reads to their end
//!   (see [`super::capture`]); its stdin is a pipe the host holds (the stop request).
//! - **Reap.** A task per child awaits `Child::wait` (woken by the runtime's child
//!   watcher, not by polling), marks the child exited, waits until its output pipes are
//!   read to the end (a descendant that left the child's process group may hold them
//!   open: the wait ends once nothing arrived for [`super::PIPE_DRAIN_LIMIT`], or after
//!   [`super::PIPE_DRAIN_MAX`]), then publishes the status on a watch
//!   channel and to the child's route: the spawn that is still waiting for it, or the
//!   host's event stream, after the child's last lines (LOG-2).
//! - **Kill.** `SIGKILL` to the whole process group (and the leader), sent under the state
//!   lock only while the leader is unreaped, so the pid cannot have been reused. After
//!   the leader is reaped, its group is killed once more to take any grandchildren with
//!   it (the kernel keeps the pgid reserved while members remain).

use hyperactor::sync::Mutex;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};

use hyperactor::ProcId;
use std::os::fd::OwnedFd;

use tokio::io::AsyncRead;
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};

use crate::bootstrap::{BootInfo, BootstrapCommand};
use crate::host::capture::{self, Capture, HostEvent};
use crate::host::status::{ProcExit, ProcStatus};
use crate::host::template::{self, Template};
use crate::output::{OutputOptions, OutputStream};

/// The longest stderr line kept, in bytes; longer lines are cut.
const STDERR_LINE_BYTES: usize = 512;

/// Where a child's exit is reported.
#[derive(Debug)]
enum Route {
    /// To the `spawn_procs` call still waiting for it to report ready: its rank.
    Spawning(mpsc::UnboundedSender<usize>),
    /// To the host's event stream.
    Host {
        proc_id: ProcId,
        events: mpsc::UnboundedSender<HostEvent>,
    },
}

/// Where the output of a spawn's children goes (see [`super::capture`]).
#[derive(Debug, Clone)]
pub(crate) struct OutputSetup {
    pub(crate) options: Arc<OutputOptions>,
    pub(crate) events: mpsc::UnboundedSender<HostEvent>,
    /// Where log files go; `None`: no log files.
    pub(crate) log_dir: Option<PathBuf>,
}

#[derive(Debug)]
struct State {
    /// Set (under this lock) as soon as the leader is reaped.
    exited: bool,
    /// Set once the exit is published (after the output pipes closed).
    published: bool,
    route: Route,
    /// Why the host killed a running child it could no longer reach, if it did.
    lost: Option<String>,
}

/// One child process, shared by its reaper task, its output tasks and its handles.
#[derive(Debug)]
pub(crate) struct ChildProc {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) pid: u32,
    state: Mutex<State>,
    status: watch::Sender<ProcStatus>,
    /// The write end of the child's stdin pipe, held open until the proc should stop.
    stdin: Mutex<Option<OwnedFd>>,
    /// The last lines of its stderr, at most `tail_lines` ([`OutputOptions::tail_lines`]).
    stderr_tail: Mutex<VecDeque<String>>,
    tail_lines: usize,
    /// How many of its output pipes are still open.
    pipes_open: watch::Sender<u8>,
    /// How many bytes were read from its output pipes: progress of the drain.
    pipe_bytes: AtomicU64,
}

impl ChildProc {
    pub(crate) fn status(&self) -> ProcStatus {
        self.status.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<ProcStatus> {
        self.status.subscribe()
    }

    /// Sends `SIGKILL` to the child's process group; false if it had already exited.
    pub(crate) fn kill(&self) -> bool {
        let state = self.state.lock();
        if state.exited {
            return false;
        }
        kill_group(self.pid);
        true
    }

    /// Kills the child because it cannot be reached (`reason`): its exit is then
    /// reported as [`ProcStatus::Lost`] with that reason. False if it had exited.
    pub(crate) fn kill_lost(&self, reason: String) -> bool {
        let mut state = self.state.lock();
        if state.exited {
            return false;
        }
        state.lost = Some(reason);
        kill_group(self.pid);
        true
    }

    /// Closes the child's stdin: the graceful stop request (BOOT-2).
    pub(crate) fn close_stdin(&self) {
        self.stdin.lock().take();
    }

    /// Whether the graceful stop request was made (its stdin is closed).
    pub(crate) fn stop_requested(&self) -> bool {
        self.stdin.lock().is_none()
    }

    /// The last lines of the child's stderr, as read so far.
    pub(crate) fn stderr_tail(&self) -> String {
        if self.tail_lines == 0 {
            return "(none kept: the spawn's tail_log_lines is 0)".to_string();
        }
        self.stderr_tail
            .lock()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the child's stderr is closed (bounded by `limit`), then returns its
    /// tail. A grandchild holding stderr open makes this wait out the limit.
    pub(crate) async fn stderr_tail_at_close(&self, limit: std::time::Duration) -> String {
        self.wait_pipes_closed(limit).await;
        self.stderr_tail()
    }

    /// Waits until both output pipes are read to their end, or until nothing was read
    /// from them for `limit` (a descendant holds them open and is silent), or
    /// [`super::PIPE_DRAIN_MAX`] passed. Progress, not total time, bounds the wait: a
    /// host slowed down by load still reads everything a proc wrote before it exited.
    async fn wait_pipes_closed(&self, limit: std::time::Duration) {
        let mut open = self.pipes_open.subscribe();
        let deadline = tokio::time::Instant::now() + super::PIPE_DRAIN_MAX;
        let mut read = self.pipe_bytes.load(Ordering::Relaxed);
        loop {
            let step = tokio::time::Instant::now() + limit;
            let until = step.min(deadline);
            if tokio::time::timeout_at(until, open.wait_for(|n| *n == 0))
                .await
                .is_ok()
            {
                return;
            }
            let now = self.pipe_bytes.load(Ordering::Relaxed);
            if now == read || until == deadline {
                return;
            }
            read = now;
        }
    }

    /// Called by a drain task for each chunk it read: `bytes` more arrived.
    pub(crate) fn pipe_read(&self, bytes: usize) {
        self.pipe_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Called by a drain task when its pipe closed.
    pub(crate) fn pipe_closed(&self) {
        self.pipes_open.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Reports this child's exit to the host's stream from now on. If its exit was
    /// already published, reports it at once.
    pub(crate) fn promote(&self, proc_id: ProcId, events: mpsc::UnboundedSender<HostEvent>) {
        let mut state = self.state.lock();
        if state.published {
            remove_socket_file(&proc_id);
            let _ = events.send(HostEvent::Exit(self.exit_event(&proc_id)));
        }
        state.route = Route::Host { proc_id, events };
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

    /// Called by the reaper once the leader is reaped: marks it exited, waits
    /// (bounded) for its output to be read to the end, then publishes the exit (LOG-2).
    async fn finish(&self, status: ProcStatus) {
        {
            let mut state = self.state.lock();
            // Take any grandchildren left in the group along (they may hold the pipes).
            kill_group(self.pid);
            state.exited = true;
        }
        self.wait_pipes_closed(super::PIPE_DRAIN_LIMIT).await;
        let mut state = self.state.lock();
        state.published = true;
        let status = match state.lost.take() {
            Some(reason) => ProcStatus::Lost { reason },
            None => status,
        };
        self.status.send_replace(status);
        self.close_stdin();
        match &state.route {
            Route::Spawning(tx) => {
                let _ = tx.send(self.rank);
            }
            Route::Host { proc_id, events } => {
                remove_socket_file(proc_id);
                let _ = events.send(HostEvent::Exit(self.exit_event(proc_id)));
            }
        }
    }

    /// Keeps `line` (of stderr) in the tail.
    pub(crate) fn push_stderr(&self, line: &str) {
        let mut end = line.len().min(STDERR_LINE_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        if self.tail_lines == 0 {
            return;
        }
        let mut tail = self.stderr_tail.lock();
        while tail.len() >= self.tail_lines {
            tail.pop_front();
        }
        tail.push_back(line[..end].trim_end().to_string());
    }

    /// Starts the tasks that read the child's output pipes.
    fn capture(
        self: &Arc<Self>,
        output: &OutputSetup,
        stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
        stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    ) {
        let capture = Arc::new(Capture::new(
            &self.name,
            self.rank,
            self.pid,
            Arc::clone(&output.options),
            output.events.clone(),
            output.log_dir.as_deref(),
        ));
        let open = u8::from(stdout.is_some()) + u8::from(stderr.is_some());
        self.pipes_open.send_replace(open);
        if let Some(pipe) = stdout {
            let (capture, child) = (Arc::clone(&capture), Arc::clone(self));
            tokio::spawn(capture::drain(pipe, OutputStream::Stdout, capture, child));
        }
        if let Some(pipe) = stderr {
            tokio::spawn(capture::drain(
                pipe,
                OutputStream::Stderr,
                capture,
                Arc::clone(self),
            ));
        }
    }
}

fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions. The targets are the child's
    // process group (created for it, see `start`) and the child itself, which the caller
    // guarantees is not yet reaped or still leads a live group.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Starts the process of proc `info.rank`, reporting its exit to `spawning` until it is
/// promoted, its output going as `output` says.
///
/// # Errors
///
/// The OS error when the process cannot be started.
///
/// # Cancel safety
///
/// Cancel safe: a process started after cancellation is killed by `kill_on_drop`.
pub(crate) async fn start(
    cmd: &BootstrapCommand,
    info: &BootInfo,
    spawning: mpsc::UnboundedSender<usize>,
    output: &OutputSetup,
) -> io::Result<Arc<ChildProc>> {
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .envs(hyperactor::channel::auth::child_env())
        .envs(info.to_env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    set_parent_death_signal(&mut command);

    let mut child = spawn_on_spawner_thread(command).await?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("the child was reaped before its pid was read"))?;
    let stdin = child.stdin.take().map(|s| s.into_owned_fd()).transpose()?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let control = ChildProc::new(info, pid, stdin, spawning, output.options.tail_lines);
    control.capture(output, stdout, stderr);
    tokio::spawn(reap(child, Arc::clone(&control)));
    Ok(control)
}

/// Like [`start`], but forks the process from `template` (see [`template`]): the same
/// environment, process group, stdin, stdout and stderr pipes as [`start`] gives.
///
/// # Errors
///
/// When the pipes cannot be made or the template cannot fork (the caller may then
/// [`start`] the process instead).
///
/// # Cancel safety
///
/// Not cancel safe: a child forked after cancellation runs until the template is
/// dropped.
pub(crate) async fn start_forked(
    template: &Arc<Template>,
    cmd: &BootstrapCommand,
    info: &BootInfo,
    spawning: mpsc::UnboundedSender<usize>,
    output: &OutputSetup,
) -> io::Result<Arc<ChildProc>> {
    let (stdin_read, stdin_write) = template::pipe()?;
    let (stdout_read, stdout_write) = template::pipe()?;
    let (stderr_read, stderr_write) = template::pipe()?;
    let mut env: Vec<(String, String)> = cmd.env.clone();
    env.extend(hyperactor::channel::auth::child_env());
    env.extend(info.to_env());
    let forked = template
        .spawn(&env, [&stdin_read, &stdout_write, &stderr_write])
        .await?;
    drop((stdin_read, stdout_write, stderr_write));
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_read)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_read)?;
    let control = ChildProc::new(
        info,
        forked.pid,
        Some(stdin_write),
        spawning,
        output.options.tail_lines,
    );
    control.capture(output, Some(stdout), Some(stderr));
    let reaper = Arc::clone(&control);
    let template = Arc::clone(template);
    tokio::spawn(async move {
        let status = forked.exit.await.unwrap_or_else(|_| ProcStatus::Lost {
            reason: "the fork server dropped its exit report".to_string(),
        });
        tracing::debug!(proc = %reaper.name, rank = reaper.rank, pid = reaper.pid, "{status}");
        reaper.finish(status).await;
        template.release(reaper.pid);
    });
    Ok(control)
}

impl ChildProc {
    fn new(
        info: &BootInfo,
        pid: u32,
        stdin: Option<OwnedFd>,
        spawning: mpsc::UnboundedSender<usize>,
        tail_lines: usize,
    ) -> Arc<Self> {
        Arc::new(ChildProc {
            name: info.name.clone(),
            rank: info.rank,
            pid,
            state: Mutex::new(State {
                lost: None,
                exited: false,
                published: false,
                route: Route::Spawning(spawning),
            }),
            status: watch::channel(ProcStatus::Running).0,
            stdin: Mutex::new(stdin),
            stderr_tail: Mutex::new(VecDeque::new()),
            tail_lines,
            pipes_open: watch::channel(0).0,
            pipe_bytes: AtomicU64::new(0),
        })
    }
}

/// Sets `PR_SET_PDEATHSIG` to `SIGKILL` in the child, between fork and exec.
#[cfg(target_os = "linux")]
pub(crate) fn set_parent_death_signal(command: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let host_pid = unsafe { libc::getpid() };
    let set = move || -> io::Result<()> {
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of the calling process; the
        // unused arguments are zero as the man page asks.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // The host may have died between fork and prctl: then no signal will come.
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != host_pid {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec; it calls only prctl and
    // getppid, which are async-signal-safe, and allocates nothing (`last_os_error` and
    // `from_raw_os_error` build an unboxed OS error).
    unsafe {
        command.pre_exec(set);
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_parent_death_signal(_command: &mut Command) {}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `command.spawn()` on the spawner thread (see the module docs), inside the
/// caller's runtime so the child is registered with its child watcher.
pub(crate) async fn spawn_on_spawner_thread(
    mut command: Command,
) -> io::Result<tokio::process::Child> {
    static SPAWNER: OnceLock<Option<std_mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("hyperactor-mesh-spawner".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .ok()
            .map(|_| tx)
    });
    let runtime = tokio::runtime::Handle::current();
    let (result_tx, result_rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        let _ = result_tx.send(command.spawn());
    });
    match spawner {
        Some(tx) => {
            if let Err(std_mpsc::SendError(job)) = tx.send(job) {
                job();
            }
        }
        // No spawner thread could be started: fork from this thread instead.
        None => job(),
    }
    result_rx
        .await
        .map_err(|_| io::Error::other("the spawner thread dropped the spawn request"))?
}

/// The reaper task of one child.
async fn reap(mut child: tokio::process::Child, control: Arc<ChildProc>) {
    let status = match child.wait().await {
        Ok(status) => ProcStatus::Exited(status),
        Err(e) => ProcStatus::Lost {
            reason: format!("cannot wait for pid {}: {e}", control.pid),
        },
    };
    tracing::debug!(proc = %control.name, rank = control.rank, pid = control.pid, "{status}");
    control.finish(status).await;
}

/// Removes the Unix socket file of a proc that has exited: a proc that is killed
/// cannot remove it itself, and nothing else would.
fn remove_socket_file(proc_id: &ProcId) {
    if let hyperactor::ChannelAddr::Unix(path) = proc_id.addr() {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(path = %path.display(), "cannot remove the socket file of an exited proc: {e}")
            }
        }
    }
}
