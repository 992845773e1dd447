//! Clients: mailboxes for code that is not an actor.
//!
//! A [`Client`] lets `main`, a test, or a binding layer take part in messaging: it has
//! an actor id and a mailbox, opens ports, sends, calls, and spawns actors that it then
//! owns — but it has no message loop. What an actor would receive on its runtime ports
//! a client reads explicitly:
//!
//! - [`Client::next_undeliverable`]: messages it sent that came back (DEL-1);
//! - [`Client::next_supervision_event`]: failures of actors it spawned (SUP-1).
//!
//! Dropping the client closes its mailbox; messages still addressed to it are returned
//! to their senders.

use std::sync::Arc;

use tokio::sync::{mpsc, Mutex};

use crate::actor::{spawn_actor, Actor, ActorHandle, Owner};
use crate::context::SendContext;
use crate::error::SpawnError;
use crate::mailbox::Mailbox;
use crate::message::{Envelope, Undeliverable, SUPERVISION_PORT, UNDELIVERABLE_PORT};
use crate::router::Proc;
use crate::supervision::SupervisionEvent;

/// A mailbox without an actor: see the [module docs](self).
#[derive(Debug)]
pub struct Client {
    proc: Proc,
    mailbox: Arc<Mailbox>,
    undeliverable: Mutex<mpsc::UnboundedReceiver<Envelope>>,
    supervision: Mutex<mpsc::UnboundedReceiver<Envelope>>,
}

impl Client {
    pub(crate) fn new(proc: Proc, mailbox: Arc<Mailbox>) -> Self {
        let undeliverable = Mutex::new(mailbox.bind_port(UNDELIVERABLE_PORT));
        let supervision = Mutex::new(mailbox.bind_port(SUPERVISION_PORT));
        Self {
            proc,
            mailbox,
            undeliverable,
            supervision,
        }
    }

    /// Spawns an actor on this client's proc, owned by this client.
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
        spawn_actor::<A>(
            &self.proc,
            name,
            params,
            Owner::Mailbox(self.actor_id().clone()),
        )
    }

    /// Spawns a driven actor (see [`crate::actor::DrivenActor`]) owned by this client:
    /// its failures arrive at [`Client::next_supervision_event`].
    ///
    /// # Errors
    ///
    /// [`SpawnError::Name`] for an invalid name; [`SpawnError::ProcStopped`] if the proc
    /// is stopped.
    pub fn spawn_driven(&self, name: &str) -> Result<crate::actor::DrivenActor, SpawnError> {
        self.proc
            .spawn_driven_owned(name, Owner::Mailbox(self.actor_id().clone()))
    }

    /// The next message this client sent that could not be delivered. `None` once the
    /// client's mailbox is closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn next_undeliverable(&self) -> Option<Undeliverable> {
        let mut port = self.undeliverable.lock().await;
        loop {
            let envelope = port.recv().await?;
            match envelope.payload.decode() {
                Ok(u) => return Some(u),
                Err(e) => {
                    tracing::error!(client = %self.actor_id(), "corrupt undeliverable message: {e}")
                }
            }
        }
    }

    /// The next failure of an actor this client owns. `None` once the client's mailbox is
    /// closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn next_supervision_event(&self) -> Option<SupervisionEvent> {
        let mut port = self.supervision.lock().await;
        loop {
            let envelope = port.recv().await?;
            match envelope.payload.decode() {
                Ok(event) => return Some(event),
                Err(e) => {
                    tracing::error!(client = %self.actor_id(), "corrupt supervision event: {e}")
                }
            }
        }
    }
}

impl SendContext for Client {
    fn proc(&self) -> &Proc {
        &self.proc
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.mailbox.close("its client was dropped");
    }
}

/// Clients are made by the proc, on top of the actor layer.
impl Proc {
    /// A client of this proc, with an actor id of its own named `name`.
    ///
    /// # Errors
    ///
    /// [`SpawnError::Name`] for an invalid name; [`SpawnError::ProcStopped`] if the proc
    /// is stopped.
    pub fn client(&self, name: &str) -> Result<Client, SpawnError> {
        let (_, mailbox, ()) = self.register(name, |id| (Mailbox::without_work_queue(id), ()))?;
        Ok(Client::new(self.clone(), mailbox))
    }
}
