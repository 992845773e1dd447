//! Supervision: how failures travel from an actor to its owner.
//!
//! Every actor has an owner: the actor (or client) that spawned it, or, for actors
//! spawned directly on a [`crate::proc::Proc`], the proc itself. When an actor fails —
//! a handler returns an error or panics, `new`/`init` fails, or it does not handle a
//! failure of its own child — it:
//!
//! 1. stops its children;
//! 2. closes its mailbox, returning every queued message to its sender (DEL-1);
//! 3. sends one [`SupervisionEvent`] to its owner (SUP-1: exactly one event per failure).
//!
//! The owner's [`crate::actor::Actor::handle_supervision_event`] decides: `Ok(true)`
//! means handled (the owner carries on); `Ok(false)` or an error passes the failure up —
//! the owner fails too, with an event whose [`SupervisionEvent::caused_by`] is the
//! child's event, so the chain of causes reaches the top intact (SUP-2).
//!
//! A client receives events for the actors it spawned on its supervision port
//! ([`crate::client::Client::next_supervision_event`]); a proc collects events for the
//! actors it owns ([`crate::proc::Proc::next_supervision_event`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::ActorId;

/// The lifecycle state of an actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ActorStatus {
    /// Spawned; `new`/`init` not yet run.
    Created,
    /// Running `new` and `init`.
    Initializing,
    /// Waiting for a message.
    Idle,
    /// Handling a message.
    Processing,
    /// Stopping: its children are being stopped.
    Stopping,
    /// Stopped gracefully (terminal).
    Stopped,
    /// Failed (terminal), with the reason.
    Failed(String),
}

impl ActorStatus {
    /// True for [`ActorStatus::Stopped`] and [`ActorStatus::Failed`].
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Stopped | Self::Failed(_))
    }

    /// True for [`ActorStatus::Failed`].
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

impl fmt::Display for ActorStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Created => f.write_str("created"),
            Self::Initializing => f.write_str("initializing"),
            Self::Idle => f.write_str("idle"),
            Self::Processing => f.write_str("processing"),
            Self::Stopping => f.write_str("stopping"),
            Self::Stopped => f.write_str("stopped"),
            Self::Failed(reason) => write!(f, "failed: {reason}"),
        }
    }
}

/// A report, sent to an owner, that one of its actors failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisionEvent {
    /// The actor that failed.
    pub actor_id: ActorId,
    /// Why it failed, in words.
    pub reason: String,
    /// The event that caused this failure, when the actor failed because it did not
    /// handle a failure of its own child (SUP-2).
    pub caused_by: Option<Box<SupervisionEvent>>,
    /// Details in a form that a layer above defines, kept through the chain: the mesh
    /// layer attaches what failed in mesh terms (mesh, rank, process, cause). `None`
    /// for failures the runtime reports on its own.
    pub detail: Option<bytes::Bytes>,
}

impl SupervisionEvent {
    /// An event saying that `actor_id` failed for `reason`, with no cause or detail.
    pub fn new(actor_id: ActorId, reason: impl Into<String>) -> Self {
        Self {
            actor_id,
            reason: reason.into(),
            caused_by: None,
            detail: None,
        }
    }

    /// The first failure in the chain: the event that started it all.
    pub fn root_cause(&self) -> &SupervisionEvent {
        let mut event = self;
        while let Some(cause) = &event.caused_by {
            event = cause;
        }
        event
    }
}

impl fmt::Display for SupervisionEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "actor {} failed: {}", self.actor_id, self.reason)?;
        if let Some(cause) = &self.caused_by {
            write!(f, "; caused by: {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SupervisionEvent {}
