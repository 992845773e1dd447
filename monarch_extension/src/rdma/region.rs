//! `RdmaRegion`: a registered region of some process's memory, as it crosses the
//! boundary ([`RemoteRegion`]'s fields, by name). The Python layer adds what it needs
//! around it (owner, host, server address) and pickles the whole as the buffer's
//! handle; a region pickles to its fields.
//!
//! ```python
//! region = rdma_register(addr, 4096, owner)
//! assert (region.len, region.pid) == (4096, os.getpid())
//! first_kb = region.with_len(1024)
//! ```

use monarch_rdma::region::RemoteRegion;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A registered region; see the [module docs](self).
#[pyclass(
    module = "monarch._rust_bindings",
    name = "RdmaRegion",
    frozen,
    eq,
    hash,
    get_all
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyRdmaRegion {
    /// The owner's process id (on the owner's host).
    pub pid: u32,
    /// The registration id, unique within the owner process.
    pub id: u64,
    /// The start address, in the owner's address space.
    pub addr: u64,
    /// The length in bytes.
    pub len: usize,
    /// The registration's secret, which a peer presents to name it over a socket.
    pub key: u64,
    /// Where the registration's liveness slot lies in the owner's address space (0:
    /// unknown).
    pub slot: u64,
}

impl From<RemoteRegion> for PyRdmaRegion {
    fn from(r: RemoteRegion) -> Self {
        Self {
            pid: r.pid,
            id: r.id,
            addr: r.addr,
            len: r.len,
            key: r.key,
            slot: r.slot,
        }
    }
}

impl From<&PyRdmaRegion> for RemoteRegion {
    fn from(r: &PyRdmaRegion) -> Self {
        Self {
            pid: r.pid,
            id: r.id,
            addr: r.addr,
            len: r.len,
            key: r.key,
            slot: r.slot,
        }
    }
}

#[pymethods]
impl PyRdmaRegion {
    /// A region from its fields (what unpickling calls).
    #[new]
    fn new(pid: u32, id: u64, addr: u64, len: usize, key: u64, slot: u64) -> Self {
        Self {
            pid,
            id,
            addr,
            len,
            key,
            slot,
        }
    }

    /// The same region, its first `len` bytes only.
    ///
    /// # Errors
    ///
    /// `ValueError` if `len` is larger than the region.
    fn with_len(&self, len: usize) -> PyResult<Self> {
        if len > self.len {
            return Err(PyValueError::new_err(format!(
                "RdmaRegion.with_len({len}): the region (id {}) has only {} bytes",
                self.id, self.len
            )));
        }
        Ok(Self { len, ..*self })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let r = slf.get();
        let py = slf.py();
        let fields = (r.pid, r.id, r.addr, r.len, r.key, r.slot).into_pyobject(py)?;
        Ok((slf.get_type().into_any(), fields))
    }

    fn __repr__(&self) -> String {
        format!(
            "RdmaRegion(pid={}, id={}, addr={:#x}, len={}, slot={:#x})",
            self.pid, self.id, self.addr, self.len, self.slot
        )
    }
}
