//! `OutputReceiver`: the client's end of proc output
//! ([`hyperactor_mesh::output::sink::OutputQueue`]), bound for Python.
//!
//! `OutputReceiver.install()` makes this process's agent queue the output batches it
//! receives instead of printing them; one Python thread then loops on `next()`, which
//! blocks without the GIL and returns text already formatted (prefixed, aggregated),
//! and writes it through `sys.stdout` / `sys.stderr`.

use std::sync::Arc;

use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::output::sink::{Mode, Next, OutputQueue};
use hyperactor_mesh::output::OutputStream;
use pyo3::prelude::*;

use crate::agent::{duration, process_agent};
use crate::runtime::{block_on, detach};

/// The client's output queue; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "OutputReceiver", frozen)]
pub struct PyOutputReceiver {
    queue: Arc<OutputQueue>,
    agent: ProcAgent,
}

impl std::fmt::Debug for PyOutputReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputReceiver({})", self.agent.id())
    }
}

#[pymethods]
impl PyOutputReceiver {
    /// Makes this process's agent queue the output of the procs spawned from this
    /// process (instead of printing it on fds 1 and 2); lines are shown as
    /// `[mesh rank] text` when `prefix` is set.
    #[staticmethod]
    #[pyo3(signature = (prefix = true))]
    fn install(prefix: bool) -> PyResult<Self> {
        let agent = process_agent()?.clone();
        let queue = Arc::new(OutputQueue::new(prefix));
        let sink = Arc::clone(&queue);
        agent.set_output_sink(Arc::new(move |batch| sink.push(batch)));
        Ok(Self { queue, agent })
    }

    /// For the writer thread: marks the text the previous call returned as written and
    /// waits, without the GIL, for more. Returns `(is_stderr, text)` runs; an empty
    /// list after `timeout` seconds; `None` once the receiver is closed.
    #[pyo3(signature = (timeout = None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Vec<(bool, String)>>> {
        let timeout = timeout.map(|t| duration("timeout", t)).transpose()?;
        let queue = Arc::clone(&self.queue);
        Ok(match detach(py, move || queue.next(timeout)) {
            Next::Chunk(runs) => Some(
                runs.into_iter()
                    .map(|(stream, text)| (stream == OutputStream::Stderr, text))
                    .collect(),
            ),
            Next::Timeout => Some(Vec::new()),
            Next::Closed => None,
        })
    }

    /// Sets how the output of proc mesh `mesh_id` is shown: not at all unless `stream`;
    /// similar lines aggregated over windows of `aggregate_window` seconds if given.
    #[pyo3(signature = (mesh_id, stream, aggregate_window = None))]
    fn set_mode(&self, mesh_id: u64, stream: bool, aggregate_window: Option<f64>) -> PyResult<()> {
        let aggregate = aggregate_window
            .map(|w| duration("aggregate_window", w))
            .transpose()?;
        self.queue.set_mode(mesh_id, Mode { stream, aggregate });
        Ok(())
    }

    /// How the output of proc mesh `mesh_id` is shown: `(stream, aggregate_window)`.
    fn mode(&self, mesh_id: u64) -> (bool, Option<f64>) {
        let mode = self.queue.mode(mesh_id);
        (mode.stream, mode.aggregate.map(|w| w.as_secs_f64()))
    }

    /// Ends the aggregation windows and waits (at most `timeout` seconds, without the
    /// GIL) until the writer has written what was queued. With `host`, first has this
    /// process's host agent send the output its procs wrote so far. False on timeout.
    #[pyo3(signature = (timeout = 1.0, host = true))]
    fn flush(&self, py: Python<'_>, timeout: f64, host: bool) -> PyResult<bool> {
        let limit = duration("timeout", timeout)?;
        if host && self.agent.is_host() {
            let agent = self.agent.clone();
            block_on(py, "OutputReceiver.flush()", async move {
                let _ = tokio::time::timeout(limit, agent.flush_output()).await;
            })?;
        }
        let queue = Arc::clone(&self.queue);
        Ok(detach(py, move || queue.flush(limit)))
    }

    /// Closes the receiver: the writer's `next()` returns `None` once the queued text
    /// is taken.
    fn close(&self) {
        self.queue.close();
    }
}
