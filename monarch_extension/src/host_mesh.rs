//! `HostMeshHandle`: a mesh of hosts whose agents spawn procs
//! ([`hyperactor_mesh::HostMesh`]), bound for Python. `spawn_procs` returns at once; the
//! procs start in the background and the operations issued meanwhile wait, in order
//! (see [`hyperactor_mesh::deferred`]).

use std::sync::Arc;

use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::bootstrap::BootstrapCommand;
use hyperactor_mesh::shape::Extent;
use hyperactor_mesh::HostMesh;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::proc_mesh::{ProcMeshInner, PyProcMesh};
use crate::runtime::runtime;
use crate::sender::Sender;
use crate::shape::PyExtent;

/// A mesh of hosts; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "HostMeshHandle", frozen)]
#[derive(Debug, Clone)]
pub struct PyHostMesh {
    mesh: HostMesh,
}

impl PyHostMesh {
    /// This machine's host as `agent` sees it: its own host, or the host that spawned it.
    ///
    /// # Errors
    ///
    /// `RuntimeError` if the agent has neither.
    pub fn of_agent(agent: &ProcAgent) -> PyResult<Self> {
        let mesh = if agent.is_host() {
            HostMesh::local(agent)
        } else if let Some(host) = agent.spawned_by() {
            HostMesh::new(vec![host.clone()], Extent::unity())
        } else {
            return Err(PyRuntimeError::new_err(
                "this process has no host agent and was not spawned by one",
            ));
        };
        Ok(Self {
            mesh: mesh.map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
        })
    }
}

#[pymethods]
impl PyHostMesh {
    /// The hosts' extent.
    fn extent(&self, py: Python<'_>) -> PyResult<PyExtent> {
        PyExtent::from_extent(py, self.mesh.extent().clone())
    }

    /// Starts `prod(per_host)` procs named `name` on every host, each running
    /// `program args...` with `env` added, owned by `sender`. Returns at once.
    #[pyo3(signature = (sender, name, per_host, program, args, env))]
    fn spawn_procs(
        &self,
        sender: &Bound<'_, PyAny>,
        name: String,
        per_host: PyRef<'_, PyExtent>,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> PyResult<PyProcMesh> {
        let sender = Sender::extract(sender)?;
        let mut command = BootstrapCommand::new(program).with_args(args);
        for (k, v) in env {
            command = command.with_env(k, v);
        }
        let inner = Arc::new(ProcMeshInner::pending(name.clone()));
        let hosts = self.mesh.clone();
        let per_host = per_host.extent().clone();
        let pending = Arc::clone(&inner);
        runtime()?.spawn(async move {
            let result = hosts
                .spawn_procs(&sender, &name, &per_host, &command)
                .await
                .map_err(|e| e.to_string());
            pending.deferred().resolve(result);
        });
        Ok(PyProcMesh::new(inner, None))
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let mesh: HostMesh = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled host mesh: {e}")))?;
        Ok(Self { mesh })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let data = bincode::serialize(&slf.get().mesh)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(slf.py(), &data),),
        ))
    }

    fn __repr__(&self) -> String {
        format!("HostMeshHandle({})", self.mesh.extent())
    }
}
