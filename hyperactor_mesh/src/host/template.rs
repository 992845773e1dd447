//! The fork server: a template process that has already started the program's
//! runtime and forks one child per proc, so a large spawn does not pay for a fresh
//! interpreter per proc.
//!
//! A [`BootstrapCommand`] with [`BootstrapCommand::fork_server`] set names the
//! arguments that make its program a fork server. The host starts it once per program
//! (lazily, at the first spawn that asks for it) and then sends it one request per
//! proc over a Unix `SOCK_SEQPACKET` socket pair whose far end the template finds in
//! [`FORK_SERVER_FD_ENV`]. Each message is one datagram:
//!
//! | from | message | meaning |
//! |---|---|---|
//! | host | `S<id>` `\0` `K=V` `\0` ... + three fds | fork a child with these variables set on top of the template's environment, the fds as its stdin, stdout and stderr |
//! | template | `P<id> <pid>` | forked: the child of request `id` is `pid` |
//! | template | `F<id> <reason>` | the fork failed |
//! | template | `X<pid> <status>` | `pid` exited with the raw wait status `status`; it is **not reaped yet** |
//! | host | `R<pid>` | the host has seen the exit: reap `pid` |
//!
//! Invariants:
//!
//! - TPL-1 (pid stays ours): the template reaps a child only when the host says so
//!   (`R`), after the host marked it exited under the child's state lock; until then the
//!   zombie holds the pid, so the host may signal the child's process group directly
//!   exactly as it does for children it forked itself.
//! - TPL-2 (no orphans): the template has a parent-death `SIGKILL` tied to the host
//!   (see [`super::child`]) and each of its children has one tied to the template;
//!   dropping a [`Template`] kills the template, and with it every child it forked. A
//!   template that exits fails the children it forked (reported as lost) and the host
//!   starts a new one at the next spawn.
//! - TPL-3 (same child either way): a forked child gets a fresh process group, its own
//!   stdin, stdout and stderr pipes from the host and the same bootstrap variables as a
//!   child started with `exec`; only the interpreter start is shared.

use hyperactor::sync::Mutex;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::process::Command;
use tokio::sync::oneshot;

use crate::bootstrap::BootstrapCommand;
use crate::host::child::{set_parent_death_signal, spawn_on_spawner_thread};
use crate::host::status::ProcStatus;

/// The variable holding the template's end of the socket pair (a file descriptor).
pub const FORK_SERVER_FD_ENV: &str = "MONARCH_FORK_SERVER_FD";

/// The largest message the template sends.
const MAX_MESSAGE: usize = 4096;

/// Which template serves a command: the program, the fork-server arguments, and the
/// variables that act while an interpreter starts (which a fork cannot change later).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TemplateKey {
    program: std::path::PathBuf,
    args: Vec<String>,
    startup_env: Vec<(String, String)>,
}

impl TemplateKey {
    /// The key of `cmd`'s template; `None` if `cmd` has no fork server.
    pub(crate) fn of(cmd: &BootstrapCommand) -> Option<Self> {
        let args = cmd.fork_server.clone()?;
        let mut startup_env: Vec<(String, String)> = cmd
            .env
            .iter()
            .filter(|(k, _)| is_startup_variable(k))
            .cloned()
            .collect();
        startup_env.sort();
        Some(Self {
            program: cmd.program.clone(),
            args,
            startup_env,
        })
    }
}

/// Variables read when an interpreter or the dynamic loader starts.
fn is_startup_variable(key: &str) -> bool {
    key.starts_with("PYTHON") || key.starts_with("LD_")
}

/// Why the fork server did not fork the child of a request (the `io::Error` that
/// [`Template::spawn`] returns wraps it).
#[derive(Debug, Clone, thiserror::Error)]
enum ForkError {
    /// The template exited, or its socket failed, before it answered.
    #[error("{reason}")]
    Gone {
        /// What happened to it, naming its pid.
        reason: String,
    },
    /// The template answered that its fork failed.
    #[error("the fork server cannot fork: {reason}")]
    Fork {
        /// The template's reason.
        reason: String,
    },
}

/// What the reader task shares with the spawning side.
#[derive(Debug, Default)]
struct Pending {
    next_id: u64,
    /// Spawn requests not answered yet.
    spawns: HashMap<u64, oneshot::Sender<Result<u32, ForkError>>>,
    /// Exit notifications by the id of their request, until the template names the pid.
    exits_by_id: HashMap<u64, oneshot::Sender<ProcStatus>>,
    /// Exit notifications of forked, unreported children.
    exits: HashMap<u32, oneshot::Sender<ProcStatus>>,
    /// Why the template is gone, once it is.
    closed: Option<String>,
}

#[derive(Debug)]
struct Shared {
    sock: AsyncFd<OwnedFd>,
    pending: Mutex<Pending>,
}

/// A running template process (see the [module docs](self)). Dropping it closes the
/// template's socket: the template then kills and reaps what it forked and exits (it
/// is killed if it has not within [`EXIT_GRACE`]).
#[derive(Debug)]
pub(crate) struct Template {
    shared: Arc<Shared>,
    pid: u32,
    process: Option<tokio::process::Child>,
}

/// How long a dropped template may take to exit before it is killed.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Template {
    fn drop(&mut self) {
        // SAFETY: shutdown(2) on the descriptor the AsyncFd owns; it stays open.
        unsafe {
            libc::shutdown(self.shared.sock.get_ref().as_raw_fd(), libc::SHUT_RDWR);
        }
        let Some(mut process) = self.process.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let pid = self.pid;
                runtime.spawn(async move {
                    if tokio::time::timeout(EXIT_GRACE, process.wait())
                        .await
                        .is_err()
                    {
                        tracing::warn!(
                            pid,
                            "the fork server did not exit when its host closed it; killing it"
                        );
                        let _ = process.kill().await;
                    }
                });
            }
            // `kill_on_drop` kills it.
            Err(_) => drop(process),
        }
    }
}

/// A child forked by a template.
#[derive(Debug)]
pub(crate) struct Forked {
    pub(crate) pid: u32,
    /// Completes when the child exits (unreaped, TPL-1): then call [`Template::release`].
    pub(crate) exit: oneshot::Receiver<ProcStatus>,
}

impl Template {
    /// Starts `cmd.program` with the fork-server arguments of `cmd`.
    ///
    /// # Errors
    ///
    /// The OS error when the socket pair or the process cannot be created; `cmd` has
    /// no fork server ([`io::ErrorKind::InvalidInput`]).
    pub(crate) async fn start(cmd: &BootstrapCommand) -> io::Result<Self> {
        let Some(args) = &cmd.fork_server else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the bootstrap command has no fork server",
            ));
        };
        let (ours, theirs) = socket_pair()?;
        let their_fd = theirs.as_raw_fd();
        let mut command = Command::new(&cmd.program);
        command
            .args(args)
            .envs(
                cmd.env
                    .iter()
                    .filter(|(k, _)| is_startup_variable(k))
                    .map(|(k, v)| (k, v)),
            )
            .env(FORK_SERVER_FD_ENV, their_fd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .process_group(0);
        set_parent_death_signal(&mut command);
        let keep = move || -> io::Result<()> {
            // SAFETY: fcntl(F_SETFD) on a descriptor the parent keeps open until the
            // spawn returns; it is async-signal-safe and allocates nothing.
            if unsafe { libc::fcntl(their_fd, libc::F_SETFD, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: the closure runs in the forked child before exec and only calls fcntl.
        unsafe {
            command.pre_exec(keep);
        }
        let process = spawn_on_spawner_thread(command).await?;
        drop(theirs);
        let pid = process.id().ok_or_else(|| {
            io::Error::other("the fork server was reaped before its pid was read")
        })?;
        // SAFETY: `ours` owns its descriptor, which nothing else closes or replaces
        // while the AsyncFd holds it.
        let sock = unsafe {
            AsyncFd::register_with_interest(ours, Interest::READABLE | Interest::WRITABLE)?
        };
        let shared = Arc::new(Shared {
            sock,
            pending: Mutex::new(Pending::default()),
        });
        tokio::spawn(read_messages(Arc::clone(&shared), pid));
        tracing::debug!(pid, program = %cmd.program.display(), "started a fork server");
        Ok(Self {
            shared,
            pid,
            process: Some(process),
        })
    }

    /// Whether the template still takes requests.
    pub(crate) fn is_alive(&self) -> bool {
        self.shared.pending.lock().closed.is_none()
    }

    /// Forks a child with `env` set and `stdio` as its standard input, output and
    /// error.
    ///
    /// # Errors
    ///
    /// When the request cannot be sent (the template is gone, the environment is too
    /// large for one message) or the template cannot fork.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a child forked after cancellation runs until the template is
    /// dropped.
    pub(crate) async fn spawn(
        &self,
        env: &[(String, String)],
        stdio: [&OwnedFd; 3],
    ) -> io::Result<Forked> {
        let (answer_tx, answer_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let id = {
            let mut pending = self.shared.pending.lock();
            if let Some(reason) = &pending.closed {
                return Err(io::Error::other(format!(
                    "the fork server is gone: {reason}"
                )));
            }
            let id = pending.next_id;
            pending.next_id += 1;
            pending.spawns.insert(id, answer_tx);
            pending.exits_by_id.insert(id, exit_tx);
            id
        };
        let mut message = format!("S{id}").into_bytes();
        for (k, v) in env {
            message.push(0);
            message.extend_from_slice(k.as_bytes());
            message.push(b'=');
            message.extend_from_slice(v.as_bytes());
        }
        if let Err(e) = self.send(&message, &stdio.map(|fd| fd.as_raw_fd())).await {
            let mut pending = self.shared.pending.lock();
            pending.spawns.remove(&id);
            pending.exits_by_id.remove(&id);
            return Err(e);
        }
        let pid = answer_rx
            .await
            .map_err(|_| io::Error::other("the fork server exited before answering"))?
            .map_err(io::Error::other)?;
        Ok(Forked { pid, exit: exit_rx })
    }

    /// Lets the template reap `pid`, whose exit the host has recorded (TPL-1).
    pub(crate) fn release(&self, pid: u32) {
        let message = format!("R{pid}");
        let sock = self.shared.sock.get_ref().as_raw_fd();
        // A small datagram on a socket that is only ever lightly used: if it cannot be
        // sent now the template is gone or stuck, and the zombie goes with it.
        if let Err(e) = send_with_fds(sock, message.as_bytes(), &[]) {
            tracing::debug!(
                template = self.pid,
                pid,
                "cannot ask the fork server to reap: {e}"
            );
        }
    }

    async fn send(&self, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
        loop {
            let mut guard = self.shared.sock.writable().await?;
            match guard.try_io(|sock| send_with_fds(sock.get_ref().as_raw_fd(), message, fds)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Reads the template's messages until it closes its end, then fails what is left.
async fn read_messages(shared: Arc<Shared>, template: u32) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let reason = loop {
        let read = shared
            .sock
            .async_io(Interest::READABLE, |sock| {
                // SAFETY: recv into a buffer we own, of the length we pass.
                let n = unsafe {
                    libc::recv(
                        sock.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n.unsigned_abs())
                }
            })
            .await;
        match read {
            Ok(0) => break format!("the fork server (pid {template}) exited"),
            Ok(n) => handle_message(&shared, &buf[..n]),
            Err(e) => break format!("cannot read from the fork server (pid {template}): {e}"),
        }
    };
    let mut pending = shared.pending.lock();
    pending.spawns.drain().for_each(|(_, tx)| {
        let _ = tx.send(Err(ForkError::Gone {
            reason: reason.clone(),
        }));
    });
    pending.exits_by_id.clear();
    for (_, tx) in pending.exits.drain() {
        let _ = tx.send(ProcStatus::Lost {
            reason: format!("{reason}, taking the procs it forked along"),
        });
    }
    tracing::debug!("{reason}");
    pending.closed = Some(reason);
}

fn handle_message(shared: &Shared, message: &[u8]) {
    let text = String::from_utf8_lossy(message);
    let (kind, rest) = text.split_at(text.char_indices().nth(1).map_or(text.len(), |(i, _)| i));
    let (first, second) = rest.split_once(' ').unwrap_or((rest, ""));
    let mut pending = shared.pending.lock();
    match (kind, first.parse::<u64>()) {
        ("P", Ok(id)) => {
            let Ok(pid) = second.parse::<u32>() else {
                tracing::warn!("ignoring a malformed message from the fork server: {text}");
                return;
            };
            if let Some(exit) = pending.exits_by_id.remove(&id) {
                pending.exits.insert(pid, exit);
            }
            if let Some(answer) = pending.spawns.remove(&id) {
                let _ = answer.send(Ok(pid));
            }
        }
        ("F", Ok(id)) => {
            pending.exits_by_id.remove(&id);
            if let Some(answer) = pending.spawns.remove(&id) {
                let _ = answer.send(Err(ForkError::Fork {
                    reason: second.to_string(),
                }));
            }
        }
        ("X", Ok(pid)) => {
            let (Ok(pid), Ok(raw)) = (u32::try_from(pid), second.parse::<i32>()) else {
                tracing::warn!("ignoring a malformed message from the fork server: {text}");
                return;
            };
            if let Some(exit) = pending.exits.remove(&pid) {
                let _ = exit.send(ProcStatus::Exited(std::process::ExitStatus::from_raw(raw)));
            }
        }
        _ => tracing::warn!("ignoring a malformed message from the fork server: {text}"),
    }
}

/// A non-blocking, close-on-exec `SOCK_SEQPACKET` Unix socket pair.
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into the array we pass.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded, so both descriptors are open and owned by nobody.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(ours.as_raw_fd())?;
    // Environments can be large (a config snapshot, a pickled bootstrap function).
    let size: libc::c_int = 4 << 20;
    // SAFETY: setsockopt reads `size` of the length given; failure only keeps the
    // default buffer size.
    unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    Ok((ours, theirs))
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `message` as one datagram on `sock`, with `fds` attached (`SCM_RIGHTS`).
fn send_with_fds(sock: RawFd, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: message.as_ptr().cast_mut().cast(),
        iov_len: message.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64 elements keep the control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` writable, aligned bytes, enough for one
        // header and `fds`; CMSG_FIRSTHDR returns a pointer into it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(header),
                fd_bytes,
            );
        }
    }
    // SAFETY: every pointer in `msg` refers to memory alive for the call.
    let sent = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An anonymous pipe, both ends close-on-exec: `(read, write)`.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
