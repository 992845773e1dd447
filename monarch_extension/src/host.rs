//! `Host` and `BootChild`: the host agent ([`hyperactor_mesh::host`]) and the child side
//! of a proc's bootstrap ([`hyperactor_mesh::bootstrap`]), bound for Python.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyperactor::ChannelTransport;
use hyperactor_mesh::bootstrap::{BootInfo, BootstrapCommand};
use hyperactor_mesh::host::{Host, ProcHandle};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::future::{Convert, PyFuture};
use crate::proc::PyProc;
use crate::runtime::{block_on, runtime};

fn duration(what: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a finite number of seconds >= 0, got {seconds}"
        ))
    })
}

#[derive(Debug)]
struct HostState {
    host: Host,
    procs: Mutex<HashMap<String, ProcHandle>>,
}

/// The host agent serving on a proc; it spawns, stops and reaps procs.
#[pyclass(module = "monarch._rust_bindings", name = "Host", frozen)]
#[derive(Debug)]
pub struct PyHost {
    state: Arc<HostState>,
}

#[pymethods]
impl PyHost {
    /// A host agent receiving its children's reports on `proc` (not a `local` proc).
    #[new]
    #[pyo3(signature = (proc, ready_timeout = 30.0))]
    fn new(proc: &PyProc, ready_timeout: f64) -> PyResult<Self> {
        let _guard = runtime()?.enter();
        let host = Host::new(proc.proc.clone())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
            .with_ready_timeout(duration("ready_timeout", ready_timeout)?);
        Ok(Self {
            state: Arc::new(HostState {
                host,
                procs: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Starts `count` procs named `name` running `program args...` with `env` added.
    /// A future of `[(proc_id, pid), ...]` by rank, once every proc reported ready.
    #[pyo3(signature = (name, count, program, args, env))]
    fn spawn_procs(
        &self,
        name: String,
        count: usize,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> PyFuture {
        let state = Arc::clone(&self.state);
        let mut cmd = BootstrapCommand::new(program).with_args(args);
        for (k, v) in env {
            cmd = cmd.with_env(k, v);
        }
        PyFuture::from_work(format!("spawning procs {name:?}"), async move {
            let handles = state
                .host
                .spawn_procs(&name, count, &cmd)
                .await
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            let out: Vec<(String, u32)> = handles
                .iter()
                .map(|h| (h.proc_id().to_string(), h.pid()))
                .collect();
            {
                let mut procs = state.procs.lock().unwrap_or_else(|e| e.into_inner());
                for h in handles {
                    procs.insert(h.proc_id().to_string(), h);
                }
            }
            let convert: Convert =
                Box::new(move |py| Ok(out.into_pyobject(py)?.into_any().unbind()));
            Ok(convert)
        })
    }

    /// Stops the given procs (stdin closed, then killed after `timeout`); a future of
    /// their final statuses as strings.
    fn stop_procs(&self, proc_ids: Vec<String>, timeout: f64) -> PyResult<PyFuture> {
        let timeout = duration("timeout", timeout)?;
        let handles: Vec<ProcHandle> = {
            let procs = self.state.procs.lock().unwrap_or_else(|e| e.into_inner());
            proc_ids
                .iter()
                .filter_map(|id| procs.get(id).cloned())
                .collect()
        };
        Ok(PyFuture::from_work("stopping procs", async move {
            let statuses = futures::future::join_all(handles.iter().map(|h| h.stop(timeout))).await;
            let out: Vec<String> = statuses.iter().map(ToString::to_string).collect();
            let convert: Convert =
                Box::new(move |py| Ok(out.into_pyobject(py)?.into_any().unbind()));
            Ok(convert)
        }))
    }

    /// Kills a proc's process group at once; false if it was not running. With a
    /// `lost` reason, the proc is counted as lost (unreachable) and its exit says why.
    #[pyo3(signature = (proc_id, lost = None))]
    fn kill_proc(&self, proc_id: &str, lost: Option<String>) -> bool {
        let procs = self.state.procs.lock().unwrap_or_else(|e| e.into_inner());
        match (procs.get(proc_id), lost) {
            (Some(proc), Some(reason)) => proc.kill_lost(reason),
            (Some(proc), None) => proc.kill(),
            (None, _) => false,
        }
    }

    /// The next exit of one of this host's procs: a future of
    /// `(proc_id, name, rank, status)`.
    fn next_exit(&self) -> PyFuture {
        let state = Arc::clone(&self.state);
        PyFuture::from_work("waiting for a proc to exit", async move {
            let exit = state.host.next_exit().await;
            let convert: Convert = Box::new(move |py| {
                Ok((
                    exit.proc_id.to_string(),
                    exit.name,
                    exit.rank,
                    exit.status.to_string(),
                )
                    .into_pyobject(py)?
                    .into_any()
                    .unbind())
            });
            Ok(convert)
        })
    }

    /// Stops every proc (each gets `timeout`, then is killed) and waits until all are
    /// reaped, blocking without the GIL.
    fn shutdown(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = duration("timeout", timeout)?;
        let state = Arc::clone(&self.state);
        block_on(py, "Host.shutdown()", async move {
            state.host.shutdown(timeout).await;
        })
    }

    /// The pids of every proc this host started and still runs.
    fn running_pids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let pids: Vec<u32> = self
            .state
            .host
            .procs()
            .iter()
            .filter(|p| p.status().is_running())
            .map(ProcHandle::pid)
            .collect();
        PyList::new(py, pids)
    }
}

/// The child side of a bootstrap: this process was started by a host agent.
#[pyclass(module = "monarch._rust_bindings", name = "BootChild", frozen)]
#[derive(Debug)]
pub struct PyBootChild {
    info: BootInfo,
    proc: hyperactor::Proc,
}

#[pymethods]
impl PyBootChild {
    /// Reads the host's variables and serves this child's proc (not yet reported).
    #[staticmethod]
    #[pyo3(signature = (transport = "unix"))]
    fn serve(py: Python<'_>, transport: &str) -> PyResult<Self> {
        let transport = match transport {
            "unix" => ChannelTransport::Unix,
            "tcp" => ChannelTransport::Tcp,
            other => {
                return Err(PyValueError::new_err(format!(
                    "a proc serves over \"unix\" or \"tcp\", not {other:?}"
                )))
            }
        };
        let info = BootInfo::from_env().map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let serving = info.clone();
        let proc = block_on(py, "BootChild.serve()", async move {
            serving.serve(transport).await
        })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(Self { info, proc })
    }

    /// The proc, to make clients on.
    #[getter]
    fn proc(&self) -> PyProc {
        PyProc {
            proc: self.proc.clone(),
        }
    }

    /// The proc name of the spawn.
    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    /// This proc's rank in the spawn.
    #[getter]
    fn rank(&self) -> usize {
        self.info.rank
    }

    /// How many procs the spawn started.
    #[getter]
    fn count(&self) -> usize {
        self.info.count
    }

    /// Tells the host this proc is ready.
    fn report_ready(&self) -> PyResult<()> {
        let _guard = runtime()?.enter();
        self.info
            .report_ready(&self.proc)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Blocks, without the GIL, until the host asks this proc to stop (stdin closes).
    fn wait_for_stop(&self, py: Python<'_>) -> PyResult<()> {
        block_on(
            py,
            "BootChild.wait_for_stop()",
            hyperactor_mesh::bootstrap::wait_for_stop(),
        )
    }
}
