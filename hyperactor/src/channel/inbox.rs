//! Where a served endpoint puts the frames it receives.
//!
//! An [`Inbox`] is either a bounded queue drained by [`ChannelRx::recv`](super::ChannelRx::recv),
//! or a direct delivery function called by the connection task itself
//! ([`serve_with`](super::serve_with)), which saves a task hop per message on
//! the receive path. Both count a frame as delivered (and so acknowledge it)
//! only once it has been handed over: popped from the queue, or passed to the
//! function. Both close when their owner (the `ChannelRx` or the
//! [`ChannelServer`](super::ChannelServer)) is dropped; connections then send a
//! final acknowledgement and stop.
//!
//! ```ignore
//! inbox.send(delivery).await?; // queue it, or deliver it right here
//! ```

use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::ack::Delivery;
use super::addr::ChannelAddr;
use super::error::AttachRefusal;
use super::frame::Frame;
use super::tx::{ChannelTx, ReturnFn};

/// The function a direct inbox hands each frame to. It must not block.
pub type DeliverFn = Arc<dyn Fn(Frame) + Send + Sync>;

/// What a gateway does with a client that asks to attach: given the client's uid and
/// the link to it, registers the link and returns the address the gateway advertises
/// (the client's id carries it, so that peers reach the client through the gateway),
/// or refuses, saying why.
pub type AttachFn =
    Arc<dyn Fn(&str, ChannelTx) -> Result<ChannelAddr, AttachRefusal> + Send + Sync>;

/// The gateway's side of attachments, installed on an endpoint with
/// [`crate::channel::serve_gateway`]; the protocol is in `net::attach`.
#[derive(Clone)]
pub struct AttachHandler {
    /// Decides, and registers the link of an accepted client.
    pub accept: AttachFn,
    /// Called for each frame an attached link could not deliver (the link failed).
    pub on_return: ReturnFn,
}

impl std::fmt::Debug for AttachHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttachHandler")
    }
}

/// See the [module docs](self).
#[derive(Clone)]
pub(crate) enum Inbox {
    Queue(mpsc::Sender<Delivery>),
    Direct(Arc<Direct>),
}

/// A direct inbox: the function, whether its owner is gone, and for a gateway what
/// to do with clients that attach (see [`super::net::attach`]).
pub(crate) struct Direct {
    deliver: DeliverFn,
    closed: watch::Sender<bool>,
    attach: Option<AttachHandler>,
}

impl Direct {
    pub(crate) fn new(deliver: DeliverFn) -> Arc<Self> {
        Self::with_attach(deliver, None)
    }

    /// A direct inbox of an endpoint that takes attachments with `attach`, if given.
    pub(crate) fn with_attach(deliver: DeliverFn, attach: Option<AttachHandler>) -> Arc<Self> {
        Arc::new(Self {
            deliver,
            closed: watch::Sender::new(false),
            attach,
        })
    }

    /// Stops delivering: later frames are refused (and so returned to
    /// their senders).
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }
}

impl Inbox {
    /// Hands a delivery over: queues it (waiting for room), or delivers it.
    ///
    /// # Errors
    /// Gives the delivery back if the inbox is closed.
    ///
    /// # Cancel safety
    /// Cancel safe for the queue (nothing is queued if cancelled); a
    /// direct delivery does not wait.
    pub(crate) async fn send(&self, delivery: Delivery) -> Result<(), Delivery> {
        match self {
            Inbox::Queue(queue) => queue.send(delivery).await.map_err(|e| e.0),
            Inbox::Direct(direct) => {
                if *direct.closed.borrow() {
                    return Err(delivery);
                }
                // Forget marks left by deliveries of other tasks that never waited (local
                // sends): only this delivery's count.
                drop(super::backpressure::take());
                (direct.deliver)(delivery.deliver());
                // A queue the delivery filled over its mark: read nothing more from
                // this connection until it has room (or the inbox closes).
                if let Some(room) = super::backpressure::take() {
                    let mut closed = direct.closed.subscribe();
                    tokio::select! {
                        () = room => {}
                        _ = closed.wait_for(|closed| *closed) => {}
                    }
                }
                Ok(())
            }
        }
    }

    /// Resolves once the inbox is closed.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn closed(&self) {
        match self {
            Inbox::Queue(queue) => queue.closed().await,
            Inbox::Direct(direct) => {
                let mut rx = direct.closed.subscribe();
                let _ = rx.wait_for(|closed| *closed).await;
            }
        }
    }

    /// What the endpoint does with clients that attach, if it takes any.
    pub(crate) fn attach_handler(&self) -> Option<AttachHandler> {
        match self {
            Inbox::Queue(_) => None,
            Inbox::Direct(direct) => direct.attach.clone(),
        }
    }

    /// True once the inbox is closed.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Inbox::Queue(queue) => queue.is_closed(),
            Inbox::Direct(direct) => *direct.closed.borrow(),
        }
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Inbox::Queue(queue) => write!(
                f,
                "Inbox::Queue({} queued)",
                queue.max_capacity() - queue.capacity()
            ),
            Inbox::Direct(direct) => {
                write!(f, "Inbox::Direct(closed: {})", *direct.closed.borrow())
            }
        }
    }
}
