//! Actors: state plus typed handlers, one message at a time.
//!
//! An actor is a type implementing [`Actor`] (construction, lifecycle hooks, and the
//! list of messages it handles) and one [`Handler<M>`] per message type `M`. The runtime
//! gives each actor a [`Context`]: its identity, its mailbox, and the means to send, open
//! ports and spawn children.
//!
//! Invariants:
//!
//! - ACT-1 (one at a time): an actor's handlers never run concurrently; the next
//!   message is taken only after the previous handler's future completed.
//! - ACT-2 (init first): `new` and `init` complete before any message is handled;
//!   messages sent meanwhile wait in the mailbox.
//! - ACT-3 (failure is loud): an error or a panic in `new`, `init`, a handler or a hook
//!   fails the actor: its children are stopped, its queued messages are returned to their
//!   senders, and its owner receives a [`SupervisionEvent`]
//!   (see [`crate::supervision`]).
//!
//! ```
//! use hyperactor::actor::{Actor, Binder, Context, Handler};
//! use hyperactor::context::SendContext;
//! use hyperactor::error::BoxError;
//! use hyperactor::port::OncePortRef;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug)]
//! struct Counter { total: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Add(u64, OncePortRef<u64>);
//!
//! impl Actor for Counter {
//!     type Params = u64;
//!     async fn new(start: u64) -> Result<Self, BoxError> {
//!         Ok(Counter { total: start })
//!     }
//!     fn bind(binder: &mut Binder<Self>) {
//!         binder.handle::<Add>();
//!     }
//! }
//!
//! impl Handler<Add> for Counter {
//!     async fn handle(&mut self, cx: &Context<Self>, Add(n, reply): Add) -> Result<(), BoxError> {
//!         self.total += n;
//!         reply.send(cx, self.total)?;
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use hyperactor::{channel::ChannelTransport, proc::Proc};
//! let proc = Proc::serve(ChannelTransport::Local, "doc").await?;
//! let client = proc.client("main")?;
//! let counter = client.spawn::<Counter>("counter", 10)?;
//! let total = client.call(&counter.bind().port::<Add>(), |reply| Add(5, reply)).await?;
//! assert_eq!(total, 15);
//! # Ok(())
//! # }
//! ```

mod driven;
mod runtime;
pub mod stats;
pub(crate) mod work_queue;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::context::SendContext;
use crate::error::{BoxError, MessageError, SpawnError};
use crate::id::ActorId;
use crate::mailbox::Mailbox;
use crate::message::{handler_port, Envelope, Message, Undeliverable};
use crate::port::PortRef;
use crate::router::Proc;
use crate::supervision::{ActorStatus, SupervisionEvent};

pub use driven::{DrivenActor, DrivenWork, Next};
pub(crate) use runtime::{spawn_actor, ActorCell, Owner};
pub use stats::{ActorStats, ActorStatsSnapshot};
pub(crate) use work_queue::WorkQueue;
pub use work_queue::{
    queue_high_water, DEFAULT_QUEUE_HIGH_WATER, MESSAGE_COST_OVERHEAD, QUEUE_HIGH_WATER_ENV,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An actor: its construction, lifecycle hooks, and the messages it handles.
///
/// Hooks run on the actor's task, one at a time with its handlers (ACT-1). A panic in any
/// of them is caught and fails the actor (ACT-3), as an `Err` does.
pub trait Actor: Sized + Send + 'static {
    /// What [`Actor::new`] is built from (the spawn arguments, kept apart from the state).
    type Params: Send + 'static;

    /// Builds the actor's state. Runs on the actor's task, before anything else.
    ///
    /// # Errors
    ///
    /// An error fails the actor; its owner gets a supervision event.
    fn new(params: Self::Params) -> impl Future<Output = Result<Self, BoxError>> + Send;

    /// Declares the messages this actor handles: call [`Binder::handle`] once per type.
    /// A message of another type sent to this actor is returned to its sender.
    fn bind(binder: &mut Binder<Self>);

    /// Runs once after [`Actor::new`], with the actor's context, before any message.
    ///
    /// # Errors
    ///
    /// An error fails the actor.
    fn init(&mut self, cx: &Context<Self>) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = cx;
        async { Ok(()) }
    }

    /// Called when an actor this one owns (a child) failed. Return `Ok(true)` if handled;
    /// `Ok(false)` (the default) passes the failure up: this actor fails too, with the
    /// child's event as the cause.
    ///
    /// # Errors
    ///
    /// An error fails this actor, as `Ok(false)` does.
    fn handle_supervision_event(
        &mut self,
        cx: &Context<Self>,
        event: &SupervisionEvent,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send {
        let _ = (cx, event);
        async { Ok(false) }
    }

    /// Called when a message this actor sent came back undeliverable (DEL-1). The
    /// default fails the actor, so lost messages are never silent.
    ///
    /// # Errors
    ///
    /// An error fails the actor.
    fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        message: Undeliverable,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = cx;
        async move { Err(Box::new(message) as BoxError) }
    }
}

/// A handler for messages of type `M`.
pub trait Handler<M: Message>: Actor {
    /// Handles one message.
    ///
    /// # Errors
    ///
    /// An error fails the actor (ACT-3).
    fn handle(
        &mut self,
        cx: &Context<Self>,
        message: M,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

type HandlerFn<A> =
    for<'a> fn(
        &'a mut A,
        &'a Context<A>,
        Envelope,
    ) -> Result<BoxFuture<'a, Result<(), BoxError>>, (Envelope, MessageError)>;

/// The table of an actor type's handlers, filled by [`Actor::bind`].
pub struct Binder<A> {
    handlers: HashMap<u64, (HandlerFn<A>, &'static str)>,
}

impl<A: Actor> Binder<A> {
    fn build() -> Self {
        let mut binder = Self {
            handlers: HashMap::new(),
        };
        A::bind(&mut binder);
        binder
    }

    /// Registers the handler for messages of type `M`.
    pub fn handle<M: Message>(&mut self) -> &mut Self
    where
        A: Handler<M>,
    {
        self.handlers.insert(
            handler_port::<M>(),
            (dispatch::<A, M>, std::any::type_name::<M>()),
        );
        self
    }

    fn get(&self, port: u64) -> Option<&(HandlerFn<A>, &'static str)> {
        self.handlers.get(&port)
    }
}

impl<A> fmt::Debug for Binder<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.values().map(|(_, name)| *name).collect();
        names.sort_unstable();
        f.debug_struct("Binder").field("handles", &names).finish()
    }
}

#[allow(clippy::type_complexity)]
fn dispatch<'a, A: Handler<M>, M: Message>(
    actor: &'a mut A,
    cx: &'a Context<A>,
    envelope: Envelope,
) -> Result<BoxFuture<'a, Result<(), BoxError>>, (Envelope, MessageError)> {
    match envelope.payload.decode::<M>() {
        Ok(message) => Ok(Box::pin(actor.handle(cx, message))),
        Err(e) => Err((envelope, e)),
    }
}

/// The context of a running actor: passed to every handler and hook.
pub struct Context<A> {
    cell: Arc<ActorCell>,
    proc: Proc,
    /// The extra header of the message being handled (see [`Context::extra`]).
    extra: crate::sync::Mutex<Option<bytes::Bytes>>,
    _actor: PhantomData<fn() -> A>,
}

impl<A: Actor> Context<A> {
    pub(crate) fn new(cell: Arc<ActorCell>, proc: Proc) -> Self {
        Self {
            cell,
            proc,
            extra: crate::sync::Mutex::new(None),
            _actor: PhantomData,
        }
    }

    /// The extra header of the message being handled
    /// ([`crate::message::EnvelopeHeader::extra`]): what a layer above attached to it,
    /// such as the mesh layer's cast route. `None` outside a handler and for plain
    /// messages.
    pub fn extra(&self) -> Option<bytes::Bytes> {
        self.extra.lock().clone()
    }

    pub(crate) fn set_extra(&self, extra: Option<bytes::Bytes>) {
        *self.extra.lock() = extra;
    }

    /// A serializable reference to this actor.
    pub fn self_ref(&self) -> ActorRef<A> {
        ActorRef::attest(self.cell.id.clone())
    }

    /// Spawns a child actor on this actor's proc. This actor becomes its owner: it
    /// receives the child's supervision events, and stops it when it stops itself.
    ///
    /// # Errors
    ///
    /// [`SpawnError::Name`] for an invalid name; [`SpawnError::OwnerStopped`] if this
    /// actor is already stopping.
    pub fn spawn<B: Actor>(
        &self,
        name: &str,
        params: B::Params,
    ) -> Result<ActorHandle<B>, SpawnError> {
        spawn_actor::<B>(
            &self.proc,
            name,
            params,
            Owner::Actor(Arc::clone(&self.cell)),
        )
    }

    /// Asks this actor to stop once the messages already queued are handled.
    pub fn stop(&self) {
        self.cell.mailbox.request_stop();
    }
}

impl<A: Actor> SendContext for Context<A> {
    fn proc(&self) -> &Proc {
        &self.proc
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.cell.mailbox
    }
}

impl<A> fmt::Debug for Context<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("actor", &self.cell.id)
            .finish()
    }
}

/// A typed, serializable reference to an actor. Send it anywhere; whoever holds it can
/// address the actor's handlers.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ActorRef<A> {
    actor_id: ActorId,
    #[serde(skip)]
    _actor: PhantomData<fn() -> A>,
}

impl<A: Actor> ActorRef<A> {
    /// A reference to `actor_id`, trusting the caller that it is an `A`.
    pub fn attest(actor_id: ActorId) -> Self {
        Self {
            actor_id,
            _actor: PhantomData,
        }
    }

    /// The referenced actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.actor_id
    }

    /// The port of the actor's handler for `M`.
    pub fn port<M: Message>(&self) -> PortRef<M>
    where
        A: Handler<M>,
    {
        PortRef::attest(self.actor_id.port_id(handler_port::<M>()))
    }

    /// Sends `message` to the actor's handler for `M`, from `cx`.
    ///
    /// # Errors
    ///
    /// [`MessageError::Encode`] if the message cannot be serialized. Delivery failures
    /// come back to `cx`'s actor as undeliverable messages.
    pub fn send<M: Message>(&self, cx: &impl SendContext, message: M) -> Result<(), MessageError>
    where
        A: Handler<M>,
    {
        self.port::<M>().send(cx, message)
    }
}

impl<A> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        Self {
            actor_id: self.actor_id.clone(),
            _actor: PhantomData,
        }
    }
}

impl<A> PartialEq for ActorRef<A> {
    fn eq(&self, other: &Self) -> bool {
        self.actor_id == other.actor_id
    }
}

impl<A> Eq for ActorRef<A> {}

impl<A> fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ActorRef<{}>({})",
            std::any::type_name::<A>(),
            self.actor_id
        )
    }
}

/// The local handle of a spawned actor: its status, and the means to stop it.
#[must_use = "an unused handle loses the only way to watch or stop the actor"]
pub struct ActorHandle<A> {
    cell: Arc<ActorCell>,
    _actor: PhantomData<fn() -> A>,
}

impl<A: Actor> ActorHandle<A> {
    pub(crate) fn new(cell: Arc<ActorCell>) -> Self {
        Self {
            cell,
            _actor: PhantomData,
        }
    }

    /// The actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.cell.id
    }

    /// A serializable reference to the actor.
    pub fn bind(&self) -> ActorRef<A> {
        ActorRef::attest(self.cell.id.clone())
    }

    /// The actor's current status.
    pub fn status(&self) -> ActorStatus {
        self.cell.status()
    }

    /// Waits until the actor has stopped or failed, and returns that final status.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait(&self) -> ActorStatus {
        self.cell.wait_terminal().await
    }

    /// Asks the actor to stop once the messages already queued are handled, and returns
    /// at once. Returns false if the actor had already ended.
    pub fn stop(&self) -> bool {
        self.cell.mailbox.request_stop()
    }

    /// Stops the actor (children first) and waits for it to end; an actor still running
    /// after `timeout` is aborted and reported failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop request is sent before the first await.
    pub async fn stop_and_wait(&self, timeout: Duration) -> ActorStatus {
        self.cell.stop_and_wait(timeout).await
    }
}

impl<A> ActorHandle<A> {
    /// The same handle without its actor type, for code that manages actors of many
    /// types (an agent that spawns them on request, for instance).
    pub fn erase(&self) -> AnyActorHandle {
        AnyActorHandle {
            cell: Arc::clone(&self.cell),
        }
    }
}

/// A handle to an actor of any type (runtime or driven): its status, and the means to
/// stop it. See [`ActorHandle::erase`] and [`DrivenActor::erase`].
#[derive(Clone)]
pub struct AnyActorHandle {
    cell: Arc<ActorCell>,
}

impl AnyActorHandle {
    /// The actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.cell.id
    }

    /// The actor's current status.
    pub fn status(&self) -> ActorStatus {
        self.cell.status()
    }

    /// Waits until the actor has stopped or failed, and returns that final status.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait(&self) -> ActorStatus {
        self.cell.wait_terminal().await
    }

    /// Waits until the actor has started (it finished `new` and `init`, or its driver
    /// called `started`) or ended, and returns that status.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_started(&self) -> ActorStatus {
        self.cell.wait_started().await
    }

    /// Asks the actor to stop once the messages already queued are handled, and returns
    /// at once. Returns false if the actor had already ended.
    pub fn stop(&self) -> bool {
        self.cell.mailbox.request_stop()
    }

    /// Stops the actor and waits for it to end; an actor still running after `timeout`
    /// is aborted and reported failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop request is sent before the first await.
    pub async fn stop_and_wait(&self, timeout: Duration) -> ActorStatus {
        self.cell.stop_and_wait(timeout).await
    }
}

impl fmt::Debug for AnyActorHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AnyActorHandle({})", self.cell.id)
    }
}

impl<A> Clone for ActorHandle<A> {
    fn clone(&self) -> Self {
        Self {
            cell: Arc::clone(&self.cell),
            _actor: PhantomData,
        }
    }
}

impl<A> fmt::Debug for ActorHandle<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ActorHandle<{}>({})",
            std::any::type_name::<A>(),
            self.cell.id
        )
    }
}
