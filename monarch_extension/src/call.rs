//! The collectors of replies made from Python: `CallReplies` (one call: a reply per
//! rank), `ReplyQueue` (streams and channels: replies in arrival order) and `PortHandle`
//! (where a reply goes; picklable). See [`hyperactor_mesh::agent::CallReplies`].
//!
//! A reply item reaches Python as a `ReplyItem` (see [`crate::reply`]): the rank's
//! index in the view, its `ReplyStatus`, and the value's parts (a pickle and its
//! out-of-band buffers, or the reason a rank cannot answer).

use std::sync::Arc;

use bytes::Bytes;
use hyperactor::message::Serialized;
use hyperactor::SendContext;
use hyperactor_mesh::agent::{CallReplies, ReplyQueue};
use hyperactor_mesh::cast::codec::ReplyTo;
use hyperactor_mesh::cast::reply::{encode_reply, ReplyItem};
use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::future::{Convert, PyFuture};
use crate::port::extract_parts;
use crate::reply::{item_to_py, status_of, PyReplyItem};
use crate::runtime::{block, deadline, runtime};
use crate::sender::Sender;

fn items_to_py(py: Python<'_>, items: &[ReplyItem]) -> PyResult<Py<PyAny>> {
    let list = PyList::empty(py);
    for item in items {
        list.append(item_to_py(py, item)?)?;
    }
    Ok(list.into_any().unbind())
}

/// The replies of one call; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "CallReplies", frozen)]
#[derive(Debug)]
pub struct PyCallReplies {
    replies: Arc<CallReplies>,
}

impl PyCallReplies {
    pub(crate) fn new(replies: CallReplies) -> Self {
        Self {
            replies: Arc::new(replies),
        }
    }

    pub(crate) fn shared(&self) -> Arc<CallReplies> {
        Arc::clone(&self.replies)
    }
}

#[pymethods]
impl PyCallReplies {
    /// Blocks until the call is complete (every rank answered, or one cannot); returns
    /// its items by index. `TimeoutError` after `timeout` seconds (nothing is lost).
    #[pyo3(signature = (timeout = None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let deadline = deadline(timeout)?;
        let replies = &self.replies;
        let got = block(py, deadline, |until| match replies.wait_blocking(until) {
            hyperactor_mesh::agent::Waited::Ready(items) => Some(items),
            hyperactor_mesh::agent::Waited::Timeout => None,
        })?;
        match got {
            Some(items) => items_to_py(py, &items),
            None => Err(PyTimeoutError::new_err(format!(
                "the call was not complete within {} s",
                timeout.unwrap_or_default()
            ))),
        }
    }

    /// The same, as a future to await.
    fn wait(&self) -> PyFuture {
        let replies = Arc::clone(&self.replies);
        PyFuture::from_work("waiting for replies", async move {
            let items = replies.wait().await;
            let convert: Convert = Box::new(move |py| items_to_py(py, &items));
            Ok(convert)
        })
    }

    /// Whether the call is complete.
    fn done(&self) -> bool {
        self.replies.is_done()
    }

    /// How many reply messages arrived (a reduced call gets one per top-level subtree).
    #[getter]
    fn messages(&self) -> usize {
        self.replies.messages()
    }
}

/// Replies in arrival order; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "ReplyQueue", frozen)]
#[derive(Debug)]
pub struct PyReplyQueue {
    queue: Arc<ReplyQueue>,
}

impl PyReplyQueue {
    pub(crate) fn new(queue: ReplyQueue) -> Self {
        Self {
            queue: Arc::new(queue),
        }
    }

    pub(crate) fn shared(&self) -> Arc<ReplyQueue> {
        Arc::clone(&self.queue)
    }
}

#[pymethods]
impl PyReplyQueue {
    /// Blocks for the next item; `TimeoutError` after `timeout` seconds.
    #[pyo3(signature = (timeout = None))]
    fn get<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyReplyItem>> {
        let deadline = deadline(timeout)?;
        let queue = &self.queue;
        let got = block(py, deadline, |until| match queue.next_blocking(until) {
            hyperactor_mesh::agent::Waited::Ready(item) => Some(item),
            hyperactor_mesh::agent::Waited::Timeout => None,
        })?;
        match got {
            Some(item) => item_to_py(py, &item),
            None => Err(PyTimeoutError::new_err(format!(
                "no reply within {} s",
                timeout.unwrap_or_default()
            ))),
        }
    }

    /// The next item if one is queued, else `None`.
    fn try_get<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyReplyItem>>> {
        self.queue
            .try_next()
            .map(|i| item_to_py(py, &i))
            .transpose()
    }

    /// The next item, as a future to await.
    fn recv(&self) -> PyFuture {
        let queue = Arc::clone(&self.queue);
        PyFuture::from_work("waiting for a reply", async move {
            let item = queue.next().await;
            let convert: Convert =
                Box::new(move |py| Ok(item_to_py(py, &item)?.into_any().unbind()));
            Ok(convert)
        })
    }

    /// A port whose messages arrive here, as items of index `index`.
    #[pyo3(signature = (index = 0))]
    fn port(&self, index: u32) -> PyPortHandle {
        PyPortHandle {
            to: self.queue.reply_to().clone(),
            index,
        }
    }
}

/// Where a reply (or a channel's message) goes: a reply target and the index the item
/// carries. Picklable: a port travels to other processes as a reference.
#[pyclass(module = "monarch._rust_bindings", name = "PortHandle", frozen)]
#[derive(Debug, Clone)]
pub struct PyPortHandle {
    pub(crate) to: ReplyTo,
    pub(crate) index: u32,
}

impl PyPortHandle {
    /// Posts `item` to the port from `sender` (a reply that cannot be delivered is
    /// dropped: nobody waits for it any more).
    pub(crate) fn post(&self, sender: &impl SendContext, item: ReplyItem) {
        let mut header = sender.envelope_header(self.to.port.clone());
        header.return_to = None;
        sender.proc().post(hyperactor::message::Envelope {
            header,
            payload: Serialized::from_parts(encode_reply(self.to.key, &[item])),
        });
    }
}

#[pymethods]
impl PyPortHandle {
    /// The index the items sent here carry.
    #[getter]
    fn index(&self) -> u32 {
        self.index
    }

    /// Sends one item (`status`: a `ReplyStatus` or its code) from `sender`.
    fn send(
        &self,
        sender: &Bound<'_, PyAny>,
        status: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let sender = Sender::extract(sender)?;
        let item = ReplyItem {
            index: self.index,
            status: status_of(status)?,
            parts: extract_parts(parts)?,
        };
        let guard = runtime()?.enter();
        self.post(&sender, item);
        drop(guard);
        crate::runtime::pace(sender_py(parts), sender.proc())
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let (to, index): (ReplyTo, u32) = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled port: {e}")))?;
        Ok(Self { to, index })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let this = slf.get();
        let data = bincode::serialize(&(&this.to, this.index))
            .map(Bytes::from)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(slf.py(), &data),),
        ))
    }

    fn __repr__(&self) -> String {
        format!("Port({}#{})", self.to.port, self.to.key)
    }
}

fn sender_py<'py>(any: &Bound<'py, PyAny>) -> Python<'py> {
    any.py()
}
