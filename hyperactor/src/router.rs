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
    self, AttachRefusal, Attachment, ChannelAddr, ChannelError, ChannelServer, ChannelTransport,
    ChannelTx, Frame, NoRoute,
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
    /// For a proc attached to a gateway ([`Proc::attach`]): the gateway's address, where
    /// every link of this proc goes, and the connection it receives on (dropping it
    /// stops receiving). `None`: links go to each proc's own address.
    via: Option<ChannelAddr>,
    attachment: Mutex<Option<Attachment>>,
    /// For a gateway ([`Proc::serve_gateway`]): the links to the clients attached to it,
    /// by their proc ids. `None`: not a gateway.
    clients: Option<RwLock<FxHashMap<ProcId, ChannelTx>>>,
}

/// How a proc is reached and reaches others, as it is built.
enum Reach {
    /// Served at its own address; a gateway if `gateway` is set.
    Served { gateway: bool },
    /// Attached to the gateway at `via`.
    Attached {
        via: ChannelAddr,
        attachment: Attachment,
    },
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
        Self::serve_inner(&listen, None, |addr| ProcId::unique(name, addr), false).await
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
        Self::serve_inner(bind, advertise, |addr| ProcId::new(uid, addr), false).await
    }

    /// Serves like [`Proc::serve_as`], as a *gateway*: clients that cannot be dialed
    /// back (outside the cluster's network) attach to it ([`Proc::attach`]) and reach
    /// every proc through it, and every proc reaches them through it.
    ///
    /// A gateway relays, and nothing else changes: a message from an attached client
    /// to another proc goes on this proc's link to that proc; a message to an attached
    /// client (its id carries this proc's address) goes on the client's connection. A
    /// message that cannot be relayed comes back to its sender (DEL-1), and each
    /// sender's order is kept (ORD-1: one link in, one link out). Attachments are
    /// authenticated like every connection ([`channel::auth`]).
    ///
    /// # Errors
    ///
    /// As [`Proc::serve_as`].
    pub async fn serve_gateway(
        bind: &channel::Listen,
        advertise: Option<&ChannelAddr>,
        uid: &str,
    ) -> Result<Self, ProcError> {
        validate_name(uid)?;
        Self::serve_inner(bind, advertise, |addr| ProcId::new(uid, addr), true).await
    }

    /// Starts a proc that is reached through the gateway at `gateway` (a proc served
    /// with [`Proc::serve_gateway`]: a worker) instead of an address of its own, for a
    /// client whose network reaches that one address only (a laptop, a notebook, a
    /// `kubectl port-forward`). Its uid is `name` followed by a unique suffix, and its
    /// address the one the gateway advertises; every message it sends goes to the
    /// gateway, which relays it, and every message to it arrives on the connection it
    /// made to the gateway. It serves no address of its own.
    ///
    /// # Errors
    ///
    /// [`ProcError::Id`] for an invalid name; [`ProcError::Attach`] naming the gateway
    /// if it cannot be reached or authenticated, or refuses.
    pub async fn attach(gateway: &ChannelAddr, name: &str) -> Result<Self, ProcError> {
        validate_name(name)?;
        let uid = ProcId::unique(name, gateway.clone())?.uid().to_string();
        let (slot, deliver) = Self::deliver_fn();
        let attachment = channel::attach(gateway, &uid, deliver).await?;
        let id = ProcId::new(uid, attachment.advertised().clone())?;
        let reach = Reach::Attached {
            via: gateway.clone(),
            attachment,
        };
        let proc = Self::build(id, None, reach);
        let _ = slot.set(Arc::downgrade(&proc.inner));
        Ok(proc)
    }

    /// The function the proc's connections hand frames to, and the slot it finds the
    /// proc in once built. Frames are delivered by the connection tasks themselves (no
    /// router hop); until the proc exists they are refused, so they go back to their
    /// senders.
    fn deliver_fn() -> (
        Arc<std::sync::OnceLock<Weak<ProcInner>>>,
        channel::DeliverFn,
    ) {
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
                Ok(envelope) => Proc { inner }.receive(envelope),
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
        (slot, deliver)
    }

    async fn serve_inner(
        listen: &channel::Listen,
        advertise: Option<&ChannelAddr>,
        make_id: impl FnOnce(ChannelAddr) -> Result<ProcId, crate::error::IdError>,
        gateway: bool,
    ) -> Result<Self, ProcError> {
        let (slot, deliver) = Self::deliver_fn();
        let server = if gateway {
            channel::serve_gateway(listen, deliver, Self::attach_handler(&slot)).await?
        } else {
            channel::serve_listen_with(listen, deliver).await?
        };
        let id = make_id(channel::advertised(server.addr(), advertise))?;
        let proc = Self::build(id, Some(server), Reach::Served { gateway });
        let _ = slot.set(Arc::downgrade(&proc.inner));
        Ok(proc)
    }

    fn build(id: ProcId, server: Option<ChannelServer>, reach: Reach) -> Self {
        let (supervision_tx, supervision_rx) = mpsc::unbounded_channel();
        let (via, attachment, clients) = match reach {
            Reach::Served { gateway } => (None, None, gateway.then(RwLock::default)),
            Reach::Attached { via, attachment } => (Some(via), Some(attachment), None),
        };
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
            server: Mutex::new(server),
            via,
            attachment: Mutex::new(attachment),
            clients,
        });
        Self { inner }
    }

    /// A gateway's handling of attachments: a client is accepted under the id its uid
    /// and this proc's address make, unless that id is taken or the proc stopped.
    fn attach_handler(slot: &Arc<std::sync::OnceLock<Weak<ProcInner>>>) -> channel::AttachHandler {
        let accepting = Arc::clone(slot);
        let returning = Arc::clone(slot);
        let accept: channel::AttachFn = Arc::new(move |uid: &str, link: ChannelTx| {
            let Some(inner) = accepting.get().and_then(Weak::upgrade) else {
                return Err(AttachRefusal::NotRunning);
            };
            Proc { inner }.accept_client(uid, link)
        });
        let on_return: channel::ReturnFn = Arc::new(move |frame: Frame, error: &ChannelError| {
            if let Some(inner) = returning.get().and_then(Weak::upgrade) {
                Proc { inner }.bounce_frame(frame, error);
            }
        });
        channel::AttachHandler { accept, on_return }
    }

    /// Registers the link to the client `uid` attaching to this gateway; it is removed
    /// once the link fails.
    fn accept_client(&self, uid: &str, link: ChannelTx) -> Result<ChannelAddr, AttachRefusal> {
        let gateway = || self.inner.id.to_string();
        let Some(clients) = &self.inner.clients else {
            return Err(AttachRefusal::NotGateway { gateway: gateway() });
        };
        if self.is_stopped() {
            return Err(AttachRefusal::Stopping { gateway: gateway() });
        }
        let id =
            ProcId::new(uid, self.inner.id.addr().clone()).map_err(|e| AttachRefusal::BadUid {
                uid: uid.to_string(),
                reason: e.to_string(),
            })?;
        if id == self.inner.id {
            return Err(AttachRefusal::OwnUid {
                uid: uid.to_string(),
            });
        }
        {
            let mut clients = clients.write();
            if clients.get(&id).is_some_and(|l| l.error().is_none()) {
                return Err(AttachRefusal::AlreadyAttached {
                    client: id.to_string(),
                });
            }
            clients.insert(id.clone(), link.clone());
        }
        let weak = Arc::downgrade(&self.inner);
        let closed = link.on_closed();
        drop(link);
        let _runtime = self.inner.runtime.enter();
        tokio::spawn(async move {
            let error = closed.await;
            let Some(inner) = weak.upgrade() else { return };
            tracing::info!(gateway = %inner.id, client = %id, "a client detached: {error}");
            if let Some(clients) = &inner.clients {
                let mut clients = clients.write();
                if clients.get(&id).is_some_and(|l| l.error().is_some()) {
                    clients.remove(&id);
                }
            }
        });
        Ok(self.inner.id.addr().clone())
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
        let link = match self.route(dest) {
            Ok(link) => link,
            Err(reason) => {
                self.bounce(Undeliverable::new(envelope, reason.to_string()));
                return None;
            }
        };
        match envelope.into_frame() {
            Ok(frame) => Some((link, frame)),
            Err(e) => {
                tracing::error!(proc = %self.inner.id, "cannot frame a message: {e}");
                None
            }
        }
    }

    /// The link that reaches `dest`, another proc: the gateway's for an attached proc,
    /// the client's connection for a client attached to this gateway, else the link to
    /// `dest`'s address. A gateway refuses (with the reason) a proc at its own address
    /// that is neither itself nor an attached client.
    fn route(&self, dest: &ProcId) -> Result<ChannelTx, NoRoute> {
        if let Some(clients) = &self.inner.clients {
            if let Some(link) = clients.read().get(dest) {
                return Ok(link.clone());
            }
            if dest.addr() == self.inner.id.addr() {
                return Err(NoRoute::NotAttached {
                    dest: dest.to_string(),
                    gateway: self.inner.id.to_string(),
                });
            }
        }
        Ok(self.link(self.inner.via.as_ref().unwrap_or(dest.addr())))
    }

    /// Routes a message that arrived on this proc's endpoint: delivers it here, or, on
    /// a gateway, relays it to the attached client it is for, or from an attached client
    /// to the proc it is for. Anything else is delivered here (and so returned as
    /// undeliverable if it is not for this proc).
    fn receive(&self, envelope: Envelope) {
        let relay = match &self.inner.clients {
            None => false,
            Some(clients) => {
                let dest = envelope.header.dest.actor().proc_id();
                if dest == &self.inner.id {
                    false
                } else {
                    let clients = clients.read();
                    clients.contains_key(dest)
                        || (dest.addr() != self.inner.id.addr()
                            && clients.contains_key(envelope.header.sender.proc_id()))
                }
            }
        };
        if !relay {
            return self.deliver_local(envelope);
        }
        if let Some((link, frame)) = self.outbound(envelope) {
            match link.post(frame) {
                Err(e) => self.bounce_frame(e.frame, &e.error),
                // A link over its budget holds up the connection the message came on
                // (as a full queue does), so that a fast sender goes at the pace of the
                // receiver behind the gateway.
                Ok(()) if link.over_budget() => {
                    channel::backpressure::defer(Arc::new(LinkRoom(link)));
                }
                Ok(()) => {}
            }
        }
    }

    /// Whether this proc is a gateway ([`Proc::serve_gateway`]).
    pub fn is_gateway(&self) -> bool {
        self.inner.clients.is_some()
    }

    /// The procs of the clients attached to this gateway now (none if it is not one).
    pub fn attached_clients(&self) -> Vec<ProcId> {
        self.inner
            .clients
            .as_ref()
            .map(|c| {
                c.read()
                    .iter()
                    .filter(|(_, link)| link.error().is_none())
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The gateway this proc is attached to ([`Proc::attach`]): the address it dialed.
    pub fn gateway(&self) -> Option<&ChannelAddr> {
        self.inner.via.as_ref()
    }

    /// Resolves, with why, once the connection of this attached proc to its gateway
    /// ended: nothing reaches it any more. Never for a proc that is not attached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn gateway_lost(&self) -> ChannelError {
        let end = self.inner.attachment.lock().as_ref().map(Attachment::end);
        match end {
            Some(end) => end.await,
            None => std::future::pending().await,
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
        self.inner.attachment.lock().take();
        if let Some(clients) = &self.inner.clients {
            clients.write().clear();
        }
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

    /// The link to `proc`, or `None` when `proc` is this proc, or a gateway has no
    /// route to it (a client that is not attached: its messages are returned at once).
    pub(crate) fn current_link(&self, proc: &ProcId) -> Option<ChannelTx> {
        (proc != &self.inner.id)
            .then(|| self.route(proc).ok())
            .flatten()
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

/// A link over its budget, as the receive-side backpressure sees it: a gateway that
/// relayed a message onto it holds up the connection the message came on until the
/// link is back within its budget (see [`channel::backpressure`]).
struct LinkRoom(ChannelTx);

impl channel::backpressure::Congested for LinkRoom {
    fn wait_for_room(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move { self.0.ready().await })
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
