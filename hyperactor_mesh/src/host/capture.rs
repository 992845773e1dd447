//! Capturing a child's output: the host reads the child's stdout and stderr pipes,
//! appends what it reads to the child's log file, cuts it into lines and either puts
//! them on the host's event stream (a spawn that forwards its output, see
//! [`crate::output`]) or prints them, prefixed `[name rank] `, on the host's own stdout
//! and stderr.
//!
//! Each pipe is read by a task of its own until it closes; the child's exit is
//! published only after both closed (bounded by progress, see
//! [`super::PIPE_DRAIN_LIMIT`]), so its last lines come before its exit on the event
//! stream (LOG-2).

use hyperactor::sync::Mutex;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use hyperactor::channel::log_limit::LogLimit;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use crate::host::child::ChildProc;
use crate::host::status::ProcExit;
use crate::output::{files, OutputBatch, OutputLine, OutputOptions, OutputStream, MAX_LINE_BYTES};

/// How much a drain task reads at once.
const READ_CHUNK: usize = 64 * 1024;

static FILE_TROUBLE: LogLimit = LogLimit::per_second();

/// What happened on a host, in the order it happened: the output of procs whose
/// spawn forwards it, and the exits of procs (see [`super::Host::next_event`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum HostEvent {
    /// Lines a proc wrote (a spawn with [`OutputOptions::forward_to`] set).
    Output(ProcOutput),
    /// A proc exited; its output was read to the end first (LOG-2).
    Exit(ProcExit),
}

/// Lines one proc wrote to one of its streams, as the host read them.
#[derive(Debug, Clone)]
pub struct ProcOutput {
    /// The proc name given to the spawn (its proc mesh's name).
    pub name: String,
    /// How the spawn's output is handled (where it is forwarded).
    pub options: Arc<OutputOptions>,
    /// The lines, each with the proc's rank in its proc mesh.
    pub lines: Vec<OutputLine>,
}

impl ProcOutput {
    /// The lines as a batch for the owner.
    pub fn into_batch(self) -> OutputBatch {
        OutputBatch {
            mesh_id: self.options.mesh_id,
            mesh: self.name,
            lines: self.lines,
        }
    }
}

/// The capture of one child's output.
#[derive(Debug)]
pub(crate) struct Capture {
    name: String,
    /// The child's rank in its proc mesh.
    rank: usize,
    options: Arc<OutputOptions>,
    events: mpsc::UnboundedSender<HostEvent>,
    file: Mutex<Option<File>>,
}

impl Capture {
    /// The capture of rank `local_rank` (pid `pid`) of a spawn named `name`; its log
    /// file goes to `log_dir` if the spawn asks for files.
    pub(crate) fn new(
        name: &str,
        local_rank: usize,
        pid: u32,
        options: Arc<OutputOptions>,
        events: mpsc::UnboundedSender<HostEvent>,
        log_dir: Option<&Path>,
    ) -> Self {
        let rank = options.rank_base + local_rank;
        let file = match log_dir {
            Some(dir) if options.files => match files::create(dir, name, rank, pid) {
                Ok((_, file)) => Some(file),
                Err(e) => {
                    if let Some(suppressed) = FILE_TROUBLE.check() {
                        tracing::warn!(
                            suppressed,
                            "cannot write the log file of proc {name} rank {rank}: {e}"
                        );
                    }
                    None
                }
            },
            _ => None,
        };
        Self {
            name: name.to_string(),
            rank,
            options,
            events,
            file: Mutex::new(file),
        }
    }

    fn write_file(&self, bytes: &[u8]) {
        let mut file = self.file.lock();
        if let Some(f) = file.as_mut() {
            if let Err(e) = f.write_all(bytes) {
                if let Some(suppressed) = FILE_TROUBLE.check() {
                    tracing::warn!(
                        suppressed,
                        "stopped writing the log file of proc {} rank {}: {e}",
                        self.name,
                        self.rank
                    );
                }
                *file = None;
            }
        }
    }

    fn emit(&self, stream: OutputStream, texts: Vec<String>) {
        if texts.is_empty() {
            return;
        }
        let lines: Vec<OutputLine> = texts
            .into_iter()
            .map(|text| OutputLine {
                rank: self.rank,
                stream,
                text,
            })
            .collect();
        if self.options.forward_to.is_some() {
            let output = ProcOutput {
                name: self.name.clone(),
                options: Arc::clone(&self.options),
                lines,
            };
            // The host holds the receiver for as long as it lives.
            let _ = self.events.send(HostEvent::Output(output));
        } else {
            OutputBatch {
                mesh_id: self.options.mesh_id,
                mesh: self.name.clone(),
                lines,
            }
            .write_to_terminal();
        }
    }
}

/// Reads `pipe` (the child's `stream`) to its end: see the [module docs](self).
pub(crate) async fn drain(
    mut pipe: impl AsyncRead + Unpin,
    stream: OutputStream,
    capture: Arc<Capture>,
    child: Arc<ChildProc>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        child.pipe_read(n);
        capture.write_file(&buf[..n]);
        partial.extend_from_slice(&buf[..n]);
        let texts = split_lines(&mut partial);
        if stream == OutputStream::Stderr {
            texts.iter().for_each(|t| child.push_stderr(t));
        }
        capture.emit(stream, texts);
    }
    if !partial.is_empty() {
        let text = String::from_utf8_lossy(&partial).into_owned();
        if stream == OutputStream::Stderr {
            child.push_stderr(&text);
        }
        capture.emit(stream, vec![text]);
    }
    child.pipe_closed();
}

/// Takes the complete lines out of `partial` (without their newline, and cut at
/// [`MAX_LINE_BYTES`]); what remains is the start of a line.
fn split_lines(partial: &mut Vec<u8>) -> Vec<String> {
    let mut texts = Vec::new();
    let mut start = 0;
    while start < partial.len() {
        let rest = &partial[start..];
        let end = match rest.iter().position(|&b| b == b'\n') {
            Some(i) if i <= MAX_LINE_BYTES => i,
            _ if rest.len() >= MAX_LINE_BYTES => MAX_LINE_BYTES,
            _ => break,
        };
        let line = &rest[..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        texts.push(String::from_utf8_lossy(line).into_owned());
        let newline = rest.get(end) == Some(&b'\n');
        start += end + usize::from(newline);
    }
    partial.drain(..start);
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_the_rest_kept() {
        let mut partial = b"a\nbc\r\n\nd".to_vec();
        assert_eq!(split_lines(&mut partial), vec!["a", "bc", ""]);
        assert_eq!(partial, b"d");
        partial.extend_from_slice(b"e\n");
        assert_eq!(split_lines(&mut partial), vec!["de"]);
        assert!(partial.is_empty());
    }

    #[test]
    fn long_lines_are_cut() {
        let mut partial = vec![b'x'; MAX_LINE_BYTES * 2 + 3];
        let texts = split_lines(&mut partial);
        assert_eq!(texts.len(), 2);
        assert!(texts.iter().all(|t| t.len() == MAX_LINE_BYTES));
        assert_eq!(partial.len(), 3);
        partial.push(b'\n');
        assert_eq!(split_lines(&mut partial), vec!["xxx"]);
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let mut partial = b"ok \xff\n".to_vec();
        assert_eq!(split_lines(&mut partial), vec!["ok \u{fffd}"]);
    }
}
