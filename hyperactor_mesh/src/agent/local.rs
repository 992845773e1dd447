//! The actors an agent spawned on its proc: creating them (native types from a
//! [`Registry`], foreign ones through a [`ForeignSpawner`]), stopping them, and telling
//! when they have started.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hyperactor::actor::{AnyActorHandle, DrivenActor};
use hyperactor::{Actor, ActorId, ActorStatus, Client};
use serde::de::DeserializeOwned;

use super::lock::{Rank, Ranked};
use super::{Control, Inner};
use crate::cast::codec::{ActorType, MeshInfo, ReplyTo, SpawnSpec, ViewExtent};
use crate::cast::reply::ReplyItem;
use crate::supervision::{FailureCause, MeshFailure};

type SpawnFn = fn(&Client, &str, &[Bytes]) -> Result<AnyActorHandle, LocalSpawnError>;

/// Why an agent could not create an actor a spawn cast asked for: reported to the
/// mesh's owner as [`FailureCause::SpawnFailed`], whose reason is this error's text.
#[derive(Debug, thiserror::Error)]
enum LocalSpawnError {
    /// The cast's parameters do not decode as the registered type's params.
    #[error("its parameters do not decode as {type_name}: {source}")]
    Params {
        /// The actor type.
        type_name: String,
        /// The decoding error.
        source: bincode::Error,
    },
    /// The actor type is not registered with this agent.
    #[error(
        "actor type {type_name} is not registered with this proc's agent (known: \
         {known:?}); register it with AgentOptions::register in the proc's main"
    )]
    NotRegistered {
        /// The type asked for.
        type_name: String,
        /// The registered types, sorted.
        known: Vec<String>,
    },
    /// A foreign actor was asked of an agent without a foreign spawner.
    #[error("this proc cannot host foreign actors (it has no foreign spawner)")]
    NoForeignSpawner,
    /// The proc could not create the actor.
    #[error(transparent)]
    Spawn(#[from] hyperactor::error::SpawnError),
}

/// The Rust actor types an agent can spawn when asked by another process: a spawn cast
/// names the type ([`Registry::type_name`]) and carries its bincode params.
///
/// ```
/// use hyperactor_mesh::agent::Registry;
/// use hyperactor::testing::Echo;
///
/// let mut registry = Registry::default();
/// registry.register::<Echo>();
/// assert!(registry.contains(&Registry::type_name::<Echo>()));
/// ```
#[derive(Default, Clone)]
pub struct Registry {
    types: HashMap<String, SpawnFn>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.types.keys().collect();
        names.sort();
        f.debug_struct("Registry").field("types", &names).finish()
    }
}

fn spawn_native<A>(
    client: &Client,
    name: &str,
    parts: &[Bytes],
) -> Result<AnyActorHandle, LocalSpawnError>
where
    A: Actor,
    A::Params: DeserializeOwned,
{
    let bytes = parts.first().map(|b| &b[..]).unwrap_or_default();
    let params: A::Params =
        bincode::deserialize(bytes).map_err(|source| LocalSpawnError::Params {
            type_name: Registry::type_name::<A>(),
            source,
        })?;
    Ok(client.spawn::<A>(name, params)?.erase())
}

impl Registry {
    /// The name under which `A` is registered.
    pub fn type_name<A: Actor>() -> String {
        std::any::type_name::<A>().to_string()
    }

    /// Registers actor type `A`, whose params travel with bincode.
    pub fn register<A>(&mut self) -> &mut Self
    where
        A: Actor,
        A::Params: DeserializeOwned,
    {
        self.types
            .insert(Self::type_name::<A>(), spawn_native::<A> as SpawnFn);
        self
    }

    /// Whether `type_name` is registered.
    pub fn contains(&self, type_name: &str) -> bool {
        self.types.contains_key(type_name)
    }

    fn spawn(
        &self,
        client: &Client,
        type_name: &str,
        name: &str,
        parts: &[Bytes],
    ) -> Result<AnyActorHandle, LocalSpawnError> {
        match self.types.get(type_name) {
            Some(spawn) => spawn(client, name, parts),
            None => {
                let mut known: Vec<_> = self.types.keys().cloned().collect();
                known.sort();
                Err(LocalSpawnError::NotRegistered {
                    type_name: type_name.to_string(),
                    known,
                })
            }
        }
    }
}

/// What a foreign spawner is asked to create.
#[derive(Debug, Clone)]
pub struct ForeignSpawn {
    /// The mesh the actor belongs to.
    pub mesh: MeshInfo,
    /// The mesh's owner.
    pub owner: ActorId,
    /// The actor that asked for the spawn.
    pub origin: ActorId,
    /// The actor's position in the proc mesh.
    pub rank: u32,
    /// The proc mesh's extent.
    pub view: ViewExtent,
    /// What the spawner needs to create it (for Python: the pickled class and args).
    pub parts: Vec<Bytes>,
}

/// Creates actors of another language. The agent creates the driven actor first, so that
/// messages sent to it queue in order; the spawner then starts its driver (typically a
/// thread that runs the constructor, calls `started` and takes messages).
pub trait ForeignSpawner: Send + Sync + 'static {
    /// Starts driving `actor`, created for `spawn`. Must not block.
    ///
    /// # Errors
    ///
    /// Gives `actor` back, undriven, when this process hosts no new actors (it is
    /// stopping): the agent ends it as stopped and tells the mesh's owner (see
    /// [`super::ProcAgent::close_spawns`]).
    fn spawn(&self, actor: DrivenActor, spawn: ForeignSpawn) -> Result<(), DrivenActor>;
}

/// An actor spawned by an agent.
#[derive(Clone)]
pub(super) struct LocalActor {
    /// `None`: the spawn was refused before the actor was created (its proc was
    /// stopping); it counts as stopped.
    pub(super) handle: Option<AnyActorHandle>,
    pub(super) mesh: MeshInfo,
    pub(super) rank: u32,
    pub(super) owner: ActorId,
    /// Why it was asked to stop, once it was.
    pub(super) stop_reason: Option<String>,
}

/// The actors an agent spawned, by actor name, and whether it still takes new ones: the
/// local-actor component. It owns its state behind one lock, which only its methods
/// take; none calls anything else while holding it (see [`super::lock`]).
pub(super) struct LocalActors {
    state: Ranked<LocalState>,
}

#[derive(Default)]
struct LocalState {
    /// Actors spawned here, by actor name.
    actors: HashMap<String, LocalActor>,
    /// Why this agent refuses new actors, once its proc is stopping
    /// ([`super::ProcAgent::close_spawns`]).
    closed: Option<String>,
}

impl Default for LocalActors {
    fn default() -> Self {
        Self {
            state: Ranked::new(Rank::Component),
        }
    }
}

impl LocalActors {
    /// Whether an actor named `name` was spawned (or refused) here.
    fn contains(&self, name: &str) -> bool {
        self.state.lock().actors.contains_key(name)
    }

    /// Records the actor `name`.
    fn insert(&self, name: &str, actor: LocalActor) {
        self.state.lock().actors.insert(name.to_string(), actor);
    }

    /// The actor `name`, as it is now.
    pub(super) fn entry(&self, name: &str) -> Option<LocalActor> {
        self.state.lock().actors.get(name).cloned()
    }

    /// The handle of the actor `name`, if it was created.
    pub(super) fn handle(&self, name: &str) -> Option<AnyActorHandle> {
        self.state
            .lock()
            .actors
            .get(name)
            .and_then(|a| a.handle.clone())
    }

    /// Every actor spawned here, as they are now.
    pub(super) fn snapshot(&self) -> HashMap<String, LocalActor> {
        self.state.lock().actors.clone()
    }

    /// Records why `name` stopped or is asked to stop (the first reason is kept);
    /// returns its handle.
    pub(super) fn note_stop_reason(&self, name: &str, reason: &str) -> Option<AnyActorHandle> {
        let mut state = self.state.lock();
        let actor = state.actors.get_mut(name)?;
        actor.stop_reason.get_or_insert_with(|| reason.to_string());
        actor.handle.clone()
    }

    /// Refuses new actors from now on, for `reason` (the first one is kept).
    pub(super) fn close(&self, reason: &str) {
        self.state
            .lock()
            .closed
            .get_or_insert_with(|| reason.to_string());
    }

    /// Why new actors are refused, if they are.
    fn closed(&self) -> Option<String> {
        self.state.lock().closed.clone()
    }
}

impl Inner {
    /// Executes a spawn cast for `actor` (on the delivering task, in order).
    pub(super) fn spawn_local(
        self: &Arc<Self>,
        actor: &str,
        spec: &SpawnSpec,
        origin: &ActorId,
        rank: u32,
        view: &ViewExtent,
        parts: Vec<Bytes>,
    ) {
        if self.local.contains(actor) {
            tracing::warn!(agent = %self.id, actor, "ignoring a second spawn of the same actor");
            return;
        }
        if let Some(why) = self.stopping() {
            return self.refuse_spawn(actor, spec, rank, None, &why);
        }
        let spawned = match &spec.actor_type {
            ActorType::Native { type_name } => {
                self.registry.spawn(&self.client, type_name, actor, &parts)
            }
            ActorType::Foreign => match &self.foreign {
                None => Err(LocalSpawnError::NoForeignSpawner),
                Some(spawner) => match self.client.spawn_driven(actor) {
                    Ok(driven) => {
                        let handle = driven.erase();
                        let spawn = ForeignSpawn {
                            mesh: spec.mesh.clone(),
                            owner: spec.owner.clone(),
                            origin: origin.clone(),
                            rank,
                            view: view.clone(),
                            parts,
                        };
                        match spawner.spawn(driven, spawn) {
                            Ok(()) => Ok(handle),
                            Err(refused) => {
                                // The spawner closed meanwhile: the process is stopping.
                                refused.stop();
                                let why = self
                                    .stopping()
                                    .unwrap_or_else(|| "its process is shutting down".to_string());
                                return self.refuse_spawn(actor, spec, rank, Some(handle), &why);
                            }
                        }
                    }
                    Err(e) => Err(LocalSpawnError::Spawn(e)),
                },
            },
        };
        match spawned {
            Ok(handle) => {
                self.local.insert(
                    actor,
                    LocalActor {
                        handle: Some(handle),
                        mesh: spec.mesh.clone(),
                        rank,
                        owner: spec.owner.clone(),
                        stop_reason: None,
                    },
                );
            }
            Err(reason) => match self.stopping() {
                // Refused because the proc stopped meanwhile, not for a fault of its own.
                Some(why) => self.refuse_spawn(actor, spec, rank, None, &why),
                None => {
                    tracing::warn!(agent = %self.id, actor, "cannot spawn: {reason}");
                    let failure = MeshFailure {
                        mesh: spec.mesh.clone(),
                        rank: rank as usize,
                        actor_id: None,
                        proc_id: self.proc.proc_id().clone(),
                        pid: Some(std::process::id()),
                        cause: FailureCause::SpawnFailed {
                            reason: reason.to_string(),
                        },
                        caused_by: None,
                        path: None,
                    };
                    self.report_to_owner(&spec.owner, &failure);
                }
            },
        }
    }

    /// Why this proc takes no new actors, if it is stopping: the agent was told
    /// ([`super::ProcAgent::close_spawns`]), or the proc itself is stopped.
    fn stopping(&self) -> Option<String> {
        if let Some(why) = self.local.closed() {
            return Some(why);
        }
        self.proc
            .is_stopped()
            .then(|| "its proc is stopped".to_string())
    }

    /// The spawn of `actor` was refused because this proc is stopping (`why`): the actor
    /// counts as stopped here (`handle`, ended already, if it was created), and the agent
    /// of the mesh's owner decides whether that is a failure (MSUP-3: not when
    /// the owner's process stopped this proc or the mesh).
    fn refuse_spawn(
        &self,
        actor: &str,
        spec: &SpawnSpec,
        rank: u32,
        handle: Option<AnyActorHandle>,
        why: &str,
    ) {
        tracing::debug!(agent = %self.id, actor, "refusing a spawn: {why}");
        let actor_id = handle.as_ref().map(|h| h.actor_id().clone());
        self.local.insert(
            actor,
            LocalActor {
                handle,
                mesh: spec.mesh.clone(),
                rank,
                owner: spec.owner.clone(),
                stop_reason: Some(format!("it was never started: {why}")),
            },
        );
        let failure = MeshFailure {
            mesh: spec.mesh.clone(),
            rank: rank as usize,
            actor_id,
            proc_id: self.proc.proc_id().clone(),
            pid: Some(std::process::id()),
            cause: FailureCause::SpawnFailed {
                reason: format!("its proc was stopping ({why}) and hosts no new actors"),
            },
            caused_by: None,
            path: None,
        };
        self.send_control(
            spec.owner.proc_id(),
            &Control::SpawnRefused {
                owner: spec.owner.clone(),
                failure,
            },
        );
    }

    /// Why calls to local actor `actor` cannot be handled, if they cannot, and whether
    /// that is because it was stopped (not a failure).
    pub(super) fn why_not_running(&self, actor: &str) -> Option<(String, bool)> {
        let Some(a) = self.local.entry(actor) else {
            return Some((
                format!(
                    "no actor {actor} on proc {} (it was never spawned here)",
                    self.proc.proc_id()
                ),
                false,
            ));
        };
        let who = format!(
            "actor '{}' ({}) rank {} on proc {} (pid {})",
            a.mesh.name,
            a.mesh.class,
            a.rank,
            self.proc.proc_id(),
            std::process::id()
        );
        let status = a
            .handle
            .as_ref()
            .map_or(ActorStatus::Stopped, AnyActorHandle::status);
        match status {
            ActorStatus::Failed(reason) => Some((format!("{who} failed: {reason}"), false)),
            ActorStatus::Stopped => Some((
                format!(
                    "{who} was stopped ({})",
                    a.stop_reason.as_deref().unwrap_or("stopped")
                ),
                true,
            )),
            _ => None,
        }
    }

    /// Executes a stop cast for `actor`: stops the meshes it owns, then the actor (its
    /// queued messages first), then replies OK to `reply` if given.
    pub(super) fn stop_local(
        self: &Arc<Self>,
        actor: &str,
        reason: String,
        reply: Option<(ReplyTo, u32)>,
    ) {
        let handle = self.local.note_stop_reason(actor, &reason);
        let inner = Arc::clone(self);
        let timeout = self.stop_timeout;
        tokio::spawn(async move {
            if let Some(handle) = handle {
                if !handle.status().is_terminal() {
                    inner
                        .stop_owned_by(handle.actor_id(), &format!("its owner stopped: {reason}"))
                        .await;
                    handle.stop_and_wait(timeout).await;
                }
            }
            if let Some((to, index)) = reply {
                inner.send_items(&to, vec![ReplyItem::ok(index, Vec::new())]);
            }
        });
    }

    /// Executes a probe cast: replies once `actor` has started (OK) or ended (FAILED).
    pub(super) fn probe_local(self: &Arc<Self>, actor: &str, reply: Option<(ReplyTo, u32)>) {
        let Some((to, index)) = reply else {
            return;
        };
        let handle = self.local.handle(actor);
        let inner = Arc::clone(self);
        let actor = actor.to_string();
        tokio::spawn(async move {
            let not_running = || {
                let (why, stopped) = inner
                    .why_not_running(&actor)
                    .unwrap_or_else(|| (format!("actor {actor} ended"), false));
                ReplyItem::unanswered(index, &why, stopped)
            };
            let item = match handle {
                None => not_running(),
                Some(handle) => match handle.wait_started().await {
                    ActorStatus::Failed(_) | ActorStatus::Stopped => not_running(),
                    _ => ReplyItem::ok(index, Vec::new()),
                },
            };
            inner.send_items(&to, vec![item]);
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use hyperactor::testing::timed;
    use hyperactor::{BoxError, ChannelTransport, Context, Handler, SendContext};
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::actor_mesh::{reply, ActorMesh, Request};
    use crate::agent::{random_id, AgentOptions, ProcAgent, ProcInfo};
    use crate::error::MeshError;
    use crate::proc_mesh::ProcMesh;
    use crate::shape::Extent;

    #[derive(Debug)]
    struct Pinged;

    #[derive(Debug, Serialize, Deserialize)]
    struct Ping;
    impl Request for Ping {
        type Reply = u8;
    }

    impl Actor for Pinged {
        type Params = ();
        async fn new(_: ()) -> Result<Self, BoxError> {
            Ok(Pinged)
        }
        fn bind(binder: &mut hyperactor::Binder<Self>) {
            binder.handle::<Ping>();
        }
    }

    impl Handler<Ping> for Pinged {
        async fn handle(&mut self, cx: &Context<Self>, _: Ping) -> Result<(), BoxError> {
            reply(cx, &1u8)?;
            Ok(())
        }
    }

    /// A foreign spawner whose process is shutting down: it refuses every actor.
    struct Closed;
    impl ForeignSpawner for Closed {
        fn spawn(&self, actor: DrivenActor, _: ForeignSpawn) -> Result<(), DrivenActor> {
            Err(actor)
        }
    }

    /// A one-proc mesh of `agent`'s proc (spawned by no host).
    fn mesh_of(agent: &ProcAgent, name: &str) -> ProcMesh {
        let info = MeshInfo {
            id: random_id(),
            name: name.into(),
            class: "procs".into(),
        };
        let proc = ProcInfo {
            rank: 0,
            proc_id: agent.proc().proc_id().clone(),
            pid: std::process::id(),
            host: None,
        };
        ProcMesh::new(
            info,
            &Extent::new(vec!["gpus"], vec![1]).unwrap(),
            vec![proc],
        )
        .unwrap()
    }

    /// MSUP-3: a spawn refused by a proc that its owner's process stopped is no
    /// failure (the actor counts as stopped: calls to it say so); refused by a proc that
    /// stops for another reason, it is one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spawn_refused_by_a_stopping_proc_fails_only_if_the_owner_did_not_stop_it() {
        let owner = ProcAgent::serve(ChannelTransport::Unix, "owner", AgentOptions::default())
            .await
            .unwrap();
        let client = owner.proc().client("client").unwrap();
        let options = || AgentOptions::default().register::<Pinged>();
        let stopped = ProcAgent::serve(ChannelTransport::Unix, "stopped", options())
            .await
            .unwrap();
        let foreign = AgentOptions::default().foreign(Arc::new(Closed));
        let other = ProcAgent::serve(ChannelTransport::Unix, "other", foreign)
            .await
            .unwrap();

        // The owner stopped this proc mesh; its host asked the proc to stop.
        let procs = mesh_of(&stopped, "stopped");
        owner.register_owned_procs(
            procs.info().clone(),
            client.actor_id().clone(),
            procs.procs(),
        );
        owner.mark_stopped(procs.info().id);
        stopped.close_spawns("its host asked it to stop");
        let refused: ActorMesh<Pinged> = procs.spawn(&client, "refused", &()).unwrap();
        match timed(refused.call(&client, &Ping)).await {
            Err(MeshError::Call {
                failed: true,
                reason,
                ..
            }) => assert!(
                reason.contains("was stopped (it was never started: its host asked it to stop)"),
                "{reason}"
            ),
            other => panic!("a call to a refused actor: {other:?}"),
        }

        // A proc stopping for its own reasons (its spawner closed) that the owner did
        // not stop: the refusal is a failure.
        let failing = mesh_of(&other, "other")
            .spawn_foreign(&client, "reported", "Foreign", Vec::new())
            .unwrap();
        // The refusal of "refused" reached the owner's agent before the call's answer
        // (same link, in order): had it been reported, it would come first.
        let event = timed(client.next_supervision_event()).await.unwrap();
        let failure = MeshFailure::from_event(&event).unwrap();
        assert_eq!(failure.mesh.name, failing.info().name);
        assert_eq!(failure.proc_id, *other.proc().proc_id());
        match &failure.cause {
            FailureCause::SpawnFailed { reason } => assert!(
                reason.contains("its proc was stopping (its process is shutting down)"),
                "{reason}"
            ),
            cause => panic!("unexpected cause {cause:?}"),
        }
    }
}
