//! [`IbvError`]: why libibverbs, the device or a peer's queue-pair address cannot be
//! used. The device's error is cached for the life of the process, so it is `Clone`:
//! OS errors are kept as their errno.

use super::sys::LIBRARY;
use super::{GID_INDEX_ENV, REASON_MISSING, REASON_NO_DEVICE};

/// Why the ibverbs backend could not load its library, open its device or connect to
/// a peer. Each message names the library, device, port or peer field at fault and
/// says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IbvError {
    /// `dlopen` could not load libibverbs.
    #[error("{}", REASON_MISSING)]
    LibraryMissing,
    /// libibverbs lacks a function this backend calls.
    #[error(
        "{} has no function {symbol}: it is too old or not rdma-core's libibverbs",
        LIBRARY
    )]
    MissingSymbol {
        /// The function's name.
        symbol: &'static str,
    },
    /// libibverbs lists no RDMA device (or not the one asked for).
    #[error("{}", REASON_NO_DEVICE)]
    NoDevice,
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({device}): {}", os_error(.errno))]
    OpenDevice {
        /// The device's name (e.g. `mlx5_0`).
        device: String,
        /// What the library reported.
        errno: i32,
    },
    /// `ibv_query_device` failed.
    #[error("ibv_query_device({device}): {}", os_error(.errno))]
    QueryDevice {
        /// The device's name.
        device: String,
        /// What the library reported.
        errno: i32,
    },
    /// No port of the device is active.
    #[error(
        "the RDMA device {device} has no active port ({}); check the cable and \
         `ibv_devinfo`",
        join(.ports)
    )]
    NoActivePort {
        /// The device's name.
        device: String,
        /// What each port reported.
        ports: Vec<PortState>,
    },
    /// The GID index named in the environment is not a number in 0..=255.
    #[error("{}={value:?} is not a GID index (0..=255)", GID_INDEX_ENV)]
    BadGidIndex {
        /// The environment's value.
        value: String,
    },
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid({device}, port {port}, index {index}): {}", os_error(.errno))]
    QueryGid {
        /// The device's name.
        device: String,
        /// The port number.
        port: u8,
        /// The GID table index.
        index: u8,
        /// What the library reported.
        errno: i32,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd({device}): {}", os_error(.errno))]
    AllocPd {
        /// The device's name.
        device: String,
        /// What the library reported.
        errno: i32,
    },
    /// A peer's queue-pair address has the wrong length or version.
    #[error(
        "malformed ibverbs connection data ({len} bytes, version {version}; expected \
         {expected_len} bytes, version {expected_version}): both sides must run the same \
         Monarch version"
    )]
    MalformedQpInfo {
        /// The bytes received.
        len: usize,
        /// The version byte received (0 when empty).
        version: u8,
        /// The length this version sends.
        expected_len: usize,
        /// This version.
        expected_version: u8,
    },
    /// The peer's port is on another link layer.
    #[error(
        "the two RDMA ports are on different link layers ({local} here, {remote} there; 1 \
         is InfiniBand, 2 Ethernet/RoCE): they cannot connect"
    )]
    LinkLayerMismatch {
        /// This side's `IBV_LINK_LAYER_*`.
        local: u8,
        /// The peer's `IBV_LINK_LAYER_*`.
        remote: u8,
    },
}

/// What one port of a device reported when no port was active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PortState {
    /// `ibv_query_port` failed.
    QueryFailed {
        /// The port number.
        port: u8,
        /// What the library reported.
        errno: i32,
    },
    /// The port is not active.
    NotActive {
        /// The port number.
        port: u8,
        /// Its `enum ibv_port_state`.
        state: u32,
    },
}

impl std::fmt::Display for PortState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortState::QueryFailed { port, errno } => {
                write!(f, "port {port}: {}", os_error(errno))
            }
            PortState::NotActive { port, state } => write!(f, "port {port}: state {state}"),
        }
    }
}

/// An errno as the OS words it (`"No such device (os error 19)"`).
fn os_error(errno: &i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(*errno)
}

/// The ports' states, comma-separated.
fn join(ports: &[PortState]) -> String {
    ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
