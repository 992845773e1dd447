//! [`RecordedSource`]: a [`Source`] over a recorded job (a JSON file with the keys
//! `summary`, `snapshot`, `events`, `logs` and `series`), for tests, for developing the
//! page and the terminal UI, and for opening a job after the fact.

use hyperactor::sync::Mutex;
use std::path::Path;

use std::time::Duration;

use futures::future::BoxFuture;
use futures::future::FutureExt;
use serde_json::json;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::AdminError;
use crate::LogQuery;
use crate::Source;
use crate::SourceError;

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
}

/// A recorded job served as if it were live. Events can be added with
/// [`RecordedSource::publish`]; kill requests are only recorded.
#[derive(Debug)]
pub struct RecordedSource {
    summary: Value,
    snapshot: Value,
    events: Mutex<Vec<Value>>,
    logs: Vec<Value>,
    series: Value,
    sender: broadcast::Sender<Value>,
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
    /// A [`RecordError`] naming the missing or malformed key.
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
        let (sender, _) = broadcast::channel(1024);
        Ok(RecordedSource {
            summary,
            snapshot,
            events: Mutex::new(events.as_array().cloned().unwrap_or_default()),
            logs: logs.as_array().cloned().unwrap_or_default(),
            series,
            sender,
            killed: Mutex::new(Vec::new()),
        })
    }

    /// Appends `event` (its `seq` set to the next one) and sends it to subscribers.
    /// Returns the seq given.
    pub fn publish(&self, mut event: Value) -> u64 {
        let mut events = self.events.lock();
        let seq = events.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0) + 1;
        if let Some(object) = event.as_object_mut() {
            object.insert("seq".into(), json!(seq));
        }
        events.push(event.clone());
        // No subscriber is not an error: the event is kept for `events_since`.
        let _ = self.sender.send(event);
        seq
    }

    /// The procs [`Source::kill_proc`] was asked to kill, in order.
    pub fn killed(&self) -> Vec<String> {
        self.killed.lock().clone()
    }

    fn proc_of_actor(&self, actor: &str) -> Option<String> {
        self.snapshot["actors"]
            .as_array()?
            .iter()
            .find(|a| a["id"] == actor)
            .and_then(|a| a["proc"].as_str().map(String::from))
    }

    fn proc_record(&self, proc: &str) -> Option<&Value> {
        self.snapshot["procs"]
            .as_array()?
            .iter()
            .find(|p| p["id"] == proc)
    }
}

impl Source for RecordedSource {
    fn snapshot(&self, _timeout: Duration) -> BoxFuture<'static, Result<Value, SourceError>> {
        futures::future::ready(Ok(self.snapshot.clone())).boxed()
    }

    fn events_since(&self, since: u64, limit: usize) -> Vec<Value> {
        let events = self.events.lock();
        events
            .iter()
            .filter(|e| e["seq"].as_u64().unwrap_or(0) > since)
            .take(limit)
            .cloned()
            .collect()
    }

    fn subscribe(&self) -> broadcast::Receiver<Value> {
        self.sender.subscribe()
    }

    fn logs(&self, q: &LogQuery) -> Vec<Value> {
        let actor_proc = q.actor.as_deref().map(|a| self.proc_of_actor(a));
        if let Some(None) = actor_proc {
            return Vec::new();
        }
        let matching: Vec<&Value> = self
            .logs
            .iter()
            .filter(|r| q.proc.as_deref().is_none_or(|p| r["proc"] == p))
            .filter(|r| match &actor_proc {
                Some(Some(p)) => r["proc"] == p.as_str(),
                _ => true,
            })
            .filter(|r| q.matches_text(r["line"].as_str().unwrap_or("")))
            .collect();
        let skip = matching.len().saturating_sub(q.limit);
        matching.into_iter().skip(skip).cloned().collect()
    }

    fn stack(
        &self,
        proc: &str,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<Value, SourceError>> {
        let result = match self.proc_record(proc) {
            Some(record) => Ok(json!({
                "proc": proc,
                "pid": record["pid"],
                "method": "faulthandler",
                "text": "this job is a recording: it has no live threads to dump\n",
            })),
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

    fn describe(&self) -> Value {
        let mut out = serde_json::Map::new();
        for key in ["session", "program", "pid", "started_at", "now"] {
            if let Some(v) = self.summary.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        if let Some(rate) = self.summary["messages"].get("rate") {
            out.insert("rate".into(), rate.clone());
        }
        Value::Object(out)
    }

    fn recorded_series(&self) -> Option<Value> {
        Some(self.series.clone())
    }
}
