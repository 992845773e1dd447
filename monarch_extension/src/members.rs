//! Shared members of the enums that cross the boundary ([`crate::reply::PyReplyStatus`],
//! [`crate::delivery_kind::PyDeliveryKind`], ...).
//!
//! A pyclass enum converted from Rust makes a new Python object each time. The values
//! handed out per message (a reply's status, a delivery's kind) are instead the class's
//! own members (`ReplyStatus.OK` itself), fetched once: handing one out allocates
//! nothing, and `is` compares them as well as `==` does.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::PyTypeInfo;

/// The members of enum class `T` named `names`, in that order, fetched from the class
/// the first time and kept in `cache`.
///
/// # Errors
///
/// Fails only if the class lacks one of `names` (a bug caught by the tests).
pub(crate) fn members<'a, T: PyTypeInfo, const N: usize>(
    py: Python<'_>,
    cache: &'a PyOnceLock<[Py<PyAny>; N]>,
    names: [&str; N],
) -> PyResult<&'a [Py<PyAny>; N]> {
    cache.get_or_try_init(py, || {
        let class = T::type_object(py);
        let mut found = Vec::with_capacity(N);
        for name in names {
            found.push(class.getattr(name)?.unbind());
        }
        found.try_into().map_err(|_| {
            pyo3::exceptions::PyRuntimeError::new_err("invariant: one member per name")
        })
    })
}
