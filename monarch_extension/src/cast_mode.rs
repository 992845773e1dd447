//! `CastMode`: what a cast to an actor mesh collects, one member per adverb (see
//! [`crate::actor_mesh`]).
//!
//! ```python
//! from monarch._rust_bindings import CastMode
//! handle.cast(sender, "ping", parts, CastMode.CALL, count=4)
//! ```

use pyo3::prelude::*;

/// What a cast collects; see the [module docs](self).
#[pyclass(
    module = "monarch._rust_bindings",
    name = "CastMode",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PyCastMode {
    /// No replies (`broadcast`).
    #[pyo3(name = "BROADCAST")]
    Broadcast,
    /// One reply per rank, reduced over the tree (`call`).
    #[pyo3(name = "CALL")]
    Call,
    /// One reply, from a view of one actor (`call_one`).
    #[pyo3(name = "ONE")]
    One,
    /// One reply, from the actor at the given index (`choose`).
    #[pyo3(name = "CHOOSE")]
    Choose,
    /// One reply per rank, in arrival order (`stream`).
    #[pyo3(name = "STREAM")]
    Stream,
    /// One reply per rank, sent to a given port (`send(..., port=...)`).
    #[pyo3(name = "PORT")]
    Port,
}
