//! Typed ports: references that travel inside messages, and their receivers.
//!
//! A port is an address an actor can receive on. Three kinds exist:
//!
//! - **handler ports**, one per message type an actor handles, reached through
//!   [`crate::actor::ActorRef::port`];
//! - **streaming ports** ([`PortRef`] + [`PortReceiver`]), opened at run time, receiving
//!   any number of messages in order;
//! - **once ports** ([`OncePortRef`] + [`OncePortReceiver`]), receiving exactly one
//!   message (MB-2): the usual way to get a reply.
//!
//! References are plain serializable values (a [`PortId`] and a type), so they can be put
//! inside messages and sent anywhere; whoever holds one can send to it with any
//! [`SendContext`].
//!
//! ```
//! # use hyperactor::{channel::ChannelTransport, proc::Proc, context::SendContext};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proc = Proc::serve(ChannelTransport::Local, "doc").await?;
//! let client = proc.client("main")?;
//! let (port, mut rx) = client.open_port::<String>();
//! port.send(&client, "hello".to_string())?;
//! assert_eq!(rx.recv().await?, "hello");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::context::SendContext;
use crate::error::{MessageError, RecvError};
use crate::id::PortId;
use crate::mailbox::{DirectPort, DirectSink, Mailbox, PortSink};
use crate::message::{Envelope, Message, Serialized};

/// A typed, serializable reference to a streaming (or handler) port.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct PortRef<M> {
    port: PortId,
    #[serde(skip)]
    _message: PhantomData<fn() -> M>,
}

/// A typed, serializable reference to a once port. Sending consumes it.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct OncePortRef<M> {
    port: PortId,
    #[serde(skip)]
    _message: PhantomData<fn() -> M>,
}

macro_rules! port_ref_common {
    ($t:ident) => {
        impl<M: Message> $t<M> {
            /// A reference to `port`, trusting the caller that it receives `M`s.
            pub fn attest(port: PortId) -> Self {
                Self {
                    port,
                    _message: PhantomData,
                }
            }

            /// The id of the referenced port.
            pub fn port_id(&self) -> &PortId {
                &self.port
            }
        }

        impl<M> fmt::Debug for $t<M> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "{}<{}>({})",
                    stringify!($t),
                    std::any::type_name::<M>(),
                    self.port
                )
            }
        }

        impl<M> PartialEq for $t<M> {
            fn eq(&self, other: &Self) -> bool {
                self.port == other.port
            }
        }

        impl<M> Eq for $t<M> {}
    };
}
port_ref_common!(PortRef);
port_ref_common!(OncePortRef);

impl<M> Clone for PortRef<M> {
    fn clone(&self) -> Self {
        Self {
            port: self.port.clone(),
            _message: PhantomData,
        }
    }
}

/// Serializes `msg` and posts it from `cx` to `port`.
pub(crate) fn post_to<M: Message>(
    cx: &(impl SendContext + ?Sized),
    port: &PortId,
    msg: &M,
) -> Result<(), MessageError> {
    let payload = Serialized::encode(msg)?;
    cx.proc().post(Envelope {
        header: cx.envelope_header(port.clone()),
        payload,
    });
    Ok(())
}

impl<M: Message> PortRef<M> {
    /// Sends `msg` to the port from `cx`. Never waits: the message is queued on its way
    /// (the per-link queue, see [`crate::proc::Proc::post`]). A message that cannot be
    /// delivered comes back to `cx`'s actor (DEL-1).
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Encode`] if `msg` cannot be serialized.
    pub fn send(&self, cx: &(impl SendContext + ?Sized), msg: M) -> Result<(), MessageError> {
        post_to(cx, &self.port, &msg)
    }
}

impl<M: Message> PortRef<M> {
    /// Sends an already-serialized message: its parts travel as they are, each its own
    /// part of the frame, never concatenated (for encoders that keep large buffers out
    /// of band, like pickle protocol 5). The receiver reads it with
    /// [`PortReceiver::recv_serialized`], or decodes it as an `M`.
    pub fn send_serialized(&self, cx: &(impl SendContext + ?Sized), payload: Serialized) {
        cx.proc().post(Envelope {
            header: cx.envelope_header(self.port.clone()),
            payload,
        });
    }

    /// Sends `msg` like [`PortRef::send`], but first waits while the link to a remote
    /// destination has too many bytes outstanding: the way for bulk senders to keep
    /// their memory bounded when the receiver is slower than they are.
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Encode`] if `msg` cannot be serialized.
    ///
    /// # Cancel safety
    ///
    /// Cancelling may drop the message before it was queued.
    pub async fn send_with_backpressure(
        &self,
        cx: &(impl SendContext + ?Sized),
        msg: M,
    ) -> Result<(), MessageError> {
        let payload = Serialized::encode(&msg)?;
        let envelope = Envelope {
            header: cx.envelope_header(self.port.clone()),
            payload,
        };
        cx.proc().send(envelope).await;
        Ok(())
    }
}

impl<M: Message> OncePortRef<M> {
    /// Sends the one message this port takes. See [`PortRef::send`].
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Encode`] if `msg` cannot be serialized.
    pub fn send(self, cx: &(impl SendContext + ?Sized), msg: M) -> Result<(), MessageError> {
        post_to(cx, &self.port, &msg)
    }
}

/// The receiving end of a streaming port. Dropping it closes the port: later messages are
/// returned to their senders.
#[must_use = "dropping the receiver closes the port"]
pub struct PortReceiver<M> {
    port: PortId,
    rx: mpsc::UnboundedReceiver<Envelope>,
    mailbox: Arc<Mailbox>,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message> PortReceiver<M> {
    pub(crate) fn new(
        port: PortId,
        rx: mpsc::UnboundedReceiver<Envelope>,
        mailbox: Arc<Mailbox>,
    ) -> Self {
        Self {
            port,
            rx,
            mailbox,
            _message: PhantomData,
        }
    }

    /// A reference to this port, to hand to senders.
    pub fn bind(&self) -> PortRef<M> {
        PortRef::attest(self.port.clone())
    }

    /// The port's id.
    pub fn port_id(&self) -> &PortId {
        &self.port
    }

    /// Receives the next message, in the order it was delivered.
    ///
    /// # Errors
    ///
    /// [`RecvError::Closed`] once the owning actor has stopped (its mailbox closed);
    /// [`RecvError::Decode`] if a message is not an `M`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken from the queue only when this returns.
    pub async fn recv(&mut self) -> Result<M, RecvError> {
        let envelope = self.rx.recv().await.ok_or_else(|| RecvError::Closed {
            port: self.port.clone(),
        })?;
        decode(&self.port, &envelope)
    }

    /// Receives the next message without decoding it: its parts, as sent (see
    /// [`PortRef::send_serialized`]).
    ///
    /// # Errors
    ///
    /// [`RecvError::Closed`] once the owning actor has stopped.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`PortReceiver::recv`].
    pub async fn recv_serialized(&mut self) -> Result<Serialized, RecvError> {
        match self.rx.recv().await {
            Some(envelope) => Ok(envelope.payload),
            None => Err(RecvError::Closed {
                port: self.port.clone(),
            }),
        }
    }

    /// Receives a message if one is already queued.
    ///
    /// # Errors
    ///
    /// As [`PortReceiver::recv`]; `Ok(None)` when nothing is queued.
    pub fn try_recv(&mut self) -> Result<Option<M>, RecvError> {
        match self.rx.try_recv() {
            Ok(envelope) => decode(&self.port, &envelope).map(Some),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => Err(RecvError::Closed {
                port: self.port.clone(),
            }),
        }
    }
}

impl<M> Drop for PortReceiver<M> {
    fn drop(&mut self) {
        self.mailbox.remove_port(self.port.index());
    }
}

impl<M> fmt::Debug for PortReceiver<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PortReceiver<{}>({})",
            std::any::type_name::<M>(),
            self.port
        )
    }
}

/// The receiving end of a once port.
#[must_use = "dropping the receiver closes the port"]
pub struct OncePortReceiver<M> {
    port: PortId,
    rx: oneshot::Receiver<Envelope>,
    mailbox: Arc<Mailbox>,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message> OncePortReceiver<M> {
    pub(crate) fn new(
        port: PortId,
        rx: oneshot::Receiver<Envelope>,
        mailbox: Arc<Mailbox>,
    ) -> Self {
        Self {
            port,
            rx,
            mailbox,
            _message: PhantomData,
        }
    }

    /// The port's id.
    pub fn port_id(&self) -> &PortId {
        &self.port
    }

    /// Receives the one message.
    ///
    /// # Errors
    ///
    /// [`RecvError::Closed`] if the owning actor stopped before a message arrived;
    /// [`RecvError::Decode`] if the message is not an `M`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the receiver is consumed, so a cancelled call loses the reply.
    pub async fn recv(mut self) -> Result<M, RecvError> {
        let envelope = (&mut self.rx).await.map_err(|_| RecvError::Closed {
            port: self.port.clone(),
        })?;
        decode(&self.port, &envelope)
    }
}

impl<M> Drop for OncePortReceiver<M> {
    fn drop(&mut self) {
        self.mailbox.remove_port(self.port.index());
    }
}

impl<M> fmt::Debug for OncePortReceiver<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "OncePortReceiver<{}>({})",
            std::any::type_name::<M>(),
            self.port
        )
    }
}

fn decode<M: Message>(port: &PortId, envelope: &Envelope) -> Result<M, RecvError> {
    envelope
        .payload
        .decode()
        .map_err(|source| RecvError::Decode {
            port: port.clone(),
            source,
        })
}

/// Opening ports: the port types are built on the mailbox, which does not name them.
impl Mailbox {
    /// Opens a streaming port: every message sent to the returned reference arrives, in
    /// order, at the returned receiver. Dropping the receiver closes the port.
    pub fn open_port<M: Message>(self: &Arc<Self>) -> (PortRef<M>, PortReceiver<M>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let port = self.insert(None, PortSink::Stream(tx));
        (
            PortRef::attest(port.clone()),
            PortReceiver::new(port, rx, Arc::clone(self)),
        )
    }

    /// Opens a once port: exactly one message sent to the returned reference arrives at
    /// the returned receiver (MB-2); later ones are returned to their senders.
    pub fn open_once_port<M: Message>(self: &Arc<Self>) -> (OncePortRef<M>, OncePortReceiver<M>) {
        let (tx, rx) = oneshot::channel();
        let port = self.insert(None, PortSink::Once(tx));
        (
            OncePortRef::attest(port.clone()),
            OncePortReceiver::new(port, rx, Arc::clone(self)),
        )
    }

    /// Opens a port whose messages are handed to `sink` as they are delivered, on the
    /// delivering task (for a remote sender, the task reading its connection), with no
    /// queue in between. `sink` must be quick and must not block; it runs without the
    /// mailbox locked, so it may send to this mailbox, and it may run on several
    /// delivering tasks at once (one per sending link). Messages from one sender reach
    /// it in send order (ORD-1).
    ///
    /// Dropping the returned [`DirectPort`] closes the port; messages sent to it later
    /// go back to their senders (DEL-1).
    pub fn open_direct_port<M: Message>(
        self: &Arc<Self>,
        sink: DirectSink,
    ) -> (PortRef<M>, DirectPort) {
        let port = self.insert(None, PortSink::Direct(sink));
        (
            PortRef::attest(port.clone()),
            DirectPort {
                port,
                mailbox: Arc::clone(self),
            },
        )
    }
}
