//! The lock of an agent component, with its place in the lock order checked in debug
//! builds.
//!
//! Each component of the agent owns its state behind one [`Ranked`] lock, taken only by
//! its own methods. A thread may take a lock only while every lock it holds is of a
//! lower [`Rank`]: two component locks of the same rank are never held together. The
//! order (docs/architecture.md, "Lock order") is
//!
//! 1. [`Rank::Singletons`]: a proc's singleton registry, held while it spawns a
//!    singleton (one spawn per name), which takes the agent's locks below;
//! 2. [`Rank::Sequencer`]: the sequencer of incoming casts, held while the casts it
//!    released execute (ORD-1), which takes the component locks below;
//! 3. [`Rank::Component`]: every other component's lock (local actors, casts out, the
//!    reply router, supervision, host liveness, output, the host's state). Their methods
//!    copy what they need out and release it before they call anything else (another
//!    component, the channel, or user code), so none is held while another is taken.
//!
//! In debug builds (without `loom`, whose threads are not the OS's) each thread keeps
//! the ranks it holds, and taking a lock out of order panics, naming both ranks.
//!
//! Outside the ranks: the process's table of agents (`super::agents`) is held only
//! while an agent starts or is looked up, before any of these; a reply collector's or a
//! reducer's lock, and hyperactor's own locks, are taken after them, never before.

use hyperactor::sync::{Mutex, MutexGuard};

/// A lock's place in the order: a thread takes a lock only while it holds none of the
/// same or a higher rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// A proc's singleton registry (`crate::singleton`).
    Singletons,
    /// The sequencer of incoming casts (see `super::cast_in`).
    Sequencer,
    /// Any other component's lock: never held while another lock is taken.
    Component,
}

/// A component's lock: a [`Mutex`] with a [`Rank`].
pub(crate) struct Ranked<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T: Default> Ranked<T> {
    /// A lock of rank `rank` over `T::default()`.
    pub(crate) fn new(rank: Rank) -> Self {
        Self {
            rank,
            inner: Mutex::new(T::default()),
        }
    }
}

impl<T> Ranked<T> {
    /// A lock of rank `rank` over `value`.
    pub(crate) fn holding(rank: Rank, value: T) -> Self {
        Self {
            rank,
            inner: Mutex::new(value),
        }
    }

    /// Takes the lock (checking the order in debug builds).
    pub(crate) fn lock(&self) -> RankedGuard<'_, T> {
        held::enter(self.rank);
        RankedGuard {
            rank: self.rank,
            guard: self.inner.lock(),
        }
    }
}

/// The guard of a [`Ranked`] lock.
pub(crate) struct RankedGuard<'a, T> {
    rank: Rank,
    guard: MutexGuard<'a, T>,
}

impl<T> std::ops::Deref for RankedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for RankedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for RankedGuard<'_, T> {
    fn drop(&mut self) {
        held::leave(self.rank);
    }
}

#[cfg(all(debug_assertions, not(feature = "loom")))]
mod held {
    use std::cell::RefCell;

    use super::Rank;

    thread_local! {
        /// The ranks of the component locks this thread holds.
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    /// This thread takes a lock of `rank`: it must hold none of the same or a higher one.
    pub(super) fn enter(rank: Rank) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(top) = held.iter().max().copied() {
                assert!(
                    top < rank,
                    "agent lock order violated: a {rank:?} lock is taken while a {top:?} lock \
                     is held (see docs/architecture.md, \"Lock order\")"
                );
            }
            held.push(rank);
        });
    }

    /// This thread released a lock of `rank`.
    pub(super) fn leave(rank: Rank) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|r| *r == rank) {
                held.remove(at);
            }
        });
    }
}

#[cfg(not(all(debug_assertions, not(feature = "loom"))))]
mod held {
    use super::Rank;

    pub(super) fn enter(_: Rank) {}
    pub(super) fn leave(_: Rank) {}
}

#[cfg(all(test, debug_assertions, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_pass() {
        let sequencer: Ranked<u8> = Ranked::new(Rank::Sequencer);
        let component: Ranked<u8> = Ranked::new(Rank::Component);
        let outer = sequencer.lock();
        let inner = component.lock();
        drop(outer);
        drop(inner);
        // Released out of order: the thread holds nothing now.
        let _again = sequencer.lock();
    }

    #[test]
    #[should_panic(expected = "agent lock order violated")]
    fn two_component_locks_together_panic() {
        let a: Ranked<u8> = Ranked::new(Rank::Component);
        let b: Ranked<u8> = Ranked::new(Rank::Component);
        let _a = a.lock();
        let _b = b.lock();
    }
}
