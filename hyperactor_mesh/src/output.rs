//! Proc output: what procs write to their stdout and stderr, captured by their host,
//! kept in per-proc log files and forwarded, as messages, to the process that owns them.
//!
//! The path of one line:
//!
//! 1. A proc writes to its stdout or stderr: both are pipes from its host (for a forked
//!    proc too: the fork server passes them on, see [`crate::host`]'s template module).
//! 2. The host reads each pipe as it fills, appends the bytes to the proc's log file
//!    ([`files`]), and cuts them into lines ([`OutputLine`], at most
//!    [`MAX_LINE_BYTES`] each).
//! 3. For a spawn whose [`OutputOptions::forward_to`] is set, the lines become
//!    [`crate::host::HostEvent::Output`] events on the host's event stream, where the
//!    proc's exit will follow them. The host agent batches them (per 10 ms or 1000
//!    lines) into an [`OutputBatch`] per destination and sends it to the owner's agent
//!    (a control message). Without `forward_to` the host prints them, prefixed, on its
//!    own stdout and stderr.
//! 4. The owner's agent hands each batch to its output sink: by default it prints the
//!    lines, prefixed, on its process's stdout and stderr; a Python client installs a
//!    [`sink::OutputQueue`] instead, from which one thread writes them through Python's
//!    `sys.stdout` / `sys.stderr`, with optional aggregation ([`aggregate`]).
//!
//! Invariants:
//!
//! - LOG-1 (order): the lines of one stream of one proc reach the owner in the order the
//!   proc wrote them. Lines of a proc's stdout and of its stderr are two streams; they
//!   are interleaved as the host read them.
//! - LOG-2 (last words first): the host reports a proc's exit only after it read the
//!   proc's pipes to their end (or until nothing arrived on them for
//!   [`crate::host::PIPE_DRAIN_LIMIT`], if a descendant holds them open) and queued the
//!   lines before the exit on the same
//!   event stream. The host agent sends the lines, then the death report, from the
//!   same sender to the same control port, so an owner that watches the proc receives
//!   the proc's last lines before its failure.
//! - LOG-3 (bounded): a line longer than [`MAX_LINE_BYTES`] is cut into pieces; the
//!   client queue holds at most [`sink::MAX_QUEUED_BYTES`] of text and counts what it
//!   drops beyond that.
//!
//! ```
//! use hyperactor_mesh::output::{OutputBatch, OutputLine, OutputStream};
//!
//! let batch = OutputBatch {
//!     mesh_id: 7,
//!     mesh: "trainers".into(),
//!     lines: vec![OutputLine { rank: 1, stream: OutputStream::Stdout, text: "step 3".into() }],
//! };
//! assert_eq!(batch.lines[0].prefixed(&batch.mesh), "[trainers 1] step 3");
//! ```

pub mod aggregate;
pub mod files;
pub mod sink;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Lines of proc output this process dropped (LOG-3), over its life.
static DROPPED_LINES: AtomicU64 = AtomicU64::new(0);

/// How many lines of proc output this process dropped so far (its writer could not
/// keep up, LOG-3).
pub fn dropped_lines() -> u64 {
    DROPPED_LINES.load(Ordering::Relaxed)
}

use hyperactor::PortId;
use serde::{Deserialize, Serialize};

/// The longest line forwarded, in bytes; longer lines are cut into pieces (LOG-3).
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Which stream of a proc a line was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line a proc wrote, without its newline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    /// The proc's rank in its proc mesh (across hosts).
    pub rank: usize,
    /// Where it was written.
    pub stream: OutputStream,
    /// The text (invalid UTF-8 replaced).
    pub text: String,
}

impl OutputLine {
    /// The line as shown to users: `[mesh rank] text`.
    pub fn prefixed(&self, mesh: &str) -> String {
        format!("[{mesh} {}] {}", self.rank, self.text)
    }
}

/// Lines of the procs of one proc mesh, from one host, in the order it read them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputBatch {
    /// The proc mesh's id.
    pub mesh_id: u64,
    /// The proc mesh's name (the prefix of its lines).
    pub mesh: String,
    /// The lines.
    pub lines: Vec<OutputLine>,
}

impl OutputBatch {
    /// Prints the lines, prefixed, on this process's stdout and stderr: one write per
    /// run of lines of one stream (the default sink of an agent).
    pub fn write_to_terminal(&self) {
        for (stream, text) in self.runs(true) {
            let _ = match stream {
                OutputStream::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
                OutputStream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
            };
        }
    }

    /// The lines as runs of one stream each, every line ending in a newline and
    /// prefixed when `prefix` is set.
    pub fn runs(&self, prefix: bool) -> Vec<(OutputStream, String)> {
        let mut runs: Vec<(OutputStream, String)> = Vec::new();
        for line in &self.lines {
            let text = if prefix {
                line.prefixed(&self.mesh)
            } else {
                line.text.clone()
            };
            match runs.last_mut() {
                Some((stream, run)) if *stream == line.stream => {
                    run.push_str(&text);
                    run.push('\n');
                }
                _ => runs.push((line.stream, text + "\n")),
            }
        }
        runs
    }
}

/// How many of the last lines of each proc's stderr its host keeps by default (see
/// [`OutputOptions::tail_lines`]).
pub const DEFAULT_TAIL_LINES: usize = 20;

/// How the host handles the output of one spawn's procs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputOptions {
    /// Where batches of the procs' lines go (an agent's control port); `None`: the
    /// host prints them on its own stdout and stderr.
    pub forward_to: Option<PortId>,
    /// The proc mesh the procs belong to.
    pub mesh_id: u64,
    /// The rank, in the proc mesh, of the spawn's rank 0 (ranks of other hosts come
    /// before).
    pub rank_base: usize,
    /// Whether the host writes a log file per proc ([`files`]).
    pub files: bool,
    /// How many of the last lines of each proc's stderr the host keeps, for the error
    /// of a proc that exits before it is ready (0: none).
    pub tail_lines: usize,
}

impl Default for OutputOptions {
    /// Printed by the host, with log files.
    fn default() -> Self {
        Self {
            forward_to: None,
            mesh_id: 0,
            rank_base: 0,
            files: true,
            tail_lines: DEFAULT_TAIL_LINES,
        }
    }
}

/// What a client asks of the hosts it spawns procs on (see
/// [`crate::host_mesh::HostMesh::spawn_procs_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputConfig {
    /// Forward the procs' output to the spawning process (else each host prints it).
    pub forward: bool,
    /// Write a log file per proc on its host.
    pub files: bool,
    /// How many of the last lines of each proc's stderr its host keeps (see
    /// [`OutputOptions::tail_lines`]).
    pub tail_lines: usize,
}

impl Default for OutputConfig {
    /// Forwarded, with log files.
    fn default() -> Self {
        Self {
            forward: true,
            files: true,
            tail_lines: DEFAULT_TAIL_LINES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(rank: usize, stream: OutputStream, text: &str) -> OutputLine {
        OutputLine {
            rank,
            stream,
            text: text.into(),
        }
    }

    #[test]
    fn runs_group_consecutive_lines_of_one_stream() {
        let batch = OutputBatch {
            mesh_id: 1,
            mesh: "m".into(),
            lines: vec![
                line(0, OutputStream::Stdout, "a"),
                line(1, OutputStream::Stdout, "b"),
                line(0, OutputStream::Stderr, "c"),
                line(0, OutputStream::Stdout, "d"),
            ],
        };
        assert_eq!(
            batch.runs(true),
            vec![
                (OutputStream::Stdout, "[m 0] a\n[m 1] b\n".to_string()),
                (OutputStream::Stderr, "[m 0] c\n".to_string()),
                (OutputStream::Stdout, "[m 0] d\n".to_string()),
            ]
        );
        assert_eq!(batch.runs(false)[0].1, "a\nb\n");
    }
}
