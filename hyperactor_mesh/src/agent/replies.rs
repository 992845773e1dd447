//! The reply router of an agent: reply messages are keyed, each key a reducer (of a cast
//! this agent relays) or a sink (a call made from this process: [`CallReplies`],
//! [`ReplyQueue`], or any [`ReplySink`]).
//!
//! Invariants:
//!
//! - REP-1 (one answer per rank): a [`CallReplies`] keeps the first item per index;
//!   later ones (a real reply racing a death notice) are ignored.
//! - REP-2 (nothing waits for the dead): a reducer stops waiting for a child whose proc
//!   died, and a call from this process is answered for every rank whose message went
//!   through a dead proc, as soon as the death is known.

use hyperactor::sync::spin::{spin_then_lock, Spin, WakeCount};
use hyperactor::sync::{Condvar, Mutex, MutexGuard};
use rustc_hash::FxHashMap;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyperactor::ProcId;
use tokio::sync::Notify;

use super::lock::{Rank, Ranked};
use super::{Inner, ProcAgent};
use crate::cast::codec::ReplyTo;
use crate::cast::reply::{decode_reply, encode_reply, ReplyItem};
use hyperactor::channel::log_limit::LogLimit;

/// Takes the replies that arrive under one key.
pub trait ReplySink: Send + Sync + 'static {
    /// Items arrived (on the delivering task: must not block).
    fn deliver(&self, items: Vec<ReplyItem>);
}

#[derive(Clone)]
pub(super) enum Slot {
    Reducer(Arc<Reducer>),
    Sink(Arc<dyn ReplySink>),
}

/// The reply router's table: what waits under each key, and the next key: the replies
/// component. It owns its table behind one lock, which only its methods take; none
/// calls anything else while holding it (see [`super::lock`]): a slot is copied out
/// before anything is delivered to it.
pub(super) struct Router {
    /// Looked up for every reply: hashed with FxHash (the keys are a counter).
    slots: Ranked<FxHashMap<u64, Slot>>,
    next_key: AtomicU64,
    /// The call opened last: whether it is still unanswered when the next one opens
    /// says whether calls are pipelined (see [`CallReplies::follows_pending`]).
    last_call: Ranked<Weak<CallInner>>,
    /// How long this process's blocked callers spin before they sleep.
    spin: Spin,
}

impl Default for Router {
    fn default() -> Self {
        Self {
            slots: Ranked::new(Rank::Component),
            next_key: AtomicU64::new(1),
            last_call: Ranked::new(Rank::Component),
            spin: Spin::default(),
        }
    }
}

impl Router {
    /// A key not used before in this process's agent.
    pub(super) fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts `slot` under `key`.
    pub(super) fn insert(&self, key: u64, slot: Slot) {
        self.slots.lock().insert(key, slot);
    }

    /// What waits under `key`, if anything does.
    fn get(&self, key: u64) -> Option<Slot> {
        self.slots.lock().get(&key).cloned()
    }

    /// Records `call` as the call opened last; whether the one opened before it is
    /// still unanswered.
    fn follow(&self, call: &Arc<CallInner>) -> bool {
        // The router's lock is released before the collector's is taken.
        let previous = std::mem::replace(&mut *self.last_call.lock(), Arc::downgrade(call));
        previous
            .upgrade()
            .is_some_and(|previous| !previous.state.lock().done())
    }

    /// Nothing waits under `key` any more.
    fn remove(&self, key: u64) {
        self.slots.lock().remove(&key);
    }

    /// The reducers waiting, with their keys.
    fn reducers(&self) -> Vec<(u64, Arc<Reducer>)> {
        self.slots
            .lock()
            .iter()
            .filter_map(|(key, slot)| match slot {
                Slot::Reducer(r) => Some((*key, Arc::clone(r))),
                Slot::Sink(_) => None,
            })
            .collect()
    }
}

/// A tree node's collection of its subtree's replies.
pub(super) struct Reducer {
    pub(super) parent: ReplyTo,
    pub(super) state: Mutex<ReduceState>,
}

pub(super) struct ReduceState {
    /// Indices still owed.
    pub(super) pending: HashSet<u32>,
    /// Items received so far.
    pub(super) got: Vec<ReplyItem>,
    /// The children: the proc of each head, and the indices of its chunk.
    pub(super) children: Vec<(ProcId, Vec<u32>)>,
}

impl Reducer {
    /// Takes `items` for the indices still owed. Returns what to send up once that
    /// completes the subtree; `None` while some index is owed, or when it completed
    /// before. Decided under the reducer's lock, so exactly one caller gets `Some`.
    fn reduce(&self, items: Vec<ReplyItem>) -> Option<Vec<ReplyItem>> {
        let mut state = self.state.lock();
        if state.pending.is_empty() {
            return None; // complete already
        }
        for item in items {
            if state.pending.remove(&item.index) {
                state.got.push(item);
            }
        }
        Self::finish_if_done(state)
    }

    /// `proc` died: stops waiting for the indices owed by children on it, answering
    /// them as unanswered (REP-2). Returns what to send up if that completes the
    /// subtree, as [`Reducer::reduce`] does.
    fn proc_died(&self, proc: &ProcId, reason: &str, stopped: bool) -> Option<Vec<ReplyItem>> {
        let mut state = self.state.lock();
        let lost: Vec<u32> = state
            .children
            .iter()
            .filter(|(p, _)| p == proc)
            .flat_map(|(_, indices)| indices.iter().copied())
            .filter(|i| state.pending.contains(i))
            .collect();
        if lost.is_empty() {
            return None;
        }
        for index in lost {
            state.pending.remove(&index);
            state
                .got
                .push(ReplyItem::unanswered(index, reason, stopped));
        }
        Self::finish_if_done(state)
    }

    /// The items to send up if nothing is owed any more (taken, under the lock).
    fn finish_if_done(
        mut state: hyperactor::sync::MutexGuard<'_, ReduceState>,
    ) -> Option<Vec<ReplyItem>> {
        if !state.pending.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut state.got))
    }
}

static MALFORMED: LogLimit = LogLimit::per_second();

impl Inner {
    /// A reply message arrived (on the delivering task).
    pub(super) fn on_reply(&self, parts: Vec<Bytes>) {
        let (key, items) = match decode_reply(&parts) {
            Ok(decoded) => decoded,
            Err(e) => {
                if let Some(suppressed) = MALFORMED.check() {
                    tracing::warn!(suppressed, "agent {}: dropping a reply: {e}", self.id);
                }
                return;
            }
        };
        self.deliver_items(key, items);
    }

    /// Hands `items` to the slot of `key` (dropped if nobody waits any more).
    pub(super) fn deliver_items(&self, key: u64, items: Vec<ReplyItem>) {
        let Some(slot) = self.replies.get(key) else {
            return;
        };
        match slot {
            Slot::Sink(sink) => sink.deliver(items),
            Slot::Reducer(reducer) => self.reduce(key, &reducer, items),
        }
    }

    fn reduce(&self, key: u64, reducer: &Reducer, items: Vec<ReplyItem>) {
        if let Some(got) = reducer.reduce(items) {
            self.finish(key, reducer, got);
        }
    }

    /// The subtree of `reducer` is complete: nothing waits under `key` any more, and
    /// `got` goes up to its parent.
    fn finish(&self, key: u64, reducer: &Reducer, got: Vec<ReplyItem>) {
        self.replies.remove(key);
        self.send_items(&reducer.parent, got);
    }

    /// Sends `items` to `to` (locally when it is this agent's own reply port).
    pub(super) fn send_items(&self, to: &ReplyTo, items: Vec<ReplyItem>) {
        if items.is_empty() {
            return;
        }
        if to.port == self.reply_port() {
            return self.deliver_items(to.key, items);
        }
        self.post(
            &self.id,
            to.port.clone(),
            None,
            encode_reply(to.key, &items),
        );
    }

    /// `proc` died: reducers stop waiting for children on it; calls from this process
    /// are answered for every rank whose message went through it (REP-2).
    pub(super) fn replies_after_death(&self, proc: &ProcId, reason: &str, stopped: bool) {
        let reducers = self.replies.reducers();
        for (key, reducer) in reducers {
            if let Some(got) = reducer.proc_died(proc, reason, stopped) {
                self.finish(key, &reducer, got);
            }
        }
        let watched = self.casts_out.calls_through(proc);
        for (key, hit) in watched {
            let items = hit
                .into_iter()
                .map(|(index, on_it)| {
                    if on_it {
                        ReplyItem::failed(index, reason)
                    } else {
                        let why =
                            format!("{reason} (the message to this rank was relayed through it)");
                        ReplyItem::failed(index, &why)
                    }
                })
                .collect();
            self.deliver_items(key, items);
        }
    }

    /// Registers `sink` under a fresh key: where to send it items.
    fn sink_address(&self, sink: Arc<dyn ReplySink>) -> ReplyTo {
        ReplyTo {
            port: self.reply_port(),
            key: self.register(sink),
        }
    }

    fn register(&self, sink: Arc<dyn ReplySink>) -> u64 {
        let key = self.replies.next_key();
        self.replies.insert(key, Slot::Sink(sink));
        key
    }

    fn unregister(&self, key: u64) {
        self.replies.remove(key);
        self.casts_out.forget_call(key);
    }
}

/// What a waiter got.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited<T> {
    /// The result.
    Ready(T),
    /// The deadline passed first.
    Timeout,
}

struct Signal {
    ready: Condvar,
    notify: Notify,
    /// How many times [`Signal::wake`] was called: what a spinning waiter watches.
    wakes: WakeCount,
}

impl Signal {
    fn new() -> Self {
        Self {
            ready: Condvar::new(),
            notify: Notify::new(),
            wakes: WakeCount::new(0),
        }
    }

    /// The state changed in a way a waiter may be waiting for (called after its lock is
    /// released).
    fn wake(&self) {
        self.wakes.fetch_add(1, Ordering::Release);
        self.ready.notify_all();
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Blocks until `done(state)` or the deadline; returns the state locked, or `None`
    /// at the deadline. With a `spin` budget the thread first watches for a wake-up for
    /// that long, without the lock and without sleeping (see
    /// [`hyperactor::sync::spin`]), then sleeps on the condition variable as without one.
    fn wait_blocking<'a, S>(
        &self,
        state: &'a Mutex<S>,
        deadline: Option<Instant>,
        spin: Option<Duration>,
        done: impl Fn(&S) -> bool,
    ) -> Option<MutexGuard<'a, S>> {
        let guard = state.lock();
        let mut guard = spin_then_lock(state, guard, &self.wakes, spin, deadline, &done);
        loop {
            if done(&guard) {
                return Some(guard);
            }
            guard = match self.ready.wait_until(guard, deadline) {
                Ok(guard) => guard,
                Err(_) => return None,
            };
        }
    }
}

/// A call's items, at most one per expected index (REP-1), in index order: `expected`
/// is sorted without duplicates and `items[i]` holds the item of `expected[i]`. A
/// reply finds its place without hashing (directly when the indices have no gaps, as
/// in `0..n`), and the caller takes the items already in order.
struct Collected {
    expected: Vec<u32>,
    items: Vec<Option<ReplyItem>>,
    /// How many of `items` are set.
    got: usize,
}

impl Collected {
    fn new(indices: impl IntoIterator<Item = u32>) -> Self {
        let mut expected: Vec<u32> = indices.into_iter().collect();
        if !expected.is_sorted() {
            expected.sort_unstable();
        }
        expected.dedup();
        let items = std::iter::repeat_with(|| None)
            .take(expected.len())
            .collect();
        Self {
            expected,
            items,
            got: 0,
        }
    }

    /// Where the item of `index` goes, if `index` is expected.
    fn slot(&self, index: u32) -> Option<usize> {
        let first = *self.expected.first()?;
        let at = index.checked_sub(first)? as usize;
        if self.expected.get(at) == Some(&index) {
            return Some(at);
        }
        self.expected.binary_search(&index).ok()
    }

    /// Keeps `item` if its index is expected and has no item yet; whether it did.
    fn keep(&mut self, item: ReplyItem) -> bool {
        let Some(at) = self.slot(item.index) else {
            return false;
        };
        let place = &mut self.items[at];
        if place.is_some() {
            return false;
        }
        *place = Some(item);
        self.got += 1;
        true
    }

    fn complete(&self) -> bool {
        self.got == self.expected.len()
    }

    /// The items kept, in index order; none are kept afterwards.
    fn take(&mut self) -> Vec<ReplyItem> {
        self.got = 0;
        self.items.iter_mut().filter_map(Option::take).collect()
    }
}

struct CallState {
    collected: Collected,
    /// A rank cannot answer: the call is over (when failing fast).
    failed: bool,
    fail_fast: bool,
    /// How many reply messages arrived (a reduced call gets one per top-level subtree).
    messages: usize,
}

impl CallState {
    fn done(&self) -> bool {
        self.failed || self.collected.complete()
    }
}

struct CallInner {
    state: Mutex<CallState>,
    signal: Signal,
}

impl ReplySink for CallInner {
    fn deliver(&self, items: Vec<ReplyItem>) {
        let mut state = self.state.lock();
        state.messages += 1;
        for item in items {
            let unanswered = item.is_unanswered();
            if state.collected.keep(item) {
                state.failed |= state.fail_fast && unanswered;
            }
        }
        let done = state.done();
        drop(state);
        if done {
            self.signal.wake();
        }
    }
}

/// The replies of one call, collected under a key of this process's reply router: one
/// item per expected index (REP-1), complete when every index answered or one cannot
/// (a [`ReplyStatus::Failed`](crate::cast::reply::ReplyStatus::Failed) or
/// [`ReplyStatus::Stopped`](crate::cast::reply::ReplyStatus::Stopped) item ends the wait
/// at once). Dropping it frees the key.
pub struct CallReplies {
    agent: Weak<Inner>,
    to: ReplyTo,
    inner: Arc<CallInner>,
    follows_pending: bool,
}

impl std::fmt::Debug for CallReplies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("CallReplies")
            .field("key", &self.to.key)
            .field("expected", &state.collected.expected.len())
            .field("got", &state.collected.got)
            .finish()
    }
}

impl CallReplies {
    /// A collector expecting one reply for each of `indices`; a failed one ends it.
    pub fn open(agent: &ProcAgent, indices: impl IntoIterator<Item = u32>) -> Self {
        Self::open_with(agent, indices, true)
    }

    /// A collector that waits for every index, failed or not (for stops).
    pub fn open_all(agent: &ProcAgent, indices: impl IntoIterator<Item = u32>) -> Self {
        Self::open_with(agent, indices, false)
    }

    fn open_with(
        agent: &ProcAgent,
        indices: impl IntoIterator<Item = u32>,
        fail_fast: bool,
    ) -> Self {
        let inner = Arc::new(CallInner {
            state: Mutex::new(CallState {
                collected: Collected::new(indices),
                failed: false,
                fail_fast,
                messages: 0,
            }),
            signal: Signal::new(),
        });
        let follows_pending = agent.inner.replies.follow(&inner);
        Self {
            agent: Arc::downgrade(&agent.inner),
            to: agent
                .inner
                .sink_address(Arc::clone(&inner) as Arc<dyn ReplySink>),
            inner,
            follows_pending,
        }
    }

    /// Whether the call this agent opened just before this one was still unanswered
    /// when this one opened: the caller issues calls without waiting for each (pipelined
    /// calls), so more are likely to follow at once. Its frames are best queued for the
    /// link tasks, which write them in batches (see [`hyperactor::channel::QueueWrites`]),
    /// rather than written one system call at a time on the caller's thread.
    pub fn follows_pending(&self) -> bool {
        self.follows_pending
    }

    /// Where the replies go.
    pub fn reply_to(&self) -> &ReplyTo {
        &self.to
    }

    /// Answers for some indices from this process (a cast that could not be sent, for
    /// instance), as if the items had arrived.
    pub fn answer(&self, items: Vec<ReplyItem>) {
        self.inner.deliver(items);
    }

    /// Whether the call is complete.
    pub fn is_done(&self) -> bool {
        self.inner.state.lock().done()
    }

    /// How many reply messages arrived so far.
    pub fn messages(&self) -> usize {
        self.inner.state.lock().messages
    }

    fn take(state: &mut CallState) -> Vec<ReplyItem> {
        state.collected.take()
    }

    /// Blocks until the call is complete or `deadline` passes; then returns the items
    /// by index (all of them, or fewer when one failed). Not for runtime threads.
    ///
    /// Before it sleeps, the thread spins for a while if this process's recent calls
    /// were answered that fast (see [`hyperactor::sync::spin`]): a reply that comes within the
    /// budget then costs no wake-up of a sleeping thread.
    pub fn wait_blocking(&self, deadline: Option<Instant>) -> Waited<Vec<ReplyItem>> {
        let agent = self.agent.upgrade();
        let spin = agent.as_ref().and_then(|a| a.replies.spin.budget());
        let start = Instant::now();
        let got =
            self.inner
                .signal
                .wait_blocking(&self.inner.state, deadline, spin, CallState::done);
        if let Some(agent) = agent {
            agent.replies.spin.waited(start.elapsed());
        }
        match got {
            Some(mut state) => Waited::Ready(Self::take(&mut state)),
            None => Waited::Timeout,
        }
    }

    /// Waits until the call is complete; returns the items by index.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is taken until it returns.
    pub async fn wait(&self) -> Vec<ReplyItem> {
        loop {
            let notified = self.inner.signal.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.inner.state.lock();
                if state.done() {
                    return Self::take(&mut state);
                }
            }
            notified.await;
        }
    }
}

impl Drop for CallReplies {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.upgrade() {
            agent.unregister(self.to.key);
        }
    }
}

struct QueueInner {
    items: Mutex<(std::collections::VecDeque<ReplyItem>, bool)>,
    signal: Signal,
}

impl ReplySink for QueueInner {
    fn deliver(&self, items: Vec<ReplyItem>) {
        let mut state = self.items.lock();
        if state.1 {
            return;
        }
        state.0.extend(items);
        drop(state);
        self.signal.wake();
    }
}

/// Replies in arrival order, any number of them, under a key of this process's reply
/// router (streams, ports and channels). Dropping it frees the key.
pub struct ReplyQueue {
    agent: Weak<Inner>,
    to: ReplyTo,
    inner: Arc<QueueInner>,
}

impl std::fmt::Debug for ReplyQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyQueue")
            .field("key", &self.to.key)
            .finish()
    }
}

impl ReplyQueue {
    /// A new, empty queue.
    pub fn open(agent: &ProcAgent) -> Self {
        let inner = Arc::new(QueueInner {
            items: Mutex::new((std::collections::VecDeque::new(), false)),
            signal: Signal::new(),
        });
        Self {
            agent: Arc::downgrade(&agent.inner),
            to: agent
                .inner
                .sink_address(Arc::clone(&inner) as Arc<dyn ReplySink>),
            inner,
        }
    }

    /// Where to send items for this queue.
    pub fn reply_to(&self) -> &ReplyTo {
        &self.to
    }

    /// The next item if one is queued.
    pub fn try_next(&self) -> Option<ReplyItem> {
        self.inner.items.lock().0.pop_front()
    }

    /// Blocks for the next item until `deadline`. Not for runtime threads.
    pub fn next_blocking(&self, deadline: Option<Instant>) -> Waited<ReplyItem> {
        match self
            .inner
            .signal
            .wait_blocking(&self.inner.items, deadline, None, |s| !s.0.is_empty())
        {
            Some(mut state) => match state.0.pop_front() {
                Some(item) => Waited::Ready(item),
                None => Waited::Timeout,
            },
            None => Waited::Timeout,
        }
    }

    /// Waits for the next item.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an item is taken only when this returns.
    pub async fn next(&self) -> ReplyItem {
        loop {
            let notified = self.inner.signal.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(item) = self.try_next() {
                return item;
            }
            notified.await;
        }
    }

    /// Answers from this process, as if the items had arrived.
    pub fn answer(&self, items: Vec<ReplyItem>) {
        self.inner.deliver(items);
    }

    /// Puts `item` back at the front (a reader that took more than it could use).
    pub fn push_front(&self, item: ReplyItem) {
        self.inner.items.lock().0.push_front(item);
        self.inner.signal.wake();
    }
}

impl Drop for ReplyQueue {
    fn drop(&mut self) {
        self.inner.items.lock().1 = true;
        if let Some(agent) = self.agent.upgrade() {
            agent.unregister(self.to.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(index: u32, value: &'static str) -> ReplyItem {
        ReplyItem::ok(index, vec![Bytes::from(value)])
    }

    fn taken(c: &mut Collected) -> Vec<(u32, Bytes)> {
        c.take()
            .into_iter()
            .map(|i| (i.index, i.parts[0].clone()))
            .collect()
    }

    /// REP-1 in the collector: one item per expected index, the first that came; other
    /// indices are ignored; the items come out in index order, whatever order they
    /// arrived in and whether the indices have gaps, repeats or come unsorted.
    #[test]
    fn a_collector_keeps_the_first_item_of_each_expected_index_in_order() {
        for indices in [vec![0, 1, 2, 3], vec![7, 3, 3, 12, 5], vec![4], vec![]] {
            let mut c = Collected::new(indices.iter().copied());
            let mut want: Vec<u32> = indices.clone();
            want.sort_unstable();
            want.dedup();
            assert_eq!(c.complete(), want.is_empty());
            for &i in want.iter().rev() {
                assert!(c.keep(ok(i, "first")), "index {i} of {indices:?}");
                assert!(!c.keep(ok(i, "late")), "a second item for {i} is ignored");
            }
            for stranger in [1, 6, 13, u32::MAX] {
                if !want.contains(&stranger) {
                    assert!(
                        !c.keep(ok(stranger, "stranger")),
                        "{stranger} in {indices:?}"
                    );
                }
            }
            assert!(c.complete());
            let got = taken(&mut c);
            assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), want);
            assert!(got.iter().all(|(_, v)| v == "first"));
            assert_eq!(
                c.complete(),
                want.is_empty(),
                "nothing is kept after a take"
            );
        }
    }

    /// A collector of 8,192 indices, as a call to 8,192 actors: each reply lands in its
    /// place, and the call completes only with the last.
    #[test]
    fn a_large_collector_completes_with_its_last_index() {
        let n = 8192;
        let mut c = Collected::new(0..n);
        for i in (0..n)
            .filter(|i| i % 2 == 1)
            .chain((0..n).filter(|i| i % 2 == 0))
        {
            assert!(!c.complete());
            assert!(c.keep(ReplyItem::ok(i, Vec::new())));
        }
        assert!(c.complete());
        let got: Vec<u32> = c.take().into_iter().map(|i| i.index).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
    }
}

/// Models of a call's collector under loom (`make loom`): replies delivered by other
/// threads (connection tasks) while the caller blocks.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    fn collector(indices: &[u32], fail_fast: bool) -> Arc<CallInner> {
        Arc::new(CallInner {
            state: Mutex::new(CallState {
                collected: Collected::new(indices.iter().copied()),
                failed: false,
                fail_fast,
                messages: 0,
            }),
            signal: Signal::new(),
        })
    }

    fn wait(call: &CallInner) -> Vec<ReplyItem> {
        wait_spinning(call, None)
    }

    /// The caller's wait, spinning first when `spin` says so (under loom the spin is
    /// bounded by a count of yields, not by time).
    fn wait_spinning(call: &CallInner, spin: Option<Duration>) -> Vec<ReplyItem> {
        match call
            .signal
            .wait_blocking(&call.state, None, spin, CallState::done)
        {
            Some(mut state) => CallReplies::take(&mut state),
            None => unreachable!("no deadline was given"),
        }
    }

    fn deliver_from_thread(call: &Arc<CallInner>, items: Vec<ReplyItem>) -> thread::JoinHandle<()> {
        let call = Arc::clone(call);
        thread::spawn(move || call.deliver(items))
    }

    /// REP-1 and no lost wake-up: two ranks answer from two threads, one of them twice;
    /// the caller wakes with exactly one item per rank, the first that arrived.
    #[test]
    fn loom_the_caller_wakes_with_one_item_per_rank() {
        loom::model(|| {
            let call = collector(&[0, 1], true);
            let first = deliver_from_thread(&call, vec![ReplyItem::ok(0, vec![Bytes::from("a")])]);
            let second = deliver_from_thread(
                &call,
                vec![
                    ReplyItem::ok(1, vec![Bytes::from("b")]),
                    ReplyItem::ok(0, vec![Bytes::from("late")]),
                ],
            );
            let items = wait(&call);
            first.join().expect("a deliverer");
            second.join().expect("a deliverer");
            let indices: Vec<u32> = items.iter().map(|i| i.index).collect();
            assert_eq!(indices, [0, 1]);
            assert_eq!(call.state.lock().messages, 2);
        });
    }

    /// The same with a caller that spins first: whether the replies land before, during
    /// or after its spin, it wakes with one item per rank (the spin's early look never
    /// loses a wake-up).
    #[test]
    fn loom_a_spinning_caller_wakes_with_one_item_per_rank() {
        loom::model(|| {
            let call = collector(&[0, 1], true);
            let first = deliver_from_thread(&call, vec![ReplyItem::ok(0, vec![Bytes::from("a")])]);
            let second = deliver_from_thread(&call, vec![ReplyItem::ok(1, vec![Bytes::from("b")])]);
            let items = wait_spinning(&call, Some(Duration::from_micros(1)));
            assert_eq!(
                items.iter().map(|i| i.index).collect::<Vec<_>>(),
                vec![0, 1]
            );
            first.join().unwrap();
            second.join().unwrap();
        });
    }

    /// A rank that cannot answer ends a fail-fast call at once: the caller wakes
    /// without waiting for the other rank.
    #[test]
    fn loom_a_failed_rank_ends_the_wait() {
        loom::model(|| {
            let call = collector(&[0, 1], true);
            let failer = deliver_from_thread(&call, vec![ReplyItem::failed(1, "proc died")]);
            let items = wait(&call);
            failer.join().expect("the deliverer");
            assert_eq!(items.len(), 1);
            assert!(items[0].is_unanswered());
        });
    }

    /// A reducer waiting for two children, rank 1 on proc `p1` and rank 2 on `p2`, that
    /// reports to key 9 of `parent`.
    fn reducer(parent: hyperactor::PortId, p1: &ProcId, p2: &ProcId) -> Arc<Reducer> {
        Arc::new(Reducer {
            parent: ReplyTo {
                port: parent,
                key: 9,
            },
            state: Mutex::new(ReduceState {
                pending: [1, 2].into_iter().collect(),
                got: Vec::new(),
                children: vec![(p1.clone(), vec![1]), (p2.clone(), vec![2])],
            }),
        })
    }

    /// REP-1 and REP-2 in a reducer: the two children reply from two threads while a
    /// third reports `p2` dead. Whatever the interleaving, exactly one caller completes
    /// the subtree (one message up, and nothing is left waiting), and that message
    /// holds one item per rank: rank 1's reply, and rank 2's reply or its unanswered
    /// item, whichever came first.
    #[test]
    fn loom_a_reducer_sends_one_item_per_rank_up_once_despite_a_death() {
        loom::model(|| {
            let p1: ProcId = "p1@local:1".parse().expect("a proc id");
            let p2: ProcId = "p2@local:2".parse().expect("a proc id");
            let parent = "p0@local:0/agent[0]:1".parse().expect("a port id");
            let reducer = reducer(parent, &p1, &p2);
            let reply = |index: u32| {
                let reducer = Arc::clone(&reducer);
                thread::spawn(move || reducer.reduce(vec![ReplyItem::ok(index, Vec::new())]))
            };
            let (first, second) = (reply(1), reply(2));
            let death = {
                let (reducer, p2) = (Arc::clone(&reducer), p2.clone());
                thread::spawn(move || reducer.proc_died(&p2, "proc p2 died", false))
            };
            let sent: Vec<Vec<ReplyItem>> = [first, second, death]
                .into_iter()
                .filter_map(|t| t.join().expect("a reply or death thread"))
                .collect();
            assert_eq!(sent.len(), 1, "the subtree completes once: {sent:?}");
            let indices: Vec<u32> = sent[0].iter().map(|i| i.index).collect();
            assert!(
                indices == [1, 2] || indices == [2, 1],
                "REP-1: one item per rank, got {indices:?}"
            );
            assert!(
                sent[0].iter().any(|i| i.index == 1 && !i.is_unanswered()),
                "rank 1 answered: its proc lives"
            );
            assert!(
                reducer.state.lock().pending.is_empty(),
                "REP-2: nothing owed"
            );
        });
    }
}
