//! The sending end of a link: [`ChannelTx`], and its byte budget.
//!
//! A `ChannelTx` is a cheap handle (clones share the link) onto a queue
//! drained by the link's task (see `link.rs`). Every frame is charged
//! against the link's *budget*: bytes queued plus bytes written but not
//! yet acknowledged by the receiver may not exceed [`LINK_BUDGET_BYTES`]
//! for [`ChannelTx::send`], which waits for room; [`ChannelTx::post`]
//! never waits and may overdraw the budget (later sends wait for the debt
//! to be paid back). A frame costs its length plus [`FRAME_COST_OVERHEAD`],
//! capped at the whole budget, so a frame larger than the budget is sent
//! alone.
//!
//! Invariant: once the link fails, every frame is accounted for exactly
//! once: either handed back by `send`/`post` in a [`SendError`], or passed
//! to the link's [`ReturnFn`], or delivered.
//!
//! ```no_run
//! # async fn example() {
//! use std::sync::Arc;
//! use hyperactor::channel::{dial, ChannelAddr, Frame};
//! let tx = dial(&"tcp:127.0.0.1:4000".parse().unwrap(), Arc::new(|_frame, _err| {}));
//! tx.send(Frame::default()).await.unwrap();
//! # }
//! ```

use crate::sync::Mutex;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::sync::OnceLock;

use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio::sync::Semaphore;

use super::addr::ChannelAddr;
use super::error::ChannelError;
use super::error::SendError;
use super::frame;
use super::frame::Frame;

/// The most bytes a link keeps outstanding (queued plus unacknowledged)
/// before [`ChannelTx::send`] waits.
pub const LINK_BUDGET_BYTES: usize = 64 << 20;

/// What each frame costs on top of its length, so that empty frames are
/// bounded too.
pub const FRAME_COST_OVERHEAD: usize = 64;

/// Called once, from a runtime task, for each frame a failed link could not
/// prove delivered, with the link's error.
pub type ReturnFn = Arc<dyn Fn(Frame, &ChannelError) + Send + Sync>;

/// A frame in a link's queue or unacknowledged window, with its cost and when it was
/// queued (the start of its delivery timeout, see `link.rs`).
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) frame: Frame,
    pub(crate) cost: usize,
    pub(crate) at: std::time::Instant,
}

/// The byte budget of one link.
#[derive(Debug)]
pub(crate) struct Budget {
    sem: Semaphore,
    /// Permits taken by `post` beyond what was available; paid back first.
    debt: Mutex<usize>,
    outstanding: AtomicUsize,
}

impl Budget {
    fn new() -> Self {
        Budget {
            sem: Semaphore::new(LINK_BUDGET_BYTES),
            debt: Mutex::new(0),
            outstanding: AtomicUsize::new(0),
        }
    }

    fn cost(frame: &Frame) -> usize {
        (frame.len().saturating_add(FRAME_COST_OVERHEAD)).min(LINK_BUDGET_BYTES)
    }

    /// Waits for `cost` bytes of budget. Fails once the budget is closed.
    async fn acquire(&self, cost: usize) -> Result<(), ()> {
        // `cost` is at most LINK_BUDGET_BYTES, which fits in u32.
        let n = u32::try_from(cost).unwrap_or(u32::MAX);
        let permit = self.sem.acquire_many(n).await.map_err(|_| ())?;
        permit.forget();
        self.outstanding.fetch_add(cost, Ordering::AcqRel);
        Ok(())
    }

    /// Takes `cost` bytes of budget without waiting, going into debt.
    fn force(&self, cost: usize) {
        let mut debt = self.debt.lock();
        let taken = self.sem.forget_permits(cost);
        if *debt == 0 && cost > taken {
            LINKS_IN_DEBT.fetch_add(1, Ordering::AcqRel);
        }
        *debt += cost - taken;
        self.outstanding.fetch_add(cost, Ordering::AcqRel);
    }

    fn in_debt(&self) -> bool {
        *self.debt.lock() > 0
    }

    /// Resolves once the link is out of debt (or the budget is closed).
    async fn out_of_debt(&self) {
        if let Ok(permit) = self.sem.acquire_many(1).await {
            // Only looked: permits are available only once the debt is paid.
            drop(permit);
        }
    }

    /// Gives back `cost` bytes of budget.
    pub(crate) fn release(&self, cost: usize) {
        if cost == 0 {
            return;
        }
        let mut debt = self.debt.lock();
        let paid = (*debt).min(cost);
        if paid > 0 && *debt == paid {
            LINKS_IN_DEBT.fetch_sub(1, Ordering::AcqRel);
        }
        *debt -= paid;
        self.sem.add_permits(cost - paid);
        self.outstanding.fetch_sub(cost, Ordering::AcqRel);
    }

    /// Fails all current and future waiters; a failed link owes nothing.
    pub(crate) fn close(&self) {
        let mut debt = self.debt.lock();
        if *debt > 0 {
            *debt = 0;
            LINKS_IN_DEBT.fetch_sub(1, Ordering::AcqRel);
        }
        self.sem.close();
    }
}

/// How many links of this process are in debt (over their budget after a `post`).
static LINKS_IN_DEBT: AtomicUsize = AtomicUsize::new(0);

/// Whether some link of this process is over its budget ([`LINK_BUDGET_BYTES`]): its
/// receiver is slower than its senders. Cheap (one atomic load): a sender that only
/// posts checks it after posting, and waits ([`ChannelTx::ready`]) when it is true.
pub fn any_link_over_budget() -> bool {
    LINKS_IN_DEBT.load(Ordering::Acquire) > 0
}

/// Frames written (or being written) but not yet acknowledged, in sequence order.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// The last acknowledged sequence number; `frames[0]` is `acked + 1`.
    pub(crate) acked: u64,
    pub(crate) frames: std::collections::VecDeque<Queued>,
}

/// A stream's write half that a sending thread may write to without the link task
/// (see [`Direct`]).
pub(crate) trait DirectWrite: Send + Sync + 'static {
    /// Writes what it can of `bufs` without blocking (`WouldBlock` if nothing).
    fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize>;
}

/// Who writes to a connected link's stream. The link task normally does, from its
/// queue; but when it is idle (nothing queued, nothing being written) a sender writes
/// its frame itself, on its own thread, sparing the task a wake-up per message. Frames
/// keep their order: a sender writes directly only while `busy` is false and `queued`
/// is 0, both checked under this lock, and the task sets `busy` (under the lock)
/// before it writes anything.
#[derive(Default)]
pub(crate) struct Direct {
    /// The write half, once connected (`None` before, and once the link failed).
    pub(crate) writer: Option<Arc<dyn DirectWrite>>,
    /// The link task is writing, or has bytes to write.
    pub(crate) busy: bool,
    /// Frames in the queue, not yet taken by the link task.
    pub(crate) queued: usize,
    /// The unwritten rest of a direct write that would have blocked: the link task
    /// writes it first.
    pub(crate) leftover: std::collections::VecDeque<bytes::Bytes>,
}

/// A frame sent less than this after the process's last direct write (to any link) is
/// queued for its link task rather than written directly: bursts, to one link or to
/// many (a cast), are written by the link tasks, batched and beside the sender, instead
/// of one system call after another on the sender's thread.
pub(crate) const DIRECT_SPACING: std::time::Duration = std::time::Duration::from_micros(15);

/// When this process last wrote a frame directly, in nanoseconds since [`epoch`].
static LAST_DIRECT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The instant the link layer measures its times from.
pub(crate) fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

thread_local! {
    /// Set while a [`QueueWrites`] of this thread asks for queued writes.
    static QUEUE_WRITES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive (and made with `true`), the frames this thread sends are queued for their
/// links' tasks rather than written on this thread (a connected, idle link otherwise
/// takes a sender's frame on the sender's own thread, one system call per frame): for a
/// sender that knows more frames follow at once, such as a call issued while its
/// predecessor is still unanswered (pipelined calls) or a reply while more calls wait for
/// the actor. The link tasks then write them in batches, and their receiver reads several
/// per wake-up, instead of one system call and one wake-up per frame. A sender that
/// waits for an answer after each frame is better served by direct writes (the default).
///
/// ```
/// use hyperactor::channel::QueueWrites;
/// let _batched = QueueWrites::new(true);
/// // ... sends from this thread go to the link tasks until `_batched` is dropped
/// ```
#[derive(Debug)]
#[must_use = "the hint lasts while the guard lives"]
pub struct QueueWrites {
    previous: bool,
}

impl QueueWrites {
    /// Queues this thread's writes while the guard lives, if `on`; with `false`, changes
    /// nothing (an enclosing guard stays in force).
    pub fn new(on: bool) -> Self {
        let previous = QUEUE_WRITES.with(|q| {
            let previous = q.get();
            q.set(previous || on);
            previous
        });
        Self { previous }
    }
}

impl Drop for QueueWrites {
    fn drop(&mut self) {
        QUEUE_WRITES.with(|q| q.set(self.previous));
    }
}

/// Whether a direct write may happen now (and if so, records it).
fn direct_write_allowed() -> bool {
    if QUEUE_WRITES.with(std::cell::Cell::get) {
        return false;
    }
    let now = epoch().elapsed().as_nanos() as u64;
    let last = LAST_DIRECT.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < DIRECT_SPACING.as_nanos() as u64 {
        return false;
    }
    LAST_DIRECT.store(now.max(1), Ordering::Relaxed);
    true
}

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct")
            .field("connected", &self.writer.is_some())
            .field("busy", &self.busy)
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

/// The state a link's handles share with its task.
pub(crate) struct LinkShared {
    pub(crate) addr: ChannelAddr,
    pub(crate) budget: Budget,
    pub(crate) on_return: ReturnFn,
    /// Written but unacknowledged frames.
    pub(crate) window: Mutex<Window>,
    /// Direct writes by senders (see [`Direct`]).
    pub(crate) direct: Mutex<Direct>,
    /// Wakes the link task when a direct write left bytes for it.
    pub(crate) flush: tokio::sync::Notify,
    /// Set once, when the link fails.
    error: OnceLock<ChannelError>,
    /// Becomes true after the failed link has returned all its frames.
    closed: watch::Sender<bool>,
    /// How long a frame may wait for its acknowledgement with no progress on the link
    /// (see `link.rs`); taken from [`super::delivery_timeout`] when the link starts.
    pub(crate) delivery_timeout: Option<std::time::Duration>,
    /// When the link last made progress (an acknowledgement, or bytes written), in
    /// nanoseconds since [`epoch`]; shared with the link's writer.
    pub(crate) progress: Arc<AtomicU64>,
}

/// Records progress now in `progress` (see [`LinkShared::progress`]).
pub(crate) fn touch(progress: &AtomicU64) {
    let now = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
    progress.fetch_max(now, Ordering::Relaxed);
}

impl fmt::Debug for LinkShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkShared")
            .field("addr", &self.addr)
            .field("budget", &self.budget)
            .field("error", &self.error.get())
            .finish_non_exhaustive()
    }
}

impl LinkShared {
    pub(crate) fn lock_window(&self) -> crate::sync::MutexGuard<'_, Window> {
        self.window.lock()
    }

    /// Records that the link made progress now (see [`LinkShared::progress`]).
    pub(crate) fn touch(&self) {
        touch(&self.progress);
    }

    /// When the link last made progress.
    pub(crate) fn last_progress(&self) -> std::time::Instant {
        epoch() + std::time::Duration::from_nanos(self.progress.load(Ordering::Relaxed))
    }

    pub(crate) fn lock_direct(&self) -> crate::sync::MutexGuard<'_, Direct> {
        self.direct.lock()
    }

    /// Writes `queued` on the sender's thread (see [`Direct`]); `direct` is locked,
    /// the link idle and connected. What would block is left to the link task.
    fn write_direct(&self, direct: &mut Direct, writer: &dyn DirectWrite, queued: Queued) {
        let mut chunks = std::collections::VecDeque::new();
        // The frame was checked by `send`/`post`, so encoding cannot fail.
        if frame::encode(&queued.frame, &mut chunks).is_err() {
            return;
        }
        self.lock_window().frames.push_back(queued);
        while !chunks.is_empty() {
            let slices: Vec<std::io::IoSlice<'_>> = chunks
                .iter()
                .take(frame::MAX_IOV)
                .map(|c| std::io::IoSlice::new(c))
                .collect();
            match writer.try_write_vectored(&slices) {
                Ok(n) if n > 0 => frame::advance(&mut chunks, n),
                // Would block, or failed: the link task writes the rest, or meets the
                // error and fails the link (returning the frame).
                _ => break,
            }
        }
        if !chunks.is_empty() {
            direct.busy = true;
            direct.leftover = chunks;
            self.flush.notify_one();
        }
    }

    /// Records the link's error; the first one wins. Returns the error in force.
    pub(crate) fn set_error(&self, error: ChannelError) -> ChannelError {
        self.error.get_or_init(|| error).clone()
    }

    /// Marks the link closed if it is not already: its task is ending
    /// without having failed it (graceful end, or the runtime dropped the
    /// task), so `closed` must not wait forever.
    pub(crate) fn mark_closed(&self) {
        if !*self.closed.borrow() {
            self.set_error(ChannelError::closed(&self.addr));
            self.budget.close();
            self.closed.send_replace(true);
        }
    }

    /// Fails the link for good: stops direct writes, closes the budget and the
    /// queue, returns every frame of the window and then of the queue, then wakes
    /// `closed`.
    pub(crate) fn fail(&self, error: ChannelError, queue: &mut mpsc::UnboundedReceiver<Queued>) {
        let error = self.set_error(error);
        tracing::debug!(addr = %self.addr, %error, "channel link failed");
        let unacked = {
            // The direct lock first: a sender in the middle of a direct write has
            // put its frame in the window by the time it lets go, so it is returned.
            let mut direct = self.lock_direct();
            direct.writer = None;
            direct.leftover.clear();
            std::mem::take(&mut self.lock_window().frames)
        };
        self.budget.close();
        queue.close();
        for queued in unacked {
            (self.on_return)(queued.frame, &error);
        }
        while let Ok(queued) = queue.try_recv() {
            (self.on_return)(queued.frame, &error);
        }
        self.closed.send_replace(true);
    }
}

/// The sending end of a link. Clones are cheap and share the link.
#[derive(Clone)]
pub struct ChannelTx {
    link: Arc<LinkShared>,
    queue: mpsc::UnboundedSender<Queued>,
}

impl fmt::Debug for ChannelTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelTx")
            .field("addr", &self.link.addr)
            .field("outstanding", &self.outstanding_bytes())
            .field("error", &self.link.error.get())
            .finish()
    }
}

impl ChannelTx {
    /// A new link to `addr`; returns the handle, and the receiving end of
    /// its queue for the link task.
    pub(crate) fn new(
        addr: &ChannelAddr,
        on_return: ReturnFn,
        delivery_timeout: Option<std::time::Duration>,
    ) -> (ChannelTx, Arc<LinkShared>, mpsc::UnboundedReceiver<Queued>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let progress = Arc::new(AtomicU64::new(0));
        touch(&progress);
        let link = Arc::new(LinkShared {
            addr: addr.clone(),
            budget: Budget::new(),
            on_return,
            window: Mutex::new(Window::default()),
            direct: Mutex::new(Direct::default()),
            flush: tokio::sync::Notify::new(),
            error: OnceLock::new(),
            closed: watch::Sender::new(false),
            delivery_timeout,
            progress,
        });
        (
            ChannelTx {
                link: Arc::clone(&link),
                queue,
            },
            link,
            rx,
        )
    }

    /// The address this link sends to.
    pub fn addr(&self) -> &ChannelAddr {
        &self.link.addr
    }

    /// Queues `frame`, first waiting while the link's outstanding bytes are
    /// over its budget ([`LINK_BUDGET_BYTES`]).
    ///
    /// # Errors
    /// A [`SendError`] holding the frame if the frame is too large
    /// ([`ChannelError::Frame`]) or the link has failed.
    ///
    /// # Cancel safety
    /// If cancelled while waiting for budget, the frame is dropped unsent;
    /// once queued the frame is sent (or returned) even if the caller is gone.
    pub async fn send(&self, frame: Frame) -> Result<(), SendError> {
        if let Err(err) = frame::check(&frame) {
            return Err(self.send_error(frame, Some(err)));
        }
        let cost = Budget::cost(&frame);
        if self.link.budget.acquire(cost).await.is_err() {
            return Err(self.send_error(frame, None));
        }
        self.enqueue(Queued {
            frame,
            cost,
            at: std::time::Instant::now(),
        })
    }

    /// Whether the link is over its budget (posts overdrew it).
    pub fn over_budget(&self) -> bool {
        self.link.budget.in_debt()
    }

    /// Resolves once the link is back within its budget, or has failed: for senders
    /// that [`post`](ChannelTx::post) and want to slow down to their receiver's pace.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn ready(&self) {
        self.link.budget.out_of_debt().await;
    }

    /// Queues `frame` without waiting, even if that overdraws the budget.
    /// Frames from `send` and `post` share one queue, so their order is kept.
    ///
    /// # Errors
    /// A [`SendError`] holding the frame if the frame is too large or the
    /// link has failed.
    pub fn post(&self, frame: Frame) -> Result<(), SendError> {
        if let Err(err) = frame::check(&frame) {
            return Err(self.send_error(frame, Some(err)));
        }
        let cost = Budget::cost(&frame);
        self.link.budget.force(cost);
        self.enqueue(Queued {
            frame,
            cost,
            at: std::time::Instant::now(),
        })
    }

    fn enqueue(&self, queued: Queued) -> Result<(), SendError> {
        let mut direct = self.link.lock_direct();
        if !direct.busy && direct.queued == 0 {
            if let Some(writer) = direct.writer.clone() {
                if direct_write_allowed() {
                    self.link.write_direct(&mut direct, &*writer, queued);
                    return Ok(());
                }
            }
        }
        direct.queued += 1;
        self.queue
            .send(queued)
            .map_err(|mpsc::error::SendError(q)| {
                direct.queued -= 1;
                self.link.budget.release(q.cost);
                self.send_error(q.frame, None)
            })
    }

    fn send_error(&self, frame: Frame, err: Option<frame::FrameError>) -> SendError {
        let error = match err {
            Some(err) => ChannelError::frame(&self.link.addr, err),
            None => self
                .link
                .error
                .get()
                .cloned()
                .unwrap_or_else(|| ChannelError::closed(&self.link.addr)),
        };
        SendError { frame, error }
    }

    /// `None` while the link is healthy; its error once it has failed.
    pub fn error(&self) -> Option<ChannelError> {
        self.link.error.get().cloned()
    }

    /// Resolves, with the link's error, once the link has failed (including
    /// being closed by the peer) and has returned its unsent frames.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn closed(&self) -> ChannelError {
        let mut rx = self.link.closed.subscribe();
        // The sender lives in `self.link`, so this cannot fail while we wait.
        let _ = rx.wait_for(|closed| *closed).await;
        self.error()
            .unwrap_or_else(|| ChannelError::closed(&self.link.addr))
    }

    /// As [`ChannelTx::closed`], as a future that does not hold the link open: a link
    /// whose handles are all dropped ends (gracefully) even while this is awaited.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub fn on_closed(&self) -> impl std::future::Future<Output = ChannelError> + Send + 'static {
        let link = Arc::clone(&self.link);
        async move {
            let mut rx = link.closed.subscribe();
            let _ = rx.wait_for(|closed| *closed).await;
            link.error
                .get()
                .cloned()
                .unwrap_or_else(|| ChannelError::closed(&link.addr))
        }
    }

    /// Bytes currently charged against the budget (queued or unacknowledged).
    pub(crate) fn outstanding_bytes(&self) -> usize {
        self.link.budget.outstanding.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::channel::{dial, serve, ChannelAddr, ChannelTransport};

    fn queued_writes() -> bool {
        QUEUE_WRITES.with(std::cell::Cell::get)
    }

    #[test]
    fn queue_writes_nests_and_restores() {
        assert!(!queued_writes());
        {
            let _outer = QueueWrites::new(true);
            assert!(queued_writes());
            assert!(
                !direct_write_allowed(),
                "no direct write while asked to queue"
            );
            {
                let _inner = QueueWrites::new(false);
                assert!(queued_writes(), "a `false` guard keeps the enclosing one");
            }
            assert!(queued_writes());
        }
        assert!(!queued_writes());
        let _off = QueueWrites::new(false);
        assert!(!queued_writes());
    }

    fn frame(n: u8) -> Frame {
        Frame::new(Bytes::copy_from_slice(&[n]), Vec::new())
    }

    #[tokio::test]
    async fn a_frame_sent_under_queue_writes_goes_to_the_link_task() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut rx = serve(&ChannelAddr::any(ChannelTransport::Unix))
                .await
                .unwrap();
            let tx = dial(rx.addr(), Arc::new(|_, _| {}));
            tx.post(frame(1)).unwrap();
            assert_eq!(rx.recv().await.unwrap().header[0], 1);
            // Connected and idle: a plain post could be written on this thread now.
            loop {
                let idle = {
                    let direct = tx.link.lock_direct();
                    direct.writer.is_some() && !direct.busy && direct.queued == 0
                };
                if idle {
                    break;
                }
                tokio::task::yield_now().await;
            }
            {
                let _batched = QueueWrites::new(true);
                tx.post(frame(2)).unwrap();
                tx.post(frame(3)).unwrap();
            }
            // This runtime has one thread, busy here: the link task has not run, so
            // the frames wait in its queue, not written (nor in the unacknowledged
            // window, where a direct write puts its frame at once).
            assert_eq!(tx.link.lock_direct().queued, 2);
            assert!(
                tx.link.lock_window().frames.len() <= 1,
                "only frame 1 may be unacked"
            );
            assert_eq!(rx.recv().await.unwrap().header[0], 2);
            assert_eq!(rx.recv().await.unwrap().header[0], 3);
        })
        .await
        .expect("test timed out");
    }
}
