//! The process-wide tokio runtime that drives every binding.
//!
//! Started lazily, on first use, as a multi-thread runtime whose worker count comes from
//! the environment variable `MONARCH_TOKIO_WORKER_THREADS` (default 2). It lives until the
//! process exits. Python threads never run on it: they hand work to it and wait without
//! holding the GIL (see [`crate::future`]).

use std::sync::OnceLock;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// The environment variable that sets the number of tokio worker threads.
pub const WORKER_THREADS_ENV: &str = "MONARCH_TOKIO_WORKER_THREADS";

/// Worker threads when [`WORKER_THREADS_ENV`] is unset.
pub const DEFAULT_WORKER_THREADS: usize = 2;

pyo3::create_exception!(
    monarch._rust_bindings,
    WouldBlockRuntime,
    PyRuntimeError,
    "Raised when a blocking call (such as `Future.get()`) is made on a thread of Monarch's \
     tokio runtime, where blocking would stall the runtime. Use `await` instead, or block \
     from a thread of your own."
);

static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();

fn worker_threads() -> Result<usize, String> {
    match std::env::var(WORKER_THREADS_ENV) {
        Err(_) => Ok(DEFAULT_WORKER_THREADS),
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{WORKER_THREADS_ENV}={value:?} is not a positive integer; unset it (default \
                 {DEFAULT_WORKER_THREADS}) or set it to the number of tokio worker threads"
            )),
        },
    }
}

fn build() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads()?)
        .thread_name("monarch-tokio")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start Monarch's tokio runtime: {e}"))
}

/// The runtime, started on first call.
///
/// # Errors
///
/// `ValueError` if `MONARCH_TOKIO_WORKER_THREADS` is not a positive integer,
/// `RuntimeError` if the runtime cannot be built. Either error is sticky.
pub fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    match RUNTIME.get_or_init(build) {
        Ok(rt) => Ok(rt),
        Err(msg) if msg.starts_with(WORKER_THREADS_ENV) => Err(PyValueError::new_err(msg.clone())),
        Err(msg) => Err(PyRuntimeError::new_err(msg.clone())),
    }
}

/// Fails with [`WouldBlockRuntime`] when the calling thread belongs to a tokio runtime,
/// where `what` (a blocking call) would stall the runtime.
///
/// # Errors
///
/// [`WouldBlockRuntime`], naming `what`.
pub fn check_may_block(what: &str) -> PyResult<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(WouldBlockRuntime::new_err(format!(
            "{what} would block a thread of Monarch's tokio runtime; await the future \
             instead, or call {what} from a thread that is not a runtime thread"
        )));
    }
    Ok(())
}

/// Runs `fut` to completion on the runtime, from a thread that is not a runtime thread,
/// with the GIL released while it runs.
///
/// # Errors
///
/// [`WouldBlockRuntime`] on a runtime thread; the runtime's start errors (see
/// [`runtime`]).
pub fn block_on<F>(py: Python<'_>, what: &str, fut: F) -> PyResult<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    check_may_block(what)?;
    let rt = runtime()?;
    Ok(py.detach(|| rt.block_on(fut)))
}
