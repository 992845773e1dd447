//! The task that drives one link, generic over its transport.
//!
//! A link task takes frames from the [`ChannelTx`](super::ChannelTx) queue,
//! numbers them (from 1), keeps them in an *unacknowledged window* and hands
//! them to a [`FrameSink`] in batches; concurrently it reads cumulative
//! acknowledgements from an [`AckSource`] and drops acknowledged frames
//! from the window, releasing their budget.
//!
//! Invariants:
//! - a frame leaves the window only when acknowledged (delivered) or when
//!   the link fails, in which case [`LinkShared::fail`] returns it, once;
//! - after a sink error the task keeps reading acknowledgements for up to
//!   [`SETTLE_TIMEOUT`], so frames that were delivered just before the peer
//!   went away are not also returned;
//! - when every `ChannelTx` is dropped, the task finishes writing, waits
//!   for all acknowledgements and ends without failing the link;
//! - with a delivery timeout (see [`super::delivery_timeout`]), a link whose
//!   oldest unacknowledged frame was queued more than the timeout ago, and that
//!   made no progress (no acknowledgement, no byte written) for that long either,
//!   fails with [`ChannelError::DeliveryTimeout`], returning its frames: a peer
//!   that stopped reading or went silent never holds them forever, and a slow
//!   transfer that keeps moving is not cut.
//!
//! ```ignore
//! drive(sink, acks, queue, link).await; // run by `dial` in its own task
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tokio::sync::mpsc;
use tokio::sync::Notify;

use super::error::ChannelError;
use super::frame::Frame;
use super::tx::LinkShared;
use super::tx::Queued;

/// The most frames handed to the sink in one batch.
const MAX_BATCH_FRAMES: usize = 64;
/// A batch stops growing once it holds this many bytes.
const MAX_BATCH_BYTES: usize = 4 << 20;
/// How long acknowledgements may still arrive after the sink failed.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a link writes frames.
pub(crate) trait FrameSink: Send {
    /// Writes `frames`, numbered consecutively from `first_seq`.
    fn write(
        &mut self,
        frames: Vec<Frame>,
        first_seq: u64,
    ) -> impl Future<Output = Result<(), ChannelError>> + Send;

    /// Writes the encoded rest of a frame a sender began writing directly (see
    /// `tx::Direct`). Only sinks that offer direct writes get this.
    fn write_rest(
        &mut self,
        chunks: VecDeque<Bytes>,
    ) -> impl Future<Output = Result<(), ChannelError>> + Send;
}

/// Where a link reads acknowledgements from.
pub(crate) trait AckSource: Send {
    /// The next cumulative acknowledgement; an error once the peer is gone.
    fn next_ack(&mut self) -> impl Future<Output = Result<u64, ChannelError>> + Send;
}

/// Marks its link closed when dropped, so that a link task dropped
/// without finishing (for example by a runtime shutting down) still
/// resolves [`ChannelTx::closed`](super::ChannelTx::closed).
#[derive(Debug)]
pub(crate) struct ClosedOnDrop(pub(crate) Arc<LinkShared>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.mark_closed();
    }
}

/// Runs a link until it fails or is closed gracefully.
pub(crate) async fn drive<S: FrameSink, A: AckSource>(
    mut sink: S,
    mut acks: A,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    let acked = Notify::new();
    let error = {
        let writing = write_loop(&mut sink, &mut queue, &link, &acked);
        let reading = ack_loop(&mut acks, &link, &acked);
        let expiring = expiry_loop(&link);
        tokio::pin!(writing);
        tokio::pin!(reading);
        tokio::pin!(expiring);
        tokio::select! {
            res = &mut writing => match res {
                Ok(()) => return,
                Err(err) => {
                    // Let acknowledgements already on their way land first.
                    let _ = tokio::time::timeout(SETTLE_TIMEOUT, &mut reading).await;
                    err
                }
            },
            err = &mut reading => err,
            err = &mut expiring => err,
        }
    };
    link.fail(error, &mut queue);
}

/// Fails a link that never got a transport (connect failed).
pub(crate) fn fail_unconnected(
    link: &LinkShared,
    error: ChannelError,
    mut queue: mpsc::UnboundedReceiver<Queued>,
) {
    link.fail(error, &mut queue);
}

async fn write_loop<S: FrameSink>(
    sink: &mut S,
    queue: &mut mpsc::UnboundedReceiver<Queued>,
    link: &LinkShared,
    acked: &Notify,
) -> Result<(), ChannelError> {
    loop {
        // Work is a queued frame, or the rest of a direct write.
        let first = tokio::select! {
            biased;
            () = link.flush.notified() => None,
            queued = queue.recv() => match queued {
                Some(queued) => Some(queued),
                None => break,
            },
        };
        // From here until the queue is empty, this task writes (see tx::Direct).
        let rest = {
            let mut direct = link.lock_direct();
            direct.busy = true;
            if first.is_some() {
                direct.queued -= 1;
            }
            std::mem::take(&mut direct.leftover)
        };
        if !rest.is_empty() {
            sink.write_rest(rest).await?;
            link.touch();
        }
        if let Some(first) = first {
            let mut batch = Vec::with_capacity(1);
            let mut bytes = 0;
            let mut next = Some(first);
            let first_seq = {
                let mut window = link.lock_window();
                let first_seq = window.acked + window.frames.len() as u64 + 1;
                while let Some(queued) = next.take() {
                    bytes += queued.frame.len();
                    batch.push(queued.frame.clone());
                    window.frames.push_back(queued);
                    if batch.len() < MAX_BATCH_FRAMES && bytes < MAX_BATCH_BYTES {
                        next = queue.try_recv().ok();
                        if next.is_some() {
                            link.lock_direct().queued -= 1;
                        }
                    }
                }
                first_seq
            };
            sink.write(batch, first_seq).await?;
            link.touch();
        }
        let mut direct = link.lock_direct();
        if direct.queued == 0 && direct.leftover.is_empty() {
            direct.busy = false;
        }
    }
    // Every handle is gone: wait until everything is acknowledged.
    loop {
        if link.lock_window().frames.is_empty() {
            return Ok(());
        }
        acked.notified().await;
    }
}

async fn ack_loop<A: AckSource>(acks: &mut A, link: &LinkShared, acked: &Notify) -> ChannelError {
    loop {
        let ack = match acks.next_ack().await {
            Ok(ack) => ack,
            Err(err) => return err,
        };
        let released = {
            let mut window = link.lock_window();
            let written = window.acked + window.frames.len() as u64;
            if ack < window.acked || ack > written {
                return ChannelError::Protocol {
                    addr: link.addr.clone(),
                    reason: format!(
                        "acknowledgement {ack} outside the window {}..={written}",
                        window.acked
                    ),
                };
            }
            let n = (ack - window.acked) as usize;
            window.acked = ack;
            window.frames.drain(..n).map(|q| q.cost).sum::<usize>()
        };
        link.touch();
        link.budget.release(released);
        acked.notify_one();
    }
}

/// Resolves, with [`ChannelError::DeliveryTimeout`], once the link's oldest
/// unacknowledged frame was queued more than its delivery timeout ago and the link
/// made no progress for that long either (see the module docs); never without a
/// delivery timeout.
async fn expiry_loop(link: &LinkShared) -> ChannelError {
    let Some(limit) = link.delivery_timeout else {
        return std::future::pending().await;
    };
    loop {
        let oldest = link.lock_window().frames.front().map(|q| q.at);
        let now = std::time::Instant::now();
        let wake = match oldest {
            // A frame that enters the window later was queued later than now: its
            // deadline is after this wake-up.
            None => now.checked_add(limit),
            Some(at) => {
                let since = at.max(link.last_progress());
                match since.checked_add(limit) {
                    Some(deadline) if deadline <= now => {
                        return ChannelError::DeliveryTimeout {
                            addr: link.addr.clone(),
                            timeout: limit,
                        };
                    }
                    deadline => deadline,
                }
            }
        };
        match wake {
            Some(wake) => tokio::time::sleep_until(wake.into()).await,
            // A limit too long to represent: never.
            None => return std::future::pending().await,
        }
    }
}
