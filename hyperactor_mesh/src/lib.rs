#![doc = include_str!("../README.md")]

pub mod agent;
pub mod bootstrap;
pub mod cast;
pub mod error;
pub mod host;
pub mod inbox;
pub mod rate_limit;
pub mod supervision;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use bootstrap::{bootstrap_proc, BootInfo, BootstrapCommand, ProcReady};
pub use agent::{AgentOptions, ProcAgent};
pub use error::{BootstrapError, CodecError, HostError, MeshError};
pub use supervision::{FailureCause, MeshFailure};
pub use host::{Host, ProcExit, ProcHandle, ProcStatus};
