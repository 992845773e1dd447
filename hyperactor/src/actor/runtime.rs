//! The actor runtime: the task that runs one actor, and its shared cell.
//!
//! [`spawn_actor`] registers a mailbox in the proc and starts the actor's task, which
//! runs [`run`]: construction, then one message at a time (ACT-1), then the terminal
//! phase shared by graceful stops and failures (children stopped, mailbox closed, queued
//! messages returned, status published, owner told of a failure).

use crate::sync::Mutex;
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, watch};

use super::stats::ActorStatsSnapshot;
use super::{Actor, ActorHandle, Binder, Context};
use crate::error::{BoxError, SpawnError};
use crate::id::ActorId;
use crate::mailbox::{Mailbox, Work};
use crate::message::{Envelope, Serialized, Undeliverable, SUPERVISION_PORT, UNDELIVERABLE_PORT};
use crate::router::{Proc, Root};
use crate::supervision::{ActorStatus, SupervisionEvent};

/// How long an owner waits for each child to stop before aborting it.
pub(crate) const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Who receives an actor's supervision events.
#[derive(Debug)]
pub(crate) enum Owner {
    /// A local actor, which also tracks the new actor as its child.
    Actor(Arc<ActorCell>),
    /// A mailbox without an actor loop (a client): events go to its supervision port.
    Mailbox(ActorId),
    /// The proc itself.
    Proc,
}

/// Where an actor's failure is reported.
#[derive(Debug, Clone)]
enum OwnerId {
    Actor(ActorId),
    Proc,
}

/// The state of one actor shared between its task, its handles and its owner.
#[derive(Debug)]
pub(crate) struct ActorCell {
    pub(crate) id: ActorId,
    pub(crate) mailbox: Arc<Mailbox>,
    owner: OwnerId,
    /// Lifecycle transitions, watched by waiters. `Idle` here means running;
    /// whether a message is being handled is `processing`, kept out of the
    /// watch so the per-message path does not notify anyone.
    status: watch::Sender<ActorStatus>,
    processing: AtomicBool,
    /// Always-on counters (see [`super::stats`]).
    pub(crate) stats: super::stats::ActorStats,
    children: Mutex<Vec<Arc<ActorCell>>>,
    abort: Mutex<Option<tokio::task::AbortHandle>>,
}

impl ActorCell {
    pub(crate) fn status(&self) -> ActorStatus {
        let status = self.status.borrow().clone();
        if status == ActorStatus::Idle && self.processing.load(Ordering::Relaxed) {
            return ActorStatus::Processing;
        }
        status
    }

    fn set_status(&self, status: ActorStatus) {
        self.status.send_replace(status);
    }

    pub(crate) async fn wait_terminal(&self) -> ActorStatus {
        let mut rx = self.status.subscribe();
        let status = match rx.wait_for(ActorStatus::is_terminal).await {
            Ok(status) => status.clone(),
            // The sender lives in `self`, so it cannot be gone while we borrow it.
            Err(_) => self.status(),
        };
        status
    }

    pub(crate) async fn wait_started(&self) -> ActorStatus {
        let mut rx = self.status.subscribe();
        let status = match rx
            .wait_for(|s| !matches!(s, ActorStatus::Created | ActorStatus::Initializing))
            .await
        {
            Ok(status) => status.clone(),
            Err(_) => self.status(),
        };
        status
    }

    fn add_child(&self, child: Arc<ActorCell>) -> bool {
        if matches!(self.status(), ActorStatus::Stopping) || self.status().is_terminal() {
            return false;
        }
        let mut children = self.children.lock();
        children.retain(|c| !c.status().is_terminal());
        children.push(child);
        true
    }

    pub(crate) async fn stop_and_wait(&self, timeout: Duration) -> ActorStatus {
        self.mailbox.request_stop();
        match tokio::time::timeout(timeout, self.wait_terminal()).await {
            Ok(status) => status,
            Err(_) => {
                self.abort(&format!("did not stop within {timeout:?} and was aborted"));
                self.status()
            }
        }
    }

    /// Ends the actor's task at once (and its children's), without running its hooks.
    fn abort(&self, reason: &str) {
        if let Some(handle) = self.abort.lock().take() {
            handle.abort();
        }
        for child in self.children.lock().drain(..) {
            child.abort(reason);
        }
        self.mailbox.close(reason);
        if !self.status().is_terminal() {
            self.set_status(ActorStatus::Failed(reason.to_string()));
        }
    }
}

impl ActorCell {
    /// A new cell in state `Created`, whose failures go to `owner`, registered with it
    /// (a local owner tracks it as a child; a mailbox or the proc as a root).
    pub(crate) fn register(
        proc: &Proc,
        id: ActorId,
        mailbox: Arc<Mailbox>,
        name: &str,
        owner: Owner,
    ) -> Result<Arc<Self>, SpawnError> {
        let owner_id = match &owner {
            Owner::Actor(parent) => OwnerId::Actor(parent.id.clone()),
            Owner::Mailbox(id) => OwnerId::Actor(id.clone()),
            Owner::Proc => OwnerId::Proc,
        };
        let cell = Arc::new(ActorCell {
            id,
            mailbox,
            owner: owner_id,
            status: watch::Sender::new(ActorStatus::Created),
            processing: AtomicBool::new(false),
            stats: super::stats::ActorStats::default(),
            children: Mutex::new(Vec::new()),
            abort: Mutex::new(None),
        });
        match owner {
            Owner::Actor(parent) => {
                if !parent.add_child(Arc::clone(&cell)) {
                    cell.mailbox.close("its owner stopped before it started");
                    return Err(SpawnError::OwnerStopped {
                        owner: parent.id.clone(),
                        name: name.to_string(),
                    });
                }
            }
            Owner::Mailbox(_) | Owner::Proc => proc.add_root(Arc::clone(&cell) as Arc<dyn Root>),
        }
        Ok(cell)
    }

    /// A copy of this actor's counters, with its status and queue length.
    pub(crate) fn stats_snapshot(&self) -> super::stats::ActorStatsSnapshot {
        self.stats
            .snapshot(self.id.clone(), self.status(), self.mailbox.queued())
    }

    /// This cell and its descendants, depth first.
    pub(crate) fn set_processing(&self, processing: bool) {
        self.processing.store(processing, Ordering::Relaxed);
    }

    pub(crate) fn set_running(&self) {
        self.set_status(ActorStatus::Idle);
    }

    pub(crate) fn set_initializing(&self) {
        self.set_status(ActorStatus::Initializing);
    }

    /// The terminal phase without children (a driven actor has none): the mailbox is
    /// closed, the final status is published, `leftovers` go back to their senders
    /// (DEL-1) and a failure is reported to the owner (SUP-1). Idempotent: only the
    /// first call of a cell counts.
    pub(crate) fn finish(
        &self,
        proc: &Proc,
        outcome: Result<(), (String, Option<Box<SupervisionEvent>>)>,
        leftovers: Vec<Work>,
    ) -> bool {
        if self.status().is_terminal() {
            return false;
        }
        let ended = match &outcome {
            Ok(()) => "stopped".to_string(),
            Err((reason, _)) => format!("failed: {reason}"),
        };
        self.mailbox.close(&ended);
        // The final status first: whoever gets a leftover back and asks why finds the
        // actor ended.
        let event = match outcome {
            Ok(()) => {
                self.set_status(ActorStatus::Stopped);
                None
            }
            Err((reason, caused_by)) => {
                self.set_status(ActorStatus::Failed(reason.clone()));
                Some(SupervisionEvent {
                    actor_id: self.id.clone(),
                    reason,
                    caused_by,
                    detail: None,
                })
            }
        };
        bounce_leftovers(proc, &self.id, &ended, leftovers);
        if let Some(event) = event {
            report(proc, self, event);
        }
        true
    }
}

impl ActorCell {
    /// Returns `leftovers` to their senders: the actor has ended.
    pub(crate) fn bounce_all(&self, proc: &Proc, leftovers: Vec<Work>) {
        let ended = match self.status() {
            ActorStatus::Failed(reason) => format!("failed: {reason}"),
            _ => "stopped".to_string(),
        };
        bounce_leftovers(proc, &self.id, &ended, leftovers);
    }
}

/// The proc stops its root actors and reads their counters through this hook.
impl Root for ActorCell {
    fn is_terminal(&self) -> bool {
        self.status().is_terminal()
    }

    fn stop_and_wait(&self, timeout: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            ActorCell::stop_and_wait(self, timeout).await;
        })
    }

    fn collect_stats(&self, out: &mut Vec<ActorStatsSnapshot>) {
        out.push(self.stats_snapshot());
        let children: Vec<_> = self.children.lock().clone();
        for child in children {
            child.collect_stats(out);
        }
    }
}

fn bounce_leftovers(proc: &Proc, id: &ActorId, ended: &str, leftovers: Vec<Work>) {
    for work in leftovers {
        if let Work::Message(envelope) = work {
            let reason = format!("actor {id} {ended} before handling it");
            proc.bounce(Undeliverable::new(envelope, reason));
        }
    }
}

/// Spawns an actor of type `A` named `name` on `proc`, owned by `owner`.
pub(crate) fn spawn_actor<A: Actor>(
    proc: &Proc,
    name: &str,
    params: A::Params,
    owner: Owner,
) -> Result<ActorHandle<A>, SpawnError> {
    let (id, mailbox, rx) = proc.allocate_actor(name)?;
    let cell = ActorCell::register(proc, id, mailbox, name, owner)?;
    let cx = Context::<A>::new(Arc::clone(&cell), proc.clone());
    let task = proc.runtime().spawn(run::<A>(cx, params, rx));
    *cell.abort.lock() = Some(task.abort_handle());
    Ok(ActorHandle::new(cell))
}

/// Why an actor failed.
#[derive(Debug)]
struct Failure {
    reason: String,
    caused_by: Option<Box<SupervisionEvent>>,
}

impl Failure {
    fn new(reason: String) -> Self {
        Self {
            reason,
            caused_by: None,
        }
    }
}

async fn run<A: Actor>(cx: Context<A>, params: A::Params, mut rx: mpsc::UnboundedReceiver<Work>) {
    let outcome = drive::<A>(&cx, params, &mut rx).await;
    let cell = &cx.cell;
    cell.set_status(ActorStatus::Stopping);
    let children: Vec<_> = cell.children.lock().drain(..).collect();
    for child in children {
        child.stop_and_wait(CHILD_STOP_TIMEOUT).await;
    }
    let ended = match &outcome {
        Ok(()) => "stopped".to_string(),
        Err(failure) => format!("failed: {}", failure.reason),
    };
    cell.mailbox.close(&ended);
    // DEL-1: whatever was still queued goes back to its senders.
    rx.close();
    let mut leftovers = Vec::new();
    while let Ok(work) = rx.try_recv() {
        leftovers.push(work);
    }
    bounce_leftovers(&cx.proc, &cell.id, &ended, leftovers);
    match outcome {
        Ok(()) => cell.set_status(ActorStatus::Stopped),
        Err(failure) => {
            cell.set_status(ActorStatus::Failed(failure.reason.clone()));
            let event = SupervisionEvent {
                actor_id: cell.id.clone(),
                reason: failure.reason,
                caused_by: failure.caused_by,
                detail: None,
            };
            report(&cx.proc, cell, event);
        }
    }
}

/// SUP-1: exactly one event per failure, to the owner.
fn report(proc: &Proc, cell: &ActorCell, event: SupervisionEvent) {
    match &cell.owner {
        OwnerId::Proc => proc.report_supervision_event(event),
        OwnerId::Actor(owner) => match Serialized::encode(&event) {
            Ok(payload) => {
                let header = crate::message::EnvelopeHeader {
                    sender: cell.id.clone(),
                    dest: owner.port_id(SUPERVISION_PORT),
                    return_to: None,
                    extra: None,
                };
                proc.post(Envelope { header, payload });
            }
            Err(e) => tracing::error!(actor = %cell.id, "cannot report failure: {e}"),
        },
    }
}

async fn drive<A: Actor>(
    cx: &Context<A>,
    params: A::Params,
    rx: &mut mpsc::UnboundedReceiver<Work>,
) -> Result<(), Failure> {
    cx.cell.set_status(ActorStatus::Initializing);
    let mut actor = guard("new", A::new(params)).await?;
    guard("init", actor.init(cx)).await?;
    let binder = Binder::<A>::build();
    cx.cell.set_status(ActorStatus::Idle);
    while let Some(work) = rx.recv().await {
        match work {
            Work::Stop => return Ok(()),
            Work::Message(envelope) => {
                cx.cell.mailbox.dequeued();
                cx.cell.processing.store(true, Ordering::Relaxed);
                let handled = handle_one(&mut actor, cx, &binder, envelope).await;
                cx.cell.processing.store(false, Ordering::Relaxed);
                handled?;
            }
        }
    }
    Ok(())
}

async fn handle_one<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    binder: &Binder<A>,
    envelope: Envelope,
) -> Result<(), Failure> {
    let stats = &cx.cell.stats;
    stats.begin(endpoint_label(binder, envelope.header.dest.index()));
    let outcome = handle_message(actor, cx, binder, envelope).await;
    if outcome.is_err() {
        stats.note_error();
    }
    stats.end();
    outcome
}

/// The name a message to `port` is counted under: its handler's message type (without
/// the module path), or the runtime port's name.
fn endpoint_label<A: Actor>(binder: &Binder<A>, port: u64) -> &'static str {
    match port {
        UNDELIVERABLE_PORT => "__undeliverable__",
        SUPERVISION_PORT => "__supervise__",
        port => match binder.get(port) {
            Some((_, type_name)) => short_type_name(type_name),
            None => "__unknown__",
        },
    }
}

/// `a::b::C<d::E>` → `C<d::E>`: the last path segment before any generics.
fn short_type_name(name: &'static str) -> &'static str {
    let head = name.split('<').next().unwrap_or(name);
    match head.rfind("::") {
        Some(i) => &name[i + 2..],
        None => name,
    }
}

async fn handle_message<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    binder: &Binder<A>,
    envelope: Envelope,
) -> Result<(), Failure> {
    match envelope.header.dest.index() {
        UNDELIVERABLE_PORT => {
            let Some(message) = decode_runtime::<Undeliverable, A>(cx, &envelope) else {
                return Ok(());
            };
            guard(
                "handle_undeliverable",
                actor.handle_undeliverable(cx, message),
            )
            .await
        }
        SUPERVISION_PORT => {
            let Some(event) = decode_runtime::<SupervisionEvent, A>(cx, &envelope) else {
                return Ok(());
            };
            let outcome = guard(
                "handle_supervision_event",
                actor.handle_supervision_event(cx, &event),
            )
            .await;
            let reason = match outcome {
                Ok(true) => return Ok(()),
                Ok(false) => format!("did not handle the failure of its child {}", event.actor_id),
                Err(failure) => failure.reason,
            };
            Err(Failure {
                reason,
                caused_by: Some(Box::new(event)),
            })
        }
        port => {
            let Some((handler, type_name)) = binder.get(port) else {
                let reason = format!("actor {} has no handler for port {port}", cx.cell.id);
                cx.proc.bounce(Undeliverable::new(envelope, reason));
                return Ok(());
            };
            cx.set_extra(envelope.header.extra.clone());
            // A message that carries an extra header (a cast, whose sender may wait for
            // a reply) goes back to its sender if its handler fails, so the sender hears
            // of it (DEL-1); plain messages have nobody waiting.
            let header = envelope
                .header
                .extra
                .is_some()
                .then(|| envelope.header.clone());
            let outcome = match handler(actor, cx, envelope) {
                Ok(future) => guard(&format!("handler for {type_name}"), future).await,
                Err((envelope, error)) => {
                    let reason = format!("actor {} could not decode it: {error}", cx.cell.id);
                    cx.proc.bounce(Undeliverable::new(envelope, reason));
                    Ok(())
                }
            };
            cx.set_extra(None);
            if let (Err(failure), Some(header)) = (&outcome, header) {
                let reason = format!(
                    "actor {} failed while handling it: {}",
                    cx.cell.id, failure.reason
                );
                let envelope = Envelope {
                    header,
                    payload: Serialized::from_parts(Vec::new()),
                };
                cx.proc.bounce(Undeliverable::new(envelope, reason));
            }
            outcome
        }
    }
}

/// A runtime message (returned message, supervision event), or `None` if it does not
/// decode: anyone can send to these ports, so a corrupt one is logged (rate-limited)
/// and dropped; the actor goes on.
fn decode_runtime<M: crate::message::Message, A: Actor>(
    cx: &Context<A>,
    envelope: &Envelope,
) -> Option<M> {
    static CORRUPT: crate::channel::log_limit::LogLimit =
        crate::channel::log_limit::LogLimit::per_second();
    match envelope.payload.decode() {
        Ok(message) => Some(message),
        Err(e) => {
            if let Some(suppressed) = CORRUPT.check() {
                tracing::warn!(
                    actor = %cx.cell.id,
                    sender = %envelope.header.sender,
                    suppressed,
                    "dropping a corrupt runtime message: {e}"
                );
            }
            None
        }
    }
}

/// Runs `future`, turning an error or a panic into a [`Failure`] (ACT-3).
async fn guard<T>(
    what: &str,
    future: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, Failure> {
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(Failure::new(format!("{what} returned an error: {error}"))),
        Err(panic) => Err(Failure::new(format!(
            "{what} panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}
