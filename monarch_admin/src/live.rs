//! The live source: the admin server over this process's runtime.
//!
//! [`LiveSource`] answers the server from the mesh layer: snapshots gathered per host
//! over the control path when asked ([`ProcAgent::monitor_snapshot`]), the events and
//! logs rings of this process ([`hyperactor_mesh::monitor`]), and stack dumps and proc
//! kills through this process's agent. Rust programs with native meshes serve their
//! job with it the same way Python programs do.

use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::monitor;
use hyperactor_mesh::monitor::{Event, LogQuery, LogRecord, Snapshot, StackDump};
use tokio::sync::broadcast;

use crate::source::{JobInfo, Source, SourceError};

/// The live job of this process as a [`Source`]: see the `live` module's docs.
pub struct LiveSource {
    agent: ProcAgent,
    program: String,
    session: String,
    started_at: f64,
}

impl std::fmt::Debug for LiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource").finish_non_exhaustive()
    }
}

fn parse_proc(proc: &str) -> Result<hyperactor::ProcId, SourceError> {
    proc.parse().map_err(|e| SourceError::BadProcId {
        proc: proc.to_string(),
        reason: format!("{e}"),
    })
}

impl LiveSource {
    /// A source over `agent` (this process's agent) for the program `program` (what
    /// the summary calls it: the script's name). Subscribers get the events of this
    /// process's events ring as they are recorded.
    pub fn new(agent: ProcAgent, program: impl Into<String>) -> LiveSource {
        let mut bytes = [0u8; 8];
        // A session id only tells two runs apart; the time serves if the OS has no RNG.
        let session = match getrandom::getrandom(&mut bytes) {
            Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            Err(_) => format!("{:x}", (monitor::unix_now() * 1e6) as u64),
        };
        LiveSource {
            agent,
            program: program.into(),
            session,
            started_at: monitor::unix_now(),
        }
    }
}

impl Source for LiveSource {
    fn snapshot(&self, timeout: Duration) -> BoxFuture<'static, Result<Snapshot, SourceError>> {
        let agent = self.agent.clone();
        async move { Ok(agent.monitor_snapshot(timeout).await) }.boxed()
    }

    fn events_since(&self, since: u64, limit: usize) -> Vec<Event> {
        monitor::events::since(since, limit)
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        monitor::events::subscribe()
    }

    fn logs(&self, q: &LogQuery) -> Vec<LogRecord> {
        monitor::logs::query(q)
    }

    fn stack(
        &self,
        proc: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<StackDump, SourceError>> {
        let agent = self.agent.clone();
        let proc = parse_proc(proc);
        async move { Ok(agent.stack_dump(&proc?, timeout).await?) }.boxed()
    }

    fn kill_proc(&self, proc: &str) -> BoxFuture<'static, Result<(), SourceError>> {
        let result = parse_proc(proc)
            .and_then(|proc| Ok(self.agent.kill_proc(&proc, "killed from the dashboard")?));
        futures::future::ready(result).boxed()
    }

    fn latest_event_seq(&self) -> u64 {
        monitor::events::latest_seq()
    }

    fn describe(&self) -> JobInfo {
        JobInfo {
            session: Some(self.session.clone()),
            program: Some(self.program.clone()),
            pid: Some(std::process::id()),
            started_at: Some(self.started_at),
            now: None,
            rate: None,
        }
    }
}
