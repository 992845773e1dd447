#![doc = include_str!("../README.md")]

pub mod actor;
pub mod channel;
pub mod client;
pub mod context;
pub mod error;
pub mod id;
pub mod mailbox;
pub mod message;
pub mod port;
pub mod proc;
mod router;
pub mod supervision;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use actor::{Actor, ActorHandle, ActorRef, Binder, Context, Handler};
pub use channel::{ChannelAddr, ChannelTransport};
pub use client::Client;
pub use context::SendContext;
pub use error::BoxError;
pub use id::{ActorId, PortId, ProcId};
pub use port::{OncePortReceiver, OncePortRef, PortReceiver, PortRef};
pub use proc::Proc;
pub use supervision::{ActorStatus, SupervisionEvent};

/// Runs the code blocks of `docs/hyperactor.md` as doctests, so the guide cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../../docs/hyperactor.md")]
pub struct DocsHyperactorGuide;
