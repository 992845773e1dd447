//! The blocking locks of every crate of the runtime: [`Mutex`], [`RwLock`] and [`Condvar`].
//!
//! They are `std::sync`'s, except that they ignore poisoning: `lock()`, `read()`,
//! `write()` and `wait()` return the guard itself, never a `Result`.
//!
//! A `std::sync` lock is poisoned when a thread panics while it holds it, and every later
//! `lock()` then fails. Here a panic inside a handler is caught and becomes a supervision
//! event (the actor stops; its proc goes on), so a poisoned lock would turn one actor's
//! failure into failures of every actor that shares the lock, or into a panic of a runtime
//! thread. The data behind these locks is kept valid between any two statements that can
//! panic (no holder leaves a half-made update behind a call that may panic), so the next
//! holder may read it as it is.
//!
//! Every crate takes its blocking locks from here rather than from `std::sync`, so that
//! the rule is written once and the locks have one place where they can be instrumented
//! or model-checked. Async code keeps `tokio::sync`.
//!
//! ```
//! use hyperactor::sync::Mutex;
//!
//! let count = Mutex::new(0);
//! *count.lock() += 1;
//! assert_eq!(*count.lock(), 1);
//! ```

use std::fmt;
use std::sync::PoisonError;
use std::time::Duration;

pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

/// A mutual-exclusion lock whose [`lock`](Mutex::lock) ignores poisoning.
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    /// The value, consuming the mutex.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Wait until the lock is free, then hold it until the guard is dropped.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold the lock if it is free now; `None` if another thread holds it.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The value, through an exclusive borrow (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> From<T> for Mutex<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.try_lock() {
            Some(guard) => f.debug_tuple("Mutex").field(&&*guard).finish(),
            None => f.write_str("Mutex(<locked>)"),
        }
    }
}

/// A reader-writer lock whose [`read`](RwLock::read) and [`write`](RwLock::write) ignore
/// poisoning.
#[derive(Default)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    /// A new unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::RwLock::new(value))
    }

    /// The value, consuming the lock.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, once no writer holds the lock.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive access, once no one else holds the lock.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through an exclusive borrow (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_read() {
            Ok(guard) => f.debug_tuple("RwLock").field(&&*guard).finish(),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => f
                .debug_tuple("RwLock")
                .field(&&*poisoned.into_inner())
                .finish(),
            Err(std::sync::TryLockError::WouldBlock) => f.write_str("RwLock(<locked>)"),
        }
    }
}

/// A condition variable for the guards of [`Mutex`], whose waits ignore poisoning.
#[derive(Debug, Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    /// A new condition variable.
    pub const fn new() -> Self {
        Self(std::sync::Condvar::new())
    }

    /// Release the lock, wait for a notification (or a spurious wake-up), take it again.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait while `condition` holds; returns with the lock held and the condition false.
    pub fn wait_while<'a, T, F>(&self, guard: MutexGuard<'a, T>, condition: F) -> MutexGuard<'a, T>
    where
        F: FnMut(&mut T) -> bool,
    {
        self.0
            .wait_while(guard, condition)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// [`wait`](Condvar::wait), for at most `timeout`.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.0
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// [`wait_while`](Condvar::wait_while), for at most `timeout`.
    pub fn wait_timeout_while<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: F,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult)
    where
        F: FnMut(&mut T) -> bool,
    {
        self.0
            .wait_timeout_while(guard, timeout, condition)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wake one waiter.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wake every waiter.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_panic_while_holding_the_lock_does_not_poison_it() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let held = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let _guard = held.lock();
            panic!("a holder panics");
        })
        .join();
        assert!(panicked.is_err());
        shared.lock().push(2);
        assert_eq!(*shared.lock(), vec![1, 2]);
        assert!(shared.try_lock().is_some());

        let lock = Arc::new(RwLock::new(1));
        let held = Arc::clone(&lock);
        assert!(std::thread::spawn(move || {
            let _guard = held.write();
            panic!("a writer panics");
        })
        .join()
        .is_err());
        *lock.write() += 1;
        assert_eq!(*lock.read(), 2);
    }

    #[test]
    fn a_waiter_wakes_when_the_condition_changes() {
        let state = Arc::new((Mutex::new(false), Condvar::new()));
        let setter = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            *setter.0.lock() = true;
            setter.1.notify_all();
        });
        let (guard, timeout) =
            state
                .1
                .wait_timeout_while(state.0.lock(), Duration::from_secs(30), |ready| !*ready);
        assert!(*guard && !timeout.timed_out());
        drop(guard);
        thread.join().unwrap();
    }
}
