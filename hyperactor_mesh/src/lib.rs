#![doc = include_str!("../README.md")]

pub mod bootstrap;
pub mod error;
pub mod host;
pub mod inbox;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use bootstrap::{bootstrap_proc, BootInfo, BootstrapCommand, ProcReady};
pub use error::{BootstrapError, HostError};
pub use host::{Host, ProcExit, ProcHandle, ProcStatus};
