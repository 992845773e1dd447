//! A value that will exist later, and the operations waiting for it, run in order.
//!
//! Spawning procs takes time, but a caller may spawn actors on them and message those
//! actors at once (non-blocking APIs, as Python's `spawn_procs` is). A [`Deferred`]
//! holds such operations until the value is resolved, then runs them in the order they
//! were issued; an operation issued after the resolution runs at once. Either way,
//! operations of one caller keep their order (what ORD-1 needs), because the queue is
//! drained under the same lock that issuing takes.
//!
//! A failed resolution hands every operation and waiter the error, of the type `E`
//! the user of the value chooses (each waiter gets a clone).
//!
//! ```
//! use std::sync::Arc;
//! use hyperactor::sync::Mutex;
//! use hyperactor_mesh::deferred::Deferred;
//!
//! let procs = Deferred::<Vec<u32>, std::io::ErrorKind>::new();
//! let log = Arc::new(Mutex::new(Vec::new()));
//! let l = Arc::clone(&log);
//! procs.run(move |procs| l.lock().push(format!("spawn on {procs:?}")));
//! let l = Arc::clone(&log);
//! procs.run(move |procs| l.lock().push(format!("cast to {procs:?}")));
//! assert!(log.lock().is_empty());
//! procs.resolve(Ok(vec![1, 2]));
//! assert_eq!(*log.lock(), ["spawn on Ok([1, 2])", "cast to Ok([1, 2])"]);
//! ```

use hyperactor::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

type Op<T, E> = Box<dyn FnOnce(Result<&T, &E>) + Send>;

enum State<T, E> {
    Pending(Vec<Op<T, E>>),
    Ready(T),
    Failed(E),
}

/// A value of type `T` that will exist later, or fail with an `E`: see the
/// [module docs](self).
pub struct Deferred<T, E> {
    state: Mutex<State<T, E>>,
    ready: Condvar,
    notify: Notify,
}

impl<T, E: std::fmt::Display> std::fmt::Debug for Deferred<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.lock() {
            State::Pending(ops) => format!("pending ({} operations waiting)", ops.len()),
            State::Ready(_) => "ready".to_string(),
            State::Failed(e) => format!("failed: {e}"),
        };
        write!(f, "Deferred({state})")
    }
}

impl<T: Send + 'static, E: Send + 'static> Default for Deferred<T, E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, E> Deferred<T, E> {
    fn lock(&self) -> MutexGuard<'_, State<T, E>> {
        self.state.lock()
    }
}

impl<T: Send + 'static, E: Send + 'static> Deferred<T, E> {
    /// A value not resolved yet.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::Pending(Vec::new())),
            ready: Condvar::new(),
            notify: Notify::new(),
        }
    }

    /// A value resolved already.
    pub fn ready(value: T) -> Self {
        Self {
            state: Mutex::new(State::Ready(value)),
            ready: Condvar::new(),
            notify: Notify::new(),
        }
    }

    /// Runs `op` with the value (or the resolution's error) now if it is resolved, else
    /// once it is, after the operations issued before it. `op` runs under this value's
    /// lock: it must not wait, nor use this `Deferred`.
    pub fn run(&self, op: impl FnOnce(Result<&T, &E>) + Send + 'static) {
        let mut state = self.lock();
        match &mut *state {
            State::Pending(ops) => ops.push(Box::new(op)),
            State::Ready(value) => op(Ok(value)),
            State::Failed(error) => op(Err(error)),
        }
    }

    /// Resolves the value (or fails it) and runs the waiting operations in order. Only
    /// the first resolution counts; returns false for later ones.
    pub fn resolve(&self, value: Result<T, E>) -> bool {
        let mut state = self.lock();
        let State::Pending(ops) = &mut *state else {
            return false;
        };
        let ops = std::mem::take(ops);
        *state = match value {
            Ok(value) => State::Ready(value),
            Err(error) => State::Failed(error),
        };
        for op in ops {
            match &*state {
                State::Ready(value) => op(Ok(value)),
                State::Failed(error) => op(Err(error)),
                State::Pending(_) => unreachable!("invariant: resolved just above"),
            }
        }
        drop(state);
        self.ready.notify_all();
        self.notify.notify_waiters();
        self.notify.notify_one();
        true
    }

    /// Whether the value is resolved (or failed).
    pub fn is_resolved(&self) -> bool {
        !matches!(&*self.lock(), State::Pending(_))
    }

    /// A clone of the value if resolved: `None` while pending.
    pub fn get(&self) -> Option<Result<T, E>>
    where
        T: Clone,
        E: Clone,
    {
        match &*self.lock() {
            State::Pending(_) => None,
            State::Ready(value) => Some(Ok(value.clone())),
            State::Failed(error) => Some(Err(error.clone())),
        }
    }

    /// Blocks the calling thread until resolved or `deadline`; `None` on timeout. Not
    /// for runtime threads.
    pub fn wait_blocking(&self, deadline: Option<Instant>) -> Option<Result<T, E>>
    where
        T: Clone,
        E: Clone,
    {
        let mut state = self.lock();
        loop {
            match &*state {
                State::Ready(value) => return Some(Ok(value.clone())),
                State::Failed(error) => return Some(Err(error.clone())),
                State::Pending(_) => {}
            }
            state = match self.ready.wait_until(state, deadline) {
                Ok(state) => state,
                Err(_) => return None,
            };
        }
    }

    /// Waits until resolved.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait(&self) -> Result<T, E>
    where
        T: Clone,
        E: Clone,
    {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(resolved) = self.get() {
                return resolved;
            }
            notified.await;
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn operations_after_resolution_run_at_once_and_failures_reach_them() {
        let d = Deferred::<u8, &'static str>::new();
        assert!(d.resolve(Err("no procs")));
        assert!(!d.resolve(Ok(1)), "only the first resolution counts");
        let seen = Arc::new(Mutex::new(None));
        let s = Arc::clone(&seen);
        d.run(move |v| *s.lock() = Some(v.copied().map_err(|e| *e)));
        assert_eq!(*seen.lock(), Some(Err("no procs")));
        assert_eq!(format!("{d:?}"), "Deferred(failed: no procs)");
    }

    #[tokio::test]
    async fn waiters_wake_on_resolution() {
        let d = Arc::new(Deferred::<u8, &'static str>::new());
        let waiter = tokio::spawn({
            let d = Arc::clone(&d);
            async move { d.wait().await }
        });
        tokio::task::yield_now().await;
        d.resolve(Ok(5));
        let got = hyperactor::testing::timed(waiter).await.unwrap();
        assert_eq!(got, Ok(5));
        assert_eq!(d.wait_blocking(None), Some(Ok(5)));
    }
}

/// Models of the ordering rule under loom (`make loom`): every interleaving of issuing
/// operations and resolving, within loom's bounds.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// Operations issued before, during and after the resolution each run exactly once,
    /// in the order they were issued, with the value.
    #[test]
    fn loom_operations_run_once_in_issue_order_across_the_resolution() {
        loom::model(|| {
            let deferred = Arc::new(Deferred::<u8, &'static str>::new());
            let log = Arc::new(Mutex::new(Vec::new()));
            let resolver = {
                let deferred = Arc::clone(&deferred);
                thread::spawn(move || assert!(deferred.resolve(Ok(5))))
            };
            for name in ["a", "b"] {
                let log = Arc::clone(&log);
                deferred.run(move |value| log.lock().push((name, value.ok().copied())));
            }
            resolver.join().expect("the resolver");
            assert_eq!(*log.lock(), [("a", Some(5)), ("b", Some(5))]);
        });
    }

    /// A thread blocked in `wait_blocking` wakes on the resolution (a lost wake-up would
    /// deadlock the model), and only the first resolution counts.
    #[test]
    fn loom_a_blocked_waiter_wakes_on_the_first_resolution() {
        loom::model(|| {
            let deferred = Arc::new(Deferred::<u8, &'static str>::new());
            let resolvers: Vec<_> = [Ok(1), Err("no procs")]
                .into_iter()
                .map(|value| {
                    let deferred = Arc::clone(&deferred);
                    thread::spawn(move || deferred.resolve(value))
                })
                .collect();
            let got = deferred.wait_blocking(None).expect("no deadline was given");
            let won: Vec<bool> = resolvers
                .into_iter()
                .map(|r| r.join().expect("a resolver"))
                .collect();
            assert_eq!(
                won.iter().filter(|w| **w).count(),
                1,
                "one resolution counts"
            );
            let expected = if won[0] { Ok(1) } else { Err("no procs") };
            assert_eq!(got, expected);
        });
    }
}
