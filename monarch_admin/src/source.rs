//! [`Source`]: what the server serves, and the records it answers with besides the
//! monitoring's own ([`JobInfo`], [`SeriesPoint`], [`SourceError`]).

use std::time::Duration;

use futures::future::BoxFuture;
use hyperactor_mesh::monitor::{Event, LogQuery, LogRecord, MonitorError, Snapshot, StackDump};
use serde::Deserialize;
use serde::Serialize;

/// The program's identity, as a [`Source`] knows it ([`Source::describe`]): what
/// `GET /v1/summary` shows besides the counts. The server fills in what is `None` from
/// its own process (the program's name, pid, start time and the time now, and the
/// message rate it samples).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobInfo {
    /// The run's session id.
    pub session: Option<String>,
    /// The program's name (the script's).
    pub program: Option<String>,
    /// The program's pid.
    pub pid: Option<u32>,
    /// When the program started (Unix seconds).
    pub started_at: Option<f64>,
    /// The time now (a recording's own "now", Unix seconds).
    pub now: Option<f64>,
    /// Messages handled per second (a recording's own rate).
    pub rate: Option<f64>,
}

/// One sample of `GET /v1/series`: the job's totals at one time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// When it was taken (Unix seconds).
    pub t: f64,
    /// Messages handled by all actors.
    pub handled: u64,
    /// Of which failed.
    pub errors: u64,
    /// Messages handled per second since the previous point.
    pub rate: f64,
    /// Resident memory of all procs, bytes.
    pub rss: u64,
    /// CPU use of all procs, percent of one CPU.
    pub cpu_pct: f64,
    /// Procs running.
    pub procs_alive: u64,
    /// Actors failed.
    pub actors_failed: u64,
}

/// Why a [`Source`] could not answer a request.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The request named something that is not a proc id.
    #[error("{proc:?} is not a proc id ({reason}); expected an id from GET /v1/procs")]
    BadProcId {
        /// What the request named.
        proc: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The request named a proc the source does not have.
    #[error("no proc {proc:?} in {place}; expected an id from GET /v1/procs")]
    UnknownProc {
        /// What the request named.
        proc: String,
        /// Where it was looked for ("the recording", say).
        place: String,
    },
    /// The runtime's monitoring could not answer.
    #[error(transparent)]
    Monitor(#[from] MonitorError),
    /// A source of another kind could not answer: the message says why.
    #[error("{0}")]
    Unavailable(String),
}

/// What the server serves: the job's state, events, logs and actions. The runtime
/// implements it for a live job; [`RecordedSource`](crate::RecordedSource) for a
/// recorded one.
pub trait Source: Send + Sync + 'static {
    /// The whole snapshot (spec section 1 shape), gathered now.
    fn snapshot(&self, timeout: Duration) -> BoxFuture<'static, Result<Snapshot, SourceError>>;
    /// Events with seq > since (oldest first), at most limit.
    fn events_since(&self, since: u64, limit: usize) -> Vec<Event>;
    /// New events as they happen.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event>;
    /// Log records matching the query (newest last).
    fn logs(&self, q: &LogQuery) -> Vec<LogRecord>;
    /// A stack dump of one proc: `{proc, pid, method, text}`.
    fn stack(
        &self,
        proc: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<StackDump, SourceError>>;
    /// Kill a proc (actions only).
    fn kill_proc(&self, proc: &str) -> BoxFuture<'static, Result<(), SourceError>>;

    /// The program's identity for `GET /v1/summary`: any of `session`, `program`,
    /// `pid`, `started_at` (and, for a recording, `now` and the message `rate`). The
    /// server fills what is missing from its own process.
    fn describe(&self) -> JobInfo {
        JobInfo::default()
    }

    /// The seq of the latest event (0 when none): a snapshot collected before it is not
    /// reused after it. The default, 0, reuses snapshots by age alone.
    fn latest_event_seq(&self) -> u64 {
        0
    }

    /// A fixed series (its points, oldest first) to serve instead of sampling, for a
    /// recording; `None` (the default) lets the server sample snapshots itself.
    fn recorded_series(&self) -> Option<Vec<SeriesPoint>> {
        None
    }
}
