//! Proc handles: the host's view of one running proc, and the record of its exit.
//!
//! A [`ProcHandle`] is returned for each rank by [`crate::host::Host::spawn_procs`]. It
//! names the proc (rank, [`ProcId`], pid), tells its [`ProcStatus`], and stops it:
//! [`ProcHandle::kill`] at once, [`ProcHandle::stop`] gracefully. Clones share the proc.
//!
//! Invariants:
//!
//! - HOST-2 (prompt exit): a proc's exit is published as soon as the host reaps it and
//!   has read its output pipes to their end (bounded by
//!   [`crate::host::PIPE_DRAIN_LIMIT`] without progress, LOG-2) — on the handle's status watch
//!   ([`ProcHandle::watch`], [`ProcHandle::wait`]) and as one [`ProcExit`] on the host's
//!   event stream ([`crate::host::Host::next_event`], [`crate::host::Host::next_exit`])
//!   — driven by the child's exit itself, never by polling.

use std::fmt;
use std::time::Duration;

use hyperactor::ProcId;
use tokio::sync::watch;

use crate::host::in_process::Child;
pub use crate::host::status::{ProcExit, ProcStatus};

/// The host's handle to one proc. Dropping it does not stop the proc: the host does,
/// on [`crate::host::Host::shutdown`] or when dropped.
#[derive(Clone)]
pub struct ProcHandle {
    proc_id: ProcId,
    child: Child,
}

impl ProcHandle {
    pub(crate) fn new(proc_id: ProcId, child: Child) -> Self {
        Self { proc_id, child }
    }

    /// The proc name given to `spawn_procs`.
    pub fn name(&self) -> &str {
        self.child.name()
    }

    /// The proc's rank, `0..count`.
    pub fn rank(&self) -> usize {
        self.child.rank()
    }

    /// The proc's id: send to its actors through it.
    pub fn proc_id(&self) -> &ProcId {
        &self.proc_id
    }

    /// The proc's OS process id (also the id of its process group); for a proc the
    /// host started in its own process ([`crate::host::in_process`]), the host's.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The proc's current status.
    pub fn status(&self) -> ProcStatus {
        self.child.status()
    }

    /// A watch of the proc's status: it changes once, from [`ProcStatus::Running`] to
    /// the final status, as soon as the host reaps the process (HOST-2).
    pub fn watch(&self) -> watch::Receiver<ProcStatus> {
        self.child.subscribe()
    }

    /// Waits until the process has exited and returns how it ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait(&self) -> ProcStatus {
        let mut watch = self.child.subscribe();
        let status = match watch.wait_for(|status| !status.is_running()).await {
            Ok(status) => status.clone(),
            // Unreachable while `self` holds the sender; kept total for safety.
            Err(_) => ProcStatus::Lost {
                reason: "the host stopped watching the process".to_string(),
            },
        };
        status
    }

    /// Sends `SIGKILL` to the proc's process group (an in-process proc is killed by its
    /// launcher instead). Returns false if the process had already exited. The exit is
    /// then published as usual (HOST-2).
    pub fn kill(&self) -> bool {
        self.child.kill()
    }

    /// Kills the proc because it cannot be reached (`reason`, e.g. messages to it came
    /// back): its exit is reported as [`ProcStatus::Lost`] with that reason. False if
    /// it was not running.
    pub fn kill_lost(&self, reason: impl Into<String>) -> bool {
        self.child.kill_lost(reason.into())
    }

    /// Stops the proc gracefully: closes its stdin (the stop request of
    /// [`crate::bootstrap::serve_until_stopped`]), waits up to `timeout` for it to exit,
    /// then kills it. Returns how it ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop request is made before the first await; a cancelled call
    /// does not kill the proc after the timeout.
    pub async fn stop(&self, timeout: Duration) -> ProcStatus {
        self.stop_logged(timeout, true).await
    }

    /// As [`Self::stop`], for a host that is ending (its process exits, or it was asked
    /// to end): the kill of a proc that overran `timeout` is expected then, and logged
    /// at info level, not as a warning.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::stop`].
    pub async fn stop_at_end(&self, timeout: Duration) -> ProcStatus {
        self.stop_logged(timeout, false).await
    }

    async fn stop_logged(&self, timeout: Duration, warn: bool) -> ProcStatus {
        self.child.close_stdin();
        match tokio::time::timeout(timeout, self.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let (proc, rank) = (&self.proc_id, self.rank());
                let message =
                    format!("proc did not stop within {timeout:?} of its stop request; killing it");
                if warn {
                    tracing::warn!(%proc, rank, "{message}");
                } else {
                    tracing::info!(%proc, rank, "{message}");
                }
                self.kill();
                self.wait().await
            }
        }
    }

    /// The last lines the proc wrote to its stderr (up to 20), as read so far.
    pub fn stderr_tail(&self) -> String {
        self.child.stderr_tail()
    }
}

impl fmt::Debug for ProcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcHandle")
            .field("name", &self.child.name())
            .field("rank", &self.child.rank())
            .field("proc_id", &self.proc_id)
            .field("pid", &self.child.pid())
            .field("status", &self.status())
            .finish()
    }
}
