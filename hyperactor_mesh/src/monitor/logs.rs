//! The logs ring: the last lines of each proc whose output reaches this process (the
//! client's agent receives its procs' output, [`crate::output`]), at most
//! [`LINES_PER_PROC`] lines and [`BYTES_PER_PROC`] bytes per proc, and a query over them.

use hyperactor::sync::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Lines kept per proc.
pub const LINES_PER_PROC: usize = 2_000;
/// Bytes of text kept per proc.
pub const BYTES_PER_PROC: usize = 1 << 20;

/// One line of a proc's output (the API's log record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// When it arrived here (Unix seconds).
    pub time: f64,
    /// The proc's id.
    pub proc: String,
    /// Its rank in its proc mesh.
    pub rank: usize,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The text.
    pub line: String,
}

/// Which lines [`query`] returns: `GET /v1/logs`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    /// A substring of the line (case-insensitive); empty or `None` matches all.
    pub text: Option<String>,
    /// Only this proc's lines.
    pub proc: Option<String>,
    /// Only the lines of this actor's proc (an actor id: its proc's id, `/`, its name
    /// and rank).
    pub actor: Option<String>,
    /// At most this many, the newest.
    pub limit: usize,
}

impl LogQuery {
    /// The limit of a query that names none.
    pub const DEFAULT_LIMIT: usize = 200;

    /// Whether `line` holds the query's text (case-insensitive).
    pub fn matches_text(&self, line: &str) -> bool {
        match self.text.as_deref() {
            None | Some("") => true,
            Some(text) => line.to_lowercase().contains(&text.to_lowercase()),
        }
    }

    /// The proc whose lines are asked for: `proc`, else the proc of `actor`.
    pub fn proc_asked(&self) -> Option<&str> {
        self.proc.as_deref().or_else(|| {
            self.actor
                .as_deref()?
                .rsplit_once('/')
                .map(|(proc, _)| proc)
        })
    }
}

impl Default for LogQuery {
    fn default() -> Self {
        Self {
            text: None,
            proc: None,
            actor: None,
            limit: Self::DEFAULT_LIMIT,
        }
    }
}

#[derive(Default)]
struct ProcLines {
    lines: VecDeque<LogRecord>,
    bytes: usize,
}

#[derive(Default)]
struct Logs {
    procs: HashMap<String, ProcLines>,
    /// Lines evicted so far.
    dropped: u64,
}

fn logs() -> &'static Mutex<Logs> {
    static LOGS: OnceLock<Mutex<Logs>> = OnceLock::new();
    LOGS.get_or_init(Mutex::default)
}

/// Keeps `records` (lines of procs, in arrival order), dropping each proc's oldest
/// lines past the bounds.
pub fn record(records: impl IntoIterator<Item = LogRecord>) {
    let mut logs = logs().lock();
    let mut dropped = 0;
    for record in records {
        let entry = logs.procs.entry(record.proc.clone()).or_default();
        entry.bytes += record.line.len();
        entry.lines.push_back(record);
        while entry.lines.len() > LINES_PER_PROC || entry.bytes > BYTES_PER_PROC {
            match entry.lines.pop_front() {
                Some(old) => {
                    entry.bytes -= old.line.len();
                    dropped += 1;
                }
                None => break,
            }
        }
    }
    logs.dropped += dropped;
}

/// The lines matching `q`, oldest first (newest last), at most its limit.
pub fn query(q: &LogQuery) -> Vec<LogRecord> {
    let logs = logs().lock();
    let matches = |r: &&LogRecord| q.matches_text(&r.line);
    let mut out: Vec<LogRecord> = match q.proc_asked() {
        Some(proc) => logs
            .procs
            .get(proc)
            .map(|p| p.lines.iter().filter(matches).cloned().collect())
            .unwrap_or_default(),
        None => logs
            .procs
            .values()
            .flat_map(|p| p.lines.iter().filter(matches).cloned())
            .collect(),
    };
    out.sort_by(|a, b| a.time.total_cmp(&b.time));
    let skip = out.len().saturating_sub(q.limit);
    out.drain(..skip);
    out
}

/// Lines evicted from the ring so far (older lines pushed out by newer ones).
pub fn evicted() -> u64 {
    logs().lock().dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(proc: &str, time: f64, text: &str) -> LogRecord {
        LogRecord {
            time,
            proc: proc.to_string(),
            rank: 0,
            stream: "stdout".to_string(),
            line: text.to_string(),
        }
    }

    #[test]
    fn bounded_and_queried() {
        record((0..LINES_PER_PROC + 10).map(|i| line("logs-test-a", i as f64, &format!("a {i}"))));
        record([line("logs-test-b", 5.5, "Hello World")]);
        let a = query(&LogQuery {
            proc: Some("logs-test-a".into()),
            limit: usize::MAX,
            ..Default::default()
        });
        assert_eq!(a.len(), LINES_PER_PROC);
        assert_eq!(a[0].line, "a 10");
        let hits = query(&LogQuery {
            text: Some("hello".into()),
            ..Default::default()
        });
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].proc, "logs-test-b");
        let last = query(&LogQuery {
            proc: Some("logs-test-a".into()),
            limit: 2,
            ..Default::default()
        });
        let texts: Vec<&str> = last.iter().map(|r| r.line.as_str()).collect();
        let n = LINES_PER_PROC + 10;
        assert_eq!(texts, [format!("a {}", n - 2), format!("a {}", n - 1)]);
        assert!(evicted() >= 10);
    }
}
