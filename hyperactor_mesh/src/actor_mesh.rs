//! Actor meshes: one actor per proc of a proc mesh, addressed together.
//!
//! [`ProcMesh::spawn`](crate::proc_mesh::ProcMesh::spawn) casts a spawn to every proc of
//! a view and returns an [`ActorMesh<A>`] at once: the actors are created in the order
//! of the spawner's messages (ORD-1), so a message sent right after the spawn is handled
//! after the actor's construction. The mesh's actors all have the same name (the
//! mesh's name and a unique suffix, index 0) on their procs.
//!
//! An actor mesh is a *view* (a [`Shape`] over the proc mesh's ranks): `select`,
//! `select_range`, `split`, `rename` and `flatten` give views that address fewer actors
//! or the same ones differently, sharing the mesh. Every message to a view is a cast
//! (see [`crate::cast`]): serialized once, fanned out over a tree of procs.
//!
//! - [`ActorMesh::cast`]: fire and forget, to every actor of the view.
//! - [`ActorMesh::call`]: a [`Request`] to every actor, whose replies (sent by the
//!   handler with [`reply`]) come back reduced over the tree and are gathered into a
//!   [`ValueMesh`] shaped like the view.
//! - [`ActorMesh::stop`]: stops the actors (after the messages sent to them before).
//!
//! The mesh's owner (the actor that spawned it) receives each failed rank's
//! [`MeshFailure`](crate::supervision::MeshFailure); calls to a failed rank fail with
//! [`MeshError::Call`] instead of waiting.
//!
//! A handler learns where its message came from with [`route`] (its position in the
//! view) and answers a call with [`reply`] (or [`reply_error`]).

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use hyperactor::actor::Context;
use hyperactor::message::{handler_port, Serialized};
use hyperactor::{Actor, ActorId, Handler, PortRef, SendContext};
use serde::{Deserialize, Serialize};

use crate::agent::{CallReplies, CastOutcome, CastTarget, ProcAgent, ProcInfo};
use crate::cast::codec::{CastKind, MeshInfo, ReplyMode, ReplyTo, Route, ViewExtent};
use crate::cast::reply::{encode_reply, ReplyItem, ReplyStatus};
use crate::error::MeshError;
use crate::shape::{Extent, Shape, ShapeError, SplitSpec};
use crate::value_mesh::ValueMesh;

/// A message that expects a reply: the handler answers with [`reply`], and
/// [`ActorMesh::call`] gathers the replies into a [`ValueMesh<Self::Reply>`].
pub trait Request: hyperactor::message::Message {
    /// The type of each actor's reply.
    type Reply: hyperactor::message::Message;
}

/// What every view of one actor mesh shares.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MeshCore {
    pub(crate) info: MeshInfo,
    /// The actors' name on every proc.
    pub(crate) actor: String,
    /// The procs, by global rank of the proc mesh.
    pub(crate) procs: Vec<ProcInfo>,
    /// The proc mesh's extent (global ranks are row-major in it).
    pub(crate) extent: Extent,
}

/// A view of an actor mesh of any actor type: the part of [`ActorMesh`] that does not
/// depend on the actor's type (foreign meshes use it directly). Serializable, as a
/// reference: whoever receives it can message the actors; supervision stays with the
/// owner. Clones are cheap.
#[derive(Debug, Clone)]
pub struct ActorMeshRef {
    core: Arc<MeshCore>,
    shape: Shape,
    /// The view's cast targets, computed at its first cast and shared by its clones.
    targets: TargetsOnce,
}

/// A view's cast targets once computed (not part of the reference: not sent, not shown).
#[derive(Clone, Default)]
struct TargetsOnce(Arc<std::sync::OnceLock<Arc<[CastTarget]>>>);

impl std::fmt::Debug for TargetsOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

#[derive(Serialize, Deserialize)]
struct WireRef {
    core: MeshCore,
    shape: Shape,
}

impl Serialize for ActorMeshRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&*self.core, &self.shape).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ActorMeshRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let WireRef { core, shape } = WireRef::deserialize(d)?;
        Ok(Self {
            core: Arc::new(core),
            shape,
            targets: TargetsOnce::default(),
        })
    }
}

impl ActorMeshRef {
    pub(crate) fn new(
        info: MeshInfo,
        actor: String,
        procs: Vec<ProcInfo>,
        extent: Extent,
        shape: Shape,
    ) -> Self {
        Self {
            core: Arc::new(MeshCore {
                info,
                actor,
                procs,
                extent,
            }),
            shape,
            targets: TargetsOnce::default(),
        }
    }

    /// The mesh: id, name, actor type.
    pub fn info(&self) -> &MeshInfo {
        &self.core.info
    }

    /// The actors' name on their procs (all index 0).
    pub fn actor_name(&self) -> &str {
        &self.core.actor
    }

    /// The id of the actor at global rank `rank`, if there is such a rank.
    pub fn actor_id(&self, rank: usize) -> Option<ActorId> {
        let proc = &self.core.procs.get(rank)?.proc_id;
        proc.actor_id(&self.core.actor, 0).ok()
    }

    /// The view.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The view's extent.
    pub fn extent(&self) -> Extent {
        self.shape.extent()
    }

    /// How many actors the view has.
    pub fn len(&self) -> usize {
        self.shape.len()
    }

    /// Whether the view has no actors.
    pub fn is_empty(&self) -> bool {
        self.shape.is_empty()
    }

    /// The procs of the whole mesh, by global rank.
    pub fn procs(&self) -> &[ProcInfo] {
        &self.core.procs
    }

    /// The same mesh seen through `shape` (whose ranks must be the mesh's ranks).
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
            targets: TargetsOnce::default(),
        })
    }

    /// Every actor of the view as a cast target: its index in the view and its proc.
    pub fn targets(&self) -> Vec<CastTarget> {
        self.shape
            .iter()
            .enumerate()
            .map(|(index, rank)| self.core.procs[rank].target(index as u32))
            .collect()
    }

    /// [`ActorMeshRef::targets`], computed once per view (a view is usually cast to
    /// many times).
    fn cast_targets(&self) -> &[CastTarget] {
        self.targets.0.get_or_init(|| self.targets().into())
    }

    /// The view's extent as casts carry it.
    pub fn view_extent(&self) -> ViewExtent {
        ViewExtent::new(
            self.shape.labels().to_vec(),
            self.shape.slice().sizes().to_vec(),
        )
    }

    /// Checks that a message with payload `parts` fits in a frame.
    ///
    /// # Errors
    ///
    /// [`MeshError::TooLarge`] if it is over [`crate::cast::max_message_len`].
    pub fn check_message_len(&self, parts: &[Bytes]) -> Result<(), MeshError> {
        let bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let max = crate::cast::max_message_len();
        if bytes > max {
            return Err(MeshError::TooLarge {
                mesh: self.core.info.name.clone(),
                bytes,
                max,
            });
        }
        Ok(())
    }

    /// Casts `parts` to every actor of the view (see [`ProcAgent::cast`]); check their
    /// size first with [`ActorMeshRef::check_message_len`] (a message over it is
    /// answered as undeliverable).
    pub fn cast_parts(
        &self,
        agent: &ProcAgent,
        origin: &ActorId,
        kind: CastKind,
        mode: ReplyMode,
        reply: Option<ReplyTo>,
        parts: Vec<Bytes>,
    ) -> CastOutcome {
        let targets = self.cast_targets();
        agent.watch(targets);
        agent.cast(
            origin,
            &self.core.actor,
            kind,
            &self.view_extent(),
            targets,
            mode,
            reply,
            parts,
        )
    }

    /// Stops every actor of the view (after the messages sent to it before) and waits,
    /// each actor bounded by its agent's stop timeout.
    ///
    /// # Errors
    ///
    /// [`MeshError::NoAgent`] if `cx`'s proc has no agent.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stop is cast before the first await.
    pub async fn stop(&self, cx: &impl SendContext, reason: &str) -> Result<(), MeshError> {
        let agent = agent_of(cx)?;
        agent.mark_stopped(self.core.info.id);
        let replies = CallReplies::open_all(&agent, 0..self.len() as u32);
        let kind = CastKind::Stop {
            reason: reason.to_string(),
        };
        let to = Some(replies.reply_to().clone());
        self.cast_parts(
            &agent,
            cx.actor_id(),
            kind,
            ReplyMode::Reduce,
            to,
            Vec::new(),
        );
        replies.wait().await;
        Ok(())
    }
}

/// The agent of `cx`'s proc.
pub(crate) fn agent_of(cx: &impl SendContext) -> Result<ProcAgent, MeshError> {
    let proc = cx.proc().proc_id();
    ProcAgent::of(proc).ok_or_else(|| MeshError::NoAgent { proc: proc.clone() })
}

/// A mesh of actors of type `A`: see the [module docs](self).
pub struct ActorMesh<A> {
    inner: ActorMeshRef,
    _actor: PhantomData<fn() -> A>,
}

impl<A> Clone for ActorMesh<A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            _actor: PhantomData,
        }
    }
}

impl<A> std::fmt::Debug for ActorMesh<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ActorMesh<{}>({:?}, {})",
            std::any::type_name::<A>(),
            self.inner.info().name,
            self.inner.extent()
        )
    }
}

impl<A> Serialize for ActorMesh<A> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.inner.serialize(s)
    }
}

impl<'de, A> Deserialize<'de> for ActorMesh<A> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self {
            inner: ActorMeshRef::deserialize(d)?,
            _actor: PhantomData,
        })
    }
}

impl<A: Actor> ActorMesh<A> {
    /// A typed mesh over `inner`, trusting the caller that its actors are `A`s.
    pub fn attest(inner: ActorMeshRef) -> Self {
        Self {
            inner,
            _actor: PhantomData,
        }
    }

    /// The untyped view.
    pub fn mesh_ref(&self) -> &ActorMeshRef {
        &self.inner
    }

    /// The view.
    pub fn shape(&self) -> &Shape {
        self.inner.shape()
    }

    /// The view's extent.
    pub fn extent(&self) -> Extent {
        self.inner.extent()
    }

    /// How many actors the view has.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the view has no actors.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn with_shape(&self, shape: Result<Shape, ShapeError>) -> Result<Self, ShapeError> {
        Ok(Self {
            inner: self.inner.view(shape?)?,
            _actor: PhantomData,
        })
    }

    /// The view keeping only coordinate `index` of dimension `label` (removed).
    ///
    /// # Errors
    ///
    /// As [`Shape::select`].
    pub fn select(&self, label: &str, index: usize) -> Result<Self, ShapeError> {
        self.with_shape(self.shape().select(label, index))
    }

    /// The view keeping coordinates `start..stop` by `step` of dimension `label`.
    ///
    /// # Errors
    ///
    /// As [`Shape::select_range`].
    pub fn select_range(
        &self,
        label: &str,
        start: usize,
        stop: usize,
        step: usize,
    ) -> Result<Self, ShapeError> {
        self.with_shape(self.shape().select_range(label, start, stop, step))
    }

    /// The view with dimensions split as `spec` says.
    ///
    /// # Errors
    ///
    /// As [`Shape::split`].
    pub fn split(&self, spec: &SplitSpec) -> Result<Self, ShapeError> {
        self.with_shape(self.shape().split(spec))
    }

    /// The view with dimension `old` renamed `new`.
    ///
    /// # Errors
    ///
    /// As [`Shape::rename`].
    pub fn rename(&self, old: &str, new: &str) -> Result<Self, ShapeError> {
        self.with_shape(self.shape().rename([(old, new)]))
    }

    /// The view with every dimension merged into one named `label` (dense views only).
    ///
    /// # Errors
    ///
    /// As [`Shape::flatten`].
    pub fn flatten(&self, label: &str) -> Result<Self, ShapeError> {
        self.with_shape(self.shape().flatten(label))
    }

    /// Sends `message` to every actor of the view, without waiting for anything.
    ///
    /// # Errors
    ///
    /// [`MeshError::Message`] if `message` cannot be serialized, [`MeshError::TooLarge`]
    /// if it is over [`crate::cast::max_message_len`], [`MeshError::NoAgent`] if `cx`'s
    /// proc has no agent.
    pub fn cast<M>(&self, cx: &impl SendContext, message: &M) -> Result<(), MeshError>
    where
        M: hyperactor::message::Message,
        A: Handler<M>,
    {
        let agent = agent_of(cx)?;
        let parts = Serialized::encode(message)?.into_parts();
        self.inner.check_message_len(&parts)?;
        let kind = CastKind::Message {
            port: handler_port::<M>(),
        };
        self.inner
            .cast_parts(&agent, cx.actor_id(), kind, ReplyMode::None, None, parts);
        Ok(())
    }

    /// Sends `message` to every actor of the view and gathers their replies into a
    /// [`ValueMesh`] shaped like the view (replies reduced over the cast tree).
    ///
    /// # Errors
    ///
    /// [`MeshError::Call`] naming the first rank that raised an error or cannot answer
    /// (its actor failed or stopped, its proc died); [`MeshError::BadReply`] if a reply
    /// does not decode; as [`ActorMesh::cast`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: later replies are dropped.
    pub async fn call<M>(
        &self,
        cx: &impl SendContext,
        message: &M,
    ) -> Result<ValueMesh<M::Reply>, MeshError>
    where
        M: Request,
        A: Handler<M>,
    {
        let agent = agent_of(cx)?;
        let parts = Serialized::encode(message)?.into_parts();
        self.inner.check_message_len(&parts)?;
        let n = self.len() as u32;
        let replies = CallReplies::open(&agent, 0..n);
        let kind = CastKind::Message {
            port: handler_port::<M>(),
        };
        let to = Some(replies.reply_to().clone());
        {
            // Calls issued without waiting for each other go out in batches.
            let _batched = hyperactor::channel::QueueWrites::new(replies.follows_pending());
            self.inner
                .cast_parts(&agent, cx.actor_id(), kind, ReplyMode::Reduce, to, parts);
        }
        let items = replies.wait().await;
        let what = format!(
            "call of {} on {:?}",
            std::any::type_name::<M>(),
            self.inner.info().name
        );
        let values = decode_items::<M::Reply>(&what, items)?;
        ValueMesh::new(self.shape().clone(), values).map_err(|e| MeshError::BadReply {
            what,
            rank: 0,
            reason: e.to_string(),
        })
    }

    /// Stops every actor of the view; see [`ActorMeshRef::stop`].
    ///
    /// # Errors
    ///
    /// As [`ActorMeshRef::stop`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn stop(&self, cx: &impl SendContext, reason: &str) -> Result<(), MeshError> {
        self.inner.stop(cx, reason).await
    }
}

/// The values of a call's items, by index; the first error or failure instead.
fn decode_items<R: serde::de::DeserializeOwned>(
    what: &str,
    items: Vec<ReplyItem>,
) -> Result<Vec<R>, MeshError> {
    if let Some(bad) = items.iter().find(|i| i.status != ReplyStatus::Ok) {
        return Err(MeshError::Call {
            what: what.to_string(),
            rank: bad.index,
            failed: bad.is_unanswered(),
            reason: bad
                .parts
                .first()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_default(),
        });
    }
    items
        .into_iter()
        .map(|item| {
            let bytes = item.parts.first().map(|b| &b[..]).unwrap_or_default();
            bincode::deserialize(bytes).map_err(|e| MeshError::BadReply {
                what: what.to_string(),
                rank: item.index,
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The route of the message being handled, when it came by a cast: the receiver's
/// position in the view, the view's extent, and where its reply goes.
pub fn route<A: Actor>(cx: &Context<A>) -> Option<Route> {
    Route::decode(&cx.extra()?).ok()
}

fn send_reply<A: Actor>(cx: &Context<A>, item: ReplyItem) -> Result<bool, MeshError> {
    let Some(route) = route(cx) else {
        return Ok(false);
    };
    let Some(ReplyTo { port, key }) = route.reply else {
        return Ok(false);
    };
    let item = ReplyItem {
        index: route.index,
        ..item
    };
    PortRef::<Vec<Bytes>>::attest(port)
        .send_serialized(cx, Serialized::from_parts(encode_reply(key, &[item])));
    Ok(true)
}

/// Answers the message being handled with `value` (to the caller of
/// [`ActorMesh::call`], through the reducer of its subtree). Returns false when the
/// message expects no reply (it was not a call).
///
/// # Errors
///
/// [`MeshError::Message`] if `value` cannot be serialized.
pub fn reply<A: Actor, R: Serialize>(cx: &Context<A>, value: &R) -> Result<bool, MeshError> {
    let parts = Serialized::encode(value)?.into_parts();
    send_reply(cx, ReplyItem::ok(0, parts))
}

/// Answers the message being handled with an error: the caller's call fails with
/// [`MeshError::Call`] carrying `message`; the actor lives on. Returns false when the
/// message expects no reply.
///
/// # Errors
///
/// Never in practice; kept for symmetry with [`reply`].
pub fn reply_error<A: Actor>(cx: &Context<A>, message: &str) -> Result<bool, MeshError> {
    send_reply(
        cx,
        ReplyItem::error(0, vec![Bytes::copy_from_slice(message.as_bytes())]),
    )
}
