//! `MeshFailure`: a failure of one rank of an actor mesh, as its owner receives it
//! ([`hyperactor_mesh::MeshFailure`], bound for Python).

use bytes::Bytes;
use hyperactor::SupervisionEvent;
use hyperactor_mesh::supervision::MeshFailure;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A failure of one rank of an actor mesh, for the mesh's owner.
#[pyclass(module = "monarch._rust_bindings", name = "MeshFailure", frozen)]
#[derive(Debug, Clone)]
pub struct PyMeshFailure {
    failure: MeshFailure,
    /// The runtime event it came in, kept to chain causes when the owner fails in turn.
    event: SupervisionEvent,
}

impl PyMeshFailure {
    /// The failure carried by `event` (a minimal one naming the actor when the event
    /// carries none).
    pub fn from_event(event: SupervisionEvent) -> Self {
        let carried = MeshFailure::from_event(&event);
        if let Some(failure) = &carried {
            // An owner heard of it: recorded once as an `actor_failed` event.
            hyperactor_mesh::monitor::failures::note_mesh_failure(failure);
        }
        let failure = carried.unwrap_or_else(|| MeshFailure {
            mesh: hyperactor_mesh::cast::codec::MeshInfo {
                id: 0,
                name: event.actor_id.name().to_string(),
                class: "?".into(),
            },
            rank: 0,
            actor_id: Some(event.actor_id.clone()),
            proc_id: event.actor_id.proc_id().clone(),
            pid: None,
            cause: hyperactor_mesh::FailureCause::Actor {
                reason: event.reason.clone(),
            },
            caused_by: None,
            path: None,
        });
        Self { failure, event }
    }

    /// The runtime event, to pass as the cause of a failure it led to.
    pub fn event(&self) -> &SupervisionEvent {
        &self.event
    }
}

#[pymethods]
impl PyMeshFailure {
    /// The name given to `spawn`.
    #[getter]
    fn mesh_name(&self) -> &str {
        &self.failure.mesh.name
    }

    /// A process-unique id of the mesh.
    #[getter]
    fn mesh_id(&self) -> u64 {
        self.failure.mesh.id
    }

    /// The actor class.
    #[getter]
    fn class_name(&self) -> &str {
        &self.failure.mesh.class
    }

    /// The failed rank (in the proc mesh the actors were spawned on).
    #[getter]
    fn rank(&self) -> usize {
        self.failure.rank
    }

    /// The proc the actor lived on.
    #[getter]
    fn proc_id(&self) -> String {
        self.failure.proc_id.to_string()
    }

    /// That proc's OS process id, when known.
    #[getter]
    fn pid(&self) -> Option<u32> {
        self.failure.pid
    }

    /// The failed actor's id, when it was created.
    #[getter]
    fn actor_id(&self) -> Option<String> {
        self.failure.actor_id.as_ref().map(ToString::to_string)
    }

    /// What happened, in words (a traceback for an exception).
    #[getter]
    fn reason(&self) -> String {
        self.failure.cause.to_string()
    }

    /// The failure that caused this one, if any.
    #[getter]
    fn cause(&self) -> Option<PyMeshFailure> {
        let failure = (*self.failure.caused_by.clone()?).clone();
        let event = self
            .event
            .caused_by
            .as_deref()
            .cloned()
            .unwrap_or_else(|| failure.to_event());
        Some(Self { failure, event })
    }

    /// The failed actor's path in the actor tree, when its owner named it.
    #[getter]
    fn path(&self) -> Option<&str> {
        self.failure.path.as_deref()
    }

    /// This failure with the failed actor's `path` (what the owner that received it
    /// names it), carried on when the owner fails in turn with this as the cause.
    fn with_path(&self, path: String) -> Self {
        let mut failure = self.failure.clone();
        failure.path = Some(path);
        let mut event = self.event.clone();
        event.detail = bincode::serialize(&failure).ok().map(Bytes::from);
        Self { failure, event }
    }

    /// Which actor failed and what kind of failure it was, in one sentence.
    fn attribution(&self) -> String {
        self.failure.attribution()
    }

    /// The first line of the report: which mesh, rank and process.
    fn headline(&self) -> String {
        self.failure.headline()
    }

    /// The failure and its causes, for people.
    fn report(&self) -> String {
        self.failure.report()
    }

    fn __str__(&self) -> String {
        self.failure.to_string()
    }

    fn __repr__(&self) -> String {
        format!("MeshFailure({})", self.failure)
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let event: SupervisionEvent = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled MeshFailure: {e}")))?;
        Ok(Self::from_event(event))
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let data = bincode::serialize(&slf.get().event)
            .map(Bytes::from)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(py, &data),),
        ))
    }
}
