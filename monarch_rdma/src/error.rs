//! [`RdmaError`]: why a registration or a transfer failed.

/// Why a registration or a transfer failed. Each message names the owner process and
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// A zero-length buffer was registered.
    #[error(
        "cannot register an empty buffer: there is nothing to transfer; register at least \
         one byte"
    )]
    Empty,
    /// A range does not fit in its region.
    #[error(
        "bytes {offset}..{offset}+{len} are outside the registered buffer of {size} bytes; \
         use a range within the buffer"
    )]
    OutOfRange {
        /// The range's start.
        offset: usize,
        /// The range's length.
        len: usize,
        /// The region's size.
        size: usize,
    },
    /// The local and remote sizes differ.
    #[error(
        "the remote buffer has {remote} bytes but the local one has {local}; transfers copy \
         whole buffers, so give a local buffer of {remote} bytes (or a range of the remote \
         one)"
    )]
    SizeMismatch {
        /// The remote buffer's size.
        remote: usize,
        /// The local buffer's size.
        local: usize,
    },
    /// The owner process no longer exists.
    #[error(
        "the owner of the buffer (pid {pid}) is gone: it exited or was killed, and its \
         memory with it"
    )]
    OwnerGone {
        /// The owner's pid.
        pid: u32,
    },
    /// The kernel refused access to the owner's memory.
    #[error(
        "access to the memory of pid {pid} was refused (EPERM): the owner must run as the \
         same user, and where Yama's ptrace_scope is 1 it must allow peers \
         (monarch_rdma::cma::allow_peer_access, which monarch procs call at start); \
         ptrace_scope 3 forbids cross-memory access entirely"
    )]
    AccessDenied {
        /// The owner's pid.
        pid: u32,
    },
    /// The remote address is not mapped in the owner (a dropped or stale buffer).
    #[error(
        "address {addr:#x} is not mapped in pid {pid}: the buffer was freed or never \
         registered there; register it again and use the new handle"
    )]
    BadAddress {
        /// The owner's pid.
        pid: u32,
        /// The address.
        addr: u64,
    },
    /// Another OS error.
    #[error("a transfer with pid {pid} failed: {source}")]
    Os {
        /// The owner's pid.
        pid: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The registration is unknown to its owner: it was dropped (or never existed).
    #[error(
        "buffer {id} of pid {pid} is not registered: it was dropped (RDMABuffer.drop()) or \
         its owner re-registered the memory; ask the owner for a new handle"
    )]
    Dropped {
        /// The owner's pid.
        pid: u32,
        /// The registration id.
        id: u64,
    },
    /// The owner's transfer server cannot be reached or closed the connection.
    #[error(
        "the owner of the buffer (pid {pid} at {addr}) cannot be reached: {source}; it \
         exited, was killed, or the network between the two hosts is cut"
    )]
    Unreachable {
        /// The owner's pid.
        pid: u32,
        /// The owner's transfer server address.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The owner refused a request for another reason (its message).
    #[error("the owner of the buffer (pid {pid}) refused the transfer: {message}")]
    Refused {
        /// The owner's pid.
        pid: u32,
        /// What the owner said.
        message: String,
    },
    /// A transfer did not finish in time.
    #[error(
        "a transfer with pid {pid} did not finish within {seconds} s; pass a larger \
         timeout= or check the network between the two hosts"
    )]
    Timeout {
        /// The owner's pid.
        pid: u32,
        /// The timeout.
        seconds: f64,
    },
    /// No allowed backend connects the two sides.
    #[error("no transfer path from {local} to the owner {remote}: {why}")]
    NoPath {
        /// This side.
        local: String,
        /// The owner.
        remote: String,
        /// Why (and what to do).
        why: String,
    },
    /// The ibverbs backend cannot be used in this process.
    #[error(
        "the ibverbs (RDMA NIC) backend is unavailable: {reason}; use another backend \
         (TCP, or cross-memory attach on one host)"
    )]
    Unavailable {
        /// Why (from `ibverbs::probe`).
        reason: String,
    },
    /// An ibverbs call failed (opening the device, a queue pair, a registration).
    #[error("the ibverbs call {call} failed: {detail}")]
    Verbs {
        /// The call (or step).
        call: String,
        /// What it reported.
        detail: String,
    },
    /// A one-sided RDMA operation completed with an error status.
    #[error(
        "an RDMA {op} with pid {pid} failed with work-completion status \"{status}\" \
         (vendor error {vendor_err:#x}): {hint}"
    )]
    Completion {
        /// The owner's pid.
        pid: u32,
        /// `read` or `write`.
        op: String,
        /// The status, as libibverbs names it.
        status: String,
        /// The NIC vendor's error code.
        vendor_err: u32,
        /// What it likely means and what to do.
        hint: String,
    },
}
