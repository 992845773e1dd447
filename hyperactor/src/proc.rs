//! Procs: the runtime of one process, hosting actors and routing their messages.
//!
//! A [`Proc`] listens on one channel address and hosts any number of actors. Every
//! message sent from the proc's actors and clients goes through [`Proc::post`]:
//!
//! - to an actor of this proc: straight into its mailbox;
//! - to another proc: into the link (one [`ChannelTx`](crate::channel::ChannelTx)) to that proc's address, created
//!   on first use and re-created after a failure.
//!
//! Messages arriving on the proc's channel are delivered to local mailboxes by the
//! connection tasks that read them ([`channel::serve_with`](crate::channel::serve_with)): no extra hop.
//!
//! A proc outside the cluster's network reaches it through a *gateway*: a proc served
//! with [`Proc::serve_gateway`] (every worker is one) relays between the clients
//! attached to it ([`Proc::attach`]) and every other proc. An attached proc's links all
//! go to its gateway, its id carries the gateway's address, and messages to it arrive
//! on the connection it made to the gateway; ORD-1 and DEL-1 hold through the relay.
//!
//! Invariants:
//!
//! - ORD-1 (per-sender FIFO): messages from one sender to one actor are delivered in
//!   send order. Locally, a post is a push into the destination's queue; remotely, all
//!   messages from this proc to another proc share one link, whose frames arrive in
//!   order, and the remote router delivers them in arrival order.
//! - DEL-1 (nothing lost silently): a message that cannot be delivered — no such actor,
//!   the actor stopped, the port is closed, the link failed before the receiver took it
//!   — is returned to the sender's `return_to` port as an [`Undeliverable`](crate::message::Undeliverable). A returned
//!   message that cannot itself be delivered is logged, never returned again.
//!
//! ```
//! # use hyperactor::{channel::ChannelTransport, proc::Proc};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proc = Proc::serve(ChannelTransport::Unix, "worker").await?;
//! println!("serving at {}", proc.proc_id());
//! proc.stop(std::time::Duration::from_secs(1)).await;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use crate::actor::{spawn_actor, Actor, ActorCell, ActorHandle, DrivenActor, Owner, WorkQueue};
use crate::error::SpawnError;
use crate::mailbox::Mailbox;

pub use crate::router::Proc;

/// Spawning, on top of the routing layer ([`Proc::client`] is in [`crate::client`]).
impl Proc {
    /// Spawns a root actor: the proc itself owns it, and its failures are collected by
    /// [`Proc::next_supervision_event`].
    ///
    /// # Errors
    ///
    /// [`SpawnError::Name`] for an invalid name; [`SpawnError::ProcStopped`] if the proc
    /// is stopped.
    pub fn spawn<A: Actor>(
        &self,
        name: &str,
        params: A::Params,
    ) -> Result<ActorHandle<A>, SpawnError> {
        spawn_actor::<A>(self, name, params, Owner::Proc)
    }

    /// Spawns a driven actor (see [`crate::actor::DrivenActor`]) owned by the proc
    /// itself: its failures are collected by [`Proc::next_supervision_event`].
    ///
    /// # Errors
    ///
    /// [`SpawnError::Name`] for an invalid name; [`SpawnError::ProcStopped`] if the proc
    /// is stopped.
    pub fn spawn_driven(&self, name: &str) -> Result<DrivenActor, SpawnError> {
        self.spawn_driven_owned(name, Owner::Proc)
    }

    pub(crate) fn spawn_driven_owned(
        &self,
        name: &str,
        owner: Owner,
    ) -> Result<DrivenActor, SpawnError> {
        let queue = Arc::new(WorkQueue::new());
        let (id, mailbox, ()) = self.register(name, |id| {
            (Mailbox::with_driven_queue(id, Arc::clone(&queue)), ())
        })?;
        let cell = ActorCell::register(self, id, mailbox, name, owner)?;
        Ok(DrivenActor::new(cell, queue, self.clone()))
    }
}
