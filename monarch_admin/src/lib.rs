//! The admin HTTP server of a Monarch job.
//!
//! It serves, under one base URL, the JSON API (version 1) a dashboard and a terminal UI
//! read, a Server-Sent Events stream of the job's events, Prometheus metrics at
//! `/metrics`, and the dashboard page itself (embedded in the binary). The contract is
//! `MONITORING_SPEC.md`: section 1 (routes and records), 2 (security) and 3 (metric
//! names).
//!
//! The server's only input is a [`Source`], so it runs against a live job
//! ([`LiveSource`], over the mesh layer) or a recorded one ([`RecordedSource`]). A source
//! answers with the typed records of [`hyperactor_mesh::monitor`] ([`Snapshot`],
//! [`Event`], [`LogRecord`], [`StackDump`]); they become JSON only where a response body
//! or an event-stream message is written. It runs on the caller's tokio runtime, so it
//! answers while the Python interpreter is busy.
//!
//! ```no_run
//! # async fn demo() -> Result<(), monarch_admin::AdminError> {
//! use std::sync::Arc;
//! use monarch_admin::{AdminConfig, AdminServer, RecordedSource};
//!
//! let source = Arc::new(RecordedSource::from_file("recorded.json".as_ref())?);
//! let server = AdminServer::start(AdminConfig::default(), source)?;
//! println!("dashboard: {}", server.url());
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod auth;
mod config;
mod http;
mod live;
mod metrics;
mod recorded;
mod routes;
mod series;
mod server;
mod snapshot;
mod sse;
mod static_files;

use std::time::Duration;

use futures::future::BoxFuture;

pub use crate::config::AdminConfig;
pub use crate::config::AdminError;
pub use crate::live::LiveSource;
pub use crate::metrics::render_metrics;
pub use crate::recorded::RecordError;
pub use crate::recorded::RecordedSource;
pub use crate::series::SeriesPoint;
pub use crate::server::AdminServer;

/// A log query: what `GET /v1/logs` asks a [`Source`] for.
pub use hyperactor_mesh::monitor::LogQuery;
/// The records a [`Source`] answers with (the API's shapes, version 1).
pub use hyperactor_mesh::monitor::{Event, LogRecord, Snapshot, StackDump};

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
    Monitor(#[from] hyperactor_mesh::monitor::MonitorError),
    /// A source of another kind could not answer: the message says why.
    #[error("{0}")]
    Unavailable(String),
}

/// What the server serves: the job's state, events, logs and actions. The runtime
/// implements it for a live job; [`RecordedSource`] for a recorded one.
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
