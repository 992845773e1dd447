//! The bindings of `monarch.rdma`: registration in this process's
//! [`Registry`], and transfers to and from registered memory of
//! other processes with the backend the Python layer chose (same-host cross-memory
//! copies, TCP, ibverbs), run off the GIL on the runtime's blocking pool.
//!
//! A region crosses the boundary as an `RdmaRegion` (see [`region`]); the Python
//! layer adds what it needs around it (owner, host, server address) and pickles the
//! whole as the buffer's handle. Local memory is given as an address and length
//! together with the Python object that owns it, which the transfer keeps alive until
//! it ends.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use monarch_rdma::region::RemoteRegion;
use monarch_rdma::tcp::TcpOptions;
use monarch_rdma::{cma, ibverbs, tcp, RdmaError, Registry};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::future::{Convert, PyFuture};

create_exception!(
    monarch._rust_bindings,
    RdmaOwnerGone,
    PyRuntimeError,
    "The owner of a registered buffer is gone or cannot be reached."
);
create_exception!(
    monarch._rust_bindings,
    RdmaDropped,
    PyRuntimeError,
    "The registered buffer was dropped by its owner."
);

pub mod region;

pub use region::PyRdmaRegion;

fn region_of(r: PyRef<'_, PyRdmaRegion>) -> RemoteRegion {
    RemoteRegion::from(&*r)
}

/// The Python exception for `e`.
fn py_err(e: RdmaError) -> PyErr {
    let msg = e.to_string();
    match e {
        RdmaError::Empty | RdmaError::OutOfRange { .. } | RdmaError::SizeMismatch { .. } => {
            PyValueError::new_err(msg)
        }
        RdmaError::Dropped { .. } => RdmaDropped::new_err(msg),
        RdmaError::OwnerGone { .. } | RdmaError::Unreachable { .. } => RdmaOwnerGone::new_err(msg),
        RdmaError::Timeout { .. } => PyTimeoutError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Registers `[addr, addr + len)` of this process in place and returns its region.
/// `keepalive` (the object owning the memory) is kept until the registration ends.
///
/// The caller (the Python layer) guarantees that `keepalive` owns the memory, so that
/// holding it keeps the memory valid (REG-1).
#[pyfunction]
pub fn rdma_register(addr: u64, len: usize, keepalive: Py<PyAny>) -> PyResult<PyRdmaRegion> {
    // SAFETY: `keepalive` owns the memory and is dropped only when the registration
    // ends (see the function's docs).
    let region = unsafe { Registry::global().register(addr, len, Some(Box::new(keepalive))) }
        .map_err(py_err)?;
    Ok(region.into())
}

/// Registers device (CUDA) memory at device address `addr`: host-memory paths refuse
/// it; the Python layer moves it with CUDA IPC.
#[pyfunction]
pub fn rdma_register_device(addr: u64, len: usize, keepalive: Py<PyAny>) -> PyResult<PyRdmaRegion> {
    // SAFETY: as in `rdma_register`; host paths never dereference device memory
    // (`Registry::lookup` refuses it).
    let region =
        unsafe { Registry::global().register_device(addr, len, Some(Box::new(keepalive))) }
            .map_err(py_err)?;
    Ok(region.into())
}

/// Ends registration `id` of this process; returns whether it was registered.
#[pyfunction]
pub fn rdma_deregister(py: Python<'_>, id: u64) -> bool {
    // The keep-alive is a Python object: drop it with the GIL held (we hold it).
    let _ = py;
    Registry::global().deregister(id)
}

/// How many regions this process has registered.
#[pyfunction]
pub fn rdma_registered() -> usize {
    Registry::global().len()
}

/// Checks, one-sided, that `region` (of a process on this host) is still registered.
///
/// Raises `RdmaDropped` if it ended, `RdmaOwnerGone` if its owner is gone.
#[pyfunction]
pub fn rdma_check_live(py: Python<'_>, region: PyRef<'_, PyRdmaRegion>) -> PyResult<()> {
    let region = region_of(region);
    py.detach(|| cma::check_live(&region)).map_err(py_err)
}

/// Starts this process's transfer server (once) and returns the address peers dial.
#[pyfunction]
pub fn rdma_serve() -> PyResult<String> {
    let addr = tcp::serve()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the RDMA TCP server: {e}")))?;
    ibverbs::serve();
    Ok(addr.to_string())
}

/// Registers `region` (live in this process) with the RDMA device for peers; returns
/// its rkey.
#[pyfunction]
pub fn rdma_ibverbs_register(region: PyRef<'_, PyRdmaRegion>) -> PyResult<u32> {
    ibverbs::register_for_peer(&region_of(region)).map_err(py_err)
}

/// Lets processes of the same user read and write this process's registered memory
/// even where Yama's ptrace_scope restricts it (a no-op elsewhere).
#[pyfunction]
pub fn rdma_allow_peer_access() -> PyResult<()> {
    cma::allow_peer_access().map_err(|e| {
        PyRuntimeError::new_err(format!(
            "cannot allow peers to reach this process's memory (prctl PR_SET_PTRACER): {e}"
        ))
    })
}

/// `(available, devices, reason)` of the ibverbs probe (`disabled`: the
/// `rdma_disable_ibverbs` setting).
#[pyfunction]
#[pyo3(signature = (disabled = false))]
pub fn rdma_ibverbs_probe(disabled: bool) -> (bool, Vec<String>, Option<String>) {
    let probe = if disabled {
        ibverbs::probe_with(true)
    } else {
        ibverbs::probe().clone()
    };
    (
        probe.available(),
        probe.devices.clone(),
        probe.reason.clone(),
    )
}

fn server_addr(server: Option<&str>, region: &RemoteRegion) -> PyResult<SocketAddr> {
    let server = server.ok_or_else(|| {
        PyRuntimeError::new_err(format!(
            "the owner of the buffer (pid {}) serves no TCP transfers",
            region.pid
        ))
    })?;
    server.parse().map_err(|e| {
        PyValueError::new_err(format!(
            "bad RDMA server address {server:?} in the handle: {e}"
        ))
    })
}

fn options(
    timeout: Option<f64>,
    parallelism: usize,
    chunk_bytes: usize,
) -> PyResult<(TcpOptions, f64)> {
    let seconds = timeout.unwrap_or(f64::INFINITY);
    let deadline = match timeout {
        Some(t) if t.is_finite() && t >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(t)),
        Some(t) if t.is_nan() || t < 0.0 => {
            return Err(PyValueError::new_err(format!(
                "timeout must be a number of seconds >= 0, got {t}"
            )))
        }
        _ => None,
    };
    Ok((
        TcpOptions {
            parallelism: parallelism.max(1),
            chunk_bytes: chunk_bytes.max(1 << 16),
            deadline,
        },
        seconds,
    ))
}

/// Same-host copies up to this size run on the runtime's thread instead of the
/// blocking pool.
const INLINE_COPY_MAX: usize = 1 << 20;

/// What one transfer does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

/// Copies `len` bytes between the remote region and local memory at `local`, in `op`'s
/// direction, over `via` ("cma", "tcp" or "ibverbs"). Runs off the GIL on the blocking
/// pool; `keepalive` (the object owning the local memory) is held until it ends.
#[allow(clippy::too_many_arguments)]
fn transfer(
    what: String,
    op: Op,
    region: RemoteRegion,
    via: &str,
    server: Option<&str>,
    rkey: Option<u32>,
    local: u64,
    keepalive: Py<PyAny>,
    timeout: Option<f64>,
    parallelism: usize,
    chunk_bytes: usize,
) -> PyResult<PyFuture> {
    #[derive(Clone, Copy)]
    enum Via {
        Cma,
        Tcp(SocketAddr),
        Ibverbs(SocketAddr, u32),
    }
    let via = match via {
        "cma" => Via::Cma,
        "tcp" => Via::Tcp(server_addr(server, &region)?),
        "ibverbs" => Via::Ibverbs(
            server_addr(server, &region)?,
            rkey.ok_or_else(|| {
                PyValueError::new_err("an ibverbs transfer needs the owner's rkey")
            })?,
        ),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown RDMA backend {other:?}: expected cma, tcp or ibverbs"
            )))
        }
    };
    let (opts, seconds) = options(timeout, parallelism, chunk_bytes)?;
    let len = region.len;
    Ok(PyFuture::from_work(what, async move {
        let run = move || {
            let _keepalive = keepalive;
            // SAFETY: the Python layer passes the address and length of memory owned by
            // `keepalive` (checked there: contiguous, at least `len` bytes), which this
            // closure holds until the copy ends.
            let local = unsafe { std::slice::from_raw_parts_mut(local as *mut u8, len) };
            let result = match (via, op) {
                (Via::Cma, Op::Read) => cma::read(&region, local),
                (Via::Cma, Op::Write) => cma::write(&region, local),
                (Via::Tcp(server), Op::Read) => tcp::read(server, &region, local, &opts),
                (Via::Tcp(server), Op::Write) => tcp::write(server, &region, local, &opts),
                (Via::Ibverbs(server, rkey), Op::Read) => {
                    ibverbs::read(server, &region, rkey, local, opts.deadline)
                }
                (Via::Ibverbs(server, rkey), Op::Write) => {
                    ibverbs::write(server, &region, rkey, local, opts.deadline)
                }
            };
            match result {
                Err(RdmaError::Timeout { pid, .. }) => Err(RdmaError::Timeout { pid, seconds }),
                other => other,
            }
        };
        // A short same-host copy (tens of microseconds) runs right here on the
        // runtime's thread: handing it to the blocking pool would cost more than it.
        let outcome = if matches!(via, Via::Cma) && len <= INLINE_COPY_MAX {
            Ok(run())
        } else {
            tokio::task::spawn_blocking(run).await
        };
        match outcome {
            Ok(Ok(())) => Ok(Box::new(|py: Python<'_>| Ok(py.None())) as Convert),
            Ok(Err(e)) => Err(py_err(e)),
            Err(e) => Err(PyRuntimeError::new_err(format!(
                "the transfer panicked: {e}"
            ))),
        }
    }))
}

/// A lazy future that copies the remote `region` into local memory at `dst`.
#[pyfunction]
#[pyo3(signature = (what, region, via, server, dst, keepalive, timeout, parallelism, chunk_bytes, rkey = None))]
#[allow(clippy::too_many_arguments)]
pub fn rdma_read(
    what: String,
    region: PyRef<'_, PyRdmaRegion>,
    via: &str,
    server: Option<&str>,
    dst: u64,
    keepalive: Py<PyAny>,
    timeout: Option<f64>,
    parallelism: usize,
    chunk_bytes: usize,
    rkey: Option<u32>,
) -> PyResult<PyFuture> {
    transfer(
        what,
        Op::Read,
        region_of(region),
        via,
        server,
        rkey,
        dst,
        keepalive,
        timeout,
        parallelism,
        chunk_bytes,
    )
}

/// A lazy future that copies local memory at `src` into the remote `region`.
#[pyfunction]
#[pyo3(signature = (what, region, via, server, src, keepalive, timeout, parallelism, chunk_bytes, rkey = None))]
#[allow(clippy::too_many_arguments)]
pub fn rdma_write(
    what: String,
    region: PyRef<'_, PyRdmaRegion>,
    via: &str,
    server: Option<&str>,
    src: u64,
    keepalive: Py<PyAny>,
    timeout: Option<f64>,
    parallelism: usize,
    chunk_bytes: usize,
    rkey: Option<u32>,
) -> PyResult<PyFuture> {
    transfer(
        what,
        Op::Write,
        region_of(region),
        via,
        server,
        rkey,
        src,
        keepalive,
        timeout,
        parallelism,
        chunk_bytes,
    )
}

/// A lazy future that asks the owner (at `server`) to end the registration; its value
/// says whether it was still registered.
#[pyfunction]
pub fn rdma_drop_remote(
    region: PyRef<'_, PyRdmaRegion>,
    server: &str,
    timeout: f64,
) -> PyResult<PyFuture> {
    let region = region_of(region);
    let server = server_addr(Some(server), &region)?;
    let (opts, seconds) = options(Some(timeout), 1, 1 << 20)?;
    Ok(PyFuture::from_work("dropping an RDMA buffer", async move {
        let outcome =
            tokio::task::spawn_blocking(move || tcp::drop_remote(server, &region, &opts)).await;
        match outcome {
            Ok(Ok(was)) => Ok(Box::new(move |py: Python<'_>| {
                Ok(pyo3::types::PyBool::new(py, was)
                    .to_owned()
                    .into_any()
                    .unbind())
            }) as Convert),
            Ok(Err(RdmaError::Timeout { pid, .. })) => {
                Err(py_err(RdmaError::Timeout { pid, seconds }))
            }
            Ok(Err(e)) => Err(py_err(e)),
            Err(e) => Err(PyRuntimeError::new_err(format!("dropping panicked: {e}"))),
        }
    }))
}

/// This process's host identity (see `monarch_rdma::buffer::host_key`).
#[pyfunction]
pub fn rdma_host_key() -> &'static str {
    monarch_rdma::buffer::host_key()
}

/// The backend a transfer from this process to a CPU buffer of `host` takes: `"cma"`,
/// `"ibverbs"` or `"tcp"`; raises `RuntimeError` naming both sides when none may.
#[pyfunction]
pub fn rdma_choose(
    region: PyRef<'_, PyRdmaRegion>,
    host: String,
    rkey: Option<u32>,
    allow_tcp: bool,
    disable_ibverbs: bool,
) -> PyResult<&'static str> {
    let buffer = monarch_rdma::Buffer {
        region: region_of(region),
        host,
        server: None,
        rkey,
    };
    let policy = monarch_rdma::Policy {
        allow_tcp,
        disable_ibverbs,
    };
    buffer.backend(policy).map(|b| b.name()).map_err(py_err)
}

/// Registers the bindings in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rdma_register, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_register_device, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_registered, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_serve, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_host_key, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_choose, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_check_live, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_allow_peer_access, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_ibverbs_probe, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_ibverbs_register, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_read, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_write, m)?)?;
    m.add_function(wrap_pyfunction!(rdma_drop_remote, m)?)?;
    m.add_class::<PyRdmaRegion>()?;
    m.add("RdmaOwnerGone", m.py().get_type::<RdmaOwnerGone>())?;
    m.add("RdmaDropped", m.py().get_type::<RdmaDropped>())?;
    Ok(())
}
