//! Aggregation of similar lines across ranks.
//!
//! With an aggregation window, the client does not print each line as it arrives: it
//! collects a window's lines of one proc mesh, groups those that are the same once
//! numbers are masked ([`mask_numbers`]; `step 3 loss 0.25` and `step 4 loss 0.5`
//! are similar), and at the end of the window prints each group once, in the order
//! of its first line: a line alone as it is, a group of `N` as
//! `[N similar log lines] <its first line>`. The window starts with the first line
//! after the previous one ended.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use hyperactor_mesh::output::aggregate::Aggregator;
//! use hyperactor_mesh::output::OutputStream;
//!
//! let mut agg = Aggregator::new(Duration::from_secs(1));
//! let now = Instant::now();
//! for rank in 0..4 {
//!     let text = format!("rank {rank} ready");
//!     agg.add(now, OutputStream::Stdout, &text, format!("[m {rank}] {text}"));
//! }
//! assert_eq!(agg.due(), Some(now + Duration::from_secs(1)));
//! let out = agg.take();
//! assert_eq!(out, vec![(OutputStream::Stdout, "[4 similar log lines] [m 0] rank 0 ready\n".to_string())]);
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::OutputStream;

/// `text` with every run of ASCII digits replaced by `<N>`: the key lines are grouped
/// by.
pub fn mask_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push_str("<N>");
                in_number = true;
            }
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

#[derive(Debug)]
struct Group {
    stream: OutputStream,
    first: String,
    count: usize,
}

/// The lines of one window of one proc mesh; see the [module docs](self).
#[derive(Debug)]
pub struct Aggregator {
    window: Duration,
    started: Option<Instant>,
    groups: Vec<Group>,
    index: HashMap<(OutputStream, String), usize>,
    bytes: usize,
}

impl Aggregator {
    /// An empty aggregator with windows of `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            started: None,
            groups: Vec::new(),
            index: HashMap::new(),
            bytes: 0,
        }
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Adds a line received at `now`: `text` is what is compared (without prefix),
    /// `shown` what is printed (the prefixed line, without newline).
    pub fn add(&mut self, now: Instant, stream: OutputStream, text: &str, shown: String) {
        self.started.get_or_insert(now);
        let key = (stream, mask_numbers(text));
        match self.index.get(&key) {
            Some(&i) => self.groups[i].count += 1,
            None => {
                self.bytes += shown.len();
                self.index.insert(key, self.groups.len());
                self.groups.push(Group {
                    stream,
                    first: shown,
                    count: 1,
                });
            }
        }
    }

    /// When the current window ends (`None` when no line is held).
    pub fn due(&self) -> Option<Instant> {
        self.started.map(|s| s + self.window)
    }

    /// The bytes of text held.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Ends the window: the groups as runs of one stream each (see the module docs).
    pub fn take(&mut self) -> Vec<(OutputStream, String)> {
        self.started = None;
        self.index.clear();
        self.bytes = 0;
        let mut runs: Vec<(OutputStream, String)> = Vec::new();
        for group in self.groups.drain(..) {
            let line = if group.count == 1 {
                group.first
            } else {
                format!("[{} similar log lines] {}", group.count, group.first)
            };
            match runs.last_mut() {
                Some((stream, run)) if *stream == group.stream => {
                    run.push_str(&line);
                    run.push('\n');
                }
                _ => runs.push((group.stream, line + "\n")),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_masked() {
        assert_eq!(
            mask_numbers("step 12 loss 0.25 at 10:03"),
            "step <N> loss <N>.<N> at <N>:<N>"
        );
        assert_eq!(mask_numbers("no digits"), "no digits");
    }

    #[test]
    fn groups_keep_first_appearance_order_and_streams_apart() {
        let mut agg = Aggregator::new(Duration::from_millis(10));
        let now = Instant::now();
        assert_eq!(agg.due(), None);
        agg.add(now, OutputStream::Stdout, "a 1", "[m 0] a 1".into());
        agg.add(now, OutputStream::Stderr, "a 1", "[m 0] a 1".into());
        agg.add(now, OutputStream::Stdout, "b", "[m 0] b".into());
        agg.add(now, OutputStream::Stdout, "a 2", "[m 1] a 2".into());
        assert_eq!(
            agg.take(),
            vec![
                (
                    OutputStream::Stdout,
                    "[2 similar log lines] [m 0] a 1\n".into()
                ),
                (OutputStream::Stderr, "[m 0] a 1\n".into()),
                (OutputStream::Stdout, "[m 0] b\n".into()),
            ]
        );
        assert_eq!(agg.due(), None, "a new window starts with the next line");
        assert!(agg.take().is_empty());
    }
}
