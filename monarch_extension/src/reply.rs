//! How a reply crosses the boundary: `ReplyStatus` (what the reply is) and `ReplyItem`
//! (one rank's reply: its index in the view, its status, its parts), both built from
//! [`hyperactor_mesh::cast::reply`]'s types.
//!
//! The statuses a Python item carries are the members of `ReplyStatus` themselves
//! (see `crate::members`): `item.status is ReplyStatus.OK` holds, and building an
//! item allocates the item and its parts list only. `ReplyStatus` compares equal to
//! its code (`ReplyStatus.ERROR == 1`), which `Delivery.reply` and `PortHandle.send`
//! also accept.

use hyperactor_mesh::cast::reply::{ReplyItem, ReplyStatus};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;

use crate::members::members;

/// What a reply is; see the [module docs](self).
#[pyclass(
    module = "monarch._rust_bindings",
    name = "ReplyStatus",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PyReplyStatus {
    /// The handler's value.
    #[pyo3(name = "OK")]
    Ok = ReplyStatus::Ok as isize,
    /// The error the handler raised (the actor lives on).
    #[pyo3(name = "ERROR")]
    Error = ReplyStatus::Error as isize,
    /// The receiver cannot answer (failed, died, unreachable); the part is the reason.
    #[pyo3(name = "FAILED")]
    Failed = ReplyStatus::Failed as isize,
    /// The receiver was stopped; the part is the reason.
    #[pyo3(name = "STOPPED")]
    Stopped = ReplyStatus::Stopped as isize,
}

impl From<PyReplyStatus> for ReplyStatus {
    fn from(status: PyReplyStatus) -> Self {
        match status {
            PyReplyStatus::Ok => ReplyStatus::Ok,
            PyReplyStatus::Error => ReplyStatus::Error,
            PyReplyStatus::Failed => ReplyStatus::Failed,
            PyReplyStatus::Stopped => ReplyStatus::Stopped,
        }
    }
}

/// The status `status` names: a `ReplyStatus`, or its code.
///
/// # Errors
///
/// `ValueError` for an int that is no status's code, `TypeError` for anything else.
pub(crate) fn status_of(status: &Bound<'_, PyAny>) -> PyResult<ReplyStatus> {
    if let Ok(member) = status.cast::<PyReplyStatus>() {
        return Ok((*member.get()).into());
    }
    match status.extract::<u8>()? {
        0 => Ok(ReplyStatus::Ok),
        1 => Ok(ReplyStatus::Error),
        2 => Ok(ReplyStatus::Failed),
        3 => Ok(ReplyStatus::Stopped),
        other => Err(PyValueError::new_err(format!(
            "reply status must be a ReplyStatus (OK, ERROR, FAILED or STOPPED) or its \
             code 0, 1, 2 or 3, got {other}"
        ))),
    }
}

/// The member of `ReplyStatus` for `status` (shared, see the [module docs](self)).
fn status_member(py: Python<'_>, status: ReplyStatus) -> PyResult<Py<PyAny>> {
    static MEMBERS: PyOnceLock<[Py<PyAny>; 4]> = PyOnceLock::new();
    let all = members::<PyReplyStatus, 4>(py, &MEMBERS, ["OK", "ERROR", "FAILED", "STOPPED"])?;
    let at = match status {
        ReplyStatus::Ok => 0,
        ReplyStatus::Error => 1,
        ReplyStatus::Failed => 2,
        ReplyStatus::Stopped => 3,
    };
    Ok(all[at].clone_ref(py))
}

/// One rank's reply; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "ReplyItem", frozen)]
#[derive(Debug)]
pub struct PyReplyItem {
    /// The replying rank's index in the view the call was cast to.
    #[pyo3(get)]
    index: u32,
    /// What the reply is.
    #[pyo3(get)]
    status: Py<PyAny>,
    /// The value's parts (a pickle, then its out-of-band buffers); for `FAILED` and
    /// `STOPPED`, the reason (UTF-8).
    #[pyo3(get)]
    parts: Py<PyList>,
}

#[pymethods]
impl PyReplyItem {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "ReplyItem(index={}, status={}, parts={})",
            self.index,
            self.status.bind(py).repr()?,
            self.parts.bind(py).len()
        ))
    }
}

/// `item` as Python sees it: a `ReplyItem`.
pub(crate) fn item_to_py<'py>(
    py: Python<'py>,
    item: &ReplyItem,
) -> PyResult<Bound<'py, PyReplyItem>> {
    let parts = crate::recv_bytes::payload_to_list(py, &item.parts)?;
    Bound::new(
        py,
        PyReplyItem {
            index: item.index,
            status: status_member(py, item.status)?,
            parts: parts.unbind(),
        },
    )
}
