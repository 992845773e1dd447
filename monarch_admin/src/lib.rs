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
mod source;
mod sse;
mod static_files;

pub use crate::config::AdminConfig;
pub use crate::config::AdminError;
pub use crate::live::LiveSource;
pub use crate::metrics::render_metrics;
pub use crate::recorded::RecordError;
pub use crate::recorded::RecordedSource;
pub use crate::server::AdminServer;
pub use crate::source::JobInfo;
pub use crate::source::SeriesPoint;
pub use crate::source::Source;
pub use crate::source::SourceError;

/// A log query: what `GET /v1/logs` asks a [`Source`] for.
pub use hyperactor_mesh::monitor::LogQuery;
/// The records a [`Source`] answers with (the API's shapes, version 1).
pub use hyperactor_mesh::monitor::{Event, LogRecord, Snapshot, StackDump};
