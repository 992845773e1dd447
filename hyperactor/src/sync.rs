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
//! the rule is written once and the locks can be model-checked: with the `loom` feature
//! they are the loom model checker's (usable only inside `loom::model`), and the tests
//! named `loom_*` (`make loom`) explore every interleaving of their threads. A `static`
//! takes [`StaticMutex`] instead, which stays `std`'s: a static outlives every model.
//! Async code keeps `tokio::sync`.
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
use std::sync::TryLockError;
use std::time::{Duration, Instant};

pub mod spin;

#[cfg(not(feature = "loom"))]
use std::sync as imp;

#[cfg(feature = "loom")]
use loom::sync as imp;

pub use imp::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

/// A mutual-exclusion lock whose [`lock`](Mutex::lock) ignores poisoning.
pub struct Mutex<T: ?Sized>(imp::Mutex<T>);

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    #[cfg(not(feature = "loom"))]
    pub const fn new(value: T) -> Self {
        Self(imp::Mutex::new(value))
    }

    /// A new unlocked mutex holding `value` (loom's: only inside a model).
    #[cfg(feature = "loom")]
    pub fn new(value: T) -> Self {
        Self(imp::Mutex::new(value))
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
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The value, through an exclusive borrow (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
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

/// The [`Mutex`] of a `static`: always `std::sync`'s, with the same rule on poisoning.
/// A static outlives every loom model, so it is never one of loom's locks, and its
/// `new` is `const` in every build.
pub struct StaticMutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> StaticMutex<T> {
    /// A new unlocked mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }
}

impl<T: ?Sized> StaticMutex<T> {
    /// Wait until the lock is free, then hold it until the guard is dropped.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for StaticMutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_lock() {
            Ok(guard) => f.debug_tuple("StaticMutex").field(&&*guard).finish(),
            Err(TryLockError::Poisoned(poisoned)) => f
                .debug_tuple("StaticMutex")
                .field(&&*poisoned.into_inner())
                .finish(),
            Err(TryLockError::WouldBlock) => f.write_str("StaticMutex(<locked>)"),
        }
    }
}

/// A reader-writer lock whose [`read`](RwLock::read) and [`write`](RwLock::write) ignore
/// poisoning.
pub struct RwLock<T: ?Sized>(imp::RwLock<T>);

impl<T> RwLock<T> {
    /// A new unlocked lock holding `value`.
    #[cfg(not(feature = "loom"))]
    pub const fn new(value: T) -> Self {
        Self(imp::RwLock::new(value))
    }

    /// A new unlocked lock holding `value` (loom's: only inside a model).
    #[cfg(feature = "loom")]
    pub fn new(value: T) -> Self {
        Self(imp::RwLock::new(value))
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

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_read() {
            Ok(guard) => f.debug_tuple("RwLock").field(&&*guard).finish(),
            Err(TryLockError::Poisoned(poisoned)) => f
                .debug_tuple("RwLock")
                .field(&&*poisoned.into_inner())
                .finish(),
            Err(TryLockError::WouldBlock) => f.write_str("RwLock(<locked>)"),
        }
    }
}

/// A condition variable for the guards of [`Mutex`], whose waits ignore poisoning.
#[derive(Debug, Default)]
pub struct Condvar(imp::Condvar);

impl Condvar {
    /// A new condition variable.
    pub fn new() -> Self {
        Self(imp::Condvar::new())
    }

    /// Release the lock, wait for a notification (or a spurious wake-up), take it again.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait while `condition` holds; returns with the lock held and the condition false.
    pub fn wait_while<'a, T, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: F,
    ) -> MutexGuard<'a, T>
    where
        F: FnMut(&mut T) -> bool,
    {
        while condition(&mut *guard) {
            guard = self.wait(guard);
        }
        guard
    }

    /// [`wait`](Condvar::wait), for at most `timeout` (under loom, a wait that never
    /// times out: loom does not model time).
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
    #[cfg(not(feature = "loom"))]
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

    /// [`wait`](Condvar::wait) until `deadline` (`None`: no deadline). `Err` hands the
    /// guard back untouched when the deadline had already passed, so a wait loop reads
    /// `guard = match cv.wait_until(guard, deadline) { Ok(g) => g, Err(_) => return .. }`
    /// and re-checks its condition after each wake-up (which may be spurious).
    pub fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard<'a, T>, MutexGuard<'a, T>> {
        match deadline {
            None => Ok(self.wait(guard)),
            Some(deadline) => {
                let now = Instant::now();
                if deadline <= now {
                    return Err(guard);
                }
                Ok(self.wait_timeout(guard, deadline - now).0)
            }
        }
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

#[cfg(all(test, not(feature = "loom")))]
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
