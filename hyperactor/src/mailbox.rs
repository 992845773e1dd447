//! Mailboxes: where an actor's messages arrive, and where its ports are opened.
//!
//! Every actor (and every [`crate::client::Client`]) owns one [`Mailbox`]. The proc
//! delivers each incoming [`Envelope`] to the mailbox of its destination actor, which
//! routes it by port number:
//!
//! - a port opened with [`Mailbox::open_port`] or [`Mailbox::open_once_port`] gets the
//!   envelope directly (its receiver decodes it);
//! - any other handler port (top bit set, see [`crate::message`]) goes to the actor's
//!   work queue, in arrival order, where the actor's loop handles one message at a time
//!   (ACT-1).
//!
//! Invariants:
//!
//! - MB-1 (per-sender FIFO): envelopes from one sender are pushed into the work queue
//!   in the order the proc delivers them; the queue never reorders.
//! - MB-2 (exactly once for once ports): a once port is removed from the table by the
//!   delivery that consumes it, under the mailbox lock, so a second message to it is
//!   returned as undeliverable.
//! - MB-3 (closed means returned): after `Mailbox::close` every delivery fails with the
//!   close reason, so the proc returns the message to its sender (DEL-1).

use crate::sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::actor::work_queue::{WorkQueue, MESSAGE_COST_OVERHEAD};
use crate::channel::backpressure::Congested;
use crate::id::{ActorId, PortId};
use crate::message::{Envelope, Undeliverable, HANDLER_PORT_BIT};

/// An item of an actor's work queue.
// Messages are the common case; boxing them to shrink the rare `Stop` would cost an
// allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Work {
    /// A message for one of the actor's handler ports.
    Message(Envelope),
    /// Stop after the messages queued before this one.
    Stop,
}

/// Where an actor's work goes: the queue of its runtime task, or the queue of a driven
/// actor, read by a thread outside the runtime (see [`crate::actor::DrivenActor`]).
#[derive(Debug)]
pub(crate) enum WorkSink {
    Task(mpsc::UnboundedSender<Work>),
    Driven(Arc<WorkQueue<Work>>),
}

impl WorkSink {
    fn send(&self, work: Work) -> Result<(), Work> {
        match self {
            WorkSink::Task(tx) => tx.send(work).map_err(|e| e.0),
            WorkSink::Driven(queue) => {
                let cost = match &work {
                    Work::Message(envelope) => envelope.payload.len() + MESSAGE_COST_OVERHEAD,
                    Work::Stop => 0,
                };
                if queue.push_costed(work, cost)? {
                    crate::channel::backpressure::defer(Arc::clone(queue) as Arc<dyn Congested>);
                }
                Ok(())
            }
        }
    }

    /// Ends the queue: the reader sees it end once it took what was queued.
    fn close(&self) {
        if let WorkSink::Driven(queue) = self {
            queue.close();
        }
        // A task's queue ends when this sender is dropped.
    }
}

/// A function that takes delivery of a direct port's messages (see
/// [`Mailbox::open_direct_port`]).
pub type DirectSink = Arc<dyn Fn(Envelope) + Send + Sync>;

/// Where an opened port's messages go.
pub(crate) enum PortSink {
    Stream(mpsc::UnboundedSender<Envelope>),
    Once(oneshot::Sender<Envelope>),
    Direct(DirectSink),
}

impl std::fmt::Debug for PortSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PortSink::Stream(_) => "Stream",
            PortSink::Once(_) => "Once",
            PortSink::Direct(_) => "Direct",
        })
    }
}

#[derive(Debug)]
struct MailboxState {
    work: Option<WorkSink>,
    ports: HashMap<u64, PortSink>,
    next_port: u64,
    closed: Option<String>,
}

/// The mailbox of one actor or client. Obtained from a context
/// ([`crate::context::SendContext::mailbox`]); it has no public constructor.
#[derive(Debug)]
pub struct Mailbox {
    actor_id: ActorId,
    state: Mutex<MailboxState>,
    /// Messages put in a runtime task's queue and not yet taken (a driven queue
    /// counts its own).
    task_queued: AtomicUsize,
}

impl Mailbox {
    /// A mailbox with a work queue (for an actor), returning the queue's receiver.
    pub(crate) fn with_work_queue(actor_id: ActorId) -> (Arc<Self>, mpsc::UnboundedReceiver<Work>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self::build(actor_id, Some(WorkSink::Task(tx)))),
            rx,
        )
    }

    /// A mailbox whose work goes to `queue` (for a driven actor).
    pub(crate) fn with_driven_queue(actor_id: ActorId, queue: Arc<WorkQueue<Work>>) -> Arc<Self> {
        Arc::new(Self::build(actor_id, Some(WorkSink::Driven(queue))))
    }

    /// A mailbox without a work queue (for a client): only opened ports receive.
    pub(crate) fn without_work_queue(actor_id: ActorId) -> Arc<Self> {
        Arc::new(Self::build(actor_id, None))
    }

    fn build(actor_id: ActorId, work: Option<WorkSink>) -> Self {
        Self {
            actor_id,
            task_queued: AtomicUsize::new(0),
            state: Mutex::new(MailboxState {
                work,
                ports: HashMap::new(),
                next_port: 1,
                closed: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        // A panic while holding this lock cannot leave the table half-updated (every
        // critical section is a single map operation), so poisoning is ignored.
        self.state.lock()
    }

    /// The id of the actor that owns this mailbox.
    pub fn actor_id(&self) -> &ActorId {
        &self.actor_id
    }

    /// Binds a streaming receiver at a fixed port number (used by clients for the
    /// runtime's reserved ports).
    pub(crate) fn bind_port(self: &Arc<Self>, index: u64) -> mpsc::UnboundedReceiver<Envelope> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.insert(Some(index), PortSink::Stream(tx));
        rx
    }

    pub(crate) fn insert(&self, index: Option<u64>, sink: PortSink) -> PortId {
        let mut state = self.lock();
        let index = index.unwrap_or_else(|| {
            let n = state.next_port;
            state.next_port += 1;
            debug_assert!(n & HANDLER_PORT_BIT == 0);
            n
        });
        if state.closed.is_none() {
            state.ports.insert(index, sink);
        }
        // On a closed mailbox the sink is dropped at once: the receiver reports the port
        // closed, which is what a caller of a stopped actor must see.
        self.actor_id.port_id(index)
    }

    /// Removes an opened port (its receiver was dropped).
    pub(crate) fn remove_port(&self, index: u64) {
        self.lock().ports.remove(&index);
    }

    /// Delivers an envelope addressed to this mailbox's actor.
    ///
    /// # Errors
    ///
    /// Returns the envelope, with the reason, when it cannot be delivered: the mailbox is
    /// closed, the port is not open, or the actor's queue is gone.
    pub(crate) fn deliver(&self, envelope: Envelope) -> Result<(), Box<Undeliverable>> {
        let index = envelope.header.dest.index();
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            let reason = format!("actor {} is not running: {reason}", self.actor_id);
            return Err(undeliverable(envelope, reason));
        }
        match state.ports.get(&index) {
            Some(PortSink::Stream(tx)) => match tx.send(envelope) {
                Ok(()) => Ok(()),
                Err(mpsc::error::SendError(envelope)) => {
                    state.ports.remove(&index);
                    Err(closed_port(envelope))
                }
            },
            Some(PortSink::Direct(sink)) => {
                // Called without the mailbox locked: a sink may deliver to this very
                // mailbox (an agent returning a message to itself, say).
                let sink = Arc::clone(sink);
                drop(state);
                sink(envelope);
                Ok(())
            }
            Some(PortSink::Once(_)) => {
                let Some(PortSink::Once(tx)) = state.ports.remove(&index) else {
                    unreachable!("invariant: the entry was just seen to be a once port");
                };
                tx.send(envelope).map_err(closed_port)
            }
            None if index & HANDLER_PORT_BIT != 0 => match &state.work {
                Some(work) => work
                    .send(Work::Message(envelope))
                    .map(|()| {
                        if matches!(work, WorkSink::Task(_)) {
                            self.task_queued.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .map_err(|e| match e {
                        Work::Message(envelope) => {
                            let reason = format!("actor {} is not running", self.actor_id);
                            undeliverable(envelope, reason)
                        }
                        Work::Stop => unreachable!("invariant: a message was sent"),
                    }),
                None => {
                    let reason = format!("{} has no handler for port {index}", self.actor_id);
                    Err(undeliverable(envelope, reason))
                }
            },
            None => {
                let reason = format!("port {} is not open", envelope.header.dest);
                Err(undeliverable(envelope, reason))
            }
        }
    }

    /// How many messages wait in the actor's queue.
    pub fn queued(&self) -> usize {
        match &self.lock().work {
            Some(WorkSink::Driven(queue)) => queue.len(),
            Some(WorkSink::Task(_)) => self.task_queued.load(Ordering::Relaxed),
            None => 0,
        }
    }

    /// The actor's task took a message from its queue.
    pub(crate) fn dequeued(&self) {
        let _ = self
            .task_queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Asks the actor loop to stop after the messages already queued.
    ///
    /// Returns false when the loop has already ended.
    pub(crate) fn request_stop(&self) -> bool {
        match &self.lock().work {
            Some(work) => work.send(Work::Stop).is_ok(),
            None => false,
        }
    }

    /// Closes the mailbox: every opened port's receiver sees the port closed, and every
    /// later delivery fails with `reason` (MB-3).
    pub(crate) fn close(&self, reason: &str) {
        let mut state = self.lock();
        if state.closed.is_none() {
            state.closed = Some(reason.to_string());
        }
        state.ports.clear();
        if let Some(work) = state.work.take() {
            work.close();
        }
    }

    /// The close reason, if closed.
    pub fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }
}

/// Keeps a port opened with [`Mailbox::open_direct_port`] open; dropping it closes the
/// port.
#[must_use = "dropping the handle closes the port"]
#[derive(Debug)]
pub struct DirectPort {
    pub(crate) port: PortId,
    pub(crate) mailbox: Arc<Mailbox>,
}

impl DirectPort {
    /// The port's id.
    pub fn port_id(&self) -> &PortId {
        &self.port
    }
}

impl Drop for DirectPort {
    fn drop(&mut self) {
        self.mailbox.remove_port(self.port.index());
    }
}

fn undeliverable(envelope: Envelope, reason: String) -> Box<Undeliverable> {
    Box::new(Undeliverable::new(envelope, reason))
}

fn closed_port(envelope: Envelope) -> Box<Undeliverable> {
    let reason = format!("port {} is closed", envelope.header.dest);
    undeliverable(envelope, reason)
}
