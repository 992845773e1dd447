//! The ibverbs backend: one-sided RDMA reads and writes over an RDMA NIC (InfiniBand
//! or RoCE), with libibverbs loaded at run time.
//!
//! # Detection
//!
//! Nothing links against libibverbs: the crate builds and runs where it is not
//! installed. [`probe`] `dlopen`s `libibverbs.so.1` once, lists the RDMA devices, and
//! says in words why the backend cannot be used when it cannot ([`Probe::reason`]):
//! the library is missing, there is no device, the named device does not exist, or
//! `MONARCH_RDMA_DISABLE_IBVERBS=1` (the `rdma_disable_ibverbs` setting) turned it
//! off. It never panics; every other entry point answers
//! [`RdmaError::Unavailable`] with that reason.
//!
//! # Design
//!
//! - **One device per process.** On first use the process opens the first device (or
//!   the one named by `MONARCH_RDMA_IBVERBS_DEVICE`), picks its first active port, a
//!   GID (on RoCE the first RoCE v2 GID, preferring an IPv4 one; override with
//!   `MONARCH_RDMA_IBVERBS_GID_INDEX`) and allocates one protection domain. These live
//!   for the rest of the process.
//! - **Memory registration.** The owner of a buffer registers it with the device
//!   ([`register_for_peer`]) and puts the resulting rkey in the handle it gives out;
//!   [`release_for_peer`] (or [`deregister`]) ends it, after which peers get
//!   [`RdmaError::Dropped`]. Registrations are cached by range and reference-counted:
//!   a range inside an existing registration reuses it. The transferring side's local
//!   buffer uses a cached registration covering it when there is one (kept alive for
//!   the transfer), otherwise a temporary one for the duration of the transfer — a
//!   cache keyed by address alone would go stale when memory is freed and reused.
//! - **Connections.** One reliable-connected (RC) queue pair per owner, keyed by the
//!   owner's transfer-server address, made on first use: this side creates a queue
//!   pair and its completion queue, moves it to INIT, and sends its address (LID, GID,
//!   QP number, PSN, port, MTU, read depth) to the owner's transfer server as control
//!   request [`KIND_IBV_CONNECT`]. The owner's handler (installed by [`serve`]) creates
//!   its own queue pair, moves it INIT → RTR → RTS against ours and answers with its
//!   address; this side then moves to RTR → RTS. Each connection has its own
//!   completion queue, so a transfer only ever sees its own completions, and a
//!   connection is used by one transfer at a time (others wait, up to their deadline).
//!   The owner keeps one queue pair per requesting connection: a requester that
//!   reconnects replaces its old one.
//! - **Transfers.** [`read`] and [`write()`] post `IBV_WR_RDMA_READ` / `IBV_WR_RDMA_WRITE`
//!   work requests, one per piece of at most the port's largest message (and at most
//!   [`MAX_PIECE`]), up to the send-queue depth at a time, each signaled, and poll the
//!   completion queue until every piece completed or the deadline passed. A failed
//!   completion becomes an error naming the status (`ibv_wc_status_str`); a timeout
//!   becomes [`RdmaError::Timeout`].
//! - **Failure is final for a connection.** After an error or a timeout the queue
//!   pair is moved to the error state, its outstanding work is drained (with a short
//!   grace), and it is destroyed before the call returns — so the NIC can no longer
//!   touch the caller's buffer — and the next transfer reconnects.
//!
//! # What was and was not exercised
//!
//! The machines this backend was developed on had no RDMA device, so **the data path
//! (device setup, queue-pair state changes, posting and polling) has never run against
//! a real NIC.** What is tested: detection (library missing; library present without a
//! device), the struct layouts against rdma-core's `verbs.h`, the connection payload,
//! the queue-pair attributes built for each transition, GID choice, piece splitting,
//! the registration cache's bookkeeping, and that every entry point fails cleanly when
//! the backend is unavailable. The layout numbers and constants the tests assert were
//! also checked by compiling a C program against rdma-core 50's installed `verbs.h`
//! (x86_64), and detection was run against that real libibverbs (every function
//! resolves; no device is reported as such).
//!
//! Known limits: one port and one GID per process; no GPU-memory (dmabuf)
//! registration path beyond what `ibv_reg_mr` accepts (GPUDirect needs
//! `nvidia-peermem`); owner-side queue pairs are only released when their requester
//! reconnects; `ibv_fork_init` is not called, so a process that forks after
//! registering memory needs a kernel and rdma-core that make that safe (Linux 5.13+);
//! as with any RDMA, a peer that can reach the transfer server and knows a
//! registration's address and rkey can access it — the 64-bit registration key of
//! [`RemoteRegion`] is not checked on this path.

mod device;
mod error;
mod mr;
mod probe;
mod qp;
mod sys;

use hyperactor::sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::ffi::{c_int, CStr};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use self::device::*;
use self::error::{IbvError, PortState};
use self::mr::*;
use self::probe::*;
pub use self::probe::{probe, probe_with, Probe};
use self::qp::*;
use self::sys::{ibv_qp_attr, ibv_wc, Lib, LoadError};
use crate::error::RdmaError;
use crate::region::{random_u64, Registry, RemoteRegion};
use crate::tcp;

/// The control-request kind of a connection request (a requester's queue-pair address;
/// the answer is the owner's).
pub const KIND_IBV_CONNECT: u8 = 16;

/// The most bytes one work request moves (ports usually allow 1 GiB, some less).
pub const MAX_PIECE: usize = 1 << 30;

/// Set to `1` to turn the backend off (the `rdma_disable_ibverbs` setting).
pub const DISABLE_ENV: &str = "MONARCH_RDMA_DISABLE_IBVERBS";

/// The name of the RDMA device to use (e.g. `mlx5_0`); the first one when unset.
pub const DEVICE_ENV: &str = "MONARCH_RDMA_IBVERBS_DEVICE";

/// The GID index to use, overriding the automatic choice (RoCE setups sometimes need
/// it).
pub const GID_INDEX_ENV: &str = "MONARCH_RDMA_IBVERBS_GID_INDEX";

/// [`Probe::reason`] when libibverbs cannot be loaded.
pub const REASON_MISSING: &str =
    "libibverbs.so.1 is not installed (install rdma-core / libibverbs1)";
/// [`Probe::reason`] when the library lists no device.
pub const REASON_NO_DEVICE: &str =
    "libibverbs found but no RDMA device (ibv_get_device_list returned none)";
/// [`Probe::reason`] when the backend was turned off.
pub const REASON_DISABLED: &str = "disabled by rdma_disable_ibverbs";

/// Send-queue depth: work requests in flight on one connection.
const SQ_DEPTH: u32 = 128;
/// Outstanding RDMA reads per queue pair, at most.
const RD_ATOMIC: u8 = 16;
/// Completions taken per poll.
const POLL_BATCH: usize = 16;
/// Empty polls before polling starts yielding the CPU.
const SPIN_POLLS: u32 = 1024;
/// How long a failed connection's outstanding work may take to drain.
const ABORT_GRACE: Duration = Duration::from_secs(2);
/// RoCE v2 hop limit.
const HOP_LIMIT: u8 = 64;

/// Installs the handler that answers connection requests ([`KIND_IBV_CONNECT`]) on
/// this process's transfer server. Call it once at start, whether or not the backend
/// is available here: where it is not, requesters are told why.
pub fn serve() {
    tcp::set_control_handler(KIND_IBV_CONNECT, Box::new(handle_connect));
}

// String because: a `ControlHandler` answers the peer with text (see its docs).
fn handle_connect(payload: &[u8]) -> Result<Vec<u8>, String> {
    let theirs = QpInfo::decode(payload).map_err(|e| e.to_string())?;
    let device = device().map_err(|e| e.to_string())?;
    device.accept(&theirs).map_err(|e| e.to_string())
}

/// Registers `region` — a live registration of this process in [`Registry::global`]
/// — with the device, so peers can read and write it; returns the rkey to put in the
/// handle. Read-only memory is registered for remote reads only. End it with
/// [`release_for_peer`] when the registration ends.
///
/// # Errors
///
/// [`RdmaError::Unavailable`] without the backend; [`RdmaError::Dropped`] if `region`
/// is not a live registration of this process; [`RdmaError::Verbs`] if the device
/// refuses the memory.
pub fn register_for_peer(region: &RemoteRegion) -> Result<u32, RdmaError> {
    let device = device()?;
    match Registry::global().get(region.id) {
        Some(live) if live == *region => {}
        _ => {
            return Err(RdmaError::Dropped {
                pid: region.pid,
                id: region.id,
            })
        }
    }
    let rkey = device
        .register(region.addr, region.len)
        .map(|(_, rkey)| rkey)?;
    lock_peer_regions().insert(region.id, *region);
    // The device registration ends with the registration, however that ends (the
    // owner's drop, a peer's drop through the transfer server).
    Registry::global().on_deregister(release_on_deregister);
    Ok(rkey)
}

/// The registrations [`register_for_peer`] registered with the device, by id.
fn lock_peer_regions() -> MutexGuard<'static, HashMap<u64, RemoteRegion>> {
    static PEER_REGIONS: OnceLock<Mutex<HashMap<u64, RemoteRegion>>> = OnceLock::new();
    PEER_REGIONS.get_or_init(Default::default).lock()
}

fn release_on_deregister(region: &RemoteRegion) {
    let registered = lock_peer_regions().remove(&region.id);
    if let Some(registered) = registered {
        release_for_peer(&registered);
    }
}

/// Ends one [`register_for_peer`] of `region`; peers then get [`RdmaError::Dropped`]
/// (unless another registration covers the memory). Returns whether there was one.
pub fn release_for_peer(region: &RemoteRegion) -> bool {
    deregister(region.addr)
}

/// Registers `[addr, addr + len)` of this process's memory with the device (or reuses
/// a registration covering it); returns `(lkey, rkey)`. Each call needs one
/// [`deregister`] of the same `addr`.
///
/// # Errors
///
/// [`RdmaError::Unavailable`] without the backend; [`RdmaError::Verbs`] if the device
/// refuses the memory.
///
/// # Safety
///
/// The memory must stay valid until the matching [`deregister`], and must tolerate
/// one-sided reads and writes by any peer given the rkey.
pub unsafe fn register(addr: u64, len: usize) -> Result<(u32, u32), RdmaError> {
    if len == 0 {
        return Err(RdmaError::Empty);
    }
    device()?.register(addr, len)
}

/// Undoes the last [`register`] (or [`register_for_peer`]) of `addr`; the device
/// registration ends with its last user. Returns whether `addr` was registered.
pub fn deregister(addr: u64) -> bool {
    match device() {
        Ok(device) => device.deregister(addr),
        Err(_) => false,
    }
}

/// Reads the memory `remote` of the owner whose transfer server listens at `server`
/// into `dst`, one-sided; `rkey` is the owner's key for the registration (from
/// [`register_for_peer`]).
///
/// # Errors
///
/// [`RdmaError::SizeMismatch`] if the lengths differ; [`RdmaError::Unavailable`]
/// without the backend; the connection's errors ([`RdmaError::Unreachable`],
/// [`RdmaError::Refused`], ...); [`RdmaError::Dropped`] if the owner ended the
/// registration; [`RdmaError::Completion`] for another failed transfer;
/// [`RdmaError::Timeout`] past `deadline`.
pub fn read(
    server: SocketAddr,
    remote: &RemoteRegion,
    rkey: u32,
    dst: &mut [u8],
    deadline: Option<Instant>,
) -> Result<(), RdmaError> {
    remote.check_len(dst.len())?;
    transfer(
        server,
        remote,
        rkey,
        dst.as_mut_ptr() as u64,
        dst.len(),
        Op::Read,
        deadline,
    )
}

/// Writes `src` into the memory `remote` of the owner whose transfer server listens at
/// `server`, one-sided.
///
/// # Errors
///
/// As [`read`].
pub fn write(
    server: SocketAddr,
    remote: &RemoteRegion,
    rkey: u32,
    src: &[u8],
    deadline: Option<Instant>,
) -> Result<(), RdmaError> {
    remote.check_len(src.len())?;
    transfer(
        server,
        remote,
        rkey,
        src.as_ptr() as u64,
        src.len(),
        Op::Write,
        deadline,
    )
}

fn transfer(
    server: SocketAddr,
    remote: &RemoteRegion,
    rkey: u32,
    local: u64,
    len: usize,
    op: Op,
    deadline: Option<Instant>,
) -> Result<(), RdmaError> {
    let start = Instant::now();
    let device = device()?;
    if len == 0 {
        return Ok(());
    }
    let timeout = || RdmaError::Timeout {
        pid: remote.pid,
        seconds: deadline.map_or(0.0, |d| d.saturating_duration_since(start).as_secs_f64()),
    };
    let local_mr = device.local_mr(local, len, op == Op::Read)?;
    let link = device.link(server);
    let Some(mut slot) = lock_until(&link.conn, deadline) else {
        return Err(timeout());
    };
    if slot.is_none() {
        *slot = Some(device.connect(server, remote.pid, link.id, deadline)?);
    }
    let job = Job {
        op,
        pid: remote.pid,
        id: remote.id,
        local,
        lkey: local_mr.lkey,
        remote: remote.addr,
        rkey,
        len,
    };
    let result = match slot.as_ref() {
        Some(conn) => device.run(conn, &job, deadline, start),
        None => Err(timeout()),
    };
    if result.is_err() {
        // Destroys the queue pair before the local registration is released: the NIC
        // cannot touch the buffer once this returns. The next transfer reconnects.
        *slot = None;
    }
    drop(slot);
    drop(local_mr);
    result
}

#[cfg(test)]
mod tests;
