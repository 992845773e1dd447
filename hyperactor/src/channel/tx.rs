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

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::PoisonError;

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

/// A frame in a link's queue or unacknowledged window, with its cost.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) frame: Frame,
    pub(crate) cost: usize,
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
        let mut debt = self.debt.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = self.sem.forget_permits(cost);
        *debt += cost - taken;
        self.outstanding.fetch_add(cost, Ordering::AcqRel);
    }

    /// Gives back `cost` bytes of budget.
    pub(crate) fn release(&self, cost: usize) {
        if cost == 0 {
            return;
        }
        let mut debt = self.debt.lock().unwrap_or_else(PoisonError::into_inner);
        let paid = (*debt).min(cost);
        *debt -= paid;
        self.sem.add_permits(cost - paid);
        self.outstanding.fetch_sub(cost, Ordering::AcqRel);
    }

    /// Fails all current and future waiters.
    pub(crate) fn close(&self) {
        self.sem.close();
    }
}

/// The state a link's handles share with its task.
pub(crate) struct LinkShared {
    pub(crate) addr: ChannelAddr,
    pub(crate) budget: Budget,
    pub(crate) on_return: ReturnFn,
    /// Set once, when the link fails.
    error: OnceLock<ChannelError>,
    /// Becomes true after the failed link has returned all its frames.
    closed: watch::Sender<bool>,
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

    /// Fails the link for good: closes the budget and the queue, returns
    /// every frame in `unacked` and then in the queue, then wakes `closed`.
    pub(crate) fn fail(
        &self,
        error: ChannelError,
        unacked: impl IntoIterator<Item = Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
    ) {
        let error = self.set_error(error);
        tracing::debug!(addr = %self.addr, %error, "channel link failed");
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
    ) -> (ChannelTx, Arc<LinkShared>, mpsc::UnboundedReceiver<Queued>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let link = Arc::new(LinkShared {
            addr: addr.clone(),
            budget: Budget::new(),
            on_return,
            error: OnceLock::new(),
            closed: watch::Sender::new(false),
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
        self.enqueue(Queued { frame, cost })
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
        self.enqueue(Queued { frame, cost })
    }

    fn enqueue(&self, queued: Queued) -> Result<(), SendError> {
        self.queue
            .send(queued)
            .map_err(|mpsc::error::SendError(q)| {
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

    /// Bytes currently charged against the budget (queued or unacknowledged).
    pub(crate) fn outstanding_bytes(&self) -> usize {
        self.link.budget.outstanding.load(Ordering::Acquire)
    }
}
