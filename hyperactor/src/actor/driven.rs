//! Driven actors: actors whose messages are handled by a thread the runtime does not
//! own — the thread of an actor written in another language (Python), for example.
//!
//! A [`DrivenActor`] has everything a runtime actor has — an id, a mailbox, a status
//! watched by its owner, supervision of its failure — except the task that runs it: its
//! *driver* takes the next message with [`DrivenActor::next_blocking`] (or
//! [`DrivenActor::next`]), handles it, and takes the next. The runtime keeps the
//! bookkeeping:
//!
//! - ACT-1 holds as long as one driver reads the queue: messages come out one at a time,
//!   in delivery order (MB-1), and the actor counts as processing from the moment a
//!   message is taken until the driver asks for the next one (or calls
//!   [`DrivenActor::idle`]).
//! - The status follows the driver's calls: `Initializing` from the spawn until
//!   [`DrivenActor::started`], then `Idle`/`Processing`, then `Stopped` after
//!   [`DrivenActor::stop`] or `Failed` after [`DrivenActor::fail`].
//! - ACT-3 and DEL-1: a driven actor that fails reports one [`SupervisionEvent`] to its
//!   owner (SUP-1); when it ends, however it ends, the messages still queued go back to
//!   their senders.
//! - A stop request ([`ActorHandle::stop`](crate::actor::ActorHandle::stop) or a proc
//!   stop) reaches the driver as [`DrivenWork::Stop`] after the messages queued before
//!   it; the driver runs its own stop procedure and then calls [`DrivenActor::stop`].
//!
//! ```
//! use hyperactor::actor::{DrivenWork, Next};
//! use hyperactor::{ChannelTransport, Proc, PortRef, SendContext};
//! use hyperactor::message::Serialized;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proc = Proc::serve(ChannelTransport::Local, "doc").await?;
//! let client = proc.client("main")?;
//! let actor = client.spawn_driven("worker")?;
//! actor.started();
//! // Anyone can send to one of its handler ports (the top bit set).
//! let port = PortRef::<String>::attest(actor.actor_id().port_id(1 << 63 | 0x1234));
//! port.send(&client, "hello".to_string())?;
//! // Its driver (usually a thread of its own) takes the message.
//! let Next::Work(DrivenWork::Message(envelope)) = actor.next().await else { panic!() };
//! assert_eq!(envelope.payload.decode::<String>()?, "hello");
//! actor.stop();
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Instant;

use super::work_queue::{Popped, WorkQueue};
use super::ActorCell;
use crate::id::ActorId;
use crate::mailbox::Work;
use crate::message::Envelope;
use crate::router::Proc;
use crate::supervision::{ActorStatus, SupervisionEvent};

/// What a driver takes from its actor's queue.
#[derive(Debug)]
// Messages are the common case; boxing them to shrink the rare `Stop` would cost an
// allocation per message.
#[allow(clippy::large_enum_variant)]
pub enum DrivenWork {
    /// A message for one of the actor's handler ports (including the runtime's
    /// supervision and undeliverable ports).
    Message(Envelope),
    /// A stop request: handle it after everything before it, then call
    /// [`DrivenActor::stop`].
    Stop,
}

/// The outcome of asking for the next item.
#[derive(Debug)]
// As for `DrivenWork`: boxing the common case would cost an allocation per message.
#[allow(clippy::large_enum_variant)]
pub enum Next {
    /// The next item; the actor now counts as processing.
    Work(DrivenWork),
    /// Nothing came before the deadline (or nothing was queued, for
    /// [`DrivenActor::try_next`]).
    Timeout,
    /// The actor has ended (stopped, failed or aborted): nothing more will come.
    Ended,
}

/// A driven actor: see the `actor::driven` module's docs. Clones share the actor.
#[derive(Clone)]
pub struct DrivenActor {
    cell: Arc<ActorCell>,
    queue: Arc<WorkQueue<Work>>,
    proc: Proc,
}

impl std::fmt::Debug for DrivenActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenActor")
            .field("id", &self.cell.id)
            .field("status", &self.cell.status())
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl crate::context::SendContext for DrivenActor {
    fn proc(&self) -> &Proc {
        &self.proc
    }

    fn mailbox(&self) -> &Arc<crate::mailbox::Mailbox> {
        &self.cell.mailbox
    }
}

impl DrivenActor {
    pub(crate) fn new(cell: Arc<ActorCell>, queue: Arc<WorkQueue<Work>>, proc: Proc) -> Self {
        cell.set_initializing();
        Self { cell, queue, proc }
    }

    /// The actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.cell.id
    }

    /// A handle to this actor that does not drive it (to watch or stop it).
    pub fn erase(&self) -> super::AnyActorHandle {
        super::AnyActorHandle {
            cell: Arc::clone(&self.cell),
        }
    }

    /// The actor's current status.
    pub fn status(&self) -> ActorStatus {
        self.cell.status()
    }

    /// Waits until the actor has ended and returns its final status.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait(&self) -> ActorStatus {
        self.cell.wait_terminal().await
    }

    /// The driver finished initializing the actor: it is now idle, waiting for messages.
    pub fn started(&self) {
        if !self.cell.status().is_terminal() {
            self.cell.set_running();
        }
    }

    fn taken(&self, popped: Popped<Work>) -> Next {
        if self.cell.status().is_terminal() {
            // Ended behind the driver's back (aborted): what is left goes back.
            let mut leftovers = self.queue.drain();
            if let Popped::Item(work) = popped {
                leftovers.insert(0, work);
            }
            self.cell.bounce_all(&self.proc, leftovers);
            return Next::Ended;
        }
        match popped {
            Popped::Item(Work::Message(envelope)) => {
                self.cell.set_processing(true);
                Next::Work(DrivenWork::Message(envelope))
            }
            Popped::Item(Work::Stop) => {
                self.cell.set_processing(true);
                Next::Work(DrivenWork::Stop)
            }
            Popped::Timeout => Next::Timeout,
            Popped::Closed => Next::Ended,
        }
    }

    /// The next item if one is queued ([`Next::Timeout`] if none).
    pub fn try_next(&self) -> Next {
        self.cell.set_processing(false);
        self.cell.stats.end();
        self.taken(self.queue.try_pop())
    }

    /// Blocks the calling thread for the next item, until `deadline` (`None`: no
    /// deadline). Call it from the driver's own thread, never from a runtime thread.
    pub fn next_blocking(&self, deadline: Option<Instant>) -> Next {
        self.cell.set_processing(false);
        self.cell.stats.end();
        self.taken(self.queue.pop_blocking(deadline))
    }

    /// Waits for the next item.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an item is taken only when this returns.
    pub async fn next(&self) -> Next {
        self.cell.set_processing(false);
        self.cell.stats.end();
        match self.queue.pop().await {
            Some(work) => self.taken(Popped::Item(work)),
            None => Next::Ended,
        }
    }

    /// The driver is done with the item it took (it counts as idle until the next one).
    pub fn idle(&self) {
        self.cell.set_processing(false);
        self.cell.stats.end();
    }

    /// The driver starts handling a message of endpoint `label` (counted in the actor's
    /// stats until the driver asks for the next item, calls [`DrivenActor::idle`], or the
    /// actor ends).
    pub fn begin(&self, label: &str) {
        self.cell.stats.begin(label);
    }

    /// The message being handled failed (its endpoint raised): counted as an error when
    /// it ends.
    pub fn note_error(&self) {
        self.cell.stats.note_error();
    }

    /// A copy of this actor's counters.
    pub fn stats(&self) -> super::ActorStatsSnapshot {
        self.cell.stats_snapshot()
    }

    /// How many items wait in the queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Asks the driver to stop after the messages queued so far ([`DrivenWork::Stop`]).
    /// False if the actor has ended.
    pub fn request_stop(&self) -> bool {
        self.cell.mailbox.request_stop()
    }

    /// Ends the actor gracefully: its status becomes `Stopped` and the messages still
    /// queued go back to their senders. False if it had ended already.
    pub fn stop(&self) -> bool {
        self.cell.stats.end();
        let leftovers = self.queue.drain();
        self.cell.finish(&self.proc, Ok(()), leftovers)
    }

    /// Fails the actor (ACT-3): its status becomes `Failed(reason)`, its owner gets one
    /// [`SupervisionEvent`] (with `caused_by` when it failed because it did not handle a
    /// failure of its own), and the messages still queued go back to their senders.
    /// False if it had ended already (only the first end counts).
    pub fn fail(&self, reason: impl Into<String>, caused_by: Option<SupervisionEvent>) -> bool {
        self.cell.stats.note_error();
        self.cell.stats.end();
        let leftovers = self.queue.drain();
        self.cell.finish(
            &self.proc,
            Err((reason.into(), caused_by.map(Box::new))),
            leftovers,
        )
    }
}
