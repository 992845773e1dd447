//! `PortRef` and `PortReceiver`: streaming ports that carry lists of byte parts.
//!
//! A message is a list of `bytes` parts (so that pickle protocol 5 out-of-band buffers
//! can travel next to the pickle stream without being concatenated into it). Each part
//! is a part of the hyperactor frame on the wire
//! ([`hyperactor::PortRef::send_serialized`]): never re-encoded, never concatenated.

use std::sync::Arc;

use bytes::Bytes;
use hyperactor::id::PortId;
use hyperactor::message::Serialized;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList};
use tokio::sync::{watch, Mutex};

use crate::future::{Convert, PyFuture};
use crate::proc::PyClient;
use crate::runtime::runtime;

/// The nominal message type of Python byte ports: the parts, in order. Messages are
/// sent and received already serialized, so this type is never encoded.
pub type Parts = Vec<Bytes>;

/// Parts at least this long are not copied: the message part keeps a reference to the
/// (immutable) `bytes` object instead (see [`part`]).
const SHARE_PARTS_FROM: usize = 64 << 10;

/// One `bytes` object as a message part: a copy when small (cheaper than keeping a
/// Python reference), the object itself when large. A 64 MiB copy into fresh memory
/// costs ~30 ms in page faults and copying; sharing costs a reference, released when
/// the frame is written and acknowledged (a thread without the GIL defers the release
/// to PyO3's reference pool).
fn part(b: &Bound<'_, PyBytes>) -> Bytes {
    let data = b.as_bytes();
    if data.len() < SHARE_PARTS_FROM {
        Bytes::copy_from_slice(data)
    } else {
        Bytes::from_owner(pyo3::pybacked::PyBackedBytes::from(b.clone()))
    }
}

/// A `bytearray` as a message part: a copy when small, else the object itself, which
/// the message holds (the sender hands it over: it must not change it afterwards; the
/// pickling module only passes `bytearray`s it snapshotted into).
fn bytearray_part(b: &Bound<'_, PyByteArray>) -> Bytes {
    let len = b.len();
    if len < SHARE_PARTS_FROM {
        // SAFETY: the GIL is held; the slice is copied before anything can resize it.
        return Bytes::copy_from_slice(unsafe { b.as_bytes() });
    }
    // SAFETY: `b` is a live bytearray and the GIL is held.
    let ptr = unsafe { pyo3::ffi::PyByteArray_AsString(b.as_ptr()) } as usize;
    Bytes::from_owner(SharedByteArray {
        ptr,
        len,
        _obj: b.clone().unbind(),
    })
}

/// A `bytearray` shared by a message part: its storage, kept alive by the reference.
struct SharedByteArray {
    ptr: usize,
    len: usize,
    _obj: Py<PyByteArray>,
}

impl AsRef<[u8]> for SharedByteArray {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `_obj` keeps the bytearray alive, and nobody resizes it (its sender
        // handed it over); `ptr` and `len` were read from it.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// `bytes` or a list of `bytes` (or `bytearray`s) as message parts (see [`part`]).
pub(crate) fn extract_parts(parts: &Bound<'_, PyAny>) -> PyResult<Parts> {
    if let Ok(b) = parts.cast::<PyBytes>() {
        return Ok(vec![part(b)]);
    }
    let wrong = || {
        PyTypeError::new_err(format!(
            "message parts are bytes or a list of bytes and bytearrays, got {}",
            parts
                .get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string())
        ))
    };
    let list = parts.cast::<PyList>().map_err(|_| wrong())?;
    list.iter()
        .map(|item| {
            if let Ok(b) = item.cast::<PyBytes>() {
                Ok(part(b))
            } else if let Ok(b) = item.cast::<PyByteArray>() {
                Ok(bytearray_part(b))
            } else {
                Err(wrong())
            }
        })
        .collect()
}

/// A reference to a port, to send to; picklable (its `str` is the port id).
#[pyclass(module = "monarch._rust_bindings", name = "PortRef", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyPortRef {
    port_id: PortId,
}

impl PyPortRef {
    pub(crate) fn new(port: hyperactor::PortRef<Parts>) -> Self {
        Self::from_id(port.port_id().clone())
    }

    fn from_id(port_id: PortId) -> Self {
        Self { port_id }
    }
}

#[pymethods]
impl PyPortRef {
    /// Parses a port id (the `str` of a `PortRef`) back into a reference.
    #[staticmethod]
    fn from_string(port_id: &str) -> PyResult<Self> {
        let port_id = port_id
            .parse()
            .map_err(|e: hyperactor::error::IdError| PyValueError::new_err(e.to_string()))?;
        Ok(Self::from_id(port_id))
    }

    /// Sends one message (`bytes`, or a list of `bytes` parts) from `client`.
    fn send(&self, py: Python<'_>, client: &PyClient, parts: &Bound<'_, PyAny>) -> PyResult<()> {
        let parts = extract_parts(parts)?;
        let port = hyperactor::PortRef::<Parts>::attest(self.port_id.clone());
        let client = Arc::clone(&client.client);
        // Sending only enqueues (the link's writer task does the I/O), so the GIL is
        // kept: releasing and retaking it would cost more than the send, and would let
        // other Python threads in mid-call.
        let guard = runtime()?.enter();
        port.send_serialized(&*client, Serialized::from_parts(parts));
        drop(guard);
        crate::runtime::pace(py, hyperactor::SendContext::proc(&*client))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let from_string = slf.get_type().getattr("from_string")?;
        Ok((from_string, (slf.get().port_id.to_string(),)))
    }

    fn __str__(&self) -> String {
        self.port_id.to_string()
    }

    fn __repr__(&self) -> String {
        format!("PortRef({})", self.port_id)
    }
}

struct ReceiverState {
    port_id: PortId,
    rx: Mutex<Option<hyperactor::PortReceiver<Parts>>>,
    closed: watch::Sender<bool>,
    /// Dropping the last client handle closes its mailbox, and with it this port: keep
    /// the client alive as long as its receiver is.
    _client: Arc<hyperactor::Client>,
}

/// The receiving end of a port opened by `Client.open_port()`.
#[pyclass(module = "monarch._rust_bindings", name = "PortReceiver", frozen)]
pub struct PyPortReceiver {
    state: Arc<ReceiverState>,
}

impl std::fmt::Debug for PyPortReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PortReceiver({})", self.state.port_id)
    }
}

impl PyPortReceiver {
    pub(crate) fn new(
        client: Arc<hyperactor::Client>,
        rx: hyperactor::PortReceiver<Parts>,
    ) -> Self {
        Self {
            state: Arc::new(ReceiverState {
                port_id: rx.port_id().clone(),
                rx: Mutex::new(Some(rx)),
                closed: watch::channel(false).0,
                _client: client,
            }),
        }
    }
}

fn closed_error(port_id: &PortId) -> PyErr {
    PyRuntimeError::new_err(format!(
        "port {port_id} is closed: its receiver was closed or its client is gone; open a \
         new port to receive again"
    ))
}

async fn recv(state: Arc<ReceiverState>) -> PyResult<Convert> {
    let mut closed = state.closed.subscribe();
    let mut rx = state.rx.lock().await;
    let Some(receiver) = rx.as_mut() else {
        return Err(closed_error(&state.port_id));
    };
    let parts = tokio::select! {
        biased;
        _ = closed.wait_for(|c| *c) => {
            rx.take();
            return Err(closed_error(&state.port_id));
        }
        received = receiver.recv_serialized() => received.map_err(|e| {
            PyRuntimeError::new_err(format!("receiving on port {}: {e}", state.port_id))
        })?.into_parts(),
    };
    Ok(Box::new(move |py: Python<'_>| {
        let list = crate::recv_bytes::payload_to_list(py, &parts)?;
        Ok(list.into_any().unbind())
    }))
}

#[pymethods]
impl PyPortReceiver {
    /// The next message, as a lazy future of its list of byte parts.
    fn recv(&self) -> PyFuture {
        PyFuture::from_work(
            format!("PortReceiver.recv() on port {}", self.state.port_id),
            recv(Arc::clone(&self.state)),
        )
    }

    /// Closes the port: pending and later `recv()` futures raise; messages sent to the
    /// port later go back to their senders.
    fn close(&self) {
        self.state.closed.send_replace(true);
        if let Ok(mut rx) = self.state.rx.try_lock() {
            rx.take();
        }
    }

    /// The id of the port (the `str` of its `PortRef`).
    #[getter]
    fn port_id(&self) -> String {
        self.state.port_id.to_string()
    }

    fn __repr__(&self) -> String {
        format!("PortReceiver({})", self.state.port_id)
    }
}
