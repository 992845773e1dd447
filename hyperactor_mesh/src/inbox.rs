//! The inbox of a process hosting actors written in another language (Python): one port
//! whose messages are sorted by a key into per-key queues, as they arrive.
//!
//! Each message's first part is its key, a little-endian `u64`; the other parts are the
//! message. A key names one receiver in the process: an actor, or the reply slot of one
//! pending call. The demultiplexing happens on the delivering task (a direct port, see
//! [`hyperactor::mailbox::Mailbox::open_direct_port`]), so a message reaches its queue
//! without any hop through another task.
//!
//! Keys come in two kinds:
//!
//! - **Actor keys** (high bit clear) are chosen by whoever spawns the actor, before the
//!   actor exists: a queue is created by the first message for its key, and messages
//!   wait there until the actor starts draining them. Everything one sender sends to the
//!   key keeps its order (ORD-1), spawn request included.
//! - **Reply keys** (high bit set, see [`REPLY_KEY_BIT`]) are handed out by
//!   [`Inbox::reply_queue`]. A reply for a key that is no longer open (its caller gave up
//!   on it) is dropped: nobody is left to read it.
//!
//! Queues can be read by blocking a thread ([`Queue::pop_blocking`]), by polling
//! ([`Queue::try_pop`]) or by awaiting ([`Queue::pop`]).
//!
//! ```
//! use bytes::Bytes;
//! use hyperactor::message::Serialized;
//! use hyperactor::{ChannelTransport, Proc};
//! use hyperactor_mesh::inbox::{Inbox, key_part};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proc = Proc::serve(ChannelTransport::Local, "doc").await?;
//! let client = proc.client("client")?;
//! let inbox = Inbox::open(&client);
//! let actor = inbox.queue(7);
//! inbox
//!     .port()
//!     .send_serialized(&client, Serialized::from_parts(vec![key_part(7), Bytes::from("hi")]));
//! assert_eq!(actor.pop().await?, vec![Bytes::from("hi")]);
//! # Ok(())
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use hyperactor::mailbox::DirectPort;
use hyperactor::message::Envelope;
use hyperactor::{ActorId, PortId, PortRef, Proc, SendContext};
use tokio::sync::Notify;

mod cast;
pub use cast::{
    chunks, reply_items, reply_parts, subtree_ends, CastReply, CastTarget, Route, GAP_GRACE,
};

/// The bit set in every reply key.
pub const REPLY_KEY_BIT: u64 = 1 << 63;

/// The key of cast messages: handled by the inbox itself (see [`Inbox::cast`]).
pub const CAST_KEY: u64 = u64::MAX;

/// The message type of an inbox's port, nominally: messages are sent already serialized
/// (a key part, then the message's parts) and never decoded as a whole.
pub type InboxMessage = Vec<Bytes>;

/// The first part of a message for `key`.
pub fn key_part(key: u64) -> Bytes {
    Bytes::copy_from_slice(&key.to_le_bytes())
}

/// A queue has been closed ([`Queue::close`], or its inbox is gone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue {key:#x} of inbox {port} is closed")]
pub struct QueueClosed {
    /// The inbox's port.
    pub port: PortId,
    /// The queue's key.
    pub key: u64,
}

#[derive(Default)]
struct QueueState {
    items: VecDeque<Vec<Bytes>>,
    closed: bool,
}

/// The messages for one key, in arrival order. See the [module docs](self).
pub struct Queue {
    key: u64,
    port: PortId,
    state: Mutex<QueueState>,
    ready: Condvar,
    notify: Notify,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({}#{:#x})", self.port, self.key)
    }
}

impl Queue {
    fn new(port: PortId, key: u64) -> Self {
        Self {
            key,
            port,
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Every critical section is a single push, pop or flag update: nothing is left
        // half-done by a panic, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This queue's key.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The inbox port that messages for this queue are sent to.
    pub fn port(&self) -> &PortId {
        &self.port
    }

    fn push(&self, parts: Vec<Bytes>) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.items.push_back(parts);
        drop(state);
        self.ready.notify_one();
        self.notify.notify_one();
    }

    fn closed(&self) -> QueueClosed {
        QueueClosed {
            port: self.port.clone(),
            key: self.key,
        }
    }

    /// The next message if one is queued.
    ///
    /// # Errors
    ///
    /// [`QueueClosed`] once the queue is closed and empty.
    pub fn try_pop(&self) -> Result<Option<Vec<Bytes>>, QueueClosed> {
        let mut state = self.lock();
        match state.items.pop_front() {
            Some(parts) => Ok(Some(parts)),
            None if state.closed => Err(self.closed()),
            None => Ok(None),
        }
    }

    /// Blocks the calling thread until a message arrives or `deadline` passes (`None`:
    /// no deadline); `Ok(None)` on timeout. Not for runtime threads.
    ///
    /// # Errors
    ///
    /// [`QueueClosed`] once the queue is closed and empty.
    pub fn pop_blocking(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<Vec<Bytes>>, QueueClosed> {
        let mut state = self.lock();
        loop {
            if let Some(parts) = state.items.pop_front() {
                return Ok(Some(parts));
            }
            if state.closed {
                return Err(self.closed());
            }
            state = match deadline {
                None => self.ready.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if deadline <= now {
                        return Ok(None);
                    }
                    self.ready
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// Waits for the next message.
    ///
    /// # Errors
    ///
    /// [`QueueClosed`] once the queue is closed and empty.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken only when this returns.
    pub async fn pop(&self) -> Result<Vec<Bytes>, QueueClosed> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a push in between is not missed.
            notified.as_mut().enable();
            if let Some(parts) = self.try_pop()? {
                return Ok(parts);
            }
            notified.await;
        }
    }

    /// Closes the queue: messages already queued can still be taken; later ones are
    /// dropped; waiters see [`QueueClosed`] once it is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
        self.notify.notify_waiters();
        // A waiter between `enable` and `await` holds no permit from notify_waiters;
        // one stored permit covers it.
        self.notify.notify_one();
    }

    /// Whether the queue was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// What a key maps to.
enum Slot {
    /// Its own queue (the key part is stripped on arrival).
    Queue(Arc<Queue>),
    /// Retired into another key's queue (see [`Inbox::retire`]); messages keep their key
    /// part, so the reader of that queue knows whom they were for.
    Retired(Arc<Queue>),
    /// A reply key collecting a cast's replies on the way up (see [`Inbox::cast`]).
    Reduce(Arc<cast::Reducer>),
}

impl Slot {
    fn queue(&self) -> Option<&Arc<Queue>> {
        match self {
            Slot::Queue(queue) | Slot::Retired(queue) => Some(queue),
            Slot::Reduce(_) => None,
        }
    }
}

struct Shared {
    port: PortId,
    /// `port`, printed.
    port_text: Bytes,
    queues: Mutex<HashMap<u64, Slot>>,
    next_reply: AtomicU64,
    /// The proc and actor that forwarded casts and reduced replies are sent from.
    proc: Proc,
    owner: ActorId,
    /// This inbox's id as a cast sender (for ORD-1 sequencing at the receivers).
    sender_id: u64,
    cast: Mutex<cast::CastState>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(self: &Arc<Self>, envelope: Envelope) {
        let mut parts = envelope.payload.into_parts();
        let key = match parts.first().and_then(|k| <[u8; 8]>::try_from(&k[..]).ok()) {
            Some(key) => u64::from_le_bytes(key),
            None => {
                tracing::warn!(
                    inbox = %self.port,
                    sender = %envelope.header.sender,
                    "dropping a message without a key part"
                );
                return;
            }
        };
        if key == CAST_KEY {
            return self.deliver_cast(parts);
        }
        parts.remove(0);
        if key & REPLY_KEY_BIT != 0 {
            let reducer = match self.lock().get(&key) {
                Some(Slot::Queue(queue)) => return queue.push(parts),
                Some(Slot::Reduce(reducer)) => Arc::clone(reducer),
                // A reply whose caller is gone: nobody will read it.
                _ => return,
            };
            return self.reduce(key, &reducer, parts);
        }
        self.push(key, parts);
    }

    /// Queues `parts` (key part stripped) for actor key `key`.
    fn push(&self, key: u64, mut parts: Vec<Bytes>) {
        let queue = {
            let mut queues = self.lock();
            match queues.get(&key) {
                Some(Slot::Queue(queue)) => Arc::clone(queue),
                // A retired key: the message goes to the target, key part included.
                Some(Slot::Retired(target)) => {
                    parts.insert(0, key_part(key));
                    Arc::clone(target)
                }
                _ => {
                    let queue = Arc::new(Queue::new(self.port.clone(), key));
                    queues.insert(key, Slot::Queue(Arc::clone(&queue)));
                    queue
                }
            }
        };
        queue.push(parts);
    }
}

/// A keyed inbox: see the [module docs](self). Dropping it closes its port and every
/// queue.
pub struct Inbox {
    shared: Arc<Shared>,
    _port: DirectPort,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Inbox({})", self.shared.port)
    }
}

impl Inbox {
    /// Opens an inbox as a new port of `cx`'s mailbox.
    pub fn open(cx: &(impl SendContext + ?Sized)) -> Self {
        // The port id is known only once the port is open, and the sink needs the shared
        // state: open with a sink that forwards to a cell filled right after.
        let cell: Arc<std::sync::OnceLock<Arc<Shared>>> = Arc::new(std::sync::OnceLock::new());
        let sink_cell = Arc::clone(&cell);
        let (port, handle) =
            cx.mailbox()
                .open_direct_port::<InboxMessage>(Arc::new(move |envelope| {
                    if let Some(shared) = sink_cell.get() {
                        shared.deliver(envelope);
                    }
                }));
        let shared = Arc::new(Shared {
            port: port.port_id().clone(),
            port_text: Bytes::from(port.port_id().to_string()),
            queues: Mutex::new(HashMap::new()),
            next_reply: AtomicU64::new(0),
            proc: cx.proc().clone(),
            owner: cx.actor_id().clone(),
            sender_id: random_id(),
            cast: Mutex::new(cast::CastState::default()),
        });
        // Nobody can know the port before this returns, so no message is missed.
        let _ = cell.set(Arc::clone(&shared));
        Self {
            shared,
            _port: handle,
        }
    }

    /// The port that messages for this inbox's queues are sent to.
    pub fn port(&self) -> PortRef<InboxMessage> {
        PortRef::attest(self.shared.port.clone())
    }

    /// The queue of actor key `key`, created if no message for it arrived yet.
    ///
    /// # Panics
    ///
    /// If `key` has [`REPLY_KEY_BIT`] set: reply keys come from [`Inbox::reply_queue`].
    pub fn queue(&self, key: u64) -> Arc<Queue> {
        assert!(
            key & REPLY_KEY_BIT == 0,
            "actor keys must leave the reply bit clear, got {key:#x}"
        );
        let mut queues = self.shared.lock();
        match queues.get(&key) {
            Some(Slot::Queue(queue)) => Arc::clone(queue),
            // Retired (or never seen): a fresh queue takes the key back.
            _ => {
                let queue = Arc::new(Queue::new(self.shared.port.clone(), key));
                queues.insert(key, Slot::Queue(Arc::clone(&queue)));
                queue
            }
        }
    }

    /// Retires actor key `key` into the queue of actor key `into`: the messages queued
    /// for `key`, then every later one, go to `into`'s queue with their key part kept
    /// in front (so its reader, e.g. one answering for many stopped actors, knows whom
    /// each was for). `key`'s own queue is closed. Order is kept.
    ///
    /// # Panics
    ///
    /// If either key has [`REPLY_KEY_BIT`] set, or they are equal.
    pub fn retire(&self, key: u64, into: u64) {
        assert!(
            (key | into) & REPLY_KEY_BIT == 0 && key != into,
            "retire({key:#x}, {into:#x}): two distinct actor keys expected"
        );
        let target = self.queue(into);
        let mut queues = self.shared.lock();
        if let Some(Slot::Queue(old)) = queues.insert(key, Slot::Retired(Arc::clone(&target))) {
            let mut state = old.lock();
            for mut parts in state.items.drain(..) {
                parts.insert(0, key_part(key));
                target.push(parts);
            }
            drop(state);
            old.close();
        }
    }

    /// A queue under a fresh reply key, for the replies of one call. Remove it with
    /// [`Inbox::remove`] when done; later replies to it are then dropped.
    pub fn reply_queue(&self) -> Arc<Queue> {
        let key = self.shared.next_reply.fetch_add(1, Ordering::Relaxed) | REPLY_KEY_BIT;
        let queue = Arc::new(Queue::new(self.shared.port.clone(), key));
        self.shared
            .lock()
            .insert(key, Slot::Queue(Arc::clone(&queue)));
        queue
    }

    /// Closes and forgets the queue of `key`. A later message for an actor key creates
    /// a new queue; one for a reply key is dropped.
    pub fn remove(&self, key: u64) {
        if let Some(Slot::Queue(queue)) = self.shared.lock().remove(&key) {
            queue.close();
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        for (_, slot) in self.shared.lock().drain() {
            if let Some(queue) = slot.queue() {
                queue.close();
            }
        }
    }
}

/// A random id (std's hasher keys are random per process; mixed with the pid and the
/// time, so that two inboxes of one process differ too).
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}
