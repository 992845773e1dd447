//! The proc as the layers below the actors see it: its id, its routing table of
//! mailboxes, its links to other procs, and the actors it owns (through the [`Root`]
//! hook, which the actor layer fills in).
//!
//! Layers: mailboxes and channels below this module; ports and contexts, then actors,
//! above it; [`crate::proc`] adds spawning on top. The routing invariants (ORD-1, DEL-1)
//! are described in [`crate::proc`].

use crate::sync::{Mutex, RwLock};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use crate::actor::stats::ActorStatsSnapshot;
use crate::channel::log_limit::LogLimit;
use crate::channel::{
    self, ChannelAddr, ChannelError, ChannelServer, ChannelTransport, ChannelTx, Frame,
};
use crate::error::{ProcError, SpawnError};
use crate::id::{validate_name, ActorId, ProcId};
use crate::mailbox::{Mailbox, Work};
use crate::message::{Envelope, EnvelopeHeader, Serialized, Undeliverable};
use crate::supervision::SupervisionEvent;

/// An actor owned by the proc itself (a root of its supervision tree), as the proc
/// sees it. The actor layer implements it; the proc stops its roots and reads their
/// counters through it without naming the actor types.
pub(crate) trait Root: Send + Sync {
    /// Whether the actor has ended (stopped or failed).
    fn is_terminal(&self) -> bool;

    /// Stops the actor (its children first), waiting up to `timeout`.
    fn stop_and_wait(&self, timeout: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// Appends the counters of the actor and of every actor below it to `out`.
    fn collect_stats(&self, out: &mut Vec<ActorStatsSnapshot>);
}

/// A handle to a proc. Cheap to clone; all clones share the proc.
#[derive(Clone)]
pub struct Proc {
    inner: Arc<ProcInner>,
}

struct ProcInner {
    id: ProcId,
    runtime: tokio::runtime::Handle,
    // Looked up on every message: hashed with FxHash, not SipHash (keys are ids
    // chosen by this process and its peers, not by untrusted input).
    actors: RwLock<FxHashMap<ActorId, Arc<Mailbox>>>,
    names: Mutex<HashMap<String, u64>>,
    /// The actors the proc itself owns (and the clients' children), as the actor layer
    /// registers them.
    roots: Mutex<Vec<Arc<dyn Root>>>,
    links: Mutex<FxHashMap<ChannelAddr, ChannelTx>>,
    supervision_tx: mpsc::UnboundedSender<SupervisionEvent>,
    supervision_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<SupervisionEvent>>,
    stopped: AtomicBool,
    /// The proc's endpoint; dropping it stops receiving.
    server: Mutex<Option<ChannelServer>>,
}

impl Proc {
    /// Starts a proc listening on a fresh address of `transport`. Its uid is `name`
    /// followed by a unique suffix.
    ///
    /// # Errors
    ///
    /// [`ProcError::Id`] for an invalid name; [`ProcError::Channel`] if the address cannot
    /// be bound.
    pub async fn serve(transport: ChannelTransport, name: &str) -> Result<Self, ProcError> {
        Self::serve_at(&ChannelAddr::any(transport), name).await
    }

    /// Starts a proc listening on `addr` (see [`ChannelAddr::any`] for fresh addresses).
    ///
    /// # Errors
    ///
    /// As [`Proc::serve`].
    pub async fn serve_at(addr: &ChannelAddr, name: &str) -> Result<Self, ProcError> {
        validate_name(name)?;
        let listen = channel::Listen::Addr(addr.clone());
        Self::serve_inner(&listen, None, |addr| ProcId::unique(name, addr)).await
    }

    /// Starts a proc listening where `bind` says (an address, or an inherited listening
    /// socket) whose id is exactly `uid` at the address peers should dial: `advertise`
    /// (its TCP port 0 replaced by the bound port), or the one [`channel::advertised`]
    /// derives from the bound address (for a TCP proc bound to every interface, this
    /// machine's primary IP, never a loopback address). A well-known uid lets peers
    /// that know only the address (a worker's) compute the proc id.
    ///
    /// # Errors
    ///
    /// As [`Proc::serve`]; [`channel::ChannelError::InheritedFd`]
    /// for an inherited descriptor that is not a listening TCP socket.
    pub async fn serve_as(
        bind: &channel::Listen,
        advertise: Option<&ChannelAddr>,
        uid: &str,
    ) -> Result<Self, ProcError> {
        validate_name(uid)?;
        Self::serve_inner(bind, advertise, |addr| ProcId::new(uid, addr)).await
    }

    async fn serve_inner(
        listen: &channel::Listen,
        advertise: Option<&ChannelAddr>,
        make_id: impl FnOnce(ChannelAddr) -> Result<ProcId, crate::error::IdError>,
    ) -> Result<Self, ProcError> {
        // Frames are delivered by the connection tasks themselves (no router
        // hop); until the proc exists they are refused, so they go back to
        // their senders.
        let slot: Arc<std::sync::OnceLock<Weak<ProcInner>>> = Arc::default();
        let deliver_to = Arc::clone(&slot);
        // Peers may send anything: the log lines about frames dropped here are
        // rate-limited process-wide, one per second per kind.
        static NO_PROC: LogLimit = LogLimit::per_second();
        static CORRUPT: LogLimit = LogLimit::per_second();
        let deliver: channel::DeliverFn = Arc::new(move |frame: Frame| {
            let Some(inner) = deliver_to.get().and_then(Weak::upgrade) else {
                if let Some(suppressed) = NO_PROC.check() {
                    tracing::error!(
                        suppressed,
                        "dropping a frame that arrived while its proc starts or stops"
                    );
                }
                return;
            };
            match Envelope::from_frame(frame) {
                Ok(envelope) => Proc { inner }.deliver_local(envelope),
                Err(e) => {
                    if let Some(suppressed) = CORRUPT.check() {
                        tracing::warn!(
                            proc = %inner.id,
                            suppressed,
                            "dropping a frame whose envelope header does not decode: {e}"
                        );
                    }
                }
            }
        });
        let server = channel::serve_listen_with(listen, deliver).await?;
        let id = make_id(channel::advertised(server.addr(), advertise))?;
        let (supervision_tx, supervision_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(ProcInner {
            id,
            runtime: tokio::runtime::Handle::current(),
            actors: RwLock::new(FxHashMap::default()),
            names: Mutex::new(HashMap::new()),
            roots: Mutex::new(Vec::new()),
            links: Mutex::new(FxHashMap::default()),
            supervision_tx,
            supervision_rx: tokio::sync::Mutex::new(supervision_rx),
            stopped: AtomicBool::new(false),
            server: Mutex::new(Some(server)),
        });
        let _ = slot.set(Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// This proc's id (its address included).
    pub fn proc_id(&self) -> &ProcId {
        &self.inner.id
    }

    /// The next failure of an actor owned by the proc itself.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn next_supervision_event(&self) -> Option<SupervisionEvent> {
        self.inner.supervision_rx.lock().await.recv().await
    }

    /// Routes `envelope` to its destination without waiting (see the module docs).
    /// Failures come back to the sender (DEL-1).
    pub fn post(&self, envelope: Envelope) {
        if let Some((link, frame)) = self.outbound(envelope) {
            if let Err(e) = link.post(frame) {
                self.bounce_frame(e.frame, &e.error);
            }
        }
    }

    /// Routes `envelope` like [`Proc::post`], but waits while the link to a remote
    /// destination has too many bytes outstanding (flow control for bulk senders).
    ///
    /// # Cancel safety
    ///
    /// Cancelling may drop the message before it was queued; it is then neither
    /// delivered nor returned.
    pub async fn send(&self, envelope: Envelope) {
        if let Some((link, frame)) = self.outbound(envelope) {
            if let Err(e) = link.send(frame).await {
                self.bounce_frame(e.frame, &e.error);
            }
        }
    }

    /// Delivers `envelope` if it is for this proc; otherwise returns the link to
    /// its destination and the frame to put on it.
    fn outbound(&self, envelope: Envelope) -> Option<(ChannelTx, Frame)> {
        let dest = envelope.header.dest.actor().proc_id();
        if dest == &self.inner.id {
            self.deliver_local(envelope);
            return None;
        }
        let link = self.link(dest.addr());
        match envelope.into_frame() {
            Ok(frame) => Some((link, frame)),
            Err(e) => {
                tracing::error!(proc = %self.inner.id, "cannot frame a message: {e}");
                None
            }
        }
    }

    /// Stops every actor of this proc (each owner stops its children first), waiting up
    /// to `timeout` for each, then stops routing. Later spawns fail.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: actors already asked to stop go on stopping.
    pub async fn stop(&self, timeout: Duration) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let roots: Vec<_> = self.inner.roots.lock().drain(..).collect();
        futures::future::join_all(roots.iter().map(|root| root.stop_and_wait(timeout))).await;
        self.inner.server.lock().take();
        self.inner.links.lock().clear();
    }

    /// Whether [`Proc::stop`] was called: the proc takes no new actors.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// The counters of every actor of this proc (runtime and driven, children included;
    /// clients are not actors), with its status and queue length.
    pub fn actor_stats(&self) -> Vec<ActorStatsSnapshot> {
        let roots: Vec<_> = self.inner.roots.lock().clone();
        let mut stats = Vec::new();
        for root in &roots {
            root.collect_stats(&mut stats);
        }
        stats
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    pub(crate) fn add_root(&self, root: Arc<dyn Root>) {
        let mut roots = self.inner.roots.lock();
        roots.retain(|r| !r.is_terminal());
        roots.push(root);
    }

    /// Registers a new mailbox named `name`, built by `make`.
    pub(crate) fn register<T>(
        &self,
        name: &str,
        make: impl FnOnce(ActorId) -> (Arc<Mailbox>, T),
    ) -> Result<(ActorId, Arc<Mailbox>, T), SpawnError> {
        validate_name(name)?;
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(SpawnError::ProcStopped {
                proc_id: self.inner.id.clone(),
                name: name.to_string(),
            });
        }
        let index = {
            let mut names = self.inner.names.lock();
            let next = names.entry(name.to_string()).or_insert(0);
            let index = *next;
            *next += 1;
            index
        };
        let id = self.inner.id.actor_id(name, index)?;
        let (mailbox, extra) = make(id.clone());
        self.inner
            .actors
            .write()
            .insert(id.clone(), Arc::clone(&mailbox));
        Ok((id, mailbox, extra))
    }

    pub(crate) fn allocate_actor(
        &self,
        name: &str,
    ) -> Result<(ActorId, Arc<Mailbox>, mpsc::UnboundedReceiver<Work>), SpawnError> {
        self.register(name, Mailbox::with_work_queue)
    }

    fn mailbox(&self, id: &ActorId) -> Option<Arc<Mailbox>> {
        self.inner.actors.read().get(id).cloned()
    }

    pub(crate) fn report_supervision_event(&self, event: SupervisionEvent) {
        tracing::warn!(proc = %self.inner.id, "root actor failure: {event}");
        // The receiver lives in `inner`, so this cannot fail while `self` exists.
        let _ = self.inner.supervision_tx.send(event);
    }

    /// Resolves, with the link's error, when the link from this proc to `proc` fails:
    /// the connection broke or was closed by the other side (for example because its
    /// process is gone). Dials `proc` if no link is open. Resolves at once for this
    /// proc itself, which has no link.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn link_failed(&self, proc: &ProcId) -> ChannelError {
        match self.current_link(proc) {
            Some(tx) => tx.closed().await,
            None => ChannelError::closed(proc.addr()),
        }
    }

    /// The link to `proc`, or `None` when `proc` is this proc.
    pub(crate) fn current_link(&self, proc: &ProcId) -> Option<ChannelTx> {
        (proc != &self.inner.id).then(|| self.link(proc.addr()))
    }

    /// Resolves once every link of this proc is within its byte budget (or has
    /// failed): a sender that posts many messages waits here to go at its receivers'
    /// pace. Immediate when no link of the process is over budget.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn links_ready(&self) {
        if !channel::any_link_over_budget() {
            return;
        }
        let congested: Vec<ChannelTx> = self
            .inner
            .links
            .lock()
            .values()
            .filter(|tx| tx.over_budget())
            .cloned()
            .collect();
        for tx in congested {
            tx.ready().await;
        }
    }

    fn link(&self, addr: &ChannelAddr) -> ChannelTx {
        let mut links = self.inner.links.lock();
        if let Some(tx) = links.get(addr) {
            if tx.error().is_none() {
                return tx.clone();
            }
        }
        let weak = Arc::downgrade(&self.inner);
        let on_return: channel::ReturnFn = Arc::new(move |frame: Frame, error: &ChannelError| {
            if let Some(inner) = weak.upgrade() {
                Proc { inner }.bounce_frame(frame, error);
            }
        });
        let _runtime = self.inner.runtime.enter();
        let tx = channel::dial(addr, on_return);
        links.insert(addr.clone(), tx.clone());
        tx
    }

    fn deliver_local(&self, envelope: Envelope) {
        match self.mailbox(envelope.header.dest.actor()) {
            Some(mailbox) => {
                if let Err(u) = mailbox.deliver(envelope) {
                    self.bounce(*u);
                }
            }
            None => {
                let reason = format!(
                    "no actor {} in proc {}",
                    envelope.header.dest.actor(),
                    self.inner.id
                );
                self.bounce(Undeliverable::new(envelope, reason));
            }
        }
    }

    fn bounce_frame(&self, frame: Frame, error: &ChannelError) {
        match Envelope::from_frame(frame) {
            Ok(envelope) => {
                // A frame error here is the sending side's own check (too large, too
                // many parts): the link is fine.
                let link_failed = !matches!(error, ChannelError::Frame { .. });
                let reason = if link_failed {
                    format!(
                        "link to {} failed: {error}",
                        envelope.header.dest.actor().proc_id()
                    )
                } else {
                    format!("it cannot be sent: {error}")
                };
                self.bounce(Undeliverable {
                    envelope,
                    reason,
                    link_failed,
                });
            }
            Err(e) => {
                if let Some(suppressed) = RETURN_FAILED.check() {
                    tracing::error!(proc = %self.inner.id, suppressed, "returned frame is corrupt: {e}");
                }
            }
        }
    }

    /// Returns an undelivered message to its sender's `return_to` port (DEL-1).
    pub(crate) fn bounce(&self, undeliverable: Undeliverable) {
        let Some(return_to) = undeliverable.envelope.header.return_to.clone() else {
            // Messages without a return address are fire-and-forget (replies,
            // supervision events): dropping one whose receiver is gone is routine, so
            // the log is at debug level, rate-limited with the count it suppressed.
            if let Some(suppressed) = DROPPED.check() {
                tracing::debug!(
                    proc = %self.inner.id,
                    suppressed,
                    "dropping an undeliverable message without a return address: {undeliverable}"
                );
            }
            return;
        };
        let header = EnvelopeHeader {
            sender: undeliverable.envelope.header.dest.actor().clone(),
            dest: return_to,
            return_to: None,
            extra: None,
        };
        match Serialized::encode(&undeliverable) {
            Ok(payload) => self.post(Envelope { header, payload }),
            Err(e) => {
                if let Some(suppressed) = RETURN_FAILED.check() {
                    tracing::error!(proc = %self.inner.id, suppressed, "cannot return a message: {e}");
                }
            }
        }
    }
}

/// Log limits of messages that cannot be returned (DEL-1), process-wide.
static DROPPED: LogLimit = LogLimit::per_second();
static RETURN_FAILED: LogLimit = LogLimit::per_second();

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc").field("id", &self.inner.id).finish()
    }
}
