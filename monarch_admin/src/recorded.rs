//! [`RecordedSource`]: a [`Source`] over a recorded job (a JSON file with the keys
//! `summary`, `snapshot`, `events`, `logs` and `series`), for tests, for developing the
//! page and the terminal UI, and for opening a job after the fact. The recording is
//! read into the API's records when it is loaded: one that does not hold them is
//! refused then, naming the key.

use hyperactor::sync::Mutex;
use std::path::Path;

use std::time::Duration;

use futures::future::BoxFuture;
use futures::future::FutureExt;
use hyperactor_mesh::monitor::{Event, LogQuery, LogRecord, Snapshot, StackDump};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::config::AdminError;
use crate::source::{JobInfo, SeriesPoint, Source, SourceError};

/// Why a JSON value is not a recording ([`RecordedSource::from_value`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A top-level key is missing.
    #[error("the key {key:?} is missing")]
    MissingKey {
        /// The key (`summary`, `snapshot`, `events`, `logs` or `series`).
        key: &'static str,
    },
    /// A top-level key holds the wrong kind of value.
    #[error("{key:?} is not {expected}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// What it must hold: `an object` or `an array`.
        expected: &'static str,
    },
    /// A top-level key holds a value of the right kind that is not the record it must
    /// be (a field missing or of the wrong type, an unknown status).
    #[error(
        "{key:?} is not {expected}: {reason}; expected the shape GET /v1/{route} answers; \
         fix that part of the recording"
    )]
    Invalid {
        /// The key.
        key: &'static str,
        /// What it must hold (`a snapshot`, `a list of events`, ...).
        expected: &'static str,
        /// The route whose answer shows the shape.
        route: &'static str,
        /// Why it does not parse (serde's message, with the line and column).
        reason: String,
    },
}

/// The `summary` of a recording: the fields [`Source::describe`] answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RecordedSummary {
    session: Option<String>,
    program: Option<String>,
    pid: Option<u32>,
    started_at: Option<f64>,
    now: Option<f64>,
    messages: RecordedMessages,
}

/// The `messages` of a recording's summary.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RecordedMessages {
    rate: Option<f64>,
}

/// The `series` of a recording.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RecordedSeries {
    points: Vec<SeriesPoint>,
}

/// `value` (under `key`) as a `T`, or [`RecordError::Invalid`].
fn parse<T: DeserializeOwned>(
    key: &'static str,
    expected: &'static str,
    route: &'static str,
    value: Value,
) -> Result<T, RecordError> {
    serde_json::from_value(value).map_err(|e| RecordError::Invalid {
        key,
        expected,
        route,
        reason: e.to_string(),
    })
}

/// A recorded job served as if it were live. Events can be added with
/// [`RecordedSource::publish`]; kill requests are only recorded.
#[derive(Debug)]
pub struct RecordedSource {
    info: JobInfo,
    snapshot: Snapshot,
    events: Mutex<Vec<Event>>,
    logs: Vec<LogRecord>,
    series: Vec<SeriesPoint>,
    sender: broadcast::Sender<Event>,
    killed: Mutex<Vec<String>>,
}

impl RecordedSource {
    /// Reads a recording from `path`.
    ///
    /// # Errors
    ///
    /// [`AdminError::Recorded`] if the file cannot be read or does not hold a recording.
    pub fn from_file(path: &Path) -> Result<RecordedSource, AdminError> {
        let bad = |problem: String| AdminError::Recorded {
            path: path.to_path_buf(),
            problem,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("it is not valid JSON: {e}")))?;
        RecordedSource::from_value(value).map_err(|e| bad(e.to_string()))
    }

    /// A recording from its JSON value.
    ///
    /// # Errors
    ///
    /// A [`RecordError`] naming the missing or malformed key: every key is checked to
    /// be there and of the right kind first, then read into its records.
    pub fn from_value(mut value: Value) -> Result<RecordedSource, RecordError> {
        let mut take = |key: &'static str, object: bool| -> Result<Value, RecordError> {
            let v = value
                .get_mut(key)
                .map(Value::take)
                .ok_or(RecordError::MissingKey { key })?;
            let ok = if object { v.is_object() } else { v.is_array() };
            if !ok {
                return Err(RecordError::WrongType {
                    key,
                    expected: if object { "an object" } else { "an array" },
                });
            }
            Ok(v)
        };
        let summary = take("summary", true)?;
        let snapshot = take("snapshot", true)?;
        let events = take("events", false)?;
        let logs = take("logs", false)?;
        let series = take("series", true)?;
        let summary: RecordedSummary = parse("summary", "a summary", "summary", summary)?;
        let snapshot: Snapshot = parse("snapshot", "a snapshot", "snapshot", snapshot)?;
        let events: Vec<Event> = parse("events", "a list of events", "events", events)?;
        let logs: Vec<LogRecord> = parse("logs", "a list of log records", "logs", logs)?;
        let series: RecordedSeries = parse("series", "a series", "series", series)?;
        let (sender, _) = broadcast::channel(1024);
        Ok(RecordedSource {
            info: JobInfo {
                session: summary.session,
                program: summary.program,
                pid: summary.pid,
                started_at: summary.started_at,
                now: summary.now,
                rate: summary.messages.rate,
            },
            snapshot,
            events: Mutex::new(events),
            logs,
            series: series.points,
            sender,
            killed: Mutex::new(Vec::new()),
        })
    }

    /// Appends `event` (its `seq` set to the next one) and sends it to subscribers.
    /// Returns the seq given.
    pub fn publish(&self, mut event: Event) -> u64 {
        let mut events = self.events.lock();
        let seq = events.last().map_or(0, |e| e.seq) + 1;
        event.seq = seq;
        events.push(event.clone());
        // No subscriber is not an error: the event is kept for `events_since`.
        let _ = self.sender.send(event);
        seq
    }

    /// The procs [`Source::kill_proc`] was asked to kill, in order.
    pub fn killed(&self) -> Vec<String> {
        self.killed.lock().clone()
    }

    fn proc_of_actor(&self, actor: &str) -> Option<&str> {
        self.snapshot
            .actors
            .iter()
            .find(|a| a.id == actor)
            .map(|a| a.proc.as_str())
    }

    fn proc_record(&self, proc: &str) -> Option<&hyperactor_mesh::monitor::ProcRecord> {
        self.snapshot.procs.iter().find(|p| p.id == proc)
    }
}

impl Source for RecordedSource {
    fn snapshot(&self, _timeout: Duration) -> BoxFuture<'static, Result<Snapshot, SourceError>> {
        futures::future::ready(Ok(self.snapshot.clone())).boxed()
    }

    fn events_since(&self, since: u64, limit: usize) -> Vec<Event> {
        let events = self.events.lock();
        events
            .iter()
            .filter(|e| e.seq > since)
            .take(limit)
            .cloned()
            .collect()
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    fn logs(&self, q: &LogQuery) -> Vec<LogRecord> {
        let actor_proc = q.actor.as_deref().map(|a| self.proc_of_actor(a));
        if let Some(None) = actor_proc {
            return Vec::new();
        }
        let matching: Vec<&LogRecord> = self
            .logs
            .iter()
            .filter(|r| q.proc.as_deref().is_none_or(|p| r.proc == p))
            .filter(|r| match actor_proc {
                Some(Some(p)) => r.proc == p,
                _ => true,
            })
            .filter(|r| q.matches_text(&r.line))
            .collect();
        let skip = matching.len().saturating_sub(q.limit);
        matching.into_iter().skip(skip).cloned().collect()
    }

    fn stack(
        &self,
        proc: &str,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<StackDump, SourceError>> {
        let result = match self.proc_record(proc) {
            Some(record) => Ok(StackDump {
                proc: proc.to_string(),
                // A recorded proc without a pid (it never started) shows 0.
                pid: record.pid.unwrap_or(0),
                method: "faulthandler".to_string(),
                text: "this job is a recording: it has no live threads to dump\n".to_string(),
            }),
            None => Err(SourceError::UnknownProc {
                proc: proc.to_string(),
                place: "the recording".to_string(),
            }),
        };
        futures::future::ready(result).boxed()
    }

    fn kill_proc(&self, proc: &str) -> BoxFuture<'static, Result<(), SourceError>> {
        let result = if self.proc_record(proc).is_some() {
            self.killed.lock().push(proc.to_string());
            Ok(())
        } else {
            Err(SourceError::UnknownProc {
                proc: proc.to_string(),
                place: "the recording".to_string(),
            })
        };
        futures::future::ready(result).boxed()
    }

    fn describe(&self) -> JobInfo {
        self.info.clone()
    }

    fn recorded_series(&self) -> Option<Vec<SeriesPoint>> {
        Some(self.series.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Result<Value, Box<dyn std::error::Error>> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/monitoring/fixtures/recorded.json");
        Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
    }

    /// The recording's records read into the typed ones write back as the same JSON.
    #[test]
    fn the_recording_round_trips() -> Result<(), Box<dyn std::error::Error>> {
        let recorded = fixture()?;
        let source = RecordedSource::from_value(recorded.clone())?;
        assert_eq!(
            serde_json::to_value(&source.snapshot)?,
            recorded["snapshot"]
        );
        assert_eq!(
            serde_json::to_value(&*source.events.lock())?,
            recorded["events"]
        );
        assert_eq!(serde_json::to_value(&source.logs)?, recorded["logs"]);
        assert_eq!(source.info.pid, Some(4000));
        assert_eq!(source.info.rate, Some(4.2));
        assert_eq!(source.series.len(), 120);
        Ok(())
    }

    #[test]
    fn a_bad_record_names_its_key() -> Result<(), Box<dyn std::error::Error>> {
        let mut recorded = fixture()?;
        recorded["snapshot"]["procs"][0]["status"] = "sleeping".into();
        let err = RecordedSource::from_value(recorded)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&err, RecordError::Invalid { key: "snapshot", reason, .. }
                if reason.contains("sleeping")),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("\"snapshot\" is not a snapshot: "),
            "{err}"
        );
        Ok(())
    }
}
