//! Where the root client's failures wait to be judged, so that taking one and judging it
//! is one step as the program's exit sees it.
//!
//! The failures of the meshes a client owns arrive on its supervision port. One thread
//! of the program (Python's `monarch-supervision`) takes them one at a time and judges
//! each (its `__supervise__` or the fault hook, which may end the program). At exit the
//! program judges what is left, and must not read its exit status while a failure is
//! taken but not yet judged. A [`FailureDesk`] makes that hold without polling:
//!
//! - [`FailureDesk::take`] hands out the next failure and marks it *in hand*, under the
//!   same lock;
//! - [`FailureDesk::judged`] clears the mark;
//! - [`FailureDesk::drain`] stops further takes (a blocked taker gets [`Taken::Ended`]), waits
//!   until no failure is in hand (unless the caller is the taker itself, which may run
//!   the exit sequence while judging), then returns every failure still waiting.
//!
//! A task moves the failures from the client's port to the desk
//! ([`FailureDesk::serve`]); the desk itself is plain locks, modelled under loom.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use hyperactor::sync::{Condvar, Mutex};
use hyperactor::{Client, SupervisionEvent};

/// What [`FailureDesk::take`] got.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken<T> {
    /// The next failure, now in hand.
    Failure(T),
    /// The deadline passed first.
    Timeout,
    /// No failure will be handed out any more: the desk drains, or closed empty.
    Ended,
}

struct Desk<T> {
    waiting: VecDeque<T>,
    in_hand: bool,
    /// No more takes: the exit sequence drains the desk.
    draining: bool,
    /// The port closed: nothing more will arrive.
    closed: bool,
}

/// See the [module docs](self).
pub struct FailureDesk<T = SupervisionEvent> {
    desk: Mutex<Desk<T>>,
    changed: Condvar,
}

impl<T> std::fmt::Debug for FailureDesk<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let desk = self.desk.lock();
        f.debug_struct("FailureDesk")
            .field("waiting", &desk.waiting.len())
            .field("in_hand", &desk.in_hand)
            .field("draining", &desk.draining)
            .field("closed", &desk.closed)
            .finish()
    }
}

impl<T> Default for FailureDesk<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> FailureDesk<T> {
    /// An empty desk.
    pub fn new() -> Self {
        Self {
            desk: Mutex::new(Desk {
                waiting: VecDeque::new(),
                in_hand: false,
                draining: false,
                closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// A failure arrived.
    pub fn put(&self, failure: T) {
        self.desk.lock().waiting.push_back(failure);
        self.changed.notify_all();
    }

    /// Nothing more will arrive: a blocked [`take`](Self::take) gets [`Taken::Ended`]
    /// once the desk is empty.
    pub fn close(&self) {
        self.desk.lock().closed = true;
        self.changed.notify_all();
    }

    /// Blocks until a failure waits, then hands it out, marked in hand until
    /// [`judged`](Self::judged); [`Taken::Ended`] once the desk drains or closes empty.
    /// Not for runtime threads.
    pub fn take(&self, deadline: Option<Instant>) -> Taken<T> {
        let mut desk = self.desk.lock();
        loop {
            if desk.draining {
                return Taken::Ended;
            }
            if let Some(failure) = desk.waiting.pop_front() {
                desk.in_hand = true;
                return Taken::Failure(failure);
            }
            if desk.closed {
                return Taken::Ended;
            }
            desk = match self.changed.wait_until(desk, deadline) {
                Ok(desk) => desk,
                Err(_) => return Taken::Timeout,
            };
        }
    }

    /// The failure handed out by [`take`](Self::take) is judged.
    pub fn judged(&self) {
        self.desk.lock().in_hand = false;
        self.changed.notify_all();
    }

    /// Stops further takes, waits until no failure is in hand (unless `taker`: the
    /// caller is the thread that holds it), and returns every failure still waiting,
    /// oldest first. Not for runtime threads.
    pub fn drain(&self, taker: bool) -> Vec<T> {
        let mut desk = self.desk.lock();
        desk.draining = true;
        self.changed.notify_all();
        if !taker {
            desk = self.changed.wait_while(desk, |d| d.in_hand);
        }
        desk.waiting.drain(..).collect()
    }
}

impl FailureDesk<SupervisionEvent> {
    /// A desk fed by `client`'s supervision port, from a task on the current tokio
    /// runtime (call it inside one); the desk closes when the port does.
    pub fn serve(client: Arc<Client>) -> Arc<Self> {
        let desk = Arc::new(Self::new());
        let feeding = Arc::clone(&desk);
        tokio::spawn(async move {
            while let Some(event) = client.next_supervision_event().await {
                feeding.put(event);
            }
            feeding.close();
        });
        desk
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn takes_in_order_and_drain_returns_the_rest() {
        let desk = FailureDesk::new();
        desk.put(1);
        desk.put(2);
        desk.put(3);
        assert_eq!(desk.take(None), Taken::Failure(1));
        desk.judged();
        assert_eq!(desk.drain(false), [2, 3]);
        assert_eq!(desk.take(None), Taken::Ended, "no take after a drain");
    }

    #[test]
    fn a_take_times_out_and_a_closed_desk_ends_takes() {
        let desk = FailureDesk::<u8>::new();
        let start = Instant::now();
        assert_eq!(
            desk.take(Some(start + Duration::from_millis(20))),
            Taken::Timeout
        );
        desk.close();
        assert_eq!(desk.take(None), Taken::Ended);
    }

    #[test]
    fn the_taker_drains_without_waiting_for_itself() {
        let desk = FailureDesk::new();
        desk.put(1);
        desk.put(2);
        assert_eq!(desk.take(None), Taken::Failure(1));
        // Judging 1 ends the program: the exit sequence drains on this very thread.
        assert_eq!(desk.drain(true), [2]);
    }
}

/// Models under loom (`make loom`): the exit never reads past a failure in hand.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// Two failures, a taker thread judging them one by one, and an exit draining at any
    /// moment: every failure is judged exactly once, by the taker or by the drain, and
    /// the drain returns only once the taker holds none.
    #[test]
    fn loom_every_failure_is_judged_once_and_the_drain_waits_for_the_one_in_hand() {
        loom::model(|| {
            let desk = Arc::new(FailureDesk::new());
            let judged = Arc::new(AtomicUsize::new(0));
            desk.put(1usize);
            let taker = {
                let desk = Arc::clone(&desk);
                let judged = Arc::clone(&judged);
                thread::spawn(move || {
                    while let Taken::Failure(failure) = desk.take(None) {
                        judged.fetch_add(failure, Ordering::SeqCst);
                        desk.judged();
                    }
                })
            };
            desk.put(10);
            let rest: usize = desk.drain(false).into_iter().sum();
            // Nothing is in hand now: what the taker judged is final.
            let by_taker = judged.load(Ordering::SeqCst);
            assert_eq!(by_taker + rest, 11, "each failure judged once");
            desk.close();
            taker.join().expect("the taker");
            assert_eq!(
                judged.load(Ordering::SeqCst),
                by_taker,
                "no take after the drain"
            );
        });
    }
}
