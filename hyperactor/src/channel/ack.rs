//! Delivery acknowledgements, shared by the receiving side of every link.
//!
//! A frame counts as delivered when [`crate::channel::ChannelRx::recv`]
//! yields it, not when it is queued: frames still queued when the
//! `ChannelRx` is dropped are therefore never acknowledged, and the sender
//! returns them. Each connection (or local link) has one [`AckState`]; the
//! receiver stamps deliveries into it, and one consumer (the connection
//! task, or the local link task) turns them into cumulative
//! acknowledgements with [`AckState::next`].
//!
//! Invariants: sequence numbers start at 1 and are delivered in order;
//! an acknowledgement `n` means frames `1..=n` were all delivered.
//! Acknowledgements are batched: one is produced when [`ACK_FRAMES`]
//! frames or [`ACK_BYTES`] bytes are unacknowledged, or [`ACK_DELAY`] after
//! the first unacknowledged delivery.
//!
//! The consumer is woken by a delivery only when it is idle (nothing was
//! left to acknowledge when it last looked) or a threshold is crossed:
//! under steady traffic it wakes on its own, at most every [`ACK_DELAY`],
//! so a stream of small messages does not pay a task wake-up per message.
//!
//! ```ignore
//! let ack = AckState::default();
//! ack.deliver(1, 10);
//! assert_eq!(ack.next().await, 1); // after at most ACK_DELAY
//! ```

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::frame::Frame;

/// Acknowledge at least every this many frames.
pub(crate) const ACK_FRAMES: u64 = 64;
/// Acknowledge at least every this many bytes.
pub(crate) const ACK_BYTES: u64 = 4 << 20;
/// Acknowledge at most this long after the first unacknowledged delivery.
///
/// Each acknowledgement the timer sends wakes two processes (the receiver to write
/// it, the sender to read it), so under request/response traffic slower than
/// [`ACK_FRAMES`] per delay the delay sets the wake-up rate. It does not delay
/// delivery, and what waits for it is bounded by the thresholds: a link's
/// unacknowledged frames ([`ACK_FRAMES`], [`ACK_BYTES`]) are kept this much longer.
/// Measured on 2 cores, call() to 64 procs (their 128 links each woke two processes
/// every 20 ms), A/B runs alternating builds: 20 vs 100 ms 3.5-5.1 vs 3.4-3.8 ms,
/// 20 vs 250 ms 4.2-4.7 vs 3.6-4.2 ms. call() to 16 procs: ~2% faster at 250 ms.
pub(crate) const ACK_DELAY: Duration = Duration::from_millis(100);

/// Delivery progress of one connection.
#[derive(Debug, Default)]
pub(crate) struct AckState {
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
    acked: AtomicU64,
    acked_bytes: AtomicU64,
    /// True while the consumer waits with nothing to acknowledge.
    idle: AtomicBool,
    notify: Notify,
}

impl AckState {
    /// Records that frame `seq` (of `len` bytes) was handed to the user.
    pub(crate) fn deliver(&self, seq: u64, len: usize) {
        // SeqCst on `delivered` and `idle` (here and in `next`): each side
        // stores its flag, then loads the other's, so at least one of them
        // sees the other's store and no wake-up is lost.
        self.delivered.store(seq, Ordering::SeqCst);
        let bytes = self.delivered_bytes.fetch_add(len as u64, Ordering::AcqRel) + len as u64;
        // Wake the consumer when it is idle (to arm its timer) or a batch fills.
        if self.idle.load(Ordering::SeqCst) || self.over_threshold(seq, bytes) {
            self.notify.notify_one();
        }
    }

    /// The last delivered sequence number.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    fn over_threshold(&self, seq: u64, bytes: u64) -> bool {
        seq.saturating_sub(self.acked.load(Ordering::Acquire)) >= ACK_FRAMES
            || bytes.saturating_sub(self.acked_bytes.load(Ordering::Acquire)) >= ACK_BYTES
    }

    fn publish(&self) -> u64 {
        let bytes = self.delivered_bytes.load(Ordering::Acquire);
        let seq = self.delivered.load(Ordering::Acquire);
        self.acked_bytes.store(bytes, Ordering::Release);
        self.acked.store(seq, Ordering::Release);
        seq
    }

    /// Waits for the next acknowledgement to send and returns it. Only one
    /// task may call this.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is marked acknowledged until it returns.
    pub(crate) async fn next(&self) -> u64 {
        loop {
            let acked = self.acked.load(Ordering::Acquire);
            let delivered = self.delivered.load(Ordering::Acquire);
            if delivered > acked {
                let bytes = self.delivered_bytes.load(Ordering::Acquire);
                if !self.over_threshold(delivered, bytes) {
                    // Batch: wait for the threshold or the delay, whichever first.
                    let _ = tokio::time::timeout(ACK_DELAY, self.notify.notified()).await;
                }
                return self.publish();
            }
            // Nothing to acknowledge: go idle, so the next delivery wakes us.
            // The re-check closes the race with a delivery that saw `idle`
            // still false; a stale permit left by `notify_one` only causes
            // one spurious loop.
            self.idle.store(true, Ordering::SeqCst);
            if self.delivered.load(Ordering::SeqCst) == acked {
                self.notify.notified().await;
            }
            self.idle.store(false, Ordering::Release);
        }
    }
}

/// A frame in a `ChannelRx` queue, with what is needed to acknowledge it.
pub(crate) struct Delivery {
    pub(crate) frame: Frame,
    pub(crate) seq: u64,
    pub(crate) ack: Arc<AckState>,
}

impl Delivery {
    /// Marks the frame delivered and yields it.
    pub(crate) fn deliver(self) -> Frame {
        self.ack.deliver(self.seq, self.frame.len());
        self.frame
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("seq", &self.seq)
            .field("frame", &self.frame)
            .finish()
    }
}
