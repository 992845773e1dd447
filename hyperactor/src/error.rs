//! The errors of the hyperactor crate.
//!
//! Each fallible operation has its own enum, so a caller matches only on what can
//! actually happen. Display strings are lowercase, have no trailing period, and name the
//! ids involved (actor, port, address). Every enum is `#[non_exhaustive]`: new failure
//! modes may be added without a breaking change.
//!
//! Handlers and lifecycle hooks written by users return [`BoxError`], so any error type
//! can be propagated from them with `?`.

use crate::channel::ChannelError;
use crate::id::{ActorId, PortId, ProcId};

/// The error type returned by actor handlers and hooks: any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An id could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// A name contains a reserved character or is empty.
    #[error(
        "invalid name {name:?}: names must be non-empty and may not contain `@ / [ ] :` or \
         whitespace"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A printed id did not parse.
    #[error("cannot parse {input:?}: expected {expected}")]
    Parse {
        /// The rejected input.
        input: String,
        /// What was expected, in words.
        expected: &'static str,
    },
}

/// A message could not be serialized or deserialized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// Serializing a value of `type_name` failed.
    #[error("cannot serialize a message of type {type_name}: {source}")]
    Encode {
        /// The Rust type being serialized.
        type_name: &'static str,
        /// The serializer's error.
        #[source]
        source: bincode::Error,
    },
    /// Deserializing a value of `type_name` failed (the bytes were of another type, or
    /// corrupt).
    #[error("cannot deserialize a message as {type_name}: {source}")]
    Decode {
        /// The Rust type expected.
        type_name: &'static str,
        /// The deserializer's error.
        #[source]
        source: bincode::Error,
    },
}

/// Receiving from a port failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// The port can receive nothing more: its actor stopped or failed, or (for a once
    /// port) the sending side was dropped without sending.
    #[error("port {port} is closed")]
    Closed {
        /// The closed port.
        port: PortId,
    },
    /// A message arrived but was not of the port's type.
    #[error("port {port} received an undecodable message: {source}")]
    Decode {
        /// The receiving port.
        port: PortId,
        /// The decoding error.
        #[source]
        source: MessageError,
    },
}

/// A request/reply exchange ([`crate::context::SendContext::call`]) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The request could not be serialized.
    #[error(transparent)]
    Encode(#[from] MessageError),
    /// The request could not be delivered and came back (DEL-1).
    #[error("request to {dest} was not delivered: {reason}")]
    Undeliverable {
        /// The request's destination.
        dest: PortId,
        /// Why it was returned.
        reason: String,
    },
    /// The connection to the destination's proc failed while waiting for the reply.
    #[error("connection to {dest} failed while waiting for a reply: {error}")]
    LinkFailed {
        /// The request's destination.
        dest: PortId,
        /// The channel error.
        #[source]
        error: ChannelError,
    },
    /// The reply port failed.
    #[error(transparent)]
    Recv(#[from] RecvError),
}

/// Spawning an actor failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The actor name is not valid.
    #[error(transparent)]
    Name(#[from] IdError),
    /// The proc no longer accepts actors.
    #[error("proc {proc_id} is stopped and cannot spawn actor {name:?}")]
    ProcStopped {
        /// The stopped proc.
        proc_id: ProcId,
        /// The actor that was to be spawned.
        name: String,
    },
    /// The owner is stopping or has failed, so it cannot take a new child.
    #[error("actor {owner} is no longer running and cannot spawn child {name:?}")]
    OwnerStopped {
        /// The would-be owner.
        owner: ActorId,
        /// The child that was to be spawned.
        name: String,
    },
}

/// Starting or using a proc failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcError {
    /// The proc's channel could not be served.
    #[error("cannot serve proc: {0}")]
    Channel(#[from] ChannelError),
    /// The proc's id is invalid.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The proc could not attach to its gateway ([`crate::Proc::attach`]); the error
    /// names the gateway and says why.
    #[error(transparent)]
    Attach(#[from] crate::channel::AttachError),
}
