//! `Proc` and `Client`: a thin binding of hyperactor procs and clients.
//!
//! A `Proc` serves one channel address (in-process, Unix socket or TCP) and routes
//! messages; a `Client` is a mailbox on a proc from which Python sends and on which it
//! opens ports.

use std::sync::Arc;

use hyperactor::context::SendContext;
use hyperactor::error::{IdError, ProcError, SpawnError};
use hyperactor::ChannelTransport;
use hyperactor_mesh::failure_desk::{FailureDesk, Taken};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::port::{PyPortReceiver, PyPortRef};
use crate::runtime::{block_on, runtime};

/// The transport named `name` (see [`ChannelTransport`]'s `FromStr`, the one parser of
/// transport names).
///
/// # Errors
///
/// `ValueError` listing the accepted names.
pub(crate) fn parse_transport(name: &str) -> PyResult<ChannelTransport> {
    name.parse()
        .map_err(|e: hyperactor::channel::ChannelError| PyValueError::new_err(e.to_string()))
}

fn spawn_error(err: SpawnError) -> PyErr {
    match err {
        SpawnError::Name(e) => PyValueError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// A hyperactor proc served on a fresh address; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "Proc", frozen)]
#[derive(Debug)]
pub struct PyProc {
    pub(crate) proc: hyperactor::Proc,
}

#[pymethods]
impl PyProc {
    /// Starts a proc listening on a fresh address of `transport`.
    #[staticmethod]
    #[pyo3(signature = (transport, name = "proc"))]
    fn serve(py: Python<'_>, transport: &str, name: &str) -> PyResult<Self> {
        let transport = parse_transport(transport)?;
        let proc = block_on(py, "Proc.serve()", hyperactor::Proc::serve(transport, name))?
            .map_err(|e| match e {
                ProcError::Id(e @ IdError::InvalidName { .. }) => {
                    PyValueError::new_err(e.to_string())
                }
                other => PyRuntimeError::new_err(format!(
                    "cannot serve proc {name:?} over {transport:?}: {other}"
                )),
            })?;
        Ok(Self { proc })
    }

    /// This proc's id, address included.
    #[getter]
    fn proc_id(&self) -> String {
        self.proc.proc_id().to_string()
    }

    /// A new client mailbox on this proc named `name`.
    #[pyo3(signature = (name = "client"))]
    fn client(&self, name: &str) -> PyResult<PyClient> {
        let _guard = runtime()?.enter();
        let client = self.proc.client(name).map_err(spawn_error)?;
        Ok(PyClient::new(Arc::new(client)))
    }

    fn __repr__(&self) -> String {
        format!("Proc({})", self.proc.proc_id())
    }
}

/// A mailbox on a proc, for code that is not an actor; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "Client", frozen)]
#[derive(Debug)]
pub struct PyClient {
    pub(crate) client: Arc<hyperactor::Client>,
    /// Where its failures wait to be judged, once something takes them.
    pub(crate) failures: std::sync::OnceLock<Arc<FailureDesk>>,
}

impl PyClient {
    pub(crate) fn new(client: Arc<hyperactor::Client>) -> Self {
        Self {
            client,
            failures: std::sync::OnceLock::new(),
        }
    }

    fn failure_desk(&self) -> PyResult<&Arc<FailureDesk>> {
        let _guard = runtime()?.enter();
        Ok(self
            .failures
            .get_or_init(|| FailureDesk::serve(Arc::clone(&self.client))))
    }
}

#[pymethods]
impl PyClient {
    /// This client's actor id.
    #[getter]
    fn actor_id(&self) -> String {
        self.client.actor_id().to_string()
    }

    /// Opens a streaming port on this client's mailbox, carrying lists of byte parts.
    fn open_port(&self) -> PyResult<(PyPortRef, PyPortReceiver)> {
        let _guard = runtime()?.enter();
        let (port, receiver) = self.client.open_port();
        Ok((
            PyPortRef::new(port),
            PyPortReceiver::new(Arc::clone(&self.client), receiver),
        ))
    }

    /// The next failure of a mesh this client owns, blocking without the GIL; `None` if
    /// `timeout` seconds pass first or the client is closed.
    #[pyo3(signature = (timeout = None))]
    fn next_supervision(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<crate::supervision::PyMeshFailure>> {
        let deadline = crate::runtime::deadline(timeout)?;
        let client = Arc::clone(&self.client);
        let rt = runtime()?;
        let got = crate::runtime::block(py, deadline, |until| {
            let wait = async {
                match until {
                    None => Some(client.next_supervision_event().await),
                    Some(until) => tokio::time::timeout(
                        until.saturating_duration_since(std::time::Instant::now()),
                        client.next_supervision_event(),
                    )
                    .await
                    .ok(),
                }
            };
            rt.block_on(wait)
        })?;
        Ok(got
            .flatten()
            .map(crate::supervision::PyMeshFailure::from_event))
    }

    /// The next failure of a mesh this client owns, marked *in hand* until
    /// `supervision_judged()`, blocking without the GIL; `None` once the failures are
    /// drained (`drain_supervision`), when the client closes, or after `timeout` seconds.
    /// Do not mix with `next_supervision` on one client.
    #[pyo3(signature = (timeout = None))]
    fn take_supervision(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<crate::supervision::PyMeshFailure>> {
        let desk = Arc::clone(self.failure_desk()?);
        let deadline = crate::runtime::deadline(timeout)?;
        let got = crate::runtime::block(py, deadline, |until| match desk.take(until) {
            Taken::Failure(event) => Some(Some(event)),
            Taken::Ended => Some(None),
            Taken::Timeout => None,
        })?;
        Ok(got
            .flatten()
            .map(crate::supervision::PyMeshFailure::from_event))
    }

    /// The failure `take_supervision` handed out is judged.
    fn supervision_judged(&self) -> PyResult<()> {
        self.failure_desk()?.judged();
        Ok(())
    }

    /// Ends `take_supervision` for good, waits (without the GIL) until no failure it
    /// handed out is still being judged (unless `taker`: the caller is the thread that
    /// holds it), and returns the failures still waiting, oldest first.
    #[pyo3(signature = (taker = false))]
    fn drain_supervision(
        &self,
        py: Python<'_>,
        taker: bool,
    ) -> PyResult<Vec<crate::supervision::PyMeshFailure>> {
        let desk = Arc::clone(self.failure_desk()?);
        let events = crate::runtime::detach(py, || desk.drain(taker));
        Ok(events
            .into_iter()
            .map(crate::supervision::PyMeshFailure::from_event)
            .collect())
    }

    fn __repr__(&self) -> String {
        format!("Client({})", self.client.actor_id())
    }
}
