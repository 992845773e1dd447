//! Proc meshes: procs (OS processes, each with an agent) laid out along named
//! dimensions, on which actor meshes are spawned.
//!
//! A [`ProcMesh`] comes from [`HostMesh::spawn_procs`](crate::host_mesh::HostMesh::spawn_procs)
//! (owned by the actor that asked for it) or from a reference received in a message.
//! Like an actor mesh it is a view: `select` and friends give sub-meshes sharing the
//! procs. [`ProcMesh::spawn`] creates one actor per proc of the view.
//!
//! ```no_run
//! # use hyperactor_mesh::proc_mesh::ProcMesh;
//! # use hyperactor::testing::Echo;
//! # async fn example(procs: ProcMesh, cx: &hyperactor::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let echoes = procs.spawn::<Echo>(cx, "echoes", &())?;
//! assert_eq!(echoes.len(), procs.len());
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use bytes::Bytes;
use hyperactor::message::Serialized;
use hyperactor::{Actor, SendContext};
use serde::{Deserialize, Serialize};

use crate::actor_mesh::{agent_of, ActorMesh, ActorMeshRef};
use crate::agent::{ProcInfo, Registry};
use crate::cast::codec::{ActorType, CastKind, MeshInfo, ReplyMode, SpawnSpec};
use crate::error::MeshError;
use crate::shape::{Extent, Shape, ShapeError};

#[derive(Debug, Serialize, Deserialize)]
struct ProcMeshCore {
    info: MeshInfo,
    /// The procs, by global rank (row-major in the mesh's extent).
    procs: Vec<ProcInfo>,
    extent: Extent,
}

/// A mesh of procs: see the [module docs](self). Serializable as a reference; clones
/// are cheap.
#[derive(Debug, Clone)]
pub struct ProcMesh {
    core: Arc<ProcMeshCore>,
    shape: Shape,
}

#[derive(Serialize, Deserialize)]
struct WireProcMesh {
    core: ProcMeshCore,
    shape: Shape,
}

impl Serialize for ProcMesh {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&*self.core, &self.shape).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ProcMesh {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let WireProcMesh { core, shape } = WireProcMesh::deserialize(d)?;
        Ok(Self {
            core: Arc::new(core),
            shape,
        })
    }
}

/// A mesh name as actor ids can carry it: characters ids reserve become `_`.
pub(crate) fn id_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if matches!(c, '@' | '/' | '[' | ']' | ':') || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if cleaned.is_empty() {
        "mesh".to_string()
    } else {
        cleaned
    }
}

impl ProcMesh {
    /// A proc mesh of `procs` (by global rank) laid out along `extent`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::ValueCountMismatch`] unless there is one proc per rank of `extent`.
    pub fn new(info: MeshInfo, extent: &Extent, procs: Vec<ProcInfo>) -> Result<Self, ShapeError> {
        if procs.len() != extent.num_ranks() {
            return Err(ShapeError::ValueCountMismatch {
                values: procs.len(),
                ranks: extent.num_ranks(),
                extent: extent.clone(),
            });
        }
        Ok(Self {
            core: Arc::new(ProcMeshCore {
                info,
                procs,
                extent: extent.clone(),
            }),
            shape: extent.region(),
        })
    }

    /// The mesh's name and id.
    pub fn info(&self) -> &MeshInfo {
        &self.core.info
    }

    /// The procs of the whole mesh, by global rank.
    pub fn procs(&self) -> &[ProcInfo] {
        &self.core.procs
    }

    /// The view.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The view's extent.
    pub fn extent(&self) -> Extent {
        self.shape.extent()
    }

    /// How many procs the view has.
    pub fn len(&self) -> usize {
        self.shape.len()
    }

    /// Whether the view has no procs.
    pub fn is_empty(&self) -> bool {
        self.shape.is_empty()
    }

    /// The same procs seen through `shape`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankOutOfRange`] if a rank of `shape` is not one of the mesh's.
    pub fn view(&self, shape: Shape) -> Result<Self, ShapeError> {
        let n = self.core.procs.len();
        if let Some(rank) = shape.iter().find(|&r| r >= n) {
            let extent = self.core.extent.clone();
            return Err(ShapeError::RankOutOfRange { rank, extent });
        }
        Ok(Self {
            core: Arc::clone(&self.core),
            shape,
        })
    }

    /// The view keeping only coordinate `index` of dimension `label` (removed).
    ///
    /// # Errors
    ///
    /// As [`Shape::select`].
    pub fn select(&self, label: &str, index: usize) -> Result<Self, ShapeError> {
        self.view(self.shape.select(label, index)?)
    }

    /// Stops every proc of the mesh (each gets its host's stop timeout, then is
    /// killed); their exits are not failures. Only the owner can stop a proc mesh. A
    /// host known lost is not waited on, and a silent one only until it is found lost
    /// ([`crate::agent::liveness`]).
    ///
    /// # Errors
    ///
    /// [`MeshError::NotOwner`] if no actor of `cx`'s process owns this mesh.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop requests are sent before the first await.
    pub async fn stop(&self, cx: &impl SendContext, reason: &str) -> Result<(), MeshError> {
        let agent = agent_of(cx)?;
        if agent.stop_owned(self.core.info.id, reason).await {
            Ok(())
        } else {
            Err(MeshError::NotOwner {
                what: format!("proc mesh {:?}", self.core.info.name),
                action: "stop",
            })
        }
    }

    /// Spawns one actor of type `A` (registered with every proc's agent) per proc of the
    /// view, with the same `params`, owned by `cx`'s actor. Returns at once: the spawn is
    /// cast before anything `cx` sends later, so later messages find the actors created.
    /// Construction failures reach the owner as mesh failures.
    ///
    /// # Errors
    ///
    /// [`MeshError::Message`] if `params` cannot be serialized; as
    /// [`ProcMesh::spawn_foreign`].
    pub fn spawn<A>(
        &self,
        cx: &impl SendContext,
        name: &str,
        params: &A::Params,
    ) -> Result<ActorMesh<A>, MeshError>
    where
        A: Actor,
        A::Params: Serialize,
    {
        let parts = Serialized::encode(params)?.into_parts();
        let actor_type = ActorType::Native {
            type_name: Registry::type_name::<A>(),
        };
        let class = std::any::type_name::<A>().to_string();
        let mesh = self.spawn_typed(cx, name, class, actor_type, parts)?;
        Ok(ActorMesh::attest(mesh))
    }

    /// Spawns one foreign actor (created by each proc's foreign spawner from `parts`)
    /// per proc of the view; see [`ProcMesh::spawn`]. `class` names the actor type in
    /// failure reports.
    ///
    /// # Errors
    ///
    /// [`MeshError::InvalidName`] for an empty name; [`MeshError::NoAgent`] if `cx`'s
    /// proc has no agent.
    pub fn spawn_foreign(
        &self,
        cx: &impl SendContext,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        self.spawn_typed(cx, name, class.to_string(), ActorType::Foreign, parts)
    }

    fn spawn_typed(
        &self,
        cx: &impl SendContext,
        name: &str,
        class: String,
        actor_type: ActorType,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        let agent = agent_of(cx)?;
        let id = crate::agent::random_id();
        self.spawn_as(&agent, cx.actor_id(), id, name, class, actor_type, parts)
    }

    /// Spawns actors like [`ProcMesh::spawn_foreign`], sent by `agent` on behalf of
    /// `owner` (an actor of the agent's process, which owns the new mesh), with the mesh
    /// id `id` (unique in the agent's process; see [`crate::agent::random_id`]).
    ///
    /// # Errors
    ///
    /// [`MeshError::InvalidName`] for an empty name.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn_as(
        &self,
        agent: &crate::agent::ProcAgent,
        owner: &hyperactor::ActorId,
        id: u64,
        name: &str,
        class: String,
        actor_type: ActorType,
        parts: Vec<Bytes>,
    ) -> Result<ActorMeshRef, MeshError> {
        if name.is_empty() {
            return Err(MeshError::InvalidName {
                name: name.to_string(),
                reason: "a mesh name must not be empty".into(),
            });
        }
        let info = MeshInfo {
            id,
            name: name.to_string(),
            class,
        };
        let actor = format!("{}-{id:016x}", id_name(name));
        let mesh = ActorMeshRef::new(
            info.clone(),
            actor.clone(),
            self.core.procs.clone(),
            self.core.extent.clone(),
            self.shape.clone(),
        );
        let ranks = self
            .shape
            .iter()
            .enumerate()
            .map(|(i, rank)| {
                let p = &self.core.procs[rank];
                (p.target(i as u32), Some(p.pid))
            })
            .collect();
        agent.register_owned_actors(
            info.clone(),
            owner.clone(),
            actor,
            mesh.view_extent(),
            ranks,
        );
        let spec = SpawnSpec {
            mesh: info,
            owner: owner.clone(),
            actor_type,
        };
        mesh.cast_parts(
            agent,
            owner,
            CastKind::Spawn(Box::new(spec)),
            ReplyMode::None,
            None,
            parts,
        );
        Ok(mesh)
    }
}
