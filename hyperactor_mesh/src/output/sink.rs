//! The client's queue of output: batches from the agent in, text for one writer out.
//!
//! An agent hands every [`OutputBatch`] it receives to its output sink. A client that
//! writes the output itself (Python writes through `sys.stdout` and `sys.stderr`, so
//! that a notebook shows it in the cell that runs) installs an [`OutputQueue`] as the
//! sink and runs one writer thread that calls [`OutputQueue::next`] in a loop and
//! writes what it gets. The queue applies each proc mesh's [`Mode`] (streamed or not,
//! aggregated or not, see [`super::aggregate`]) and formats the lines, so the writer
//! only writes strings.
//!
//! [`OutputQueue::flush`] waits until the writer has written everything queued before
//! the call (ending the aggregation windows now): the client calls it before it reports
//! a failure, so that the failed proc's last lines, which arrived first (LOG-2), are
//! printed first.
//!
//! ```
//! use std::time::Duration;
//! use hyperactor_mesh::output::sink::{Next, OutputQueue};
//! use hyperactor_mesh::output::{OutputBatch, OutputLine, OutputStream};
//!
//! let queue = OutputQueue::new(true);
//! queue.push(OutputBatch {
//!     mesh_id: 1,
//!     mesh: "m".into(),
//!     lines: vec![OutputLine { rank: 0, stream: OutputStream::Stderr, text: "hi".into() }],
//! });
//! match queue.next(Some(Duration::ZERO)) {
//!     Next::Chunk(runs) => assert_eq!(runs, vec![(OutputStream::Stderr, "[m 0] hi\n".to_string())]),
//!     other => panic!("{other:?}"),
//! }
//! ```

use hyperactor::sync::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};

use std::time::{Duration, Instant};

use super::aggregate::Aggregator;
use super::{OutputBatch, OutputStream};

/// The most text the queue holds for its writer; lines beyond it are dropped and
/// counted (LOG-3).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// Text for the writer: runs of lines of one stream each, every line ending in `\n`.
pub type Chunk = Vec<(OutputStream, String)>;

/// How the client shows the output of one proc mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Show it at all (the host still writes the log files).
    pub stream: bool,
    /// Aggregate similar lines over windows of this length.
    pub aggregate: Option<Duration>,
}

impl Default for Mode {
    /// Streamed, line by line.
    fn default() -> Self {
        Self {
            stream: true,
            aggregate: None,
        }
    }
}

/// What [`OutputQueue::next`] returns.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Text to write.
    Chunk(Chunk),
    /// Nothing came within the timeout.
    Timeout,
    /// The queue was closed: the writer should stop.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    chunks: VecDeque<Chunk>,
    bytes: usize,
    modes: HashMap<u64, Mode>,
    aggregators: HashMap<u64, Aggregator>,
    /// Chunks queued so far.
    pushed: u64,
    /// Chunks handed to the writer.
    taken: u64,
    /// Chunks the writer has written.
    written: u64,
    /// Lines dropped and not reported yet.
    dropped: usize,
    closed: bool,
}

impl State {
    fn push(&mut self, chunk: Chunk) {
        if chunk.is_empty() {
            return;
        }
        let size: usize = chunk.iter().map(|(_, t)| t.len()).sum();
        if self.bytes + size > MAX_QUEUED_BYTES {
            let lines = chunk
                .iter()
                .map(|(_, t)| t.matches('\n').count())
                .sum::<usize>();
            self.dropped += lines;
            super::DROPPED_LINES.fetch_add(lines as u64, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        if self.dropped > 0 {
            let notice = format!(
                "[monarch] {} lines of proc output were dropped: this process did not write \
                 them as fast as they came (the full output is in the procs' log files)\n",
                std::mem::take(&mut self.dropped)
            );
            self.enqueue(vec![(OutputStream::Stderr, notice)]);
        }
        self.enqueue(chunk);
    }

    fn enqueue(&mut self, chunk: Chunk) {
        self.bytes += chunk.iter().map(|(_, t)| t.len()).sum::<usize>();
        self.chunks.push_back(chunk);
        self.pushed += 1;
    }

    /// Ends the windows of every aggregator due at `now` (all of them with `None`).
    fn end_windows(&mut self, now: Option<Instant>) {
        let mut due: Vec<(Instant, u64)> = self
            .aggregators
            .iter()
            .filter_map(|(id, a)| a.due().map(|d| (d, *id)))
            .filter(|(d, _)| now.is_none_or(|now| *d <= now))
            .collect();
        due.sort();
        for (_, id) in due {
            if let Some(chunk) = self.aggregators.get_mut(&id).map(Aggregator::take) {
                self.push(chunk);
            }
        }
    }

    fn next_window_end(&self) -> Option<Instant> {
        self.aggregators.values().filter_map(Aggregator::due).min()
    }
}

/// The client's output queue; see the [module docs](self).
#[derive(Debug)]
pub struct OutputQueue {
    prefix: bool,
    state: Mutex<State>,
    changed: Condvar,
}

impl OutputQueue {
    /// An empty queue; lines are shown as `[mesh rank] text` when `prefix` is set.
    pub fn new(prefix: bool) -> Self {
        Self {
            prefix,
            state: Mutex::default(),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Queues the lines of `batch`, as its proc mesh's mode says.
    pub fn push(&self, batch: OutputBatch) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        let mode = state.modes.get(&batch.mesh_id).copied().unwrap_or_default();
        if !mode.stream {
            return;
        }
        match mode.aggregate {
            None => {
                let chunk = batch.runs(self.prefix);
                state.push(chunk);
            }
            Some(window) => {
                let now = Instant::now();
                let agg = state
                    .aggregators
                    .entry(batch.mesh_id)
                    .or_insert_with(|| Aggregator::new(window));
                for line in &batch.lines {
                    let shown = if self.prefix {
                        line.prefixed(&batch.mesh)
                    } else {
                        line.text.clone()
                    };
                    agg.add(now, line.stream, &line.text, shown);
                }
                if agg.held_bytes() > MAX_QUEUED_BYTES / 4 {
                    let chunk = agg.take();
                    state.push(chunk);
                }
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Sets how the output of proc mesh `mesh_id` is shown from now on; lines held for
    /// aggregation under the previous mode are queued first.
    pub fn set_mode(&self, mesh_id: u64, mode: Mode) {
        let mut state = self.lock();
        if let Some(mut agg) = state.aggregators.remove(&mesh_id) {
            let chunk = agg.take();
            state.push(chunk);
        }
        state.modes.insert(mesh_id, mode);
        drop(state);
        self.changed.notify_all();
    }

    /// The mode of proc mesh `mesh_id`.
    pub fn mode(&self, mesh_id: u64) -> Mode {
        self.lock().modes.get(&mesh_id).copied().unwrap_or_default()
    }

    /// For the writer: marks what the previous call returned as written, then waits
    /// (at most `timeout`; `None`: as long as it takes) for the next text to write.
    pub fn next(&self, timeout: Option<Duration>) -> Next {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.lock();
        if state.written != state.taken {
            state.written = state.taken;
            self.changed.notify_all();
        }
        loop {
            if let Some(chunk) = state.chunks.pop_front() {
                state.bytes -= chunk.iter().map(|(_, t)| t.len()).sum::<usize>();
                state.taken += 1;
                return Next::Chunk(chunk);
            }
            let now = Instant::now();
            if state.next_window_end().is_some_and(|end| end <= now) {
                state.end_windows(Some(now));
                continue;
            }
            if state.closed {
                return Next::Closed;
            }
            let wake = match (deadline, state.next_window_end()) {
                (Some(d), Some(w)) => Some(d.min(w)),
                (d, w) => d.or(w),
            };
            state = match wake {
                None => self.changed.wait(state),
                Some(wake) if wake <= now => return Next::Timeout,
                Some(wake) => self.changed.wait_timeout(state, wake - now).0,
            };
        }
    }

    /// Ends every aggregation window now and waits (at most `timeout`) until the writer
    /// has written everything queued before the call. False on timeout (no writer, or
    /// one that is stuck).
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        state.end_windows(None);
        let target = state.pushed;
        self.changed.notify_all();
        while state.written < target && !state.closed {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self.changed.wait_timeout(state, deadline - now).0;
        }
        true
    }

    /// Closes the queue: the writer's next call returns [`Next::Closed`] once the
    /// queued text is taken; later batches are dropped.
    pub fn close(&self) {
        let mut state = self.lock();
        state.end_windows(None);
        state.closed = true;
        drop(state);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputLine;
    use std::sync::Arc;

    fn batch(mesh_id: u64, lines: &[(usize, OutputStream, &str)]) -> OutputBatch {
        OutputBatch {
            mesh_id,
            mesh: format!("m{mesh_id}"),
            lines: lines
                .iter()
                .map(|(rank, stream, text)| OutputLine {
                    rank: *rank,
                    stream: *stream,
                    text: (*text).into(),
                })
                .collect(),
        }
    }

    const OUT: OutputStream = OutputStream::Stdout;
    const ERR: OutputStream = OutputStream::Stderr;

    #[test]
    fn lines_come_out_in_order_with_prefixes() {
        let q = OutputQueue::new(true);
        q.push(batch(1, &[(0, OUT, "a"), (1, ERR, "b")]));
        q.push(batch(1, &[(0, OUT, "c")]));
        assert_eq!(
            q.next(Some(Duration::ZERO)),
            Next::Chunk(vec![(OUT, "[m1 0] a\n".into()), (ERR, "[m1 1] b\n".into())])
        );
        assert_eq!(
            q.next(Some(Duration::ZERO)),
            Next::Chunk(vec![(OUT, "[m1 0] c\n".into())])
        );
        assert_eq!(q.next(Some(Duration::ZERO)), Next::Timeout);
        q.close();
        assert_eq!(q.next(None), Next::Closed);
    }

    #[test]
    fn a_mesh_not_streamed_is_dropped() {
        let q = OutputQueue::new(false);
        q.set_mode(
            2,
            Mode {
                stream: false,
                aggregate: None,
            },
        );
        q.push(batch(2, &[(0, OUT, "hidden")]));
        q.push(batch(3, &[(0, OUT, "shown")]));
        assert_eq!(
            q.next(Some(Duration::ZERO)),
            Next::Chunk(vec![(OUT, "shown\n".into())])
        );
    }

    #[test]
    fn flush_ends_windows_and_waits_for_the_writer() {
        let q = Arc::new(OutputQueue::new(true));
        q.set_mode(
            1,
            Mode {
                stream: true,
                aggregate: Some(Duration::from_secs(3600)),
            },
        );
        for rank in 0..3 {
            q.push(batch(1, &[(rank, OUT, &format!("loss {rank}"))]));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || loop {
                match q.next(None) {
                    Next::Chunk(chunk) => tx.send(chunk).unwrap(),
                    Next::Timeout => {}
                    Next::Closed => return,
                }
            })
        };
        assert!(
            q.flush(Duration::from_secs(10)),
            "the writer took the window"
        );
        assert_eq!(
            rx.try_recv().unwrap(),
            vec![(OUT, "[3 similar log lines] [m1 0] loss 0\n".into())]
        );
        q.close();
        writer.join().unwrap();
    }

    #[test]
    fn a_window_ends_on_its_own() {
        let q = OutputQueue::new(true);
        q.set_mode(
            1,
            Mode {
                stream: true,
                aggregate: Some(Duration::from_millis(1)),
            },
        );
        q.push(batch(1, &[(0, OUT, "x 1"), (1, OUT, "x 2")]));
        // `next` waits for the window's end (no timeout given).
        assert_eq!(
            q.next(None),
            Next::Chunk(vec![(OUT, "[2 similar log lines] [m1 0] x 1\n".into())])
        );
    }

    #[test]
    fn flush_without_a_writer_times_out() {
        let q = OutputQueue::new(true);
        q.push(batch(1, &[(0, OUT, "a")]));
        assert!(!q.flush(Duration::from_millis(1)));
        assert!(
            OutputQueue::new(true).flush(Duration::ZERO),
            "nothing queued: nothing to wait for"
        );
    }

    #[test]
    fn a_full_queue_drops_and_reports() {
        let q = OutputQueue::new(false);
        let big = "x".repeat(MAX_QUEUED_BYTES / 2);
        q.push(batch(1, &[(0, OUT, &big)]));
        q.push(batch(1, &[(0, OUT, &big), (0, OUT, "lost")]));
        q.push(batch(1, &[(0, OUT, "after")]));
        assert!(matches!(q.next(Some(Duration::ZERO)), Next::Chunk(_)));
        match q.next(Some(Duration::ZERO)) {
            Next::Chunk(c) => assert!(c[0].1.contains("2 lines of proc output were dropped")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            q.next(Some(Duration::ZERO)),
            Next::Chunk(vec![(OUT, "after\n".into())])
        );
    }
}
