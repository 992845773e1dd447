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
//!
//! A failure already delivered to the port but not yet moved must not be missed by the
//! drain: the exit first learns that a killed proc's failure was *sent* (its death was
//! handled), then drains. So a served desk's [`FailureDesk::drain`] first asks the task
//! to move everything the port holds (a *flush*) and waits for its answer, bounded by
//! [`FLUSH_WAIT`]: the task takes every failure that is ready before it answers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor::sync::{Condvar, Mutex};
use hyperactor::{Client, SupervisionEvent};

/// How long a served desk's drain waits for its task to move what the port holds (a
/// runtime too busy to answer in that time leaves the rest undrained rather than
/// holding up the exit).
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A request to move every failure the port holds now; answered on the sender.
type Flush = std::sync::mpsc::Sender<()>;

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
    /// The serving task's flush requests (a served desk only).
    flush: Option<tokio::sync::mpsc::UnboundedSender<Flush>>,
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
            flush: None,
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

    /// A served desk: waits (up to [`FLUSH_WAIT`]) until its task moved every failure
    /// its port held when this was called. Nothing for a desk fed by hand.
    fn flush(&self) {
        let Some(requests) = &self.flush else { return };
        let (done, answered) = std::sync::mpsc::channel();
        if requests.send(done).is_ok() {
            // An error: the task ended (the port closed), having moved everything.
            let _ = answered.recv_timeout(FLUSH_WAIT);
        }
    }

    /// Moves what a served desk's port holds (see the [module docs](self)), stops
    /// further takes, waits until no failure is in hand (unless `taker`: the caller is
    /// the thread that holds it), and returns every failure still waiting, oldest
    /// first. Not for runtime threads.
    pub fn drain(&self, taker: bool) -> Vec<T> {
        self.flush();
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
        let (requests, mut flushes) = tokio::sync::mpsc::unbounded_channel::<Flush>();
        let desk = Arc::new(Self {
            flush: Some(requests),
            ..Self::new()
        });
        let feeding = Arc::downgrade(&desk);
        tokio::spawn(async move {
            loop {
                // Failures first: a flush is answered only once the port has none ready,
                // so every failure delivered before the request is on the desk by then.
                let event = tokio::select! {
                    biased;
                    event = client.next_supervision_event() => event,
                    Some(done) = flushes.recv() => {
                        let _ = done.send(());
                        continue;
                    }
                };
                let Some(desk) = feeding.upgrade() else {
                    return;
                };
                match event {
                    Some(event) => desk.put(event),
                    None => {
                        desk.close();
                        return;
                    }
                }
            }
        });
        desk
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::time::Duration;

    use hyperactor::SendContext;

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

    /// A failure delivered to the client's port just before the drain is drained, even
    /// when the runtime has not moved it yet: the drain waits for the move.
    #[test]
    fn a_drain_takes_a_failure_still_on_the_port() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let proc = rt
            .block_on(hyperactor::Proc::serve(
                hyperactor::ChannelTransport::Local,
                "desk",
            ))
            .expect("a proc");
        let _in_runtime = rt.enter();
        let client = Arc::new(proc.client("client").expect("a client"));
        let desk = FailureDesk::serve(Arc::clone(&client));
        // Hold the only worker, so that the desk's task cannot move the failure.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (holding, worker_held) = std::sync::mpsc::channel::<()>();
        rt.spawn(async move {
            holding.send(()).expect("the test waits");
            let _ = held.recv();
        });
        worker_held.recv().expect("the worker is held");
        let event = SupervisionEvent::new(client.actor_id().clone(), "killed");
        client.proc().post(hyperactor::message::Envelope {
            header: hyperactor::message::EnvelopeHeader {
                sender: client.actor_id().clone(),
                dest: client
                    .actor_id()
                    .port_id(hyperactor::message::SUPERVISION_PORT),
                return_to: None,
                extra: None,
            },
            payload: hyperactor::message::Serialized::encode(&event).expect("encodes"),
        });
        // Free the worker a little later: a drain that does not wait for the move
        // returns before that, empty.
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let _ = release.send(());
        });
        let drained = desk.drain(false);
        releaser.join().expect("the releaser");
        assert_eq!(drained.len(), 1, "the failure on the port was drained");
        assert_eq!(drained[0].reason, "killed");
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
