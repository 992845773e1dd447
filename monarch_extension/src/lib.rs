#![doc = include_str!("../README.md")]

use pyo3::prelude::*;
use pyo3::types::PyDict;

pub mod actor;
pub mod actor_mesh;
pub mod admin;
pub mod agent;
pub mod call;
pub mod cast_mode;
pub mod delivery_kind;
pub mod future;
pub mod host_mesh;
mod members;
pub mod monitor;
pub mod output;
pub mod port;
pub mod proc;
pub mod proc_mesh;
pub mod rdma;
mod recv_bytes;
pub mod reply;
pub mod runtime;
pub mod sender;
pub mod shape;
pub mod supervision;

/// The crate version, exported to Python as `monarch._rust_bindings.__version__`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The cargo profile this module was compiled with: `"debug"` or `"release"`.
///
/// Derived from `debug_assertions`, which is what distinguishes the two profiles
/// `make build-dev` and `make build-prod` use.
pub const PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The target triple this module was compiled for, e.g. `x86_64-unknown-linux-gnu`.
pub const TARGET: &str = env!("MONARCH_BUILD_TARGET");

/// The output of `rustc --version` for the compiler that built this module.
pub const RUSTC: &str = env!("MONARCH_BUILD_RUSTC");

/// Describe how this extension was built, for bug reports.
///
/// Returns a new dict with the keys `version`, `profile`, `target` and `rustc`, all
/// strings (see [`VERSION`], [`PROFILE`], [`TARGET`] and [`RUSTC`]).
///
/// # Errors
///
/// Fails only if Python cannot allocate the dict or its items.
#[pyfunction]
pub fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = PyDict::new(py);
    info.set_item("version", VERSION)?;
    info.set_item("profile", PROFILE)?;
    info.set_item("target", TARGET)?;
    info.set_item("rustc", RUSTC)?;
    Ok(info)
}

/// The index of the first occurrence of `needle` in `haystack`, or -1: `bytes.find`
/// with a vectorized search (the standard one scans a 64 MiB pickle at about
/// 1.5 GB/s, which `runtime.dumps` paid on every large message). Releases the GIL for
/// large inputs.
#[pyfunction]
pub fn find(py: Python<'_>, haystack: &[u8], needle: &[u8]) -> isize {
    const DETACH_ABOVE: usize = 1 << 20;
    let search = || memchr::memmem::find(haystack, needle).map_or(-1, |i| i as isize);
    if haystack.len() > DETACH_ABOVE {
        py.detach(search)
    } else {
        search()
    }
}

/// The compiled half of the `monarch` package. Private: `monarch` re-exports what users need.
///
/// (This doc is the module's `__doc__`; the interpreter calls this function on
/// `import monarch._rust_bindings` to fill the module in.)
///
/// # Errors
///
/// Fails if adding an attribute to the module fails.
#[pymodule]
pub fn _rust_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("__version__", VERSION)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(find, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_prepare_exit, m)?)?;
    m.add_class::<future::PyFuture>()?;
    m.add_class::<proc::PyProc>()?;
    m.add_class::<proc::PyClient>()?;
    m.add_class::<port::PyPortRef>()?;
    m.add_class::<port::PyPortReceiver>()?;
    m.add_class::<agent::PyProcAgent>()?;
    m.add_class::<actor::PyDrivenActor>()?;
    m.add_class::<actor::PyDelivery>()?;
    m.add_class::<host_mesh::PyHostMesh>()?;
    m.add_class::<proc_mesh::PyProcMesh>()?;
    m.add_class::<actor_mesh::PyActorMesh>()?;
    m.add_class::<call::PyCallReplies>()?;
    m.add_class::<call::PyReplyQueue>()?;
    m.add_class::<call::PyPortHandle>()?;
    m.add_class::<supervision::PyMeshFailure>()?;
    m.add_class::<output::PyOutputReceiver>()?;
    shape::register(m)?;
    monitor::register(m)?;
    rdma::register(m)?;
    admin::register(m)?;
    m.add_class::<cast_mode::PyCastMode>()?;
    m.add_class::<reply::PyReplyStatus>()?;
    m.add_class::<reply::PyReplyItem>()?;
    m.add_class::<delivery_kind::PyDeliveryKind>()?;
    // The names of earlier releases, as aliases of the enums' members.
    let status = m.getattr("ReplyStatus")?;
    for name in ["OK", "ERROR", "FAILED", "STOPPED"] {
        m.add(format!("REPLY_{name}"), status.getattr(name)?)?;
    }
    let kind = m.getattr("DeliveryKind")?;
    for name in ["CALL", "SUPERVISE", "STOP", "ENDED", "SKIP"] {
        m.add(format!("DELIVERY_{name}"), kind.getattr(name)?)?;
    }
    m.add("PYTHON_MESSAGE_PORT", actor::py_message_port())?;
    m.add_function(wrap_pyfunction!(max_message_len, m)?)?;
    m.add_function(wrap_pyfunction!(agent::set_cluster_secret, m)?)?;
    m.add_function(wrap_pyfunction!(agent::set_trust_all_connections, m)?)?;
    m.add_function(wrap_pyfunction!(agent::set_tls_credentials, m)?)?;
    m.add_function(wrap_pyfunction!(agent::cluster_auth_env, m)?)?;
    m.add_function(wrap_pyfunction!(agent::worker_proc_id, m)?)?;
    m.add_function(wrap_pyfunction!(agent::primary_ip, m)?)?;
    m.add_function(wrap_pyfunction!(set_max_frame_len, m)?)?;
    m.add_function(wrap_pyfunction!(set_channel_settings, m)?)?;
    m.add_function(wrap_pyfunction!(set_call_spin, m)?)?;
    m.add_function(wrap_pyfunction!(lend_bytearray, m)?)?;
    m.add(
        "WouldBlockRuntime",
        m.py().get_type::<runtime::WouldBlockRuntime>(),
    )?;
    m.add(
        "MessageTooLarge",
        m.py().get_type::<actor_mesh::MessageTooLarge>(),
    )?;
    Ok(())
}

/// The largest payload (the sum of a message's parts, in bytes) a message may have in
/// this process: the largest frame less room for the headers.
#[pyfunction]
fn max_message_len() -> u64 {
    hyperactor_mesh::cast::max_message_len()
}

/// Sets the largest frame this process sends or accepts, in bytes (the
/// `codec_max_frame_length` config key); only before the first message. Returns the
/// largest frame in force (another value if it was fixed already).
#[pyfunction]
fn set_max_frame_len(len: u64) -> u64 {
    match hyperactor::channel::set_max_frame_len(len) {
        Ok(()) => len.max(1),
        Err(in_force) => in_force,
    }
}

/// Sets this process's channel settings for the links and connections made from now on
/// (see `hyperactor::channel::set_delivery_timeout` and its kin): `delivery_timeout`
/// (`message_delivery_timeout`), `tcp_keepalive_idle` (`channel_tcp_keepalive_idle`),
/// in seconds (`None`: no limit, the kernel's default), and `tcp_congestion`
/// (`channel_tcp_congestion`; empty or `None`: the kernel's default).
///
/// # Errors
///
/// `ValueError` if a duration is negative or not finite.
#[pyfunction]
#[pyo3(signature = (delivery_timeout = None, tcp_keepalive_idle = None, tcp_congestion = None))]
fn set_channel_settings(
    delivery_timeout: Option<f64>,
    tcp_keepalive_idle: Option<f64>,
    tcp_congestion: Option<&str>,
) -> PyResult<()> {
    let delivery = delivery_timeout
        .map(|s| agent::duration("delivery_timeout", s))
        .transpose()?;
    let keepalive = tcp_keepalive_idle
        .map(|s| agent::duration("tcp_keepalive_idle", s))
        .transpose()?;
    hyperactor::channel::set_delivery_timeout(delivery);
    hyperactor::channel::set_tcp_keepalive_idle(keepalive);
    hyperactor::channel::set_tcp_congestion(tcp_congestion);
    Ok(())
}

/// Sets the longest a thread of this process blocked on a call's replies spins before it
/// sleeps, in seconds (the `call_spin` config key; 0: never); see
/// [`hyperactor::sync::spin`].
///
/// # Errors
///
/// `ValueError` if `seconds` is negative or not finite.
#[pyfunction]
fn set_call_spin(seconds: f64) -> PyResult<()> {
    hyperactor::sync::spin::set_spin_limit(agent::duration("call_spin", seconds)?);
    Ok(())
}

/// A `bytearray` of `len` bytes (contents arbitrary) to snapshot a writable buffer into
/// before sending it as a message part: recycled when a free one of that length exists.
#[pyfunction]
fn lend_bytearray(py: Python<'_>, len: usize) -> Bound<'_, pyo3::types::PyByteArray> {
    recv_bytes::lend_bytearray(py, len)
}

/// The environment variable that filters the runtime's log lines (the syntax of
/// `tracing_subscriber`'s `EnvFilter`, e.g. `info` or `hyperactor=debug`); `RUST_LOG`
/// when it is unset; warnings and errors by default.
pub const LOG_ENV: &str = "MONARCH_LOG";

/// Sends the runtime's log lines (warnings and errors unless [`LOG_ENV`] says
/// otherwise) to this process's stderr, one line each. Nothing if the embedding
/// program installed a subscriber of its own.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = [LOG_ENV, "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}
