//! `DrivenActor` and `Delivery`: a Python actor hosted by the runtime
//! ([`hyperactor::actor::DrivenActor`]), and one item of its queue.
//!
//! The actor's thread takes deliveries with `DrivenActor.next()` (blocking without the
//! GIL) and handles one at a time (ACT-1): a call (`method`, the pickled arguments),
//! a failure of a mesh it owns (`failure`), or a stop request. It answers a call with
//! `Delivery.reply(status, parts)`, which goes to the caller (or the reducer of its
//! subtree). The runtime keeps the actor's status, returns what it could not handle,
//! and reports its failure (`DrivenActor.fail`) to the mesh's owner.
//!
//! A Python message's payload is `[method name (UTF-8), pickle, buffers...]`, sent to
//! the handler port [`py_message_port`].

use std::sync::OnceLock;

use bytes::Bytes;
use hyperactor::actor::{DrivenActor, DrivenWork, Next};
use hyperactor::channel::log_limit::LogLimit;
use hyperactor::id::ActorId;
use hyperactor::message::{handler_port_for_name, Envelope, SUPERVISION_PORT, UNDELIVERABLE_PORT};
use hyperactor::SupervisionEvent;
use hyperactor_mesh::agent::{ForeignSpawn, ProcAgent};
use hyperactor_mesh::cast::codec::{ReplyTo, Route, ViewExtent};
use hyperactor_mesh::cast::reply::ReplyItem;
use hyperactor_mesh::shape::Extent;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::call::PyPortHandle;
use crate::delivery_kind::PyDeliveryKind;
use crate::future::{Convert, PyFuture};
use crate::port::extract_parts;
use crate::runtime::{block, deadline};
use crate::runtime::{detach, runtime};
use crate::shape::PyExtent;
use crate::supervision::PyMeshFailure;

/// The handler port of every Python actor.
pub fn py_message_port() -> u64 {
    static PORT: OnceLock<u64> = OnceLock::new();
    *PORT.get_or_init(|| handler_port_for_name("monarch.python.Message"))
}

/// Malformed messages addressed to Python actors: logged at most once a second per
/// process, with the count of those not logged.
static MALFORMED: LogLimit = LogLimit::per_second();
/// Messages that came back to a Python actor: logged likewise.
static RETURNED: LogLimit = LogLimit::per_second();

fn extent(view: &ViewExtent) -> PyResult<Extent> {
    Extent::new(view.labels.clone(), view.sizes.clone())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A Python actor hosted by the runtime; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "DrivenActor", frozen)]
#[derive(Debug)]
pub struct PyDrivenActor {
    actor: DrivenActor,
    agent: ProcAgent,
    spawn: ForeignSpawn,
}

impl PyDrivenActor {
    pub(crate) fn new(actor: DrivenActor, agent: ProcAgent, spawn: ForeignSpawn) -> Self {
        Self {
            actor,
            agent,
            spawn,
        }
    }

    /// The runtime's actor.
    pub fn actor(&self) -> &DrivenActor {
        &self.actor
    }

    /// The delivery of `work`. Never an error: whatever a peer sent, the actor's loop
    /// goes on (a malformed message becomes a [`PyDeliveryKind::Skip`], logged).
    fn delivery(&self, work: DrivenWork) -> PyDelivery {
        let mut delivery = PyDelivery {
            kind: PyDeliveryKind::Stop,
            actor: self.actor.clone(),
            method: String::new(),
            parts: Vec::new(),
            route: None,
            failure: None,
            malformed: None,
        };
        let envelope: Envelope = match work {
            DrivenWork::Stop => return delivery,
            DrivenWork::Message(envelope) => envelope,
        };
        delivery.kind = PyDeliveryKind::Skip;
        let sender = envelope.header.sender.clone();
        match envelope.header.dest.index() {
            SUPERVISION_PORT => match envelope.payload.decode::<SupervisionEvent>() {
                Ok(event) => {
                    self.actor.begin("__supervise__");
                    delivery.kind = PyDeliveryKind::Supervise;
                    delivery.failure = Some(PyMeshFailure::from_event(event));
                }
                Err(e) => self.malformed(&sender, &format!("a supervision event: {e}")),
            },
            UNDELIVERABLE_PORT => {
                // Python actors send replies that nobody returns; anything else that
                // comes back is only logged.
                if let Some(suppressed) = RETURNED.check() {
                    tracing::warn!(
                        actor = %self.actor.actor_id(),
                        suppressed,
                        "a message it sent came back"
                    );
                }
            }
            _ => {
                let route = match envelope.header.extra.as_deref().map(Route::decode) {
                    None => None,
                    Some(Ok(route)) => Some(route),
                    Some(Err(e)) => {
                        self.malformed(&sender, &format!("a call whose route is malformed: {e}"));
                        return delivery;
                    }
                };
                let mut parts = envelope.payload.into_parts();
                let method = match parts.is_empty() {
                    true => Err("it has no parts".to_string()),
                    false => String::from_utf8(parts.remove(0).to_vec())
                        .map_err(|_| "its endpoint name is not UTF-8".to_string()),
                };
                delivery.route = route;
                match method {
                    Ok(method) => {
                        self.actor.begin(&method);
                        delivery.kind = PyDeliveryKind::Call;
                        delivery.method = method;
                        delivery.parts = parts;
                    }
                    Err(why) => {
                        // Malformed, but it may say where to answer: Python tells the
                        // caller why (an error, as the caller decodes it).
                        self.malformed(&sender, &format!("a call: {why}"));
                        delivery.kind = PyDeliveryKind::Call;
                        delivery.malformed = Some(why);
                    }
                }
            }
        }
        delivery
    }

    fn malformed(&self, sender: &ActorId, what: &str) {
        if let Some(suppressed) = MALFORMED.check() {
            tracing::warn!(
                actor = %self.actor.actor_id(),
                %sender,
                suppressed,
                "dropping a malformed message, {what}"
            );
        }
    }

    fn next_work(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyDelivery>> {
        let deadline = deadline(timeout)?;
        let actor = &self.actor;
        // Fast path: something is queued already.
        let next = match actor.try_next() {
            Next::Timeout => {
                match block(py, deadline, |until| match actor.next_blocking(until) {
                    Next::Timeout => None,
                    other => Some(other),
                })? {
                    Some(next) => next,
                    None => return Ok(None),
                }
            }
            other => other,
        };
        match next {
            Next::Work(work) => Ok(Some(self.delivery(work))),
            Next::Timeout => Ok(None),
            Next::Ended => Ok(Some(self.ended())),
        }
    }

    fn ended(&self) -> PyDelivery {
        PyDelivery {
            kind: PyDeliveryKind::Ended,
            actor: self.actor.clone(),
            method: String::new(),
            parts: Vec::new(),
            route: None,
            failure: None,
            malformed: None,
        }
    }
}

#[pymethods]
impl PyDrivenActor {
    /// The actor's id, printed.
    #[getter]
    fn actor_id(&self) -> String {
        self.actor.actor_id().to_string()
    }

    /// Its proc's id, printed.
    #[getter]
    fn proc_id(&self) -> String {
        self.actor.actor_id().proc_id().to_string()
    }

    /// The mesh's name (given to `spawn`).
    #[getter]
    fn mesh_name(&self) -> &str {
        &self.spawn.mesh.name
    }

    /// The mesh's process-unique id.
    #[getter]
    fn mesh_id(&self) -> u64 {
        self.spawn.mesh.id
    }

    /// The actor's class, as named at spawn.
    #[getter]
    fn class_name(&self) -> &str {
        &self.spawn.mesh.class
    }

    /// The actor's rank in the proc mesh it was spawned on.
    #[getter]
    fn rank(&self) -> u32 {
        self.spawn.rank
    }

    /// That proc mesh's extent.
    fn extent(&self, py: Python<'_>) -> PyResult<PyExtent> {
        PyExtent::from_extent(py, extent(&self.spawn.view)?)
    }

    /// The actor that spawned the mesh, printed.
    #[getter]
    fn creator(&self) -> String {
        self.spawn.origin.to_string()
    }

    /// The name of the actor that spawned the mesh (`client` for a process's client).
    #[getter]
    fn creator_name(&self) -> String {
        self.spawn.origin.name().to_string()
    }

    /// The parts the spawner sent (the pickled class, then the pickled arguments).
    fn spawn_parts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::recv_bytes::parts_to_list(py, &self.spawn.parts)
    }

    /// The next delivery, blocking without the GIL; `None` if `timeout` seconds pass
    /// first. A delivery of kind `ENDED` means the actor has ended.
    #[pyo3(signature = (timeout = None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyDelivery>> {
        self.next_work(py, timeout)
    }

    /// The next delivery if one is queued, else `None` (never blocks).
    fn try_next(&self) -> PyResult<Option<PyDelivery>> {
        match self.actor.try_next() {
            Next::Work(work) => Ok(Some(self.delivery(work))),
            Next::Timeout => Ok(None),
            Next::Ended => Ok(Some(self.ended())),
        }
    }

    /// The next delivery, as a future to await (on the actor's asyncio loop).
    fn next_async(slf: &Bound<'_, Self>) -> PyFuture {
        let this: Py<Self> = slf.clone().unbind();
        let actor = slf.get().actor.clone();
        PyFuture::from_work("waiting for the next message", async move {
            let next = actor.next().await;
            let convert: Convert = Box::new(move |py| {
                let this = this.bind(py).get();
                let delivery = match next {
                    Next::Work(work) => this.delivery(work),
                    Next::Timeout | Next::Ended => this.ended(),
                };
                Ok(Py::new(py, delivery)?.into_any())
            });
            Ok(convert)
        })
    }

    /// The constructor ran: the actor takes messages.
    fn started(&self) {
        self.actor.started();
    }

    /// The current message is handled (the actor counts as idle).
    fn idle(&self) {
        self.actor.idle();
    }

    /// Fails the actor: its owner hears of it (with `cause`, a failure it did not
    /// handle), queued messages go back to their senders. False if it had ended.
    #[pyo3(signature = (reason, cause = None))]
    fn fail(&self, reason: &str, cause: Option<PyRef<'_, PyMeshFailure>>) -> PyResult<bool> {
        let _guard = runtime()?.enter();
        Ok(self.actor.fail(reason, cause.map(|c| c.event().clone())))
    }

    /// Ends the actor gracefully (after its stop procedure), for `reason` (what calls to
    /// it are told). False if it had ended.
    #[pyo3(signature = (reason = None))]
    fn stopped(&self, reason: Option<&str>) -> PyResult<bool> {
        if let Some(reason) = reason {
            self.agent
                .note_stop_reason(self.actor.actor_id().name(), reason);
        }
        let _guard = runtime()?.enter();
        Ok(self.actor.stop())
    }

    /// Asks the actor to stop after the messages queued so far: its driver then takes a
    /// `STOP` delivery and runs its stop procedure. False if it had ended.
    fn request_stop(&self) -> PyResult<bool> {
        let _guard = runtime()?.enter();
        Ok(self.actor.request_stop())
    }

    /// The actor's status, in words (`idle`, `processing`, `stopped`, `failed: ...`).
    #[getter]
    fn status(&self) -> String {
        self.actor.status().to_string()
    }

    /// Stops the meshes this actor owns (each bounded by the agent's stop timeout),
    /// blocking without the GIL.
    fn stop_owned(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let agent = self.agent.clone();
        let owner = self.actor.actor_id().clone();
        let reason = reason.to_string();
        let rt = runtime()?;
        detach(py, || rt.block_on(agent.stop_owned_by(&owner, &reason)));
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("DrivenActor({})", self.actor.actor_id())
    }
}

/// One item of a driven actor's queue; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "Delivery", frozen)]
#[derive(Debug)]
pub struct PyDelivery {
    kind: PyDeliveryKind,
    actor: DrivenActor,
    method: String,
    parts: Vec<Bytes>,
    route: Option<Route>,
    failure: Option<PyMeshFailure>,
    malformed: Option<String>,
}

impl PyDelivery {
    fn reply_to(&self) -> Option<(&ReplyTo, u32)> {
        let route = self.route.as_ref()?;
        Some((route.reply.as_ref()?, route.index))
    }
}

#[pymethods]
impl PyDelivery {
    /// What the delivery is: a `DeliveryKind` (the class's own member).
    #[getter]
    fn kind(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.kind.member(py)
    }

    /// The endpoint called.
    #[getter]
    fn method(&self) -> &str {
        &self.method
    }

    /// Why the call cannot be decoded (it is answered with an error), or `None`.
    #[getter]
    fn malformed(&self) -> Option<&str> {
        self.malformed.as_deref()
    }

    /// The payload's parts: the pickled arguments, then their out-of-band buffers.
    #[getter]
    fn args<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::recv_bytes::payload_to_list(py, &self.parts)
    }

    /// The receiver's index in the view the message was sent to.
    #[getter]
    fn index(&self) -> u32 {
        self.route.as_ref().map_or(0, |r| r.index)
    }

    /// How many procs the message passed through to get here.
    #[getter]
    fn hops(&self) -> u8 {
        self.route.as_ref().map_or(0, |r| r.hops)
    }

    /// The extent of the view the message was sent to.
    fn extent(&self, py: Python<'_>) -> PyResult<PyExtent> {
        let view = self
            .route
            .as_ref()
            .map(|r| r.view.clone())
            .unwrap_or_default();
        PyExtent::from_extent(py, extent(&view)?)
    }

    /// Whether a caller waits for a reply.
    #[getter]
    fn has_reply(&self) -> bool {
        self.reply_to().is_some()
    }

    /// The failure of a mesh the actor owns (`SUPERVISE` deliveries).
    #[getter]
    fn failure(&self) -> Option<PyMeshFailure> {
        self.failure.clone()
    }

    /// Answers the call (`status`: a `ReplyStatus` or its code) with `parts`. Does
    /// nothing if nobody waits for a reply.
    fn reply(&self, status: &Bound<'_, PyAny>, parts: &Bound<'_, PyAny>) -> PyResult<()> {
        let status = crate::reply::status_of(status)?;
        if matches!(status, hyperactor_mesh::cast::reply::ReplyStatus::Error) {
            // The endpoint raised: counted in the actor's stats.
            self.actor.note_error();
        }
        let Some((to, index)) = self.reply_to() else {
            return Ok(());
        };
        let item = ReplyItem {
            index,
            status,
            parts: extract_parts(parts)?,
        };
        let port = PyPortHandle {
            to: to.clone(),
            index,
        };
        let _guard = runtime()?.enter();
        // More calls wait for this actor (a caller pipelines them): its replies go out
        // in batches, written by the link task.
        let _batched = hyperactor::channel::QueueWrites::new(self.actor.queued() > 0);
        port.post(&self.actor, item);
        Ok(())
    }

    /// The port the reply goes to (for endpoints that answer through an explicit port),
    /// or `None`.
    fn port(&self) -> Option<PyPortHandle> {
        self.reply_to().map(|(to, index)| PyPortHandle {
            to: to.clone(),
            index,
        })
    }

    fn __repr__(&self) -> String {
        format!("Delivery(kind={:?}, method={:?})", self.kind, self.method)
    }
}
