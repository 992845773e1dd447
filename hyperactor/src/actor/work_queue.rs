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

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
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
    items: VecDeque<T>,
    closed: bool,
}

/// See the [module docs](self).
pub(crate) struct WorkQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    notify: Notify,
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
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every critical section is one push, pop or flag update: a panic cannot leave
        // the state half-changed, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `item`; hands it back if the queue is closed (WQ-2).
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        let mut state = self.lock();
        if state.closed {
            return Err(item);
        }
        state.items.push_back(item);
        drop(state);
        self.ready.notify_one();
        self.notify.notify_one();
        Ok(())
    }

    /// The next item if one is queued.
    pub(crate) fn try_pop(&self) -> Popped<T> {
        let mut state = self.lock();
        match state.items.pop_front() {
            Some(item) => Popped::Item(item),
            None if state.closed => Popped::Closed,
            None => Popped::Timeout,
        }
    }

    /// Blocks the calling thread until an item comes, the queue closes, or `deadline`
    /// passes (`None`: no deadline). Not for runtime threads.
    pub(crate) fn pop_blocking(&self, deadline: Option<Instant>) -> Popped<T> {
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                return Popped::Item(item);
            }
            if state.closed {
                return Popped::Closed;
            }
            state = match deadline {
                None => self.ready.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if deadline <= now {
                        return Popped::Timeout;
                    }
                    self.ready
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
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
        let items = state.items.drain(..).collect();
        drop(state);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

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
        let got = crate::testing::timed(reader).await.unwrap();
        assert_eq!(got, Some(3), "WQ-3: woken by the push");
        let reader = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.close();
        let got = crate::testing::timed(reader).await.unwrap();
        assert_eq!(got, None, "WQ-3: woken by the close");
    }
}
