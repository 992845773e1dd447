//! The in-process transport.
//!
//! A process-global registry maps local ids to the queue of the
//! [`ChannelRx`](super::ChannelRx) served there. Serving `Local(0)`
//! allocates a fresh id from an atomic counter. A link "writes" a frame by
//! pushing it (moved, never serialised) into that queue, and learns of
//! deliveries through the shared [`AckState`], exactly like a socket link
//! learns of them through acknowledgements. So the budget bounds a local
//! sender's frames until the receiver pulls them.
//!
//! Invariants: an id is registered by at most one live `ChannelRx`, and
//! unregistered when it drops; dialing an id that is not registered fails
//! the link with [`ChannelError::NotServed`]; dropping the `ChannelRx`
//! fails its links, which return every frame not yet yielded by `recv`.
//!
//! ```
//! # async fn example() {
//! use hyperactor::channel::{serve, ChannelAddr, ChannelTransport};
//! let rx = serve(&ChannelAddr::any(ChannelTransport::Local)).await.unwrap();
//! assert!(matches!(rx.addr(), ChannelAddr::Local(id) if *id != 0));
//! # }
//! ```

use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::sync::OnceLock;

use tokio::sync::mpsc;

use super::ack::AckState;
use super::ack::Delivery;
use super::addr::ChannelAddr;
use super::error::ChannelError;
use super::frame::Frame;
use super::inbox::Inbox;
use super::link;
use super::link::AckSource;
use super::link::FrameSink;
use super::tx::LinkShared;
use super::tx::Queued;

type Registry = Mutex<HashMap<u64, Inbox>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Registers a queue at `id` (or at a fresh id if `id` is 0) and returns
/// the id.
///
/// # Errors
/// [`ChannelError::AddrInUse`] if `id` is already served.
pub(crate) fn register(id: u64, queue: Inbox) -> Result<u64, ChannelError> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut map = registry().lock();
    let id = if id == 0 {
        loop {
            let candidate = NEXT.fetch_add(1, Ordering::Relaxed);
            if candidate != 0 && !map.contains_key(&candidate) {
                break candidate;
            }
        }
    } else if map.contains_key(&id) {
        return Err(ChannelError::AddrInUse {
            addr: ChannelAddr::Local(id),
        });
    } else {
        id
    };
    map.insert(id, queue);
    Ok(id)
}

/// Removes `id` from the registry.
pub(crate) fn unregister(id: u64) {
    registry().lock().remove(&id);
}

/// Runs a link to the local endpoint `id`.
pub(crate) async fn run_link(
    id: u64,
    queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    let target = registry().lock().get(&id).cloned();
    let Some(target) = target else {
        let error = ChannelError::NotServed {
            addr: link.addr.clone(),
        };
        return link::fail_unconnected(&link, error, queue);
    };
    let ack = Arc::new(AckState::default());
    let sink = LocalSink {
        target: target.clone(),
        ack: Arc::clone(&ack),
        addr: link.addr.clone(),
    };
    let acks = LocalAcks {
        target,
        ack,
        addr: link.addr.clone(),
        gone: false,
    };
    link::drive(sink, acks, queue, link).await;
}

#[derive(Debug)]
struct LocalSink {
    target: Inbox,
    ack: Arc<AckState>,
    addr: ChannelAddr,
}

impl FrameSink for LocalSink {
    /// Never called: local links offer no direct writes (their frames are queued to
    /// the receiver by the link task only).
    async fn write_rest(
        &mut self,
        _chunks: std::collections::VecDeque<bytes::Bytes>,
    ) -> Result<(), ChannelError> {
        Ok(())
    }

    async fn write(&mut self, frames: Vec<Frame>, first_seq: u64) -> Result<(), ChannelError> {
        for (seq, frame) in (first_seq..).zip(frames) {
            let delivery = Delivery {
                frame,
                seq,
                ack: Arc::clone(&self.ack),
            };
            if self.target.send(delivery).await.is_err() {
                return Err(ChannelError::closed(&self.addr));
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct LocalAcks {
    target: Inbox,
    ack: Arc<AckState>,
    addr: ChannelAddr,
    /// The receiver is gone and its final delivery count was reported.
    gone: bool,
}

impl AckSource for LocalAcks {
    async fn next_ack(&mut self) -> Result<u64, ChannelError> {
        if self.gone {
            return Err(ChannelError::closed(&self.addr));
        }
        tokio::select! {
            ack = self.ack.next() => Ok(ack),
            () = self.target.closed() => {
                // The receiver is dropped, so no more deliveries: report
                // the final count, then the error on the next call.
                self.gone = true;
                Ok(self.ack.delivered())
            }
        }
    }
}
