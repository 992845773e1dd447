//! Monitoring for Python (tests, the CLI, the admin server's Python glue): thin
//! wrappers over [`hyperactor_mesh::monitor`] and this process's agent, answering JSON
//! strings in the shapes of the monitoring API (version 1).

use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::monitor::{self, events, stack, Event, LogQuery};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::agent::process_agent;
use crate::runtime::runtime;

fn json<T: serde::Serialize>(value: &T) -> PyResult<String> {
    monitor::to_json(value).map_err(failed)
}

/// A monitoring error as Python's `RuntimeError`, with its message.
fn failed(error: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(error.to_string())
}

fn seconds(timeout_s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout_s)
        .map_err(|_| PyValueError::new_err(format!("timeout_s must be >= 0, not {timeout_s}")))
}

fn proc_id(proc: &str) -> PyResult<ProcId> {
    proc.parse()
        .map_err(|e| PyValueError::new_err(format!("not a proc id: {proc:?}: {e}")))
}

/// A snapshot of every host, proc, mesh and actor this process knows (JSON).
#[pyfunction]
pub fn monitor_snapshot(py: Python<'_>, timeout_s: f64) -> PyResult<String> {
    let agent = process_agent()?.clone();
    let timeout = seconds(timeout_s)?;
    let rt = runtime()?;
    let snapshot = py.detach(|| rt.block_on(agent.monitor_snapshot(timeout)));
    json(&snapshot)
}

/// The events with `seq > since`, oldest first, at most `limit` (JSON
/// `{"version", "items", "next"}`).
#[pyfunction]
#[pyo3(signature = (since=0, limit=1000))]
pub fn monitor_events(since: u64, limit: usize) -> PyResult<String> {
    monitor::events_json(since, limit).map_err(failed)
}

/// The kept log lines matching `q` (case-insensitive) and `proc`, newest last (JSON
/// `{"version", "items"}`).
#[pyfunction]
#[pyo3(signature = (q=None, proc=None, limit=200))]
pub fn monitor_logs(q: Option<String>, proc: Option<String>, limit: usize) -> PyResult<String> {
    monitor::logs_json(&LogQuery {
        text: q,
        proc,
        actor: None,
        limit,
    })
    .map_err(failed)
}

/// The stacks of every thread of `proc` (JSON `{proc, pid, method, text}`).
#[pyfunction]
pub fn monitor_stack(py: Python<'_>, proc: &str, timeout_s: f64) -> PyResult<String> {
    let agent = process_agent()?.clone();
    let proc = proc_id(proc)?;
    let timeout = seconds(timeout_s)?;
    let rt = runtime()?;
    let dump = py
        .detach(|| rt.block_on(agent.stack_dump(&proc, timeout)))
        .map_err(failed)?;
    json(&dump)
}

/// Kills `proc` through its host (an admin action).
#[pyfunction]
#[pyo3(signature = (proc, reason=None))]
pub fn monitor_kill_proc(proc: &str, reason: Option<String>) -> PyResult<()> {
    let reason = reason.unwrap_or_else(|| "killed from the admin".to_string());
    let agent = process_agent()?;
    let proc = proc_id(proc)?;
    let _guard = runtime()?.enter();
    agent.kill_proc(&proc, &reason).map_err(failed)
}

/// Records an event (`breakpoint`, say); returns its sequence number.
#[pyfunction]
#[pyo3(signature = (kind, message, mesh=None, actor=None, proc=None, rank=None))]
pub fn monitor_record_event(
    kind: &str,
    message: &str,
    mesh: Option<String>,
    actor: Option<String>,
    proc: Option<String>,
    rank: Option<usize>,
) -> u64 {
    let mut event = Event::new(kind, message);
    event.mesh = mesh;
    event.actor = actor;
    event.proc = proc;
    event.rank = rank;
    events::record(event)
}

/// The file descriptor `faulthandler.register` should write to, and the signal to
/// register it on: `(fd, signal)`.
#[pyfunction]
pub fn monitor_stack_fd() -> PyResult<(i32, i32)> {
    let fd = stack::faulthandler_fd().map_err(failed)?;
    Ok((fd, stack::STACK_SIGNAL))
}

/// Adds the monitoring functions to the module.
///
/// # Errors
///
/// If adding one fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(monitor_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_events, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_logs, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_stack, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_kill_proc, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_record_event, m)?)?;
    m.add_function(wrap_pyfunction!(monitor_stack_fd, m)?)?;
    Ok(())
}
