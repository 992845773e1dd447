//! Messages, their serialized form, and the envelope they travel in.
//!
//! Any `Serialize + DeserializeOwned + Send + Sync + 'static` type is a [`Message`].
//! A message is serialized once, at the sender, into a [`Serialized`] value: a list of
//! byte parts. Typed Rust messages use one part (bincode); other encoders (Python's
//! pickle with out-of-band buffers) may use several, so large buffers travel as their
//! own parts and are never concatenated.
//!
//! An [`Envelope`] is a small [`EnvelopeHeader`] (sender, destination port, where to
//! return the message if it cannot be delivered) plus the payload parts. On the wire it
//! becomes one channel [`Frame`]: the bincode header, then the parts untouched.
//!
//! # Port numbers
//!
//! Port numbers with the top bit set ([`HANDLER_PORT_BIT`]) address an actor's
//! handlers: [`handler_port::<M>()`](handler_port) is derived from the message type's
//! name, so a sender can address the handler for `M` without asking the actor. Ports
//! opened at run time count up from 1 without that bit. Two handler ports are reserved
//! for the runtime: [`UNDELIVERABLE_PORT`] and [`SUPERVISION_PORT`].
//!
//! ```
//! use hyperactor::message::{handler_port, Serialized, HANDLER_PORT_BIT};
//!
//! let s = Serialized::encode(&(1u32, "two".to_string())).unwrap();
//! assert_eq!(s.decode::<(u32, String)>().unwrap(), (1, "two".to_string()));
//! assert_ne!(handler_port::<u32>() & HANDLER_PORT_BIT, 0);
//! ```

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::channel::Frame;
use crate::error::MessageError;
use crate::id::PortId;

/// A type that can be sent between actors.
///
/// Blanket-implemented for every serializable, sendable type. Handler ports are keyed by
/// [`std::any::type_name`], so both ends must be built from the same definition of the
/// type (the usual case: one binary, or one crate shared by both).
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Message for T {}

/// The bit that marks a port number as addressing an actor's handlers.
pub const HANDLER_PORT_BIT: u64 = 1 << 63;

/// The port to which undeliverable messages are returned (see [`Undeliverable`]).
pub const UNDELIVERABLE_PORT: u64 = HANDLER_PORT_BIT | 1;

/// The port on which an owner receives its children's supervision events.
pub const SUPERVISION_PORT: u64 = HANDLER_PORT_BIT | 2;

/// The handler port for messages of type `M`: FNV-1a of the type name, with the handler
/// bit set. The reserved runtime ports are never produced.
pub fn handler_port<M: Message>() -> u64 {
    handler_port_for_name(std::any::type_name::<M>())
}

/// The handler port for a message type of the given name (see [`handler_port`]).
pub fn handler_port_for_name(type_name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in type_name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Keep clear of the reserved runtime ports (small numbers).
    HANDLER_PORT_BIT | (h | 0x100)
}

/// A serialized message: one or more byte parts.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serialized {
    parts: Vec<Bytes>,
}

impl Serialized {
    /// Serializes `value` with bincode into a single part.
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Encode`] if the value cannot be serialized.
    pub fn encode<M: Serialize>(value: &M) -> Result<Self, MessageError> {
        let bytes = bincode::serialize(value).map_err(|source| MessageError::Encode {
            type_name: std::any::type_name::<M>(),
            source,
        })?;
        Ok(Self {
            parts: vec![Bytes::from(bytes)],
        })
    }

    /// Deserializes the first part as an `M` (the inverse of [`Serialized::encode`]).
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Decode`] if the bytes are not a valid `M`.
    pub fn decode<M: DeserializeOwned>(&self) -> Result<M, MessageError> {
        let first = self.parts.first().map(|b| &b[..]).unwrap_or_default();
        bincode::deserialize(first).map_err(|source| MessageError::Decode {
            type_name: std::any::type_name::<M>(),
            source,
        })
    }

    /// Wraps already-serialized parts (for encoders other than bincode).
    pub fn from_parts(parts: Vec<Bytes>) -> Self {
        Self { parts }
    }

    /// The parts.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Takes the parts.
    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// The total size in bytes.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// True when there are no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for Serialized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Serialized({} parts, {} bytes)",
            self.parts.len(),
            self.len()
        )
    }
}

/// The routing information of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeHeader {
    /// The actor that sent the message.
    pub sender: crate::id::ActorId,
    /// The port the message is for.
    pub dest: PortId,
    /// Where the message goes back if it cannot be delivered (DEL-1); `None` means it is
    /// dropped with an error log (used for returned messages themselves, so returns never
    /// loop).
    pub return_to: Option<PortId>,
    /// An opaque header for the layer above, delivered with the message: the mesh layer
    /// puts a cast's route here (the receiver's position in the view and where its reply
    /// goes). Handlers read it with [`crate::actor::Context::extra`]; `None` for plain
    /// messages.
    pub extra: Option<Bytes>,
}

/// A message in transit: header plus serialized payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Routing information.
    pub header: EnvelopeHeader,
    /// The serialized message.
    pub payload: Serialized,
}

impl Envelope {
    /// Turns the envelope into a channel frame (the header is serialized; the payload
    /// parts are moved, not copied).
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Encode`] if the header cannot be serialized.
    pub fn into_frame(self) -> Result<Frame, MessageError> {
        let header = bincode::serialize(&self.header).map_err(|source| MessageError::Encode {
            type_name: std::any::type_name::<EnvelopeHeader>(),
            source,
        })?;
        Ok(Frame::new(Bytes::from(header), self.payload.into_parts()))
    }

    /// Rebuilds an envelope from a frame made by [`Envelope::into_frame`].
    ///
    /// # Errors
    ///
    /// Returns [`MessageError::Decode`] if the frame header is not an envelope header.
    pub fn from_frame(frame: Frame) -> Result<Self, MessageError> {
        let header =
            bincode::deserialize(&frame.header).map_err(|source| MessageError::Decode {
                type_name: std::any::type_name::<EnvelopeHeader>(),
                source,
            })?;
        Ok(Self {
            header,
            payload: Serialized::from_parts(frame.parts),
        })
    }
}

/// A message that could not be delivered, returned to its sender (DEL-1).
///
/// Actors receive these through [`crate::actor::Actor::handle_undeliverable`]; the
/// default there fails the actor, so a lost message is never silent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undeliverable {
    /// The message that was not delivered.
    pub envelope: Envelope,
    /// Why, in words (names the destination).
    pub reason: String,
    /// Whether the link to the destination's proc failed (so that proc may be gone);
    /// false when the destination refused the message, or the message could not be
    /// sent at all (too large for a frame).
    pub link_failed: bool,
}

impl Undeliverable {
    /// `envelope` was refused (not a link failure) for `reason`.
    pub fn new(envelope: Envelope, reason: impl Into<String>) -> Self {
        Self {
            envelope,
            reason: reason.into(),
            link_failed: false,
        }
    }
}

impl std::fmt::Display for Undeliverable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "message from {} to {} was not delivered: {}",
            self.envelope.header.sender, self.envelope.header.dest, self.reason
        )
    }
}

impl std::error::Error for Undeliverable {}
