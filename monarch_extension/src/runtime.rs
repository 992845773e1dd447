//! The process-wide tokio runtime that drives every binding.
//!
//! Started lazily, on first use, as a multi-thread runtime whose worker count comes from
//! the environment variable `MONARCH_TOKIO_WORKER_THREADS` (default 2). It lives until the
//! process exits. Python threads never run on it: they hand work to it and wait without
//! holding the GIL (see [`crate::future`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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

/// Why Monarch's tokio runtime could not start. Kept for the life of the process (the
/// failure is sticky), so it is `Clone`.
#[derive(Debug, Clone)]
pub enum RuntimeStartError {
    /// [`WORKER_THREADS_ENV`] is set to something other than a positive integer
    /// (raised as `ValueError`).
    WorkerThreads {
        /// The variable's value.
        value: String,
    },
    /// Tokio could not build the runtime (raised as `RuntimeError`).
    Build {
        /// Tokio's error.
        source: Arc<std::io::Error>,
    },
}

impl std::fmt::Display for RuntimeStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WorkerThreads { value } => write!(
                f,
                "{WORKER_THREADS_ENV}={value:?} is not a positive integer; unset it (default \
                 {DEFAULT_WORKER_THREADS}) or set it to the number of tokio worker threads"
            ),
            Self::Build { source } => write!(f, "cannot start Monarch's tokio runtime: {source}"),
        }
    }
}

impl std::error::Error for RuntimeStartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::WorkerThreads { .. } => None,
            Self::Build { source } => Some(source.as_ref()),
        }
    }
}

impl From<&RuntimeStartError> for PyErr {
    fn from(error: &RuntimeStartError) -> Self {
        match error {
            RuntimeStartError::WorkerThreads { .. } => PyValueError::new_err(error.to_string()),
            RuntimeStartError::Build { .. } => PyRuntimeError::new_err(error.to_string()),
        }
    }
}

static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, RuntimeStartError>> = OnceLock::new();

fn worker_threads() -> Result<usize, RuntimeStartError> {
    match std::env::var(WORKER_THREADS_ENV) {
        Err(_) => Ok(DEFAULT_WORKER_THREADS),
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(RuntimeStartError::WorkerThreads { value }),
        },
    }
}

fn build() -> Result<tokio::runtime::Runtime, RuntimeStartError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads()?)
        .thread_name("monarch-tokio")
        .enable_all()
        .build()
        .map_err(|e| RuntimeStartError::Build {
            source: Arc::new(e),
        })
}

/// The runtime, started on first call.
///
/// # Errors
///
/// `ValueError` if `MONARCH_TOKIO_WORKER_THREADS` is not a positive integer,
/// `RuntimeError` if the runtime cannot be built. Either error is sticky.
pub fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    RUNTIME.get_or_init(build).as_ref().map_err(PyErr::from)
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
    Ok(detach(py, || rt.block_on(fut)))
}

/// Backpressure for Python senders: after a message is posted, waits (without the
/// GIL, interruptible by signals) while some link of `proc` is over its byte budget,
/// so that a sender faster than its receivers goes at their pace instead of queueing
/// without bound. Free when no link of the process is over budget (one atomic load);
/// never waits on a runtime thread.
pub fn pace(py: Python<'_>, proc: &hyperactor::Proc) -> PyResult<()> {
    if !hyperactor::channel::any_link_over_budget() || check_may_block("").is_err() {
        return Ok(());
    }
    let rt = runtime()?;
    block(py, None, |until| {
        let proc = proc.clone();
        rt.block_on(async move {
            match until {
                None => {
                    proc.links_ready().await;
                    Some(())
                }
                Some(until) => tokio::time::timeout_at(until.into(), proc.links_ready())
                    .await
                    .ok(),
            }
        })
    })?;
    Ok(())
}

/// Set once the interpreter starts exiting (see [`_prepare_exit`]).
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that called [`_prepare_exit`]: the one finalizing the interpreter.
static EXIT_THREAD: OnceLock<std::thread::ThreadId> = OnceLock::new();
/// How many threads Python did not create are inside [`attach_from_rust`].
static ATTACHED_FROM_RUST: AtomicUsize = AtomicUsize::new(0);

/// How long [`_prepare_exit`] waits for runtime threads to leave Python.
const EXIT_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Never returns on a thread other than the finalizing one once the interpreter exits.
///
/// Once CPython starts finalizing, a thread that takes the GIL back is ended with
/// `pthread_exit`, whose forced unwind cannot cross Rust frames: the process aborts.
/// A thread coming back from a GIL-free wait during that window parks instead (the
/// process is about to end; 3.14 does the same for every thread).
fn park_if_exiting() {
    if EXITING.load(Ordering::SeqCst) && EXIT_THREAD.get() != Some(&std::thread::current().id()) {
        loop {
            std::thread::park();
        }
    }
}

/// Runs `f` without the GIL and takes it back, unless the interpreter started exiting
/// meanwhile (see `park_if_exiting`). Every GIL-free wait of the bindings goes
/// through here.
pub fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    py.detach(|| {
        let out = f();
        park_if_exiting();
        out
    })
}

/// Runs `f` with the GIL from a thread Python did not create (a runtime thread), or
/// does nothing once the interpreter is exiting. [`_prepare_exit`] waits for the calls
/// in progress, so none is inside Python when finalization starts.
pub fn attach_from_rust<F: FnOnce(Python<'_>)>(f: F) {
    ATTACHED_FROM_RUST.fetch_add(1, Ordering::SeqCst);
    if !EXITING.load(Ordering::SeqCst) {
        Python::attach(f);
    }
    ATTACHED_FROM_RUST.fetch_sub(1, Ordering::SeqCst);
}

/// Registered with `atexit` by `monarch/__init__.py` (so it runs after every monarch
/// exit hook): from here on no runtime thread enters Python and no waiting thread takes
/// the GIL back; waits (bounded) for runtime threads already inside Python to leave.
#[pyfunction]
pub fn _prepare_exit(py: Python<'_>) {
    let _ = EXIT_THREAD.set(std::thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = std::time::Instant::now() + EXIT_DRAIN_LIMIT;
        while ATTACHED_FROM_RUST.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

// Blocking a Python thread on Rust work: in slices on the main thread, so that its
// signal handlers (Ctrl-C) run.

/// How often a blocked `get` on Python's main thread takes the GIL back to run signal
/// handlers (Ctrl-C).
pub const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

thread_local! {
    /// Whether this thread is Python's main thread (decided on first use).
    static ON_MAIN_THREAD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// How long a blocking wait on this thread may last before it takes the GIL back to run
/// signal handlers: [`SIGNAL_CHECK_INTERVAL`] on Python's main thread, `None` (no limit)
/// on any other, where Python never runs them. An actor's thread waiting for its next
/// message then sleeps until it comes, instead of waking ten times a second: with many
/// idle procs on few cores those wake-ups add up.
pub fn signal_slice(py: Python<'_>) -> Option<Duration> {
    let on_main = ON_MAIN_THREAD.with(|cell| {
        if let Some(known) = cell.get() {
            return known;
        }
        let known = is_main_thread(py).unwrap_or(true);
        cell.set(Some(known));
        known
    });
    on_main.then_some(SIGNAL_CHECK_INTERVAL)
}

fn is_main_thread(py: Python<'_>) -> PyResult<bool> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    let current = threading.call_method0("current_thread")?;
    Ok(main.is(&current))
}

/// A deadline `timeout` seconds from now (`None`: none).
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Instant::now().checked_add(Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX)))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, or None; got {t}"
        ))),
    }
}

/// Blocks (without the GIL, in slices on the main thread so signals run) on `wait` until
/// it returns `Some` or `deadline` passes (`None`).
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    wait: impl Fn(Option<Instant>) -> Option<T> + Send + Sync,
) -> PyResult<Option<T>> {
    let slice = signal_slice(py);
    loop {
        let until = match (deadline, slice.map(|s| Instant::now() + s)) {
            (Some(d), Some(s)) => Some(d.min(s)),
            (d, s) => d.or(s),
        };
        if let Some(got) = detach(py, || wait(until)) {
            return Ok(Some(got));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        py.check_signals()?;
    }
}
