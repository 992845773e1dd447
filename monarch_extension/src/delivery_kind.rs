//! `DeliveryKind`: what one item of a driven actor's queue is (see [`crate::actor`]).
//!
//! `Delivery.kind` hands out the class's own members (see `crate::members`), so a
//! loop over deliveries may compare them with `is`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::members::members;

/// What a delivery is; see the [module docs](self).
#[pyclass(
    module = "monarch._rust_bindings",
    name = "DeliveryKind",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PyDeliveryKind {
    /// A call of an endpoint.
    #[pyo3(name = "CALL")]
    Call = 0,
    /// A failure of a mesh the actor owns.
    #[pyo3(name = "SUPERVISE")]
    Supervise = 1,
    /// A stop request.
    #[pyo3(name = "STOP")]
    Stop = 2,
    /// The actor has ended: nothing more comes.
    #[pyo3(name = "ENDED")]
    Ended = 3,
    /// A message the runtime dealt with already (a malformed one, logged and answered
    /// where it could be, or a returned reply): nothing to do.
    #[pyo3(name = "SKIP")]
    Skip = 4,
}

impl PyDeliveryKind {
    /// The class's member for this kind (shared, see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// Only if the class lacks a member (a bug caught by the tests).
    pub(crate) fn member(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        static MEMBERS: PyOnceLock<[Py<PyAny>; 5]> = PyOnceLock::new();
        let all = members::<Self, 5>(py, &MEMBERS, ["CALL", "SUPERVISE", "STOP", "ENDED", "SKIP"])?;
        Ok(all[self as usize].clone_ref(py))
    }
}
