//! `ProcMeshHandle`: a view of a proc mesh ([`hyperactor_mesh::ProcMesh`]) that may
//! still be starting, bound for Python. Operations on a starting mesh (spawns, and the
//! casts to actor meshes spawned on it) wait in order until its procs are ready, or
//! fail with the reason they could not start.

use std::sync::Arc;

use bytes::Bytes;
use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::cast::codec::{ActorType, MeshInfo};
use hyperactor_mesh::deferred::Deferred;
use hyperactor_mesh::shape::{Extent, Shape, ShapeError};
use hyperactor_mesh::{MeshError, ProcMesh};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::actor_mesh::{ActorMeshError, ActorMeshInner, PyActorMesh};
use crate::future::{Convert, PyFuture};
use crate::port::extract_parts;
use crate::runtime::runtime;
use crate::runtime::{block, deadline};
use crate::sender::Sender;
use crate::shape::PyShape;

/// Why the procs of a proc mesh could not start. Every operation waiting on them gets
/// it, so it is `Clone`.
#[derive(Debug, Clone)]
pub enum ProcsStartError {
    /// The attached workers they were to run on could not be reached.
    Attach(crate::host_mesh::AttachError),
    /// The spawn failed.
    Spawn(Arc<MeshError>),
}

impl std::fmt::Display for ProcsStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Attach(e) => e.fmt(f),
            Self::Spawn(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ProcsStartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Attach(e) => Some(e),
            Self::Spawn(e) => Some(e.as_ref()),
        }
    }
}

/// What every view of one proc mesh shares: the mesh, once its procs are ready.
#[derive(Debug)]
pub struct ProcMeshInner {
    name: String,
    deferred: Deferred<ProcMesh, ProcsStartError>,
    /// For a mesh composed of the procs of other meshes ([`PyProcMesh::compose`]): the
    /// spawned meshes its procs belong to, which own them (stopping it stops these).
    /// Empty for a spawned mesh.
    parts: Vec<Arc<ProcMeshInner>>,
}

impl ProcMeshInner {
    /// A mesh whose procs are starting.
    pub fn pending(name: String) -> Self {
        Self {
            name,
            deferred: Deferred::new(),
            parts: Vec::new(),
        }
    }

    /// The spawned meshes that own this mesh's procs: the parts of a composed mesh,
    /// else the mesh itself.
    fn owners(self: &Arc<Self>) -> Vec<Arc<ProcMeshInner>> {
        if self.parts.is_empty() {
            vec![Arc::clone(self)]
        } else {
            self.parts.clone()
        }
    }

    /// The mesh, when ready.
    pub fn deferred(&self) -> &Deferred<ProcMesh, ProcsStartError> {
        &self.deferred
    }

    /// The mesh's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A view of a proc mesh; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "ProcMeshHandle", frozen)]
#[derive(Debug, Clone)]
pub struct PyProcMesh {
    inner: Arc<ProcMeshInner>,
    view: Option<Shape>,
}

fn rt_err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

impl PyProcMesh {
    pub(crate) fn new(inner: Arc<ProcMeshInner>, view: Option<Shape>) -> Self {
        Self { inner, view }
    }

    /// This process's own proc as a mesh with no dimension.
    ///
    /// # Errors
    ///
    /// `RuntimeError` if the mesh cannot be built (it can always be).
    pub fn of_self(agent: &ProcAgent) -> PyResult<Self> {
        let info = MeshInfo {
            id: hyperactor_mesh::agent::random_id(),
            name: "this_proc".into(),
            class: "proc".into(),
        };
        let mesh =
            ProcMesh::new(info, &Extent::unity(), vec![agent.self_info()]).map_err(rt_err)?;
        Ok(Self {
            inner: Arc::new(ProcMeshInner {
                name: "this_proc".into(),
                deferred: Deferred::ready(mesh),
                parts: Vec::new(),
            }),
            view: None,
        })
    }

    /// The mesh seen through this handle's view.
    pub(crate) fn viewed(&self, mesh: &ProcMesh) -> Result<ProcMesh, ShapeError> {
        match &self.view {
            None => Ok(mesh.clone()),
            Some(shape) => mesh.view(shape.clone()),
        }
    }

    fn ready(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<ProcMesh> {
        let deadline = deadline(timeout)?;
        let deferred = &self.inner.deferred;
        match block(py, deadline, |until| deferred.wait_blocking(until))? {
            None => Err(PyTimeoutError::new_err(format!(
                "the procs of {:?} were not ready within {} s",
                self.inner.name,
                timeout.unwrap_or_default()
            ))),
            Some(Err(e)) => Err(rt_err(format!(
                "the procs of {:?} failed to start: {e}",
                self.inner.name
            ))),
            Some(Ok(mesh)) => self.viewed(&mesh).map_err(rt_err),
        }
    }
}

#[pymethods]
impl PyProcMesh {
    /// The mesh's name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The proc mesh's id, once its procs are ready (`None` before, or if they failed
    /// to start); views share it.
    #[getter]
    fn mesh_id(&self) -> Option<u64> {
        match self.inner.deferred.get() {
            Some(Ok(mesh)) => Some(mesh.info().id),
            _ => None,
        }
    }

    /// The same procs through `shape` (in the mesh's global ranks).
    fn view(&self, shape: PyRef<'_, PyShape>) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            view: Some(shape.shape().clone()),
        }
    }

    /// Blocks until the procs are ready; raises `RuntimeError` if they failed to start,
    /// `TimeoutError` after `timeout` seconds.
    #[pyo3(signature = (timeout = None))]
    fn wait_ready(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.ready(py, timeout).map(|_| ())
    }

    /// Whether the procs are ready (or failed).
    fn is_ready(&self) -> bool {
        self.inner.deferred.is_resolved()
    }

    /// A future of `True` once the procs are ready (an error if they failed to start).
    fn initialized(&self) -> PyFuture {
        let inner = Arc::clone(&self.inner);
        PyFuture::from_work(
            format!("procs {:?} starting", self.inner.name),
            async move {
                inner.deferred.wait().await.map_err(|e| {
                    rt_err(format!(
                        "the procs of {:?} failed to start: {e}",
                        inner.name
                    ))
                })?;
                let convert: Convert =
                    Box::new(|py| Ok(true.into_pyobject(py)?.to_owned().into_any().unbind()));
                Ok(convert)
            },
        )
    }

    /// The OS process ids of the view's procs, in view order (waits until ready).
    fn pids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        let mesh = self.ready(py, None)?;
        Ok(mesh.shape().iter().map(|r| mesh.procs()[r].pid).collect())
    }

    /// The proc ids of the view's procs, printed, in view order (waits until ready).
    fn proc_ids(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let mesh = self.ready(py, None)?;
        Ok(mesh
            .shape()
            .iter()
            .map(|r| mesh.procs()[r].proc_id.to_string())
            .collect())
    }

    /// Spawns one Python actor per proc of the view (made from `parts`: the pickled class
    /// and arguments), owned by `sender`; returns at once.
    #[pyo3(signature = (sender, name, class_name, parts))]
    fn spawn(
        &self,
        sender: &Bound<'_, PyAny>,
        name: &str,
        class_name: &str,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<PyActorMesh> {
        let sender = Sender::extract(sender)?;
        let parts: Vec<Bytes> = extract_parts(parts)?;
        if name.is_empty() {
            return Err(PyValueError::new_err(
                "spawn(): the mesh name must not be empty",
            ));
        }
        let agent = crate::agent::process_agent()?.clone();
        let id = hyperactor_mesh::agent::random_id();
        let actor = Arc::new(ActorMeshInner::pending(
            Some(Arc::clone(&self.inner)),
            id,
            name.to_string(),
            class_name.to_string(),
        ));
        let spawned = Arc::clone(&actor);
        let this = self.clone();
        let (name, class) = (name.to_string(), class_name.to_string());
        let _guard = runtime()?.enter();
        self.inner.deferred.run(move |mesh| {
            let result = mesh
                .map_err(|e| ActorMeshError::ProcsFailed(e.clone()))
                .and_then(|m| {
                    let viewed = this.viewed(m).map_err(ActorMeshError::View)?;
                    use hyperactor::SendContext;
                    viewed
                        .spawn_as(
                            &agent,
                            sender.actor_id(),
                            id,
                            &name,
                            class,
                            ActorType::Foreign,
                            parts,
                        )
                        .map_err(|e| ActorMeshError::Spawn(Arc::new(e)))
                });
            spawned.set(result);
        });
        Ok(PyActorMesh::new(actor, None))
    }

    /// Stops every proc of the mesh (only its owner can). A future of `None`. A
    /// composed mesh ([`PyProcMesh::compose`]) stops the spawned meshes its procs belong
    /// to.
    fn stop(&self, sender: &Bound<'_, PyAny>, reason: String) -> PyResult<PyFuture> {
        let sender = Sender::extract(sender)?;
        let owners = self.inner.owners();
        Ok(PyFuture::from_work(
            format!("stopping procs {:?}", self.inner.name),
            async move {
                for inner in owners {
                    // A mesh that failed to start has nothing to stop.
                    if let Ok(mesh) = inner.deferred.wait().await {
                        mesh.stop(&sender, &reason).await.map_err(rt_err)?;
                    }
                }
                let convert: Convert = Box::new(|py| Ok(py.None()));
                Ok(convert)
            },
        ))
    }

    /// Marks the mesh stopped without stopping its procs, which are about to end with
    /// their hosts (a job being killed): their ends, and what they cause in this
    /// process, are then no failures. A mesh still starting is marked once it is up.
    fn abandon(&self) -> PyResult<()> {
        let agent = crate::agent::process_agent()?.clone();
        for inner in self.inner.owners() {
            let agent = agent.clone();
            inner.deferred.run(move |mesh| {
                if let Ok(mesh) = mesh {
                    agent.mark_stopped(mesh.info().id);
                }
            });
        }
        Ok(())
    }

    /// A new proc mesh named `name`, laid out along `extent`, whose rank `i` is the one
    /// proc of `members[i]` (a one-proc view of any ready proc mesh): procs already
    /// running, gathered from several meshes (the survivors of a mesh that lost a proc,
    /// and a replacement). It has an id of its own, so actors spawned on it form new
    /// meshes; its procs stay owned by the meshes that spawned them, and stopping it
    /// stops those meshes (every proc of them). Blocks until the members are ready
    /// (`timeout` seconds at most).
    ///
    /// Raises `ValueError` when the number of members is not the extent's number of
    /// ranks or a member is not one proc, `RuntimeError` when a member's procs failed
    /// to start, `TimeoutError` when they are not ready in time.
    #[staticmethod]
    #[pyo3(signature = (name, extent, members, timeout = None))]
    fn compose(
        py: Python<'_>,
        name: &str,
        extent: PyRef<'_, crate::shape::PyExtent>,
        members: Vec<PyRef<'_, PyProcMesh>>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let extent = extent.extent().clone();
        if members.len() != extent.num_ranks() {
            return Err(PyValueError::new_err(format!(
                "compose({name:?}): {} member procs for an extent of {} ranks ({extent}); \
                 give one one-proc view per rank",
                members.len(),
                extent.num_ranks()
            )));
        }
        let mut procs = Vec::with_capacity(members.len());
        let mut parts: Vec<Arc<ProcMeshInner>> = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let viewed = member.ready(py, timeout)?;
            let mut ranks = viewed.shape().iter();
            let (Some(rank), None) = (ranks.next(), ranks.next()) else {
                return Err(PyValueError::new_err(format!(
                    "compose({name:?}): member {i} is a view of {} procs of {:?}; give a \
                     view of exactly one proc (a slice down to one rank)",
                    viewed.len(),
                    member.inner.name
                )));
            };
            let mut proc = viewed.procs()[rank].clone();
            proc.rank = i;
            procs.push(proc);
            for owner in member.inner.owners() {
                if !parts.iter().any(|p| Arc::ptr_eq(p, &owner)) {
                    parts.push(owner);
                }
            }
        }
        let info = MeshInfo {
            id: hyperactor_mesh::agent::random_id(),
            name: name.to_string(),
            class: "proc".into(),
        };
        let mesh = ProcMesh::new(info, &extent, procs).map_err(rt_err)?;
        Ok(Self {
            inner: Arc::new(ProcMeshInner {
                name: name.to_string(),
                deferred: Deferred::ready(mesh),
                parts,
            }),
            view: None,
        })
    }

    /// Whether the procs failed to start, and why (`None` while starting or when ready).
    fn error(&self) -> Option<String> {
        match self.inner.deferred.get() {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        }
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let mesh: ProcMesh = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled proc mesh: {e}")))?;
        Ok(Self {
            inner: Arc::new(ProcMeshInner {
                name: mesh.info().name.clone(),
                deferred: Deferred::ready(mesh),
                parts: Vec::new(),
            }),
            view: None,
        })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let mesh = slf.get().ready(py, None)?;
        let data = bincode::serialize(&mesh).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(py, &data),),
        ))
    }

    fn __repr__(&self) -> String {
        format!("ProcMeshHandle({:?})", self.inner.name)
    }
}
