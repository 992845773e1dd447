#![doc = include_str!("../README.md")]

pub mod actor_mesh;
pub mod agent;
pub mod bootstrap;
pub mod cast;
pub mod deferred;
pub mod error;
pub mod failure_desk;
pub mod host;
pub mod host_mesh;
pub mod monitor;
pub mod output;
pub mod proc_mesh;
pub mod shape;
mod singleton;
pub mod supervision;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod value_mesh;
pub mod worker;

pub use actor_mesh::{reply, reply_error, route, ActorMesh, ActorMeshRef, Request};
pub use agent::{AgentOptions, ProcAgent};
pub use bootstrap::{bootstrap_proc, BootInfo, BootstrapCommand, ProcCommands, ProcReady};
pub use error::{BootstrapError, CodecError, HostError, MeshError};
pub use host::{Host, ProcExit, ProcHandle, ProcStatus};
pub use host_mesh::HostMesh;
pub use proc_mesh::ProcMesh;
pub use shape::{Extent, Point, Shape, ShapeError, Slice, SplitSpec};
pub use supervision::{FailureCause, MeshFailure};
pub use value_mesh::ValueMesh;
