//! `Inbox` and `Queue`: the keyed inbox of a process hosting Python actors (see
//! [`hyperactor_mesh::inbox`]), bound for Python.
//!
//! Messages are lists of `bytes` parts; the key part is stripped on arrival. A `Queue`
//! is read by blocking a thread without the GIL (`get`), by polling (`try_get`) or by
//! awaiting (`recv`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyperactor_mesh::inbox::{self, CastReply, CastTarget, QueueClosed, REPLY_KEY_BIT};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::future::{signal_slice, Convert, PyFuture};
use crate::port::{extract_parts, PyPortRef};
use crate::proc::PyClient;
use crate::runtime::{detach, runtime};

fn to_list(py: Python<'_>, parts: &[Bytes]) -> PyResult<Py<PyAny>> {
    Ok(PyList::new(py, parts.iter().map(|p| PyBytes::new(py, p)))?
        .into_any()
        .unbind())
}

/// The first part of an agent message reporting a returned message (no pickle starts
/// with a zero byte).
pub const UNDELIVERABLE_TAG: &[u8] = b"\0undeliverable";

fn closed_error(e: &QueueClosed) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{e}: the actor or call it belonged to is gone, or its process is shutting down"
    ))
}

/// A keyed inbox on a client's mailbox; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "Inbox", frozen)]
#[derive(Debug)]
pub struct PyInbox {
    inbox: Arc<inbox::Inbox>,
    _client: Arc<hyperactor::Client>,
}

#[pymethods]
impl PyInbox {
    /// Opens an inbox as a new port of `client`.
    #[new]
    fn new(client: &PyClient) -> PyResult<Self> {
        let _guard = runtime()?.enter();
        Ok(Self {
            inbox: Arc::new(inbox::Inbox::open(&*client.client)),
            _client: Arc::clone(&client.client),
        })
    }

    /// The port to send this inbox's messages to (first part: the key).
    #[getter]
    fn port(&self) -> PyPortRef {
        PyPortRef::new(self.inbox.port())
    }

    /// The queue of actor key `key` (high bit clear).
    fn queue(&self, key: u64) -> PyResult<PyQueue> {
        if key & REPLY_KEY_BIT != 0 {
            return Err(PyValueError::new_err(format!(
                "actor key {key:#x} has the reply bit (1 << 63) set; use a key below 2**63"
            )));
        }
        Ok(PyQueue {
            queue: self.inbox.queue(key),
            inbox: Arc::clone(&self.inbox),
            remove_on_drop: false,
        })
    }

    /// A queue under a fresh reply key; it is removed when the object is dropped.
    fn reply_queue(&self) -> PyQueue {
        PyQueue {
            queue: self.inbox.reply_queue(),
            inbox: Arc::clone(&self.inbox),
            remove_on_drop: true,
        }
    }

    /// Retires actor key `key` into actor key `into`: its queued and later messages go
    /// to `into`'s queue, each with its 8-byte key part first.
    fn retire(&self, key: u64, into: u64) -> PyResult<()> {
        if (key | into) & REPLY_KEY_BIT != 0 || key == into {
            return Err(PyValueError::new_err(format!(
                "retire({key:#x}, {into:#x}): expected two distinct actor keys below 2**63"
            )));
        }
        self.inbox.retire(key, into);
        Ok(())
    }

    /// Closes and forgets the queue of `key`.
    fn remove(&self, key: u64) {
        self.inbox.remove(key);
    }

    /// Casts the message `parts` to actor `actor_key` on `targets` (`(index in the view,
    /// inbox port)`, in view order) over a tree of at most `fanout` children per node.
    /// `mode`: 0 no replies, 1 each replies to `reply_port` under `reply_key`, 2 replies
    /// reduced per subtree. Returns, per position, the end of the subtree it heads.
    #[pyo3(signature = (actor_key, targets, fanout, mode, reply_port, reply_key, parts))]
    #[allow(clippy::too_many_arguments)]
    fn cast(
        &self,
        actor_key: u64,
        targets: Vec<(u32, PyRef<'_, PyPortRef>)>,
        fanout: usize,
        mode: u8,
        reply_port: Option<PyRef<'_, PyPortRef>>,
        reply_key: u64,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u32>> {
        if actor_key & REPLY_KEY_BIT != 0 {
            return Err(PyValueError::new_err(format!(
                "cast to actor key {actor_key:#x}: actor keys are below 2**63"
            )));
        }
        if fanout == 0 {
            return Err(PyValueError::new_err("cast fan-out must be at least 1"));
        }
        let reply = match (mode, reply_port) {
            (0, _) => CastReply::None,
            (1, Some(port)) => CastReply::Direct {
                port: port.port_id().clone(),
                key: reply_key,
            },
            (2, Some(port)) => CastReply::Reduce {
                port: port.port_id().clone(),
                key: reply_key,
            },
            _ => {
                return Err(PyValueError::new_err(format!(
                    "cast mode {mode}: expected 0 (no replies), or 1 (direct) or 2 (reduced) \
                     with a reply port"
                )))
            }
        };
        let targets: Vec<CastTarget> = targets
            .iter()
            .map(|(index, port)| port.cast_target(*index))
            .collect();
        let parts = extract_parts(parts)?;
        let _guard = runtime()?.enter();
        Ok(self.inbox.cast(actor_key, &targets, fanout, &reply, parts))
    }

    /// From now on, every message this inbox's client sent that comes back undelivered
    /// (DEL-1) is reported to the agent (key 0) as
    /// `[UNDELIVERABLE_TAG, destination proc id, reason]`, instead of piling up unread.
    fn forward_undeliverable(&self) -> PyResult<()> {
        let client = Arc::clone(&self._client);
        let port = self.inbox.port();
        runtime()?.spawn(async move {
            while let Some(returned) = client.next_undeliverable().await {
                let dest = returned.envelope.header.dest.actor().proc_id().to_string();
                let parts = vec![
                    inbox::key_part(0),
                    Bytes::from_static(UNDELIVERABLE_TAG),
                    Bytes::from(dest),
                    Bytes::from(returned.reason),
                ];
                port.send_serialized(&*client, hyperactor::message::Serialized::from_parts(parts));
            }
        });
        Ok(())
    }

    /// The proc `proc_id` is gone: casts skip it and stop waiting for replies through it.
    fn peer_died(&self, proc_id: &str) -> PyResult<()> {
        let proc: hyperactor::ProcId = proc_id
            .parse()
            .map_err(|e: hyperactor::error::IdError| PyValueError::new_err(e.to_string()))?;
        let _guard = runtime()?.enter();
        self.inbox.peer_died(&proc);
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inbox)
    }
}

/// The messages of one key, in arrival order.
#[pyclass(module = "monarch._rust_bindings", name = "Queue", frozen)]
#[derive(Debug)]
pub struct PyQueue {
    queue: Arc<inbox::Queue>,
    inbox: Arc<inbox::Inbox>,
    remove_on_drop: bool,
}

impl Drop for PyQueue {
    fn drop(&mut self) {
        if self.remove_on_drop {
            self.inbox.remove(self.queue.key());
        }
    }
}

#[pymethods]
impl PyQueue {
    /// The key (the first part of every message for this queue).
    #[getter]
    fn key(&self) -> u64 {
        self.queue.key()
    }

    /// The key as the 8-byte part that starts a message for this queue.
    #[getter]
    fn key_part<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.queue.key().to_le_bytes())
    }

    /// The inbox port messages for this queue go to.
    #[getter]
    fn port(&self) -> PyPortRef {
        PyPortRef::new(self.inbox.port())
    }

    /// The next message if one is queued, else `None`.
    fn try_get(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.queue.try_pop() {
            Ok(Some(parts)) => Ok(Some(to_list(py, &parts)?)),
            Ok(None) => Ok(None),
            Err(e) => Err(closed_error(&e)),
        }
    }

    /// Blocks, without the GIL, for the next message; `TimeoutError` after `timeout`
    /// seconds (the message, when it comes, stays queued).
    #[pyo3(signature = (timeout = None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let deadline = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => {
                Instant::now().checked_add(Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX))
            }
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "timeout must be a finite number of seconds >= 0, or None; got {t}"
                )))
            }
        };
        if let Ok(Some(parts)) = self.queue.try_pop() {
            return to_list(py, &parts);
        }
        let slice = signal_slice(py);
        loop {
            let slice_end = slice.map(|s| Instant::now() + s);
            let until = match (deadline, slice_end) {
                (Some(d), Some(s)) => Some(d.min(s)),
                (d, s) => d.or(s),
            };
            let popped = detach(py, || self.queue.pop_blocking(until));
            match popped {
                Ok(Some(parts)) => return to_list(py, &parts),
                Err(e) => return Err(closed_error(&e)),
                Ok(None) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(PyTimeoutError::new_err(format!(
                            "no message on queue {:#x} within {} s",
                            self.queue.key(),
                            timeout.unwrap_or_default()
                        )));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// The next message, as a future to await (or `get()`).
    fn recv(&self) -> PyFuture {
        let queue = Arc::clone(&self.queue);
        PyFuture::from_work(format!("{:?}.recv()", self.queue), async move {
            let parts = queue.pop().await.map_err(|e| closed_error(&e))?;
            let convert: Convert = Box::new(move |py: Python<'_>| to_list(py, &parts));
            Ok(convert)
        })
    }

    /// Closes the queue; waiters raise once it is empty.
    fn close(&self) {
        self.queue.close();
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.queue)
    }
}
