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
use serde_json::Value;
use tokio::sync::broadcast;

use crate::{LogQuery, Source, SourceError};

/// The live job of this process as a [`Source`]: see the `live` module's docs.
pub struct LiveSource {
    agent: ProcAgent,
    events: broadcast::Sender<Value>,
    program: String,
    session: String,
    started_at: f64,
}

impl std::fmt::Debug for LiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource").finish_non_exhaustive()
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(
        |e| serde_json::json!({"error": format!("cannot serialize a monitoring record: {e}")}),
    )
}

fn parse_proc(proc: &str) -> Result<hyperactor::ProcId, SourceError> {
    proc.parse().map_err(|e| SourceError::BadProcId {
        proc: proc.to_string(),
        reason: format!("{e}"),
    })
}

impl LiveSource {
    /// A source over `agent` (this process's agent) for the program `program` (what
    /// the summary calls it: the script's name). Call it within a tokio runtime: it
    /// starts the task that forwards events to subscribers.
    pub fn new(agent: ProcAgent, program: impl Into<String>) -> LiveSource {
        let (events, _) = broadcast::channel(1024);
        // Weak, so the task ends (at the next event) once the source is gone.
        let forward = events.downgrade();
        let mut live = monitor::events::subscribe();
        tokio::spawn(async move {
            loop {
                match live.recv().await {
                    Ok(event) => {
                        let Some(forward) = forward.upgrade() else {
                            return;
                        };
                        // No subscriber now is fine: the event stays in the ring.
                        let _ = forward.send(to_value(&event));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        let mut bytes = [0u8; 8];
        // A session id only tells two runs apart; the time serves if the OS has no RNG.
        let session = match getrandom::getrandom(&mut bytes) {
            Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            Err(_) => format!("{:x}", (hyperactor_mesh::monitor::unix_now() * 1e6) as u64),
        };
        LiveSource {
            agent,
            events,
            program: program.into(),
            session,
            started_at: hyperactor_mesh::monitor::unix_now(),
        }
    }
}

impl Source for LiveSource {
    fn snapshot(&self, timeout: Duration) -> BoxFuture<'static, Result<Value, SourceError>> {
        let agent = self.agent.clone();
        async move { Ok(to_value(&agent.monitor_snapshot(timeout).await)) }.boxed()
    }

    fn events_since(&self, since: u64, limit: usize) -> Vec<Value> {
        monitor::events::since(since, limit)
            .iter()
            .map(to_value)
            .collect()
    }

    fn subscribe(&self) -> broadcast::Receiver<Value> {
        self.events.subscribe()
    }

    fn logs(&self, q: &LogQuery) -> Vec<Value> {
        monitor::logs::query(q).iter().map(to_value).collect()
    }

    fn stack(
        &self,
        proc: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Value, SourceError>> {
        let agent = self.agent.clone();
        let proc = parse_proc(proc);
        async move {
            let dump = agent.stack_dump(&proc?, timeout).await?;
            Ok(to_value(&dump))
        }
        .boxed()
    }

    fn kill_proc(&self, proc: &str) -> BoxFuture<'static, Result<(), SourceError>> {
        let result = parse_proc(proc)
            .and_then(|proc| Ok(self.agent.kill_proc(&proc, "killed from the dashboard")?));
        futures::future::ready(result).boxed()
    }

    fn latest_event_seq(&self) -> u64 {
        monitor::events::latest_seq()
    }

    fn describe(&self) -> Value {
        serde_json::json!({
            "session": self.session,
            "program": self.program,
            "pid": std::process::id(),
            "started_at": self.started_at,
        })
    }
}
