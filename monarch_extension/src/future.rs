//! `monarch._rust_bindings.Future`: a result computed on the tokio runtime, waited for
//! from Python either by blocking (`get`) or by awaiting on any asyncio loop.
//!
//! A future wraps a Rust future (the *work*). The work is lazy: it is spawned on the
//! runtime the first time someone waits (`get`, `result`, `exception`, `await`,
//! `as_asyncio`). Its output is kept as a Rust value until the first waiter holding the
//! GIL turns it into a Python object (or exception), which is then cached: every later
//! waiter gets that same object, or the same exception object re-raised.
//!
//! Waiting never holds the GIL:
//!
//! - `get` waits on a condition variable inside [`Python::detach`]; on Python's main
//!   thread in slices of [`SIGNAL_CHECK_INTERVAL`](crate::runtime::SIGNAL_CHECK_INTERVAL), so that Ctrl-C still interrupts it
//!   (other threads never run signal handlers: they sleep until woken). Timing out does
//!   not cancel the work.
//! - `await` creates an `asyncio.Future` on the awaiting loop and registers it. When the
//!   work ends, a blocking-pool thread takes the GIL just long enough to schedule, with
//!   `loop.call_soon_threadsafe`, a callback that settles the asyncio future on its own
//!   loop thread. No loop is ever blocked, and any number of loops in any number of
//!   threads can await one future.

use hyperactor::sync::{Condvar, Mutex};
use std::ffi::CStr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyDict, PyTuple};

use crate::runtime::{attach_from_rust, check_may_block, detach, runtime, signal_slice};

/// Turns the work's Rust output into a Python object; runs with the GIL, once.
pub type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

type Outcome = PyResult<Convert>;
type Work = Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>;
type Resolved = Result<Py<PyAny>, Py<pyo3::exceptions::PyBaseException>>;

enum Phase {
    /// Not started: nobody has waited yet.
    Idle(Work),
    Running,
    /// Finished; the outcome is taken by the first conversion.
    Done(Option<Outcome>),
}

/// An `asyncio.Future` waiting for the result, and the loop it belongs to.
struct Waiter {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
}

struct State {
    phase: Phase,
    waiters: Vec<Waiter>,
}

struct Shared {
    /// What the work is, for messages (e.g. `PortReceiver.recv() on port ...`).
    what: String,
    state: Mutex<State>,
    finished: Condvar,
    value: PyOnceLock<Resolved>,
}

impl Shared {
    fn is_done(&self) -> bool {
        matches!(self.state.lock().phase, Phase::Done(_))
    }

    /// Spawns the work if nobody has yet.
    fn start(self: &Arc<Self>) -> PyResult<()> {
        let rt = runtime()?;
        let work = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut state.phase, Phase::Running) {
                Phase::Idle(work) => work,
                other => {
                    state.phase = other;
                    return Ok(());
                }
            }
        };
        let shared = Arc::clone(self);
        rt.spawn(async move {
            // A second task, so that a panic in the work still finishes the future.
            let outcome = match tokio::spawn(work).await {
                Ok(outcome) => outcome,
                Err(e) => Err(PyRuntimeError::new_err(format!(
                    "{} failed inside Monarch's runtime: {e}",
                    shared.what
                ))),
            };
            shared.finish(outcome);
        });
        Ok(())
    }

    fn finish(self: &Arc<Self>, outcome: Outcome) {
        let waiters = {
            let mut state = self.state.lock();
            state.phase = Phase::Done(Some(outcome));
            std::mem::take(&mut state.waiters)
        };
        self.finished.notify_all();
        if !waiters.is_empty() {
            let shared = Arc::clone(self);
            // Taking the GIL may take a while; keep it off the runtime's workers.
            tokio::task::spawn_blocking(move || {
                attach_from_rust(|py| {
                    for waiter in waiters {
                        shared.schedule_settle(py, waiter);
                    }
                })
            });
        }
    }

    /// Asks the waiter's loop to settle its asyncio future, on the loop's own thread.
    fn schedule_settle(self: &Arc<Self>, py: Python<'_>, waiter: Waiter) {
        let shared = Arc::clone(self);
        let future = waiter.future.clone_ref(py);
        let settle = PyCFunction::new_closure(
            py,
            None,
            None,
            move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| {
                shared.settle(args.py(), future.bind(args.py()))
            },
        );
        let scheduled = settle.and_then(|settle| {
            waiter
                .event_loop
                .call_method1(py, "call_soon_threadsafe", (settle,))
        });
        // A loop that was closed in the meantime has nobody left to tell.
        drop(scheduled);
    }

    /// Sets the result (or exception) on an asyncio future, unless it was cancelled.
    fn settle(&self, py: Python<'_>, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        // Even a failure to produce the result settles the future: an awaiting task
        // must never be left hanging.
        match self.resolved(py) {
            Ok(Ok(value)) => future.call_method1("set_result", (value,))?,
            Ok(Err(exc)) => future.call_method1("set_exception", (exc,))?,
            Err(err) => future.call_method1("set_exception", (err.into_value(py),))?,
        };
        Ok(())
    }

    /// The cached Python result of a finished future, converting it on first use.
    ///
    /// Several threads may ask at once (a `get` and loops settling their futures); the
    /// once-cell runs exactly one conversion and makes the others wait for it, without
    /// holding the GIL, since a conversion running Python code may let other threads in.
    fn resolved(&self, py: Python<'_>) -> PyResult<Resolved> {
        let resolved = self.value.get_or_try_init(py, || {
            let outcome = match &mut self.state.lock().phase {
                Phase::Done(outcome) => outcome.take(),
                _ => None,
            };
            let Some(outcome) = outcome else {
                return Err(PyRuntimeError::new_err(format!(
                    "the result of {} was read before it was ready (a bug in monarch)",
                    self.what
                )));
            };
            Ok(match outcome.and_then(|convert| convert(py)) {
                Ok(value) => Ok(value),
                Err(err) => Err(err.into_value(py)),
            })
        })?;
        Ok(clone_resolved(py, resolved))
    }

    /// Blocks (without the GIL) until done or until `deadline`; true when done.
    fn wait(&self, py: Python<'_>, deadline: Option<Instant>) -> PyResult<bool> {
        let slice = signal_slice(py);
        loop {
            let done = detach(py, || {
                let mut state = self.state.lock();
                loop {
                    if matches!(state.phase, Phase::Done(_)) {
                        return Some(true);
                    }
                    let now = Instant::now();
                    let slice_end = slice.map(|s| now + s);
                    let until = match (deadline, slice_end) {
                        (Some(d), _) if d <= now => return Some(false),
                        (Some(d), Some(s)) => Some(d.min(s)),
                        (d, s) => d.or(s),
                    };
                    state = match until {
                        Some(until) => self.finished.wait_timeout(state, until - now).0,
                        None => self.finished.wait(state),
                    };
                    if slice_end.is_some_and(|s| Instant::now() >= s) {
                        return None; // go check signals
                    }
                }
            });
            match done {
                Some(done) => return Ok(done),
                None => py.check_signals()?,
            }
        }
    }
}

fn clone_resolved(py: Python<'_>, v: &Resolved) -> Resolved {
    match v {
        Ok(value) => Ok(value.clone_ref(py)),
        Err(exc) => Err(exc.clone_ref(py)),
    }
}

/// Validates a `timeout` argument and turns it into a deadline (`None`: wait forever).
fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    let Some(t) = timeout else { return Ok(None) };
    if !t.is_finite() || t < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, or None to wait forever; \
             got {t}"
        )));
    }
    Ok(Duration::try_from_secs_f64(t)
        .ok()
        .and_then(|d| Instant::now().checked_add(d)))
}

/// Whether the calling thread runs an asyncio loop. Never imports asyncio: a thread
/// running Python code (an import) from inside a binding can be ended by CPython at
/// exit with Rust frames on its stack, which aborts; and without asyncio imported (or
/// while it is being imported) no loop can be running.
fn in_running_loop(py: Python<'_>) -> PyResult<bool> {
    let modules = py.import("sys")?.getattr("modules")?;
    let Ok(asyncio) = modules.get_item("asyncio") else {
        return Ok(false);
    };
    match asyncio.getattr("_get_running_loop") {
        Ok(get) => Ok(!get.call0()?.is_none()),
        Err(_) => Ok(false),
    }
}

const GET_IN_LOOP: &CStr = c"Future.get() called on a thread running an asyncio loop: it \
blocks the loop until the result is ready. Use `await fut` in async code instead.";

/// The result of work running on Monarch's runtime. See the
/// [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "Future", frozen, generic)]
pub struct PyFuture {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PyFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Future({})", self.shared.what)
    }
}

impl PyFuture {
    /// A future over `work`, whose output `convert`s to Python with the GIL. `what`
    /// names the work in error messages. Nothing runs until someone waits.
    pub fn from_work<F>(what: impl Into<String>, work: F) -> Self
    where
        F: std::future::Future<Output = PyResult<Convert>> + Send + 'static,
    {
        Self {
            shared: Arc::new(Shared {
                what: what.into(),
                state: Mutex::new(State {
                    phase: Phase::Idle(Box::pin(work)),
                    waiters: Vec::new(),
                }),
                finished: Condvar::new(),
                value: PyOnceLock::new(),
            }),
        }
    }

    /// Waits (see [`PyFuture::get`]) and returns the result or the work's exception.
    fn wait_resolved(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Resolved> {
        let deadline = deadline(timeout)?;
        check_may_block("Future.get()")?;
        if in_running_loop(py)? {
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), GET_IN_LOOP, 1)?;
        }
        if !self.shared.is_done() {
            self.shared.start()?;
            if !self.shared.wait(py, deadline)? {
                return Err(PyTimeoutError::new_err(format!(
                    "{} did not finish within {} s; it keeps running: call get() again or \
                     await the future to collect its result",
                    self.shared.what,
                    timeout.unwrap_or_default()
                )));
            }
        }
        self.shared.resolved(py)
    }

    /// A new `asyncio.Future` on `event_loop` that completes with this future.
    fn asyncio_on<'py>(&self, event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = event_loop.py();
        let future = event_loop.call_method0("create_future")?;
        let done = {
            let mut state = self.shared.state.lock();
            let done = matches!(state.phase, Phase::Done(_));
            if !done {
                state.waiters.push(Waiter {
                    event_loop: event_loop.clone().unbind(),
                    future: future.clone().unbind(),
                });
            }
            done
        };
        if done {
            self.shared.settle(py, &future)?;
        } else {
            self.shared.start()?;
        }
        Ok(future)
    }
}

#[pymethods]
impl PyFuture {
    /// Blocks until the result is ready and returns it (or raises the work's exception).
    /// See the `.pyi` stub for the full contract.
    #[pyo3(signature = (timeout = None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        match self.wait_resolved(py, timeout)? {
            Ok(value) => Ok(value),
            Err(exc) => Err(PyErr::from_value(exc.into_bound(py).into_any())),
        }
    }

    /// Same as `get`.
    #[pyo3(signature = (timeout = None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        self.get(py, timeout)
    }

    /// Waits like `get`, then returns the work's exception, or `None` if it succeeded.
    #[pyo3(signature = (timeout = None))]
    fn exception(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .wait_resolved(py, timeout)?
            .err()
            .map(|exc| exc.into_any()))
    }

    /// An `asyncio.Future` on the running loop that completes with this future.
    fn as_asyncio<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        self.asyncio_on(&event_loop)
    }

    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let event_loop = py.import("asyncio")?.call_method0("_get_running_loop")?;
        if event_loop.is_none() {
            return Err(PyValueError::new_err(format!(
                "cannot await the future of {} outside a running asyncio loop; use \
                 get() in synchronous code",
                self.shared.what
            )));
        }
        self.asyncio_on(&event_loop)?.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let state = if self.shared.is_done() {
            "done"
        } else {
            "pending"
        };
        format!("<monarch Future of {} ({state})>", self.shared.what)
    }
}
