//! Singletons: one named actor per proc, spawned the first time it is asked for
//! ([`ProcAgent::singleton`], or from another process with
//! [`ProcAgent::remote_singleton`] and [`Control::Singleton`]), the same mesh later.
//!
//! A singleton is a one-rank actor mesh on the agent's own proc: its registry makes
//! mesh handles ([`ProcMesh`], [`ActorMeshRef`]), which sit on the layer above the
//! agent. So the registry lives here, on that layer, and owns its state, one
//! [`Singletons`] per agent; the agent holds it only as its singleton hook
//! ([`SingletonService`]) and hands it the [`Control::Singleton`] requests it receives.
//! Every agent is started here ([`ProcAgent::new`], [`ProcAgent::serve`]), which fills
//! that hook: the agent itself never names the mesh handles.
//!
//! Lock order: a registry's `meshes` lock is held while a singleton is spawned (so that
//! two requests for one name spawn it once), which takes the agent's own locks: it has
//! the lowest rank ([`crate::agent::lock::Rank::Singletons`]); nothing of the agent calls
//! into a registry while it holds a lock of its own (see docs/architecture.md, "Lock
//! order").

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hyperactor::{ActorId, ChannelTransport, PortId, PortRef, Proc, ProcId, SendContext};

use crate::actor_mesh::ActorMeshRef;
use crate::agent::lock::{Rank, Ranked};
use crate::agent::{random_id, AgentOptions, Control, ProcAgent, SingletonService};
use crate::cast::codec::{ActorType, MeshInfo};
use crate::error::{MeshError, RemoteError, RemoteErrorKind};
use crate::proc_mesh::ProcMesh;
use crate::shape::Extent;

/// The singletons of one agent's proc, and who owns those spawned at another process's
/// request.
pub(crate) struct Singletons {
    /// Named singletons spawned on this proc. Held while one is spawned (the lowest
    /// rank: the spawn takes the agent's locks).
    meshes: Ranked<HashMap<String, ActorMeshRef>>,
    /// Who owns the singletons spawned at another process's request.
    owner: Ranked<Option<ActorId>>,
}

impl Default for Singletons {
    fn default() -> Self {
        Self {
            meshes: Ranked::new(Rank::Singletons),
            owner: Ranked::new(Rank::Component),
        }
    }
}

impl Singletons {
    /// The registry `agent` was started with.
    fn of(agent: &ProcAgent) -> &Self {
        // invariant: agents are started only by `ProcAgent::new`, with a `Singletons`.
        #[allow(clippy::expect_used)]
        agent
            .singletons()
            .as_any()
            .downcast_ref::<Self>()
            .expect("invariant: every agent is started with a Singletons registry")
    }

    /// The owner of singletons spawned at another process's request: the one set with
    /// [`ProcAgent::set_singleton_owner`], else `fallback`.
    fn owner_or(&self, fallback: &ActorId) -> ActorId {
        self.owner
            .lock()
            .clone()
            .unwrap_or_else(|| fallback.clone())
    }

    /// The singleton `name` of `agent`'s proc, spawned if it does not exist yet.
    fn get_or_spawn(
        &self,
        agent: &ProcAgent,
        owner: &ActorId,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        // Held while spawning: one spawn per name (lock order: this, then the agent's).
        let mut meshes = self.meshes.lock();
        if let Some(mesh) = meshes.get(name) {
            return Ok(mesh.clone());
        }
        let info = MeshInfo {
            id: random_id(),
            name: format!("{name}-procs"),
            class: "proc".into(),
        };
        let own = ProcMesh::new(info, &Extent::unity(), vec![agent.self_info()]).map_err(|e| {
            MeshError::SpawnProcs {
                name: name.to_string(),
                reason: e.to_string(),
            }
        })?;
        let mesh = own.spawn_as(
            agent,
            owner,
            random_id(),
            name,
            class.to_string(),
            ActorType::Foreign,
            parts,
        )?;
        meshes.insert(name.to_string(), mesh.clone());
        Ok(mesh)
    }
}

impl SingletonService for Singletons {
    fn on_request(
        &self,
        agent: &ProcAgent,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
        reply: PortId,
    ) {
        let owner = self.owner_or(agent.id());
        let result = self
            .get_or_spawn(agent, &owner, name, class, parts)
            .map_err(|e| RemoteError::new(RemoteErrorKind::Singleton, e));
        let reply = PortRef::<Result<ActorMeshRef, RemoteError>>::attest(reply);
        if let Err(e) = reply.send(agent.client(), result) {
            tracing::error!(agent = %agent.id(), "cannot answer a singleton request: {e}");
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl ProcAgent {
    /// Serves a new proc named `name` (uid prefix) on `transport` and starts its agent.
    ///
    /// # Errors
    ///
    /// [`MeshError::SpawnProcs`] if the proc cannot be served; as [`ProcAgent::new`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing stays served.
    pub async fn serve(
        transport: ChannelTransport,
        name: &str,
        options: AgentOptions,
    ) -> Result<Self, MeshError> {
        let proc = Proc::serve(transport, name)
            .await
            .map_err(|e| MeshError::SpawnProcs {
                name: name.to_string(),
                reason: e.to_string(),
            })?;
        Self::new(proc, options)
    }

    /// Starts the agent of `proc`. Must be called from within a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`MeshError::AgentExists`] if `proc` has an agent; [`MeshError::Agent`] if its
    /// mailbox cannot be created (the proc is stopped, or the name is taken).
    pub fn new(proc: Proc, options: AgentOptions) -> Result<Self, MeshError> {
        Self::start(proc, options, Arc::new(Singletons::default()))
    }

    /// The singleton actor `name` of this proc: spawned (a foreign actor made from
    /// `parts`, owned by `owner`) the first time it is asked for, the same mesh later.
    ///
    /// # Errors
    ///
    /// As [`crate::proc_mesh::ProcMesh::spawn_as`].
    pub fn singleton(
        &self,
        owner: &ActorId,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        Singletons::of(self).get_or_spawn(self, owner, name, class, parts)
    }

    /// Makes `owner` the owner of the singletons this agent spawns at other processes'
    /// request (the process's root client, whose owner hooks then hear of them).
    pub fn set_singleton_owner(&self, owner: ActorId) {
        *Singletons::of(self).owner.lock() = Some(owner);
    }

    /// Asks the agent of `proc` for its singleton `name` (see [`ProcAgent::singleton`]);
    /// `sender` (a mailbox of this process) receives the answer.
    ///
    /// # Errors
    ///
    /// [`MeshError::Host`] naming `proc` if the request cannot be sent or answered;
    /// [`MeshError::Remote`] naming `proc` with its agent's error (of kind
    /// [`crate::error::RemoteErrorKind::Singleton`]) if it could not make the singleton.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn remote_singleton(
        &self,
        sender: &impl SendContext,
        proc: &ProcId,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        if proc == self.proc().proc_id() {
            let owner = Singletons::of(self).owner_or(sender.actor_id());
            return self.singleton(&owner, name, class, parts);
        }
        let (port, receiver) = sender
            .mailbox()
            .open_once_port::<Result<ActorMeshRef, RemoteError>>();
        self.send_control(
            proc,
            &Control::Singleton {
                name: name.to_string(),
                class: class.to_string(),
                parts,
                reply: port.port_id().clone(),
            },
        );
        receiver
            .recv()
            .await
            .map_err(|e| MeshError::Host {
                host: proc.clone(),
                reason: e.to_string(),
            })?
            .map_err(|error| MeshError::Remote {
                host: proc.clone(),
                error,
            })
    }
}
