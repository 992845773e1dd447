#![doc = include_str!("../README.md")]

pub mod bootstrap;
pub mod error;
pub mod host;
pub mod inbox;
pub mod shape;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod value_mesh;

pub use bootstrap::{bootstrap_proc, BootInfo, BootstrapCommand, ProcReady};
pub use error::{BootstrapError, HostError};
pub use host::{Host, ProcExit, ProcHandle, ProcStatus};
pub use shape::{Extent, Point, Shape, ShapeError, Slice, SplitSpec};
pub use value_mesh::ValueMesh;
