//! Sending contexts: who is sending, and through which proc.
//!
//! Every send names its sender, so that a message that cannot be delivered can go back
//! to it (DEL-1). [`SendContext`] is the capability to send: it is implemented by an
//! actor's [`crate::actor::Context`] (inside handlers) and by a
//! [`crate::client::Client`] (in `main`, tests, or any code that is not an actor).
//!
//! Besides sending (see [`crate::port::PortRef::send`]), a context opens ports on its own
//! mailbox and offers [`SendContext::call`], a request/reply exchange that cannot hang:
//! it ends with the reply, with the request returned as undeliverable, or with the
//! failure of the connection to the destination.
//!
//! ```
//! # use hyperactor::{channel::ChannelTransport, proc::Proc, context::SendContext};
//! # use hyperactor::port::OncePortRef;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proc = Proc::serve(ChannelTransport::Local, "doc").await?;
//! let client = proc.client("main")?;
//! // An echo service run by hand on a port: it answers each request on the reply port
//! // the request carries.
//! let (service, mut requests) = client.open_port::<(u64, OncePortRef<u64>)>();
//! let echo = proc.client("echo")?;
//! tokio::spawn(async move {
//!     while let Ok((n, reply)) = requests.recv().await {
//!         reply.send(&echo, n + 1).unwrap();
//!     }
//! });
//! let answer = client.call(&service, |reply| (41, reply)).await?;
//! assert_eq!(answer, 42);
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use crate::error::CallError;
use crate::id::{ActorId, PortId};
use crate::mailbox::Mailbox;
use crate::message::{
    Envelope, EnvelopeHeader, Message, Serialized, Undeliverable, UNDELIVERABLE_PORT,
};
use crate::port::{OncePortReceiver, OncePortRef, PortReceiver, PortRef};
use crate::router::Proc;

/// The capability to send messages and open ports, as a given actor.
pub trait SendContext: Send + Sync {
    /// The proc that routes this context's messages.
    fn proc(&self) -> &Proc;

    /// This context's mailbox.
    fn mailbox(&self) -> &Arc<Mailbox>;

    /// The id of the sending actor.
    fn actor_id(&self) -> &ActorId {
        self.mailbox().actor_id()
    }

    /// The header of a message from this context to `dest`: undeliverable messages come
    /// back to this actor's undeliverable port.
    fn envelope_header(&self, dest: PortId) -> EnvelopeHeader {
        EnvelopeHeader {
            sender: self.actor_id().clone(),
            dest,
            return_to: Some(self.actor_id().port_id(UNDELIVERABLE_PORT)),
            extra: None,
        }
    }

    /// Opens a streaming port on this context's mailbox.
    fn open_port<M: Message>(&self) -> (PortRef<M>, PortReceiver<M>)
    where
        Self: Sized,
    {
        self.mailbox().open_port()
    }

    /// Opens a once port on this context's mailbox.
    fn open_once_port<M: Message>(&self) -> (OncePortRef<M>, OncePortReceiver<M>)
    where
        Self: Sized,
    {
        self.mailbox().open_once_port()
    }

    /// Sends the request built by `make` (which receives the reply port) to `dest`, and
    /// waits for the reply.
    ///
    /// The request is sent when `call` is called, not when the future is first polled.
    ///
    /// # Errors
    ///
    /// - [`CallError::Encode`] if the request cannot be serialized;
    /// - [`CallError::Undeliverable`] if the request came back (no such actor or port,
    ///   actor stopped, connection failed before delivery);
    /// - [`CallError::LinkFailed`] if the connection to a remote destination fails while
    ///   waiting (the destination's proc died);
    /// - [`CallError::Recv`] if the reply cannot be decoded, or this context stopped.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops the reply port; a reply that arrives later is returned to the
    /// replier as undeliverable.
    fn call<'a, M: Message, R: Message, F: FnOnce(OncePortRef<R>) -> M>(
        &'a self,
        dest: &PortRef<M>,
        make: F,
    ) -> impl Future<Output = Result<R, CallError>> + Send + use<'a, Self, M, R, F>
    where
        Self: Sized,
    {
        let (reply, reply_rx) = self.open_once_port::<R>();
        let (returned, returned_rx) = self.open_once_port::<Undeliverable>();
        let dest = dest.port_id().clone();
        let sent = Serialized::encode(&make(reply)).map(|payload| {
            let mut header = self.envelope_header(dest.clone());
            header.return_to = Some(returned.port_id().clone());
            self.proc().post(Envelope { header, payload });
        });
        let link = self.proc().current_link(dest.actor().proc_id());
        async move {
            sent?;
            let link_failed = async {
                match link {
                    Some(link) => link.closed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                reply = reply_rx.recv() => Ok(reply?),
                returned = returned_rx.recv() => Err(match returned {
                    Ok(u) => CallError::Undeliverable { dest, reason: u.reason },
                    Err(e) => e.into(),
                }),
                error = link_failed => Err(CallError::LinkFailed { dest, error }),
            }
        }
    }
}
