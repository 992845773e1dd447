//! The cast codec: the header that travels with a cast from node to node, and the
//! route each receiver's message carries.
//!
//! A cast frame is sent to the *cast port* of a proc's agent. Its first part is a
//! bincode [`CastHeader`]; the other parts are the user's (the serialized message),
//! forwarded untouched. The header names the target actor (the same name on every
//! proc of the mesh), what to do with it ([`CastKind`]), where replies go, the view's
//! extent, and the receivers of this node's chunk, each with its index in the view,
//! its proc, and a sequence number (ORD-1, see [`super::order`]).
//!
//! A message delivered to an actor carries a [`Route`] in its envelope's extra header
//! ([`hyperactor::message::EnvelopeHeader::extra`]): the receiver's index in the view,
//! the view's extent, the hops it took and where its reply goes.
//!
//! ```
//! use hyperactor_mesh::cast::codec::{Route, ViewExtent};
//!
//! let route = Route {
//!     index: 3,
//!     hops: 2,
//!     view: ViewExtent::new(vec!["gpus".into()], vec![8]),
//!     reply: None,
//! };
//! assert_eq!(Route::decode(&route.encode().unwrap()).unwrap(), route);
//! ```

use bytes::Bytes;
use hyperactor::{ActorId, PortId, ProcId};
use serde::{Deserialize, Serialize};

use crate::error::CodecError;

/// The extent of the view a cast was sent to: its dimension names and sizes (the
/// receivers' positions are row-major indices into it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ViewExtent {
    /// Dimension names, outermost first.
    pub labels: Vec<String>,
    /// Dimension sizes, in the order of `labels`.
    pub sizes: Vec<usize>,
}

impl ViewExtent {
    /// The extent of `labels` and `sizes` (same lengths).
    pub fn new(labels: Vec<String>, sizes: Vec<usize>) -> Self {
        Self { labels, sizes }
    }

    /// The number of positions: the product of the sizes (1 for no dimension).
    pub fn len(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Whether the extent has no positions (a dimension of size 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where the replies of a cast go: a port of an agent's reply router and the key that
/// selects the collector (or reducer) there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplyTo {
    /// The reply port.
    pub port: PortId,
    /// The key of the collector or reducer.
    pub key: u64,
}

/// How a cast's receivers reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplyMode {
    /// Nobody replies.
    None,
    /// Every receiver replies straight to the reply target.
    Direct,
    /// Replies are reduced on the way up: the reply target receives one message per
    /// top-level subtree.
    Reduce,
}

/// The mesh an actor belongs to, as its supervision reports name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshInfo {
    /// A process-unique id of the mesh, chosen by its spawner.
    pub id: u64,
    /// The name given to the spawn.
    pub name: String,
    /// The actor type, as users know it (a Rust type name, a Python class).
    pub class: String,
}

/// How to create the actor of a spawn cast.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActorType {
    /// A Rust actor type registered with the receiving agent under this name; the user
    /// parts are its bincode params.
    Native {
        /// The registered type name.
        type_name: String,
    },
    /// An actor of another language, created by the agent's foreign spawner from the
    /// user parts (for Python: the pickled class and arguments).
    Foreign,
}

/// What a spawn cast creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnSpec {
    /// The mesh the actors form.
    pub mesh: MeshInfo,
    /// The actor that owns the mesh: it receives its failures.
    pub owner: ActorId,
    /// How to create each actor.
    pub actor_type: ActorType,
}

/// What a cast does at each receiver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CastKind {
    /// Delivers the user parts to handler port `port` of the target actor.
    Message {
        /// The handler port number.
        port: u64,
    },
    /// Creates the target actor.
    Spawn(Box<SpawnSpec>),
    /// Stops the target actor (after the messages sent to it before), then replies.
    Stop {
        /// Why, for the actor's logs and later callers.
        reason: String,
    },
    /// Replies once the target actor has started, or with the failure that stopped it.
    Probe,
}

/// One receiver of a node's chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its index in the view.
    pub index: u32,
    /// The sequence number of this cast among those of the same sender to the same
    /// actor (ORD-1).
    pub seq: u64,
    /// Its proc.
    pub proc: ProcId,
}

/// The first part of every cast frame: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CastHeader {
    /// The sending agent's sequencing id.
    pub sender: u64,
    /// The actor that sent the cast (the sender of every delivered message).
    pub origin: ActorId,
    /// The target actor's name, the same on every proc.
    pub actor: String,
    /// What to do at each receiver.
    pub kind: CastKind,
    /// How receivers reply.
    pub mode: ReplyMode,
    /// Where replies go (for [`ReplyMode::Reduce`], this node's parent).
    pub reply: Option<ReplyTo>,
    /// The extent of the view cast to.
    pub view: ViewExtent,
    /// How many hops the frame took so far (1: straight from the sender).
    pub hops: u8,
    /// The fan-out of the tree.
    pub fanout: u16,
    /// This node's chunk: this node first, then the receivers it relays to.
    pub entries: Vec<Entry>,
    /// Procs the sender knows are gone (the most recent ones): a receiver holding a
    /// message for a sequence gap learns from this that the gap may never fill (the
    /// missing message may have died with a relay), see [`super::order`].
    pub dead: Vec<ProcId>,
}

/// A [`CastHeader`] by reference, with its per-chunk fields given apart: encoding a
/// chunk's header copies nothing but the bytes (same layout as [`CastHeader`]).
#[derive(Serialize)]
struct HeaderRef<'a> {
    sender: u64,
    origin: &'a ActorId,
    actor: &'a str,
    kind: &'a CastKind,
    mode: ReplyMode,
    reply: Option<&'a ReplyTo>,
    view: &'a ViewExtent,
    hops: u8,
    fanout: u16,
    entries: &'a [Entry],
    dead: &'a [ProcId],
}

impl CastHeader {
    /// The header's part.
    ///
    /// # Errors
    ///
    /// [`CodecError::Encode`] if bincode fails (it does not for these types).
    pub fn encode(&self) -> Result<Bytes, CodecError> {
        self.encode_chunk(self.hops, self.reply.as_ref(), &self.entries)
    }

    /// The part of this header for a chunk: with `hops`, `reply` and `entries` instead
    /// of its own (the rest shared, not copied).
    ///
    /// # Errors
    ///
    /// [`CodecError::Encode`] if bincode fails (it does not for these types).
    pub fn encode_chunk(
        &self,
        hops: u8,
        reply: Option<&ReplyTo>,
        entries: &[Entry],
    ) -> Result<Bytes, CodecError> {
        let header = HeaderRef {
            sender: self.sender,
            origin: &self.origin,
            actor: &self.actor,
            kind: &self.kind,
            mode: self.mode,
            reply,
            view: &self.view,
            hops,
            fanout: self.fanout,
            entries,
            dead: &self.dead,
        };
        bincode::serialize(&header)
            .map(Bytes::from)
            .map_err(|e| CodecError::Encode(e.to_string()))
    }

    /// Decodes a header part.
    ///
    /// # Errors
    ///
    /// [`CodecError::Header`] if the part is not a cast header.
    pub fn decode(part: &[u8]) -> Result<Self, CodecError> {
        decode_bounded(part).map_err(|e| CodecError::Header(e.to_string()))
    }
}

/// What a delivered message carries about its cast: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The receiver's index in the view.
    pub index: u32,
    /// How many procs the message passed through to get here (1: sent directly).
    pub hops: u8,
    /// The extent of the view cast to.
    pub view: ViewExtent,
    /// Where the receiver's reply goes (`None`: nobody waits for one).
    pub reply: Option<ReplyTo>,
}

impl Route {
    /// The route's bytes (the envelope's extra header).
    ///
    /// # Errors
    ///
    /// [`CodecError::Encode`] if bincode fails (it does not for these types).
    pub fn encode(&self) -> Result<Bytes, CodecError> {
        bincode::serialize(self)
            .map(Bytes::from)
            .map_err(|e| CodecError::Encode(e.to_string()))
    }

    /// Decodes a route.
    ///
    /// # Errors
    ///
    /// [`CodecError::Route`] if the bytes are not a route.
    pub fn decode(part: &[u8]) -> Result<Self, CodecError> {
        decode_bounded(part).map_err(|e| CodecError::Route(e.to_string()))
    }
}

use bincode::Options as _;

/// Decodes a bincode value from `part`, never allocating more than the part holds (a
/// length field claiming more is an error).
fn decode_bounded<T: serde::de::DeserializeOwned>(part: &[u8]) -> Result<T, bincode::Error> {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(part.len() as u64)
        .deserialize(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CastHeader {
        let proc: ProcId = "p-1@unix:/tmp/x.sock".parse().unwrap();
        CastHeader {
            sender: 9,
            origin: proc.actor_id("client", 0).unwrap(),
            actor: "trainers-1f".into(),
            kind: CastKind::Message { port: 1 << 63 | 5 },
            mode: ReplyMode::Reduce,
            reply: Some(ReplyTo {
                port: proc.actor_id("mesh", 0).unwrap().port_id(3),
                key: 12,
            }),
            view: ViewExtent::new(vec!["hosts".into(), "gpus".into()], vec![2, 4]),
            hops: 1,
            fanout: 16,
            entries: (0..8)
                .map(|i| Entry {
                    index: i,
                    seq: u64::from(i) + 1,
                    proc: proc.clone(),
                })
                .collect(),
            dead: vec![proc.clone()],
        }
    }

    #[test]
    fn headers_round_trip() {
        let header = sample();
        assert_eq!(
            CastHeader::decode(&header.encode().unwrap()).unwrap(),
            header
        );
    }

    #[test]
    fn malformed_headers_and_routes_are_errors_not_panics() {
        let bytes = sample().encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(CastHeader::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // A length claiming more than the part holds is refused without allocating it.
        let mut huge = bytes.to_vec();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(CastHeader::decode(&huge).is_err());
        assert!(Route::decode(b"garbage").is_err());
    }
}
