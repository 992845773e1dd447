#![doc = include_str!("../README.md")]

pub mod buffer;
pub mod cma;
mod error;
pub mod ibverbs;
pub mod region;
pub mod tcp;

pub use buffer::{Backend, Buffer, Policy};
pub use error::RdmaError;
pub use region::{Registry, RemoteRegion};
