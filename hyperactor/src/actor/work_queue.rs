//! The work queue of a driven actor: a FIFO read by a thread the runtime does not own,
//! by blocking (with a deadline) or by awaiting.
//!
//! Invariants:
//!
//! - WQ-1 (FIFO): items are taken in push order, by whichever reader comes first.
//! - WQ-2 (closed is final): after [`WorkQueue::close`] pushes fail, handing the item
//!   back; the items already queued stay readable until taken or drained.
//! - WQ-3 (no lost wake-up): a reader that found the queue empty is woken by the next
//!   push or by the close, whether it blocks a thread or awaits.
//! - WQ-4 (bounded): items pushed with a cost ([`WorkQueue::push_costed`]) count
//!   against the queue's *high water* mark ([`queue_high_water`]); a push that leaves
//!   the queue over it says so, and [`WorkQueue::room`] waits until the queue is back
//!   under half of it (or closed). The connection that delivered such a push stops
//!   reading until then ([`crate::channel::backpressure`]), so a slow reader slows its senders
//!   down instead of growing the queue without bound.

use crate::sync::spin::{spin_then_lock, Spin, WakeCount};
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use std::time::Instant;

use tokio::sync::Notify;

/// What a blocking or awaiting read got.
#[derive(Debug)]
pub(crate) enum Popped<T> {
    /// The next item.
    Item(T),
    /// The deadline passed first.
    Timeout,
    /// The queue is closed and empty.
    Closed,
}

struct State<T> {
    items: VecDeque<(T, usize)>,
    /// The sum of the queued items' costs.
    cost: usize,
    closed: bool,
}

impl<T> State<T> {
    fn pop_front(&mut self) -> Option<T> {
        let (item, cost) = self.items.pop_front()?;
        self.cost -= cost;
        Some(item)
    }
}

/// The environment variable that sets [`queue_high_water`], in bytes.
pub const QUEUE_HIGH_WATER_ENV: &str = "HYPERACTOR_QUEUE_HIGH_WATER";

/// The default of [`queue_high_water`]: 256 MiB.
pub const DEFAULT_QUEUE_HIGH_WATER: usize = 256 << 20;

/// The cost a queued message adds to its size (its envelope and bookkeeping), so that
/// many small messages count too.
pub const MESSAGE_COST_OVERHEAD: usize = 256;

/// How many bytes of messages (each costing its payload plus
/// [`MESSAGE_COST_OVERHEAD`]) a driven actor's queue holds before its senders are
/// slowed down (WQ-4): `HYPERACTOR_QUEUE_HIGH_WATER` if set to a positive number,
/// else [`DEFAULT_QUEUE_HIGH_WATER`]. Read once per process.
pub fn queue_high_water() -> usize {
    static HIGH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *HIGH.get_or_init(|| {
        std::env::var(QUEUE_HIGH_WATER_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(DEFAULT_QUEUE_HIGH_WATER)
    })
}

/// See the [module docs](self).
pub(crate) struct WorkQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    notify: Notify,
    /// Woken when the queue drops under half its high water mark, or closes.
    room: Notify,
    high_water: usize,
    /// Bumped after each push and the close: what a spinning reader watches.
    wakes: WakeCount,
    /// How long the blocking reader's recent waits took: how long it spins before it
    /// sleeps (see [`crate::sync::spin`]).
    spin: Spin,
}

impl<T> std::fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("WorkQueue")
            .field("len", &state.items.len())
            .field("closed", &state.closed)
            .finish()
    }
}

impl<T> WorkQueue<T> {
    pub(crate) fn new() -> Self {
        Self::with_high_water(queue_high_water())
    }

    pub(crate) fn with_high_water(high_water: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                cost: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            notify: Notify::new(),
            room: Notify::new(),
            high_water,
            wakes: WakeCount::new(0),
            spin: Spin::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every critical section is one push, pop or flag update: a panic cannot leave
        // the state half-changed, so poisoning is ignored.
        self.state.lock()
    }

    /// Appends `item` at no cost; hands it back if the queue is closed (WQ-2).
    #[cfg(test)]
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        self.push_costed(item, 0).map(|_| ())
    }

    /// Appends `item`, which costs `cost` (WQ-4); hands it back if the queue is closed
    /// (WQ-2). Returns whether the queue is now over its high water mark.
    pub(crate) fn push_costed(&self, item: T, cost: usize) -> Result<bool, T> {
        let mut state = self.lock();
        if state.closed {
            return Err(item);
        }
        state.items.push_back((item, cost));
        state.cost += cost;
        let over = state.cost > self.high_water;
        drop(state);
        self.wakes.fetch_add(1, Ordering::Release);
        self.ready.notify_one();
        self.notify.notify_one();
        Ok(over)
    }

    /// Takes the front item, waking those waiting for room when the queue drops under
    /// half its high water mark.
    fn take_front(&self, state: &mut State<T>) -> Option<T> {
        let before = state.cost;
        let item = state.pop_front()?;
        let low = self.high_water / 2;
        if before > low && state.cost <= low {
            self.room.notify_waiters();
        }
        Some(item)
    }

    /// Resolves once the queue holds at most half its high water mark, or is closed
    /// (WQ-4).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                if state.closed || state.cost <= self.high_water / 2 {
                    return;
                }
            }
            notified.await;
        }
    }

    /// The next item if one is queued.
    pub(crate) fn try_pop(&self) -> Popped<T> {
        let mut state = self.lock();
        match self.take_front(&mut state) {
            Some(item) => Popped::Item(item),
            None if state.closed => Popped::Closed,
            None => Popped::Timeout,
        }
    }

    /// Blocks the calling thread until an item comes, the queue closes, or `deadline`
    /// passes (`None`: no deadline). Not for runtime threads.
    ///
    /// Before it sleeps, the thread spins for a while if its recent waits were that
    /// short (see [`crate::sync::spin`]): an actor answering calls one after another
    /// then takes the next message without being woken.
    pub(crate) fn pop_blocking(&self, deadline: Option<Instant>) -> Popped<T> {
        let start = Instant::now();
        let popped = self.pop_blocking_inner(deadline);
        self.spin.waited(start.elapsed());
        popped
    }

    fn pop_blocking_inner(&self, deadline: Option<Instant>) -> Popped<T> {
        let state = self.lock();
        let mut state = spin_then_lock(
            &self.state,
            state,
            &self.wakes,
            self.spin.budget(),
            deadline,
            |s| s.closed || !s.items.is_empty(),
        );
        loop {
            if let Some(item) = self.take_front(&mut state) {
                return Popped::Item(item);
            }
            if state.closed {
                return Popped::Closed;
            }
            state = match self.ready.wait_until(state, deadline) {
                Ok(state) => state,
                Err(_) => return Popped::Timeout,
            };
        }
    }

    /// Waits for the next item; `None` once the queue is closed and empty.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an item is taken only when this returns.
    pub(crate) async fn pop(&self) -> Option<T> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a push in between is not missed (WQ-3).
            notified.as_mut().enable();
            match self.try_pop() {
                Popped::Item(item) => return Some(item),
                Popped::Closed => return None,
                Popped::Timeout => notified.await,
            }
        }
    }

    /// Closes the queue (WQ-2) and wakes every reader.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wakes.fetch_add(1, Ordering::Release);
        self.room.notify_waiters();
        self.ready.notify_all();
        self.notify.notify_waiters();
        // A reader between `enable` and `await` holds no permit from notify_waiters;
        // one stored permit covers it.
        self.notify.notify_one();
    }

    /// Closes the queue and takes every item still in it.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut state = self.lock();
        state.closed = true;
        state.cost = 0;
        let items = state.items.drain(..).map(|(item, _)| item).collect();
        drop(state);
        self.wakes.fetch_add(1, Ordering::Release);
        self.room.notify_waiters();
        self.ready.notify_all();
        self.notify.notify_waiters();
        self.notify.notify_one();
        items
    }

    /// How many items are queued.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }
}

/// The transport waits on a congested queue through this hook (see
/// [`crate::channel::backpressure`]).
impl<T: Send + 'static> crate::channel::backpressure::Congested for WorkQueue<T> {
    fn wait_for_room(
        self: std::sync::Arc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.room().await })
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wq4_a_queue_over_its_mark_says_so_and_room_waits_for_half() {
        let q = Arc::new(WorkQueue::with_high_water(100));
        assert_eq!(q.push_costed(1, 60), Ok(false));
        assert_eq!(q.push_costed(2, 60), Ok(true), "WQ-4: over the mark");
        assert_eq!(q.push(3), Ok(()), "a free push adds nothing");
        let room = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!room.is_finished(), "120 of 100: no room yet");
        assert!(matches!(q.try_pop(), Popped::Item(1)));
        // 60 left: still over half the mark.
        tokio::task::yield_now().await;
        assert!(!room.is_finished(), "60 > 50");
        assert!(matches!(q.try_pop(), Popped::Item(2)));
        tokio::time::timeout(Duration::from_secs(10), room)
            .await
            .expect("WQ-4: room once at most half the mark is queued")
            .unwrap();
        // A closed queue has room (nobody will drain it).
        q.push_costed(4, 500).unwrap();
        q.close();
        tokio::time::timeout(Duration::from_secs(10), q.room())
            .await
            .expect("a closed queue has room");
    }

    #[test]
    fn wq1_items_come_out_in_push_order() {
        let q = WorkQueue::new();
        for i in 0..5 {
            q.push(i).unwrap();
        }
        let got: Vec<i32> = (0..5)
            .map(|_| match q.try_pop() {
                Popped::Item(i) => i,
                other => panic!("WQ-1: expected an item, got {other:?}"),
            })
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4], "WQ-1");
    }

    #[test]
    fn wq2_a_closed_queue_refuses_pushes_and_keeps_its_items() {
        let q = WorkQueue::new();
        q.push(1).unwrap();
        q.close();
        assert_eq!(q.push(2), Err(2), "WQ-2: the item comes back");
        assert!(
            matches!(q.try_pop(), Popped::Item(1)),
            "WQ-2: queued items stay"
        );
        assert!(matches!(q.try_pop(), Popped::Closed));
        let q = WorkQueue::new();
        q.push(7).unwrap();
        assert_eq!(q.drain(), vec![7]);
        assert!(matches!(q.pop_blocking(None), Popped::Closed));
    }

    #[test]
    fn a_blocking_pop_times_out_and_is_woken_by_a_push() {
        let q = Arc::new(WorkQueue::<u8>::new());
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(matches!(q.pop_blocking(Some(soon)), Popped::Timeout));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let reader = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                started_tx.send(()).unwrap();
                q.pop_blocking(Some(Instant::now() + Duration::from_secs(30)))
            })
        };
        started_rx.recv().unwrap();
        q.push(9).unwrap();
        assert!(matches!(reader.join().unwrap(), Popped::Item(9)), "WQ-3");
    }

    #[tokio::test]
    async fn wq3_an_awaiting_reader_is_woken_by_push_and_close() {
        let q = Arc::new(WorkQueue::<u8>::new());
        let reader = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.push(3).unwrap();
        // The queue sits below the test helpers of `crate::testing`: a plain timeout.
        let wait = std::time::Duration::from_secs(30);
        let got = tokio::time::timeout(wait, reader)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got, Some(3), "WQ-3: woken by the push");
        let reader = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.close();
        let got = tokio::time::timeout(wait, reader)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got, None, "WQ-3: woken by the close");
    }
}

/// Models of WQ-1 to WQ-3 under loom (`make loom`): every interleaving of a writer and a
/// blocked reader, within loom's bounds.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// WQ-1, WQ-3: a reader that blocks on the empty queue gets both pushes, in order,
    /// however the push and the wait interleave (a lost wake-up would deadlock the model).
    #[test]
    fn loom_a_blocked_reader_gets_every_push_in_order() {
        loom::model(|| {
            let queue = Arc::new(WorkQueue::with_high_water(usize::MAX));
            let writer = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || {
                    assert!(queue.push(1).is_ok());
                    assert!(queue.push(2).is_ok());
                })
            };
            let first = queue.pop_blocking(None);
            let second = queue.pop_blocking(None);
            writer.join().expect("the writer");
            assert!(matches!(first, Popped::Item(1)), "{first:?}");
            assert!(matches!(second, Popped::Item(2)), "{second:?}");
        });
    }

    /// WQ-2, WQ-3: closing wakes a blocked reader, which still gets what was queued
    /// before the close; a push after the close is handed back.
    #[test]
    fn loom_close_wakes_the_reader_and_is_final() {
        loom::model(|| {
            let queue = Arc::new(WorkQueue::with_high_water(usize::MAX));
            let closer = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || {
                    assert!(queue.push(7).is_ok());
                    queue.close();
                    assert!(matches!(queue.push(8), Err(8)));
                })
            };
            let mut got = Vec::new();
            loop {
                match queue.pop_blocking(None) {
                    Popped::Item(item) => got.push(item),
                    Popped::Closed => break,
                    Popped::Timeout => unreachable!("no deadline was given"),
                }
            }
            closer.join().expect("the closer");
            assert_eq!(got, [7]);
        });
    }
}
