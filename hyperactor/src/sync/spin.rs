//! Spinning before sleeping: how a thread that blocks on a [`Mutex`] and
//! [`Condvar`](super::Condvar) (a caller waiting for its call's replies, an actor's own
//! thread waiting for its next message) first watches for a short, adaptive while.
//!
//! What such a thread waits for arrives on a runtime thread, which then has to wake it if
//! it sleeps. Waking a sleeping thread is the dearest step of a short call: the kernel
//! has to schedule it again, and on a busy host it may wait for a core. A thread that
//! keeps watching instead (yielding its core to any thread that wants it between looks)
//! takes what it waits for as soon as it lands.
//!
//! Spinning only pays when the wait is short, so each waiter keeps an average of how long
//! its recent waits took ([`Spin`]) and spins for at most twice that, never longer than
//! the process-wide limit ([`set_spin_limit`]; Monarch's `call_spin` setting). When
//! recent waits took longer than the limit it sleeps at once: a program of long calls, or
//! an actor that waits long between messages, spends nothing on spinning. A limit of zero
//! turns spinning off.
//!
//! The spin only decides when the waiter looks again ([`spin_then_lock`]): it then takes
//! the lock and checks the state exactly as a woken sleeper does, and sleeps if what it
//! waits for has not come. Whoever changes the state bumps a [`WakeCount`] after it
//! releases the lock, and the spinner watches that count.

use super::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest a waiter spins before it sleeps, unless [`set_spin_limit`] says otherwise.
pub const DEFAULT_SPIN_LIMIT: Duration = Duration::from_micros(200);

/// The shortest spin when spinning at all: the first calls of a process, whose average
/// is still zero, spin this long.
const MIN_SPIN: Duration = Duration::from_micros(20);

static LIMIT_NS: AtomicU64 = AtomicU64::new(DEFAULT_SPIN_LIMIT.as_nanos() as u64);

/// Sets the longest a waiting thread of this process spins before it sleeps; zero: it
/// never spins.
pub fn set_spin_limit(limit: Duration) {
    LIMIT_NS.store(nanos(limit), Ordering::Relaxed);
}

/// The limit [`set_spin_limit`] set (or [`DEFAULT_SPIN_LIMIT`]).
pub fn spin_limit() -> Duration {
    Duration::from_nanos(LIMIT_NS.load(Ordering::Relaxed))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The recent waits of one waiter (or of a process's callers), averaged: how long the
/// next may spin.
#[derive(Debug, Default)]
pub struct Spin {
    /// The average wait in nanoseconds, each new wait weighing an eighth.
    recent_ns: AtomicU64,
}

impl Spin {
    /// How long the next wait may spin, `None` when it should sleep at once.
    pub fn budget(&self) -> Option<Duration> {
        budget(
            LIMIT_NS.load(Ordering::Relaxed),
            self.recent_ns.load(Ordering::Relaxed),
        )
    }

    /// A wait took `took` (until complete, or until its deadline). A wait counts at
    /// most four times the limit: one long wait stops the spinning for a few waits, not
    /// for as long as it lasted.
    pub fn waited(&self, took: Duration) {
        let took = nanos(took).min(LIMIT_NS.load(Ordering::Relaxed).saturating_mul(4));
        // Two waiters updating at once may lose one sample: it is an estimate.
        let old = self.recent_ns.load(Ordering::Relaxed);
        let new = old - old / 8 + took / 8;
        self.recent_ns.store(new, Ordering::Relaxed);
    }
}

fn budget(limit_ns: u64, recent_ns: u64) -> Option<Duration> {
    if limit_ns == 0 || recent_ns > limit_ns {
        return None;
    }
    let spin = recent_ns
        .saturating_mul(2)
        .clamp(nanos(MIN_SPIN).min(limit_ns), limit_ns);
    Some(Duration::from_nanos(spin))
}

/// The count of wake-ups a spinning waiter watches.
#[cfg(not(feature = "loom"))]
pub type WakeCount = AtomicU64;

/// The count of wake-ups a spinning waiter watches (loom's, so that the models see it).
#[cfg(feature = "loom")]
pub type WakeCount = loom::sync::atomic::AtomicU64;

/// Spins, if `budget` says so and `ready(state)` does not hold yet, until `count` moves
/// or the budget (or `deadline`) runs out; returns `state` locked again, to be checked
/// and waited on as before. `guard` is `state` locked; `count` is the one bumped after
/// each change of `state` (read here under the lock, so a change made while this thread
/// does not hold it always moves it).
pub fn spin_then_lock<'a, S>(
    state: &'a Mutex<S>,
    guard: MutexGuard<'a, S>,
    count: &WakeCount,
    budget: Option<Duration>,
    deadline: Option<Instant>,
    ready: impl Fn(&S) -> bool,
) -> MutexGuard<'a, S> {
    let Some(budget) = budget.filter(|_| !ready(&guard)) else {
        return guard;
    };
    let seen = count.load(Ordering::Acquire);
    drop(guard);
    let until = Instant::now() + budget;
    until_changed(count, seen, deadline.map_or(until, |d| d.min(until)));
    state.lock()
}

/// Returns once `count` is no longer `seen` or `until` passed, yielding the core
/// between looks.
#[cfg(not(feature = "loom"))]
fn until_changed(count: &WakeCount, seen: u64, until: Instant) {
    while count.load(Ordering::Acquire) == seen && Instant::now() < until {
        std::thread::yield_now();
    }
}

/// Under loom: a couple of looks, whatever the time (a model's threads take turns only
/// when one yields).
#[cfg(feature = "loom")]
fn until_changed(count: &WakeCount, seen: u64, _until: Instant) {
    for _ in 0..2 {
        if count.load(Ordering::Acquire) != seen {
            return;
        }
        loom::thread::yield_now();
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn the_budget_is_twice_the_recent_wait_within_the_limit() {
        assert_eq!(budget(200 * US, 0), Some(Duration::from_micros(20)));
        assert_eq!(budget(200 * US, 40 * US), Some(Duration::from_micros(80)));
        assert_eq!(budget(200 * US, 150 * US), Some(Duration::from_micros(200)));
        // Recent waits longer than the limit: no spin at all.
        assert_eq!(budget(200 * US, 201 * US), None);
        // A limit of zero turns spinning off; a limit under the minimum is kept.
        assert_eq!(budget(0, 0), None);
        assert_eq!(budget(5 * US, 0), Some(Duration::from_micros(5)));
    }

    #[test]
    fn long_waits_stop_the_spinning_and_short_ones_bring_it_back() {
        let spin = Spin::default();
        let limit = spin_limit();
        for _ in 0..40 {
            spin.waited(Duration::from_millis(10));
        }
        assert_eq!(
            spin.budget(),
            None,
            "after long waits a caller sleeps at once"
        );
        for _ in 0..30 {
            spin.waited(Duration::from_micros(50));
        }
        let budget = spin.budget().expect("short waits again: it spins");
        assert!(
            budget >= Duration::from_micros(90) && budget <= limit,
            "{budget:?}"
        );
    }

    /// The spin ends on the change, not on the budget: the waiter gets the state with
    /// the change made, without sleeping on a condition variable.
    #[test]
    fn spin_then_lock_returns_the_state_changed() {
        let state = std::sync::Arc::new((Mutex::new(false), WakeCount::new(0)));
        let changer = {
            let state = std::sync::Arc::clone(&state);
            std::thread::spawn(move || {
                *state.0.lock() = true;
                state.1.fetch_add(1, Ordering::Release);
            })
        };
        let (flag, count) = &*state;
        let deadline = Instant::now() + Duration::from_secs(60);
        let guard = spin_then_lock(
            flag,
            flag.lock(),
            count,
            Some(Duration::from_secs(60)),
            Some(deadline),
            |done| *done,
        );
        assert!(*guard, "the spin ended before the change");
        assert!(Instant::now() < deadline);
        drop(guard);
        changer.join().unwrap();
        // No budget: the state as it is, at once.
        let guard = spin_then_lock(flag, flag.lock(), count, None, None, |_| false);
        assert!(*guard);
    }

    #[test]
    fn a_spinning_waiter_returns_when_the_count_moves() {
        let count = std::sync::Arc::new(WakeCount::new(0));
        let waker = {
            let count = std::sync::Arc::clone(&count);
            std::thread::spawn(move || {
                count.fetch_add(1, Ordering::Release);
            })
        };
        let until = Instant::now() + Duration::from_secs(60);
        until_changed(&count, 0, until);
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert!(
            Instant::now() < until,
            "it returned at the bound, not on the change"
        );
        waker.join().unwrap();
    }
}
