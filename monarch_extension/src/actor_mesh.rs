//! `ActorMeshHandle`: a view of a mesh of Python actors ([`hyperactor_mesh::ActorMeshRef`])
//! that may still be spawning, bound for Python. Every message is a cast (see
//! [`hyperactor_mesh::cast`]); what it returns depends on the adverb:
//!
//! | mode ([`PyCastMode`]) | replies | returns |
//! |---|---|---|
//! | `BROADCAST` | none | `None` |
//! | `CALL` | one per rank, reduced over the tree | `CallReplies` |
//! | `ONE` | one (a view of one actor) | `CallReplies` |
//! | `CHOOSE` | one, from the actor at `index` | `CallReplies` |
//! | `STREAM` | one per rank, in arrival order | `ReplyQueue` |
//! | `PORT` | one per rank, to `port` | `None` |
//!
//! Casts to a mesh whose procs are starting wait, in order, with the spawn (see
//! [`crate::proc_mesh`]); if the spawn failed, every rank answers "cannot answer".

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use hyperactor::SendContext;
use hyperactor_mesh::agent::{CallReplies, CastTarget, ProcAgent, ReplyQueue};
use hyperactor_mesh::cast::codec::{CastKind, ReplyMode, ReplyTo, ViewExtent};
use hyperactor_mesh::cast::reply::ReplyItem;
use hyperactor_mesh::shape::{Shape, ShapeError};
use hyperactor_mesh::{ActorMeshRef, MeshError};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::actor::py_message_port;
use crate::call::{PyCallReplies, PyPortHandle, PyReplyQueue};
use crate::cast_mode::PyCastMode;
use crate::port::extract_parts;
use crate::proc_mesh::{ProcMeshInner, ProcsStartError};
use crate::runtime::runtime;
use crate::runtime::{block, deadline};
use crate::sender::Sender;
use crate::shape::PyShape;

pyo3::create_exception!(
    monarch._rust_bindings,
    MessageTooLarge,
    PyValueError,
    "A message is over the largest message size a channel carries (the \
     `codec_max_frame_length` config key): it was not sent."
);

/// What every view of one actor mesh shares.
#[derive(Debug)]
pub struct ActorMeshInner {
    /// The proc mesh it is spawned on, while that may be starting (`None` for a
    /// received reference, ready at once).
    base: Option<Arc<ProcMeshInner>>,
    id: u64,
    name: String,
    class: String,
    mesh: OnceLock<Result<ActorMeshRef, ActorMeshError>>,
}

/// Why an actor mesh handle has no mesh to use: its spawn failed, or never happened.
/// Every operation on the handle gets it, so it is `Clone`.
#[derive(Debug, Clone)]
pub enum ActorMeshError {
    /// The procs it was to be spawned on failed to start.
    ProcsFailed(ProcsStartError),
    /// The view of the proc mesh it was spawned on, or its own view, does not fit.
    View(ShapeError),
    /// The spawn itself failed.
    Spawn(Arc<MeshError>),
    /// Its proc mesh is ready but the spawn did not happen.
    NeverSpawned,
}

impl std::fmt::Display for ActorMeshError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ProcsFailed(e) => write!(f, "its procs failed to start: {e}"),
            Self::View(e) => e.fmt(f),
            Self::Spawn(e) => e.fmt(f),
            Self::NeverSpawned => f.write_str("it was never spawned"),
        }
    }
}

impl std::error::Error for ActorMeshError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::ProcsFailed(e) => Some(e),
            Self::View(e) => Some(e),
            Self::Spawn(e) => Some(e.as_ref()),
            Self::NeverSpawned => None,
        }
    }
}

impl ActorMeshInner {
    /// A mesh being spawned on `base`.
    pub fn pending(base: Option<Arc<ProcMeshInner>>, id: u64, name: String, class: String) -> Self {
        Self {
            base,
            id,
            name,
            class,
            mesh: OnceLock::new(),
        }
    }

    /// The spawn's outcome (once).
    pub fn set(&self, result: Result<ActorMeshRef, ActorMeshError>) {
        let _ = self.mesh.set(result);
    }
}

/// Where a cast's answers go, and how to answer for it from here when it cannot be sent.
enum Reply {
    None,
    Call(Arc<CallReplies>),
    Queue(Arc<ReplyQueue>),
    Port(ReplyTo),
}

impl Reply {
    fn target(&self) -> Option<ReplyTo> {
        match self {
            Reply::None => None,
            Reply::Call(c) => Some(c.reply_to().clone()),
            Reply::Queue(q) => Some(q.reply_to().clone()),
            Reply::Port(to) => Some(to.clone()),
        }
    }

    fn fail(&self, indices: impl Iterator<Item = u32>, reason: &str) {
        let items: Vec<ReplyItem> = indices.map(|i| ReplyItem::failed(i, reason)).collect();
        match self {
            Reply::Call(c) => c.answer(items),
            Reply::Queue(q) => q.answer(items),
            Reply::None | Reply::Port(_) => {}
        }
    }
}

/// A view of an actor mesh; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "ActorMeshHandle", frozen)]
#[derive(Debug)]
pub struct PyActorMesh {
    inner: Arc<ActorMeshInner>,
    view: Option<Shape>,
    /// The view's cast targets and extent, computed once.
    targets: OnceLock<Arc<(Vec<CastTarget>, ViewExtent)>>,
}

fn rt_err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

impl PyActorMesh {
    /// Casts a control message (`kind`: stop, probe) to the view once the mesh exists,
    /// with replies reduced over the tree into the returned call (`all`: every rank's
    /// reply is awaited even after a failure). If the mesh never came to be (or the
    /// view does not fit it), the call is answered with `missing(why)` instead.
    fn control_cast(
        &self,
        py: Python<'_>,
        sender: &Bound<'_, PyAny>,
        count: u32,
        all: bool,
        kind: CastKind,
        missing: impl FnOnce(ActorMeshError) -> Vec<ReplyItem> + Send + 'static,
    ) -> PyResult<Py<PyCallReplies>> {
        let sender = Sender::extract(sender)?;
        let agent = crate::agent::process_agent()?.clone();
        let call = match all {
            true => CallReplies::open_all(&agent, 0..count),
            false => CallReplies::open(&agent, 0..count),
        };
        let replies = PyCallReplies::new(call);
        let shared = replies.shared();
        let view_self = Self::new(Arc::clone(&self.inner), self.view.clone());
        let stop = matches!(kind, CastKind::Stop { .. });
        let _guard = runtime()?.enter();
        self.with_mesh(move |mesh| {
            let mesh = match mesh
                .map_err(ActorMeshError::clone)
                .and_then(|m| view_self.viewed(m).map_err(ActorMeshError::View))
            {
                Ok(mesh) => mesh,
                Err(why) => return shared.answer(missing(why)),
            };
            if stop {
                agent.mark_stopped(mesh.info().id);
            }
            mesh.cast_parts(
                &agent,
                sender.actor_id(),
                kind,
                ReplyMode::Reduce,
                Some(shared.reply_to().clone()),
                Vec::new(),
            );
        });
        Py::new(py, replies)
    }
    pub(crate) fn new(inner: Arc<ActorMeshInner>, view: Option<Shape>) -> Self {
        Self {
            inner,
            view,
            targets: OnceLock::new(),
        }
    }

    /// A handle of an existing mesh (a received reference, a singleton).
    pub fn of_ref(mesh: ActorMeshRef) -> Self {
        let info = mesh.info();
        let inner = ActorMeshInner::pending(None, info.id, info.name.clone(), info.class.clone());
        inner.set(Ok(mesh));
        Self::new(Arc::new(inner), None)
    }

    fn viewed(&self, mesh: &ActorMeshRef) -> Result<ActorMeshRef, ShapeError> {
        match &self.view {
            None => Ok(mesh.clone()),
            Some(shape) => mesh.view(shape.clone()),
        }
    }

    /// The view's targets (computed, and watched at their hosts, once).
    fn targets(
        &self,
        agent: &ProcAgent,
        mesh: &ActorMeshRef,
    ) -> Result<Arc<(Vec<CastTarget>, ViewExtent)>, ShapeError> {
        if let Some(t) = self.targets.get() {
            return Ok(Arc::clone(t));
        }
        let viewed = self.viewed(mesh)?;
        let targets = viewed.targets();
        agent.watch(&targets);
        let t = Arc::new((targets, viewed.view_extent()));
        Ok(Arc::clone(self.targets.get_or_init(|| t)))
    }

    /// Runs `op` with the mesh (or the reason it does not exist), after the operations
    /// issued before it on a starting mesh.
    fn with_mesh(&self, op: impl FnOnce(Result<&ActorMeshRef, &ActorMeshError>) + Send + 'static) {
        let inner = Arc::clone(&self.inner);
        let run = move || match inner.mesh.get() {
            Some(Ok(mesh)) => op(Ok(mesh)),
            Some(Err(e)) => op(Err(e)),
            None => op(Err(&ActorMeshError::NeverSpawned)),
        };
        match &self.inner.base {
            Some(base) => base.deferred().run(move |_| run()),
            None => run(),
        }
    }

    fn ready(&self, py: Python<'_>) -> PyResult<ActorMeshRef> {
        if let Some(base) = &self.inner.base {
            let d = base.deferred();
            block(py, deadline(None)?, |until| d.wait_blocking(until))?;
        }
        match self.inner.mesh.get() {
            Some(Ok(mesh)) => self.viewed(mesh).map_err(rt_err),
            Some(Err(e)) => Err(rt_err(format!(
                "actor mesh {:?} could not be spawned: {e}",
                self.inner.name
            ))),
            None => Err(rt_err(format!(
                "actor mesh {:?} was never spawned",
                self.inner.name
            ))),
        }
    }
}

#[pymethods]
impl PyActorMesh {
    /// The name given to `spawn`.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The actor class, as named at spawn.
    #[getter]
    fn class_name(&self) -> &str {
        &self.inner.class
    }

    /// The mesh's process-unique id.
    #[getter]
    fn mesh_id(&self) -> u64 {
        self.inner.id
    }

    /// The same mesh through `shape` (in the proc mesh's global ranks).
    fn view(&self, shape: PyRef<'_, PyShape>) -> Self {
        Self::new(Arc::clone(&self.inner), Some(shape.shape().clone()))
    }

    /// Casts `method(*parts)` to the view (see the [module docs](self) for `mode`).
    #[pyo3(signature = (sender, method, parts, mode, port = None, index = None, count = None))]
    #[allow(clippy::too_many_arguments)]
    fn cast(
        slf: &Bound<'_, Self>,
        sender: &Bound<'_, PyAny>,
        method: &str,
        parts: &Bound<'_, PyAny>,
        mode: PyRef<'_, PyCastMode>,
        port: Option<PyRef<'_, PyPortHandle>>,
        index: Option<u32>,
        count: Option<u32>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let this = slf.get();
        let sender = Sender::extract(sender)?;
        let pace_proc = hyperactor::SendContext::proc(&sender).clone();
        let agent = crate::agent::process_agent()?.clone();
        let mut user = Vec::with_capacity(1 + parts.len().unwrap_or(1));
        user.push(Bytes::copy_from_slice(method.as_bytes()));
        user.extend(extract_parts(parts)?);
        let bytes: u64 = user.iter().map(|p| p.len() as u64).sum();
        let max = hyperactor_mesh::cast::max_message_len();
        if bytes > max {
            let too_large = hyperactor_mesh::MeshError::TooLarge {
                mesh: this.inner.name.clone(),
                bytes,
                max,
            };
            return Err(MessageTooLarge::new_err(format!(
                "cannot call endpoint {method}: {too_large}"
            )));
        }
        let mode = *mode;
        // The indices a call expects: every rank of the view, or the chosen one.
        let n = count.unwrap_or(0);
        // A call issued while the previous one is unanswered: pipelined (see below).
        let mut pipelined = false;
        let (cast_mode, reply, out): (ReplyMode, Reply, Option<Py<PyAny>>) = match mode {
            PyCastMode::Broadcast => (ReplyMode::None, Reply::None, None),
            PyCastMode::Call | PyCastMode::One | PyCastMode::Choose => {
                let indices: Vec<u32> = match (mode, index) {
                    (PyCastMode::Choose, Some(i)) => vec![i],
                    (PyCastMode::One, _) => vec![0],
                    _ => (0..n).collect(),
                };
                let replies = CallReplies::open(&agent, indices);
                pipelined = replies.follows_pending();
                let replies = PyCallReplies::new(replies);
                let shared = replies.shared();
                let reduce = match mode {
                    PyCastMode::Call => ReplyMode::Reduce,
                    _ => ReplyMode::Direct,
                };
                let obj = Py::new(py, replies)?.into_any();
                (reduce, Reply::Call(shared), Some(obj))
            }
            PyCastMode::Stream => {
                let queue = PyReplyQueue::new(ReplyQueue::open(&agent));
                let shared = queue.shared();
                let obj = Py::new(py, queue)?.into_any();
                (ReplyMode::Direct, Reply::Queue(shared), Some(obj))
            }
            PyCastMode::Port => {
                let port =
                    port.ok_or_else(|| PyValueError::new_err("CastMode.PORT needs a port"))?;
                (ReplyMode::Direct, Reply::Port(port.to.clone()), None)
            }
        };
        let view_self = Self::new(Arc::clone(&this.inner), this.view.clone());
        let cached = this.targets.get().cloned();
        let _guard = runtime()?.enter();
        this.with_mesh(move |mesh| {
            let mesh = match mesh {
                Ok(mesh) => mesh,
                Err(why) => {
                    let why = format!(
                        "actor mesh {:?} does not exist: {why}",
                        view_self.inner.name
                    );
                    return reply.fail(0..n.max(1), &why);
                }
            };
            let targets = match cached
                .map(Ok)
                .unwrap_or_else(|| view_self.targets(&agent, mesh))
            {
                Ok(t) => t,
                Err(why) => return reply.fail(0..n.max(1), &why.to_string()),
            };
            let (all, extent) = (&targets.0, &targets.1);
            let chosen: Vec<CastTarget>;
            let to: &[CastTarget] = match index {
                Some(i) => {
                    chosen = all.iter().filter(|t| t.index == i).cloned().collect();
                    &chosen
                }
                _ => all,
            };
            // Pipelined calls go to the link tasks, which write them in batches.
            let _batched = hyperactor::channel::QueueWrites::new(pipelined);
            agent.cast(
                sender.actor_id(),
                mesh.actor_name(),
                CastKind::Message {
                    port: py_message_port(),
                },
                extent,
                to,
                cast_mode,
                reply.target(),
                user,
            );
        });
        if let Some(mesh) = this.inner.mesh.get().and_then(|m| m.as_ref().ok()) {
            if let Ok(agent) = crate::agent::process_agent() {
                let _ = this.targets(agent, mesh);
            }
        }
        drop(_guard);
        crate::runtime::pace(py, &pace_proc)?;
        Ok(out)
    }

    /// Stops every actor of the view (after the messages sent to it before): the stop
    /// is cast now; the returned call completes once every actor has stopped.
    fn stop(
        &self,
        py: Python<'_>,
        sender: &Bound<'_, PyAny>,
        reason: String,
        count: u32,
    ) -> PyResult<Py<PyCallReplies>> {
        // If the mesh never came to be, there is nothing to stop.
        self.control_cast(
            py,
            sender,
            count,
            true,
            CastKind::Stop { reason },
            move |_| (0..count).map(|i| ReplyItem::ok(i, Vec::new())).collect(),
        )
    }

    /// A call that completes once every actor of the view has started (ran its
    /// constructor), or with "cannot answer" for one that failed to.
    fn probe(
        &self,
        py: Python<'_>,
        sender: &Bound<'_, PyAny>,
        count: u32,
    ) -> PyResult<Py<PyCallReplies>> {
        let name = self.inner.name.clone();
        self.control_cast(py, sender, count, false, CastKind::Probe, move |why| {
            let why = format!("actor mesh {name:?} does not exist: {why}");
            (0..count).map(|i| ReplyItem::failed(i, &why)).collect()
        })
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let mesh: ActorMeshRef = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled actor mesh: {e}")))?;
        Ok(Self::of_ref(mesh))
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let mesh = slf.get().ready(py)?;
        let data = bincode::serialize(&mesh).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(py, &data),),
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "ActorMeshHandle({:?}, {})",
            self.inner.name, self.inner.class
        )
    }
}
