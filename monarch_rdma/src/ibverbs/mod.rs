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

mod sys;

use std::collections::HashMap;
use std::ffi::{c_int, CStr};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use self::sys::{ibv_qp_attr, ibv_wc, Lib, LoadError};
use crate::region::{random_u64, RemoteRegion};
use crate::{tcp, RdmaError, Registry};

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

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The RDMA devices libibverbs lists (kernel names, e.g. `mlx5_0`).
    pub devices: Vec<String>,
    /// Why the backend cannot be used; `None` when it can.
    pub reason: Option<String>,
}

impl Probe {
    /// Whether the backend can be used.
    pub fn available(&self) -> bool {
        self.reason.is_none()
    }

    fn unavailable(reason: impl Into<String>, devices: Vec<String>) -> Self {
        Self {
            devices,
            reason: Some(reason.into()),
        }
    }
}

/// Whether this process can use the backend, checked once (the environment's
/// [`DISABLE_ENV`] is read then). Never panics, whatever is installed.
pub fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| probe_with(env_flag(std::env::var(DISABLE_ENV).ok().as_deref())))
}

/// Checks, now and without caching, whether the backend can be used; `disabled` turns
/// it off (the `rdma_disable_ibverbs` setting).
pub fn probe_with(disabled: bool) -> Probe {
    if disabled {
        return Probe::unavailable(REASON_DISABLED, Vec::new());
    }
    let lib = match Lib::get() {
        Ok(lib) => lib,
        Err(e) => return Probe::unavailable(load_reason(&e), Vec::new()),
    };
    let devices = with_devices(lib, |list| {
        list.iter()
            .map(|(_, name)| name.clone())
            .collect::<Vec<_>>()
    });
    if devices.is_empty() {
        return Probe::unavailable(REASON_NO_DEVICE, devices);
    }
    if let Some(wanted) = wanted_device() {
        if !devices.contains(&wanted) {
            let why = format!(
                "{DEVICE_ENV} names the RDMA device {wanted:?}, which does not exist \
                 (devices: {})",
                devices.join(", ")
            );
            return Probe::unavailable(why, devices);
        }
    }
    Probe {
        devices,
        reason: None,
    }
}

/// Whether an environment value turns a flag on.
fn env_flag(value: Option<&str>) -> bool {
    matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

fn wanted_device() -> Option<String> {
    std::env::var(DEVICE_ENV)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn load_reason(e: &LoadError) -> String {
    match e {
        LoadError::Missing(_) => REASON_MISSING.to_string(),
        LoadError::Incomplete(why) => why.clone(),
    }
}

/// Calls `f` with the devices libibverbs lists (pointer and name), then frees the
/// list. An error listing them counts as no device.
fn with_devices<R>(lib: &Lib, f: impl FnOnce(&[(*mut sys::ibv_device, String)]) -> R) -> R {
    let mut count: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated
    // array it owns, or NULL on failure.
    let list = unsafe { (lib.get_device_list)(&mut count) };
    let mut devices = Vec::new();
    if !list.is_null() {
        for i in 0..usize::try_from(count).unwrap_or(0) {
            // SAFETY: the array holds `count` device pointers.
            let device = unsafe { *list.add(i) };
            if device.is_null() {
                break;
            }
            // SAFETY: a device of the live list; the name is a NUL-terminated string
            // owned by the device (or NULL, checked).
            let name = unsafe { (lib.get_device_name)(device) };
            let name = if name.is_null() {
                format!("device{i}")
            } else {
                // SAFETY: see above.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            };
            devices.push((device, name));
        }
    }
    let result = f(&devices);
    if !list.is_null() {
        // SAFETY: the list came from ibv_get_device_list and is freed once; devices
        // opened by `f` stay valid (libibverbs reference-counts them).
        unsafe { (lib.free_device_list)(list) };
    }
    result
}

/// The port this process uses and its address on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Port {
    /// The port number (from 1).
    num: u8,
    /// The port's LID (InfiniBand; 0 on RoCE).
    lid: u16,
    /// The GID at `gid_index`.
    gid: [u8; 16],
    /// The GID table index used as source GID.
    gid_index: u8,
    /// The active MTU (`enum ibv_mtu`, 1..=5).
    mtu: u8,
    /// `IBV_LINK_LAYER_*`.
    link_layer: u8,
}

/// A queue pair's address, as exchanged at connection (the [`KIND_IBV_CONNECT`]
/// payload and answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QpInfo {
    lid: u16,
    gid: [u8; 16],
    qp_num: u32,
    psn: u32,
    port: u8,
    mtu: u8,
    link_layer: u8,
    /// Outstanding RDMA reads this side accepts as responder.
    rd_atomic: u8,
    /// The requester's id for the connection: an owner keeps one queue pair per link.
    link: u64,
}

impl QpInfo {
    const VERSION: u8 = 1;
    const LEN: usize = 1 + 2 + 16 + 4 + 4 + 1 + 1 + 1 + 1 + 8;

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.push(Self::VERSION);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.qp_num.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&[self.port, self.mtu, self.link_layer, self.rd_atomic]);
        out.extend_from_slice(&self.link.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != Self::LEN || bytes[0] != Self::VERSION {
            return Err(format!(
                "malformed ibverbs connection data ({} bytes, version {}; expected {} \
                 bytes, version {}): both sides must run the same Monarch version",
                bytes.len(),
                bytes.first().copied().unwrap_or(0),
                Self::LEN,
                Self::VERSION
            ));
        }
        let mut rest = &bytes[1..];
        let mut take = |n: usize| {
            let (field, tail) = rest.split_at(n);
            rest = tail;
            field
        };
        let lid = take(2);
        let lid = u16::from_le_bytes([lid[0], lid[1]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(take(16));
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let qp_num = word(take(4));
        let psn = word(take(4));
        let small = take(4);
        let (port, mtu, link_layer, rd_atomic) = (small[0], small[1], small[2], small[3]);
        let mut link = [0u8; 8];
        link.copy_from_slice(take(8));
        Ok(Self {
            lid,
            gid,
            qp_num,
            psn,
            port,
            mtu,
            link_layer,
            rd_atomic,
            link: u64::from_le_bytes(link),
        })
    }
}

/// Checks that two ports can talk.
fn check_compatible(local: &Port, remote: &QpInfo) -> Result<(), String> {
    if local.link_layer != remote.link_layer {
        return Err(format!(
            "the two RDMA ports are on different link layers ({} here, {} there; 1 is \
             InfiniBand, 2 Ethernet/RoCE): they cannot connect",
            local.link_layer, remote.link_layer
        ));
    }
    Ok(())
}

/// Attributes for RESET → INIT.
fn init_attr(port: u8) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: port,
        qp_access_flags: (sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_WRITE) as u32,
        ..Default::default()
    };
    let mask =
        sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
    (attr, mask)
}

/// Attributes for INIT → RTR against `remote`; `rd_atomic` is how many RDMA reads this
/// side serves at once.
fn rtr_attr(local: &Port, remote: &QpInfo, rd_atomic: u8) -> (ibv_qp_attr, c_int) {
    let mtu = u32::from(local.mtu.min(remote.mtu)).clamp(sys::IBV_MTU_256, sys::IBV_MTU_4096);
    let global = local.link_layer == sys::IBV_LINK_LAYER_ETHERNET || remote.lid == 0;
    let mut attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTR,
        path_mtu: mtu,
        dest_qp_num: remote.qp_num,
        rq_psn: remote.psn,
        max_dest_rd_atomic: rd_atomic.max(1),
        min_rnr_timer: 12,
        ..Default::default()
    };
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = local.num;
    if global {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid.raw = remote.gid;
        attr.ah_attr.grh.sgid_index = local.gid_index;
        attr.ah_attr.grh.hop_limit = HOP_LIMIT;
    }
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_AV
        | sys::IBV_QP_PATH_MTU
        | sys::IBV_QP_DEST_QPN
        | sys::IBV_QP_RQ_PSN
        | sys::IBV_QP_MAX_DEST_RD_ATOMIC
        | sys::IBV_QP_MIN_RNR_TIMER;
    (attr, mask)
}

/// Attributes for RTR → RTS; `rd_atomic` is how many RDMA reads this side issues at
/// once (at most what the peer serves).
fn rts_attr(psn: u32, rd_atomic: u8) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        sq_psn: psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: rd_atomic.max(1),
        ..Default::default()
    };
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_TIMEOUT
        | sys::IBV_QP_RETRY_CNT
        | sys::IBV_QP_RNR_RETRY
        | sys::IBV_QP_SQ_PSN
        | sys::IBV_QP_MAX_QP_RD_ATOMIC;
    (attr, mask)
}

/// A fresh 24-bit packet sequence number.
fn new_psn() -> u32 {
    (random_u64() & 0x00ff_ffff) as u32
}

/// One GID table entry: index, GID, and its type as sysfs names it (`"RoCE v2"`,
/// `"IB/RoCE v1"`), when known.
type GidEntry = (u8, [u8; 16], Option<String>);

/// The GID index to use: 0 on InfiniBand; on RoCE the first RoCE v2 GID holding an
/// IPv4 address, else the first RoCE v2 GID, else the first non-zero GID, else 0.
fn choose_gid_index(entries: &[GidEntry], ethernet: bool) -> u8 {
    if !ethernet {
        return 0;
    }
    let live = || {
        entries
            .iter()
            .filter(|(_, gid, _)| gid.iter().any(|&b| b != 0))
    };
    let v2 = |kind: &Option<String>| {
        kind.as_deref()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("RoCE v2"))
    };
    let ipv4 = |gid: &[u8; 16]| gid[..10].iter().all(|&b| b == 0) && gid[10..12] == [0xff, 0xff];
    live()
        .find(|(_, gid, kind)| v2(kind) && ipv4(gid))
        .or_else(|| live().find(|(_, _, kind)| v2(kind)))
        .or_else(|| live().next())
        .map_or(0, |(index, _, _)| *index)
}

/// Splits `len` bytes into `(offset, length)` pieces of at most `max` bytes.
fn pieces(len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let max = max.max(1);
    (0..len)
        .step_by(max)
        .map(move |offset| (offset, max.min(len - offset)))
}

/// A registration of memory with the device.
#[derive(Debug)]
struct CachedMr {
    mr: *mut sys::ibv_mr,
    start: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    /// Registered with local and remote write access (read-only memory is registered
    /// for remote reads only).
    writable: bool,
    /// Registrations ([`register`]) and transfers using it.
    refs: usize,
}

/// The process's registrations, by an internal id, and the ids each registered
/// address holds (a stack: one entry per [`register`] call).
#[derive(Debug, Default)]
struct MrCache {
    next_id: u64,
    mrs: HashMap<u64, CachedMr>,
    handles: HashMap<u64, Vec<u64>>,
}

impl MrCache {
    /// A registration covering `[start, start + len)`, writable if `need_write`,
    /// preferring writable ones.
    fn covering(&self, start: u64, len: usize, need_write: bool) -> Option<u64> {
        let end = start.checked_add(len as u64)?;
        let covers = |m: &CachedMr| {
            m.start <= start && m.start.checked_add(m.len as u64).is_some_and(|e| end <= e)
        };
        let mut best: Option<(u64, bool)> = None;
        for (id, m) in &self.mrs {
            if covers(m) && (m.writable || !need_write) && best.is_none_or(|(_, w)| !w) {
                best = Some((*id, m.writable));
            }
        }
        best.map(|(id, _)| id)
    }

    /// Adds a registration with one reference; returns its id.
    fn insert(&mut self, mut mr: CachedMr) -> u64 {
        self.next_id += 1;
        mr.refs = 1;
        self.mrs.insert(self.next_id, mr);
        self.next_id
    }

    /// Takes a reference on `id`; its keys.
    fn acquire(&mut self, id: u64) -> Option<(u32, u32)> {
        let m = self.mrs.get_mut(&id)?;
        m.refs += 1;
        Some((m.lkey, m.rkey))
    }

    /// Drops a reference on `id`; the registration to deregister when it was the last.
    fn release(&mut self, id: u64) -> Option<CachedMr> {
        let m = self.mrs.get_mut(&id)?;
        m.refs = m.refs.saturating_sub(1);
        if m.refs == 0 {
            self.mrs.remove(&id)
        } else {
            None
        }
    }

    /// Records that address `addr` was registered through `id`.
    fn push_handle(&mut self, addr: u64, id: u64) {
        self.handles.entry(addr).or_default().push(id);
    }

    /// Undoes the last registration of `addr`: `Some(last)` if there was one, with
    /// the registration to deregister when that was its last reference.
    fn pop_handle(&mut self, addr: u64) -> Option<Option<CachedMr>> {
        let ids = self.handles.get_mut(&addr)?;
        let id = ids.pop()?;
        if ids.is_empty() {
            self.handles.remove(&addr);
        }
        Some(self.release(id))
    }
}

/// A queue pair and its completion queue; destroyed on drop.
#[derive(Debug)]
struct Conn {
    lib: &'static Lib,
    qp: *mut sys::ibv_qp,
    cq: *mut sys::ibv_cq,
}

// SAFETY: the queue pair and completion queue are plain handles to library objects;
// libibverbs' calls are thread-safe, and a connection is used by one thread at a time
// (it lives behind a mutex).
unsafe impl Send for Conn {}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.qp.is_null() {
            // SAFETY: a queue pair created by ibv_create_qp and destroyed once.
            unsafe { (self.lib.destroy_qp)(self.qp) };
        }
        if !self.cq.is_null() {
            // SAFETY: a completion queue created by ibv_create_cq, destroyed once,
            // after the queue pair using it.
            unsafe { (self.lib.destroy_cq)(self.cq) };
        }
    }
}

impl Conn {
    fn qp_num(&self) -> u32 {
        // SAFETY: a live queue pair; qp_num is set at creation and never changes.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(&self, (mut attr, mask): (ibv_qp_attr, c_int), what: &str) -> Result<(), RdmaError> {
        // SAFETY: a live queue pair and a fully initialized attribute struct that
        // outlives the call.
        let rc = unsafe { (self.lib.modify_qp)(self.qp, &mut attr, mask) };
        if rc != 0 {
            return Err(verbs(
                format!("ibv_modify_qp ({what})"),
                sys::rc_error(rc).to_string(),
            ));
        }
        Ok(())
    }

    /// Posts one signaled RDMA work request.
    fn post(&self, job: &Job, (offset, len): (usize, usize), wr_id: u64) -> std::io::Result<()> {
        let length =
            u32::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut sge = sys::ibv_sge {
            addr: job.local + offset as u64,
            length,
            lkey: job.lkey,
        };
        let mut wr = sys::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: job.op.opcode(),
            send_flags: sys::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.rdma.remote_addr = job.remote + offset as u64;
        wr.rdma.rkey = job.rkey;
        // SAFETY: a live queue pair; its context is the process's open device, whose
        // ops table the library filled.
        let post = unsafe { (*(*self.qp).context).ops.post_send };
        let post = post.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSYS))?;
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the work request and its scatter entry are valid for the call (the
        // provider copies them into the send queue); the local range lies in a
        // registration held for the transfer and the caller's live buffer.
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(sys::rc_error(rc));
        }
        Ok(())
    }

    /// Takes up to `wcs.len()` completions.
    fn poll(&self, wcs: &mut [ibv_wc]) -> std::io::Result<usize> {
        // SAFETY: a live completion queue whose context is the open device.
        let poll = unsafe { (*(*self.cq).context).ops.poll_cq };
        let poll = poll.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSYS))?;
        let room = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: `wcs` has room for `room` completions.
        let n = unsafe { poll(self.cq, room, wcs.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| sys::rc_error(n))
    }

    /// Stops the connection after a failure: the queue pair goes to the error state,
    /// which flushes its outstanding work, and the flushes are collected (for at most
    /// [`ABORT_GRACE`]). The caller then destroys the connection.
    fn abort(&self, mut outstanding: usize) {
        let attr = ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        // Best effort: destroying the queue pair afterwards stops it in any case.
        let _ = self.modify((attr, sys::IBV_QP_STATE), "to ERR");
        let until = Instant::now() + ABORT_GRACE;
        let mut wcs = [ibv_wc::default(); POLL_BATCH];
        while outstanding > 0 && Instant::now() < until {
            match self.poll(&mut wcs) {
                Ok(0) => std::thread::yield_now(),
                Ok(n) => outstanding = outstanding.saturating_sub(n),
                Err(_) => break,
            }
        }
    }
}

/// One requester's connection to one owner.
#[derive(Debug)]
struct Link {
    /// Sent with every connection request, so the owner replaces this link's old
    /// queue pair.
    id: u64,
    conn: Mutex<Option<Conn>>,
}

/// The direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn opcode(self) -> u32 {
        match self {
            Op::Read => sys::IBV_WR_RDMA_READ,
            Op::Write => sys::IBV_WR_RDMA_WRITE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// What one transfer moves.
#[derive(Debug, Clone, Copy)]
struct Job {
    op: Op,
    pid: u32,
    id: u64,
    local: u64,
    lkey: u32,
    remote: u64,
    rkey: u32,
    len: usize,
}

/// The process's device: context, protection domain, port, registrations and
/// connections. Opened once, never closed.
#[derive(Debug)]
struct Device {
    lib: &'static Lib,
    name: String,
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    port: Port,
    max_piece: usize,
    sq_depth: u32,
    rd_atomic: u8,
    mrs: Mutex<MrCache>,
    links: Mutex<HashMap<SocketAddr, Arc<Link>>>,
    /// The owner side's queue pairs, by the requester's link id.
    served: Mutex<HashMap<u64, Conn>>,
}

// SAFETY: the raw pointers are handles to libibverbs objects that live for the rest
// of the process; libibverbs' calls are thread-safe, and the mutable state
// (registrations, connections) is behind mutexes.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The process's device, opened on first use.
fn device() -> Result<&'static Device, RdmaError> {
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    if let Some(reason) = &probe().reason {
        return Err(RdmaError::Unavailable {
            reason: reason.clone(),
        });
    }
    DEVICE
        .get_or_init(Device::open)
        .as_ref()
        .map_err(|detail| verbs("opening the RDMA device", detail.clone()))
}

fn verbs(call: impl Into<String>, detail: impl Into<String>) -> RdmaError {
    RdmaError::Verbs {
        call: call.into(),
        detail: detail.into(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks a connection slot, waiting until `deadline` at most. A slot poisoned by a
/// panic mid-transfer is emptied (its connection's state is unknown).
fn lock_until<T>(
    mutex: &Mutex<Option<T>>,
    deadline: Option<Instant>,
) -> Option<MutexGuard<'_, Option<T>>> {
    let mut pause = Duration::from_micros(20);
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(e)) => {
                let mut guard = e.into_inner();
                *guard = None;
                mutex.clear_poison();
                return Some(guard);
            }
            Err(TryLockError::WouldBlock) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

impl Device {
    fn open() -> Result<Device, String> {
        let lib = Lib::get().map_err(|e| load_reason(&e))?;
        let wanted = wanted_device();
        let (ctx, name) = with_devices(lib, |list| {
            let chosen = match &wanted {
                Some(w) => list.iter().find(|(_, name)| name == w),
                None => list.first(),
            };
            let Some((device, name)) = chosen else {
                return Err(REASON_NO_DEVICE.to_string());
            };
            // SAFETY: a device of the live list.
            let ctx = unsafe { (lib.open_device)(*device) };
            if ctx.is_null() {
                return Err(format!("ibv_open_device({name}): {}", sys::errno()));
            }
            Ok((ctx, name.clone()))
        })?;
        Self::setup(lib, ctx, name).inspect_err(|_| {
            // SAFETY: the context was opened above and nothing else uses it.
            unsafe { (lib.close_device)(ctx) };
        })
    }

    fn setup(
        lib: &'static Lib,
        ctx: *mut sys::ibv_context,
        name: String,
    ) -> Result<Device, String> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: an open context and a writable attribute struct of the C layout.
        let rc = unsafe { (lib.query_device)(ctx, &mut attr) };
        if rc != 0 {
            return Err(format!("ibv_query_device({name}): {}", sys::rc_error(rc)));
        }
        let (num, port_attr) = Self::active_port(lib, ctx, &name, attr.phys_port_cnt)?;
        let ethernet = port_attr.link_layer == sys::IBV_LINK_LAYER_ETHERNET;
        let gid_index = match std::env::var(GID_INDEX_ENV).ok() {
            Some(v) => v
                .trim()
                .parse::<u8>()
                .map_err(|_| format!("{GID_INDEX_ENV}={v:?} is not a GID index (0..=255)"))?,
            None => {
                let entries = Self::gid_table(lib, ctx, &name, num, port_attr.gid_tbl_len);
                choose_gid_index(&entries, ethernet)
            }
        };
        let gid = Self::gid(lib, ctx, num, gid_index)
            .map_err(|e| format!("ibv_query_gid({name}, port {num}, index {gid_index}): {e}"))?;
        // SAFETY: an open context.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(format!("ibv_alloc_pd({name}): {}", sys::errno()));
        }
        let max_msg = match port_attr.max_msg_sz {
            0 => MAX_PIECE,
            n => (n as usize).min(MAX_PIECE),
        };
        let positive = |v: c_int| u32::try_from(v).unwrap_or(0);
        let sq_depth = SQ_DEPTH.min(positive(attr.max_qp_wr)).max(1);
        let rd = positive(attr.max_qp_rd_atom).min(positive(attr.max_qp_init_rd_atom));
        let rd_atomic = u8::try_from(rd.min(u32::from(RD_ATOMIC)))
            .unwrap_or(1)
            .max(1);
        Ok(Device {
            lib,
            name,
            ctx,
            pd,
            port: Port {
                num,
                lid: port_attr.lid,
                gid,
                gid_index,
                mtu: u8::try_from(port_attr.active_mtu).unwrap_or(1),
                link_layer: port_attr.link_layer,
            },
            max_piece: max_msg,
            sq_depth,
            rd_atomic,
            mrs: Mutex::default(),
            links: Mutex::default(),
            served: Mutex::default(),
        })
    }

    /// The first active port.
    fn active_port(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        name: &str,
        ports: u8,
    ) -> Result<(u8, sys::ibv_port_attr), String> {
        let mut states = Vec::new();
        for num in 1..=ports.max(1) {
            let mut attr = sys::ibv_port_attr::default();
            // SAFETY: an open context and a zeroed attribute buffer at least as large
            // as any layout the library writes (see sys).
            let rc = unsafe { (lib.query_port)(ctx, num, &mut attr) };
            if rc != 0 {
                states.push(format!("port {num}: {}", sys::rc_error(rc)));
                continue;
            }
            if attr.state == sys::IBV_PORT_ACTIVE {
                return Ok((num, attr));
            }
            states.push(format!("port {num}: state {}", attr.state));
        }
        Err(format!(
            "the RDMA device {name} has no active port ({}); check the cable and \
             `ibv_devinfo`",
            states.join(", ")
        ))
    }

    /// The port's non-empty GID entries with their sysfs types.
    fn gid_table(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        name: &str,
        port: u8,
        len: c_int,
    ) -> Vec<GidEntry> {
        let len = u8::try_from(len.clamp(0, 255)).unwrap_or(0);
        (0..len)
            .filter_map(|index| {
                let gid = Self::gid(lib, ctx, port, index).ok()?;
                if gid.iter().all(|&b| b == 0) {
                    return None;
                }
                let kind = std::fs::read_to_string(format!(
                    "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
                ))
                .ok();
                Some((index, gid, kind))
            })
            .collect()
    }

    fn gid(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        port: u8,
        index: u8,
    ) -> std::io::Result<[u8; 16]> {
        let mut gid = sys::ibv_gid::default();
        // SAFETY: an open context and a writable 16-byte GID.
        let rc = unsafe { (lib.query_gid)(ctx, port, c_int::from(index), &mut gid) };
        if rc != 0 {
            return Err(sys::rc_error(rc));
        }
        Ok(gid.raw)
    }

    /// This side's address for a queue pair.
    fn info(&self, qp_num: u32, psn: u32, link: u64) -> QpInfo {
        QpInfo {
            lid: self.port.lid,
            gid: self.port.gid,
            qp_num,
            psn,
            port: self.port.num,
            mtu: self.port.mtu,
            link_layer: self.port.link_layer,
            rd_atomic: self.rd_atomic,
            link,
        }
    }

    /// A new queue pair (with its own completion queue) in the INIT state.
    fn new_conn(&self) -> Result<Conn, RdmaError> {
        let depth = c_int::try_from(self.sq_depth).unwrap_or(c_int::MAX);
        // SAFETY: an open context; no completion channel, no user context.
        let cq = unsafe {
            (self.lib.create_cq)(
                self.ctx,
                depth.saturating_add(1),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(verbs("ibv_create_cq", sys::errno().to_string()));
        }
        let mut conn = Conn {
            lib: self.lib,
            qp: std::ptr::null_mut(),
            cq,
        };
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: sys::ibv_qp_cap {
                max_send_wr: self.sq_depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: the process's protection domain and a filled init struct; the
        // completion queue is live.
        conn.qp = unsafe { (self.lib.create_qp)(self.pd, &mut init) };
        if conn.qp.is_null() {
            return Err(verbs("ibv_create_qp", sys::errno().to_string()));
        }
        conn.modify(init_attr(self.port.num), "RESET to INIT")?;
        Ok(conn)
    }

    /// The requester's side of a connection to the owner at `server`.
    fn connect(
        &self,
        server: SocketAddr,
        pid: u32,
        link: u64,
        deadline: Option<Instant>,
    ) -> Result<Conn, RdmaError> {
        let conn = self.new_conn()?;
        let psn = new_psn();
        let mine = self.info(conn.qp_num(), psn, link);
        let opts = tcp::TcpOptions {
            deadline,
            ..Default::default()
        };
        let reply = tcp::request(server, pid, KIND_IBV_CONNECT, &mine.encode(), &opts)?;
        let theirs =
            QpInfo::decode(&reply).map_err(|message| RdmaError::Refused { pid, message })?;
        check_compatible(&self.port, &theirs)
            .map_err(|message| RdmaError::Refused { pid, message })?;
        conn.modify(rtr_attr(&self.port, &theirs, self.rd_atomic), "INIT to RTR")?;
        conn.modify(
            rts_attr(psn, self.rd_atomic.min(theirs.rd_atomic)),
            "RTR to RTS",
        )?;
        Ok(conn)
    }

    /// The owner's side of a connection: a queue pair ready for `theirs`; answers
    /// with its address.
    fn accept(&self, theirs: &QpInfo) -> Result<Vec<u8>, RdmaError> {
        check_compatible(&self.port, theirs).map_err(|message| RdmaError::Refused {
            pid: std::process::id(),
            message,
        })?;
        let conn = self.new_conn()?;
        let psn = new_psn();
        conn.modify(rtr_attr(&self.port, theirs, self.rd_atomic), "INIT to RTR")?;
        conn.modify(
            rts_attr(psn, self.rd_atomic.min(theirs.rd_atomic)),
            "RTR to RTS",
        )?;
        let mine = self.info(conn.qp_num(), psn, theirs.link);
        let replaced = lock(&self.served).insert(theirs.link, conn);
        drop(replaced);
        Ok(mine.encode())
    }

    fn link(&self, server: SocketAddr) -> Arc<Link> {
        lock(&self.links)
            .entry(server)
            .or_insert_with(|| {
                Arc::new(Link {
                    id: random_u64(),
                    conn: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Registers `[addr, addr + len)` (or reuses a registration covering it) and
    /// records it under `addr`.
    fn register(&'static self, addr: u64, len: usize) -> Result<(u32, u32), RdmaError> {
        {
            let mut cache = lock(&self.mrs);
            let found = cache
                .covering(addr, len, true)
                .or_else(|| cache.covering(addr, len, false));
            if let Some(id) = found {
                if let Some(keys) = cache.acquire(id) {
                    cache.push_handle(addr, id);
                    return Ok(keys);
                }
            }
        }
        // Registering pins the memory, which takes a while for large buffers: done
        // without holding the cache.
        let full = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_WRITE;
        let mr = match self.reg_mr(addr, len, full) {
            Ok(mr) => mr,
            // Read-only memory cannot be registered for writing: serve reads only (and
            // report the first failure if that fails too).
            Err(first) => self
                .reg_mr(addr, len, sys::IBV_ACCESS_REMOTE_READ)
                .map_err(|_| first)?,
        };
        let mut cache = lock(&self.mrs);
        let keys = (mr.lkey, mr.rkey);
        let id = cache.insert(mr);
        cache.push_handle(addr, id);
        Ok(keys)
    }

    /// Undoes the last [`Device::register`] of `addr`.
    fn deregister(&self, addr: u64) -> bool {
        let popped = lock(&self.mrs).pop_handle(addr);
        match popped {
            Some(last) => {
                if let Some(mr) = last {
                    self.dereg_mr(&mr);
                }
                true
            }
            None => false,
        }
    }

    fn reg_mr(&self, addr: u64, len: usize, access: c_int) -> Result<CachedMr, RdmaError> {
        // SAFETY: registration only pins and maps the range (the kernel refuses
        // unmapped memory with an error); the callers guarantee the memory stays
        // valid while registered.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr as *mut _, len, access) };
        if mr.is_null() {
            let e = sys::errno();
            return Err(verbs(
                "ibv_reg_mr",
                format!("{len} bytes at {addr:#x} on {}: {e}", self.name),
            ));
        }
        // SAFETY: a live registration returned by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(CachedMr {
            mr,
            start: addr,
            len,
            lkey,
            rkey,
            writable: access & sys::IBV_ACCESS_LOCAL_WRITE != 0,
            refs: 0,
        })
    }

    fn dereg_mr(&self, mr: &CachedMr) {
        // SAFETY: a registration from ibv_reg_mr, removed from the cache, so
        // deregistered once.
        unsafe { (self.lib.dereg_mr)(mr.mr) };
    }

    /// The registration a transfer uses for its local buffer.
    fn local_mr(
        &'static self,
        addr: u64,
        len: usize,
        need_write: bool,
    ) -> Result<LocalMr, RdmaError> {
        {
            let mut cache = lock(&self.mrs);
            if let Some(id) = cache.covering(addr, len, need_write) {
                if let Some((lkey, _)) = cache.acquire(id) {
                    return Ok(LocalMr {
                        device: self,
                        lkey,
                        kind: LocalKind::Cached(id),
                    });
                }
            }
        }
        let access = if need_write {
            sys::IBV_ACCESS_LOCAL_WRITE
        } else {
            0
        };
        let mr = self.reg_mr(addr, len, access)?;
        Ok(LocalMr {
            device: self,
            lkey: mr.lkey,
            kind: LocalKind::Temporary(mr),
        })
    }

    /// Moves `job` over `conn`, piece by piece.
    fn run(
        &self,
        conn: &Conn,
        job: &Job,
        deadline: Option<Instant>,
        start: Instant,
    ) -> Result<(), RdmaError> {
        let pieces: Vec<(usize, usize)> = pieces(job.len, self.max_piece).collect();
        let window = self.sq_depth as usize;
        let (mut next, mut outstanding, mut finished) = (0usize, 0usize, 0usize);
        let mut wcs = [ibv_wc::default(); POLL_BATCH];
        let mut idle = 0u32;
        let failure = 'pump: loop {
            while outstanding < window && next < pieces.len() {
                if let Err(e) = conn.post(job, pieces[next], next as u64) {
                    break 'pump Some(verbs("ibv_post_send", e.to_string()));
                }
                next += 1;
                outstanding += 1;
            }
            if finished == pieces.len() {
                break None;
            }
            let got = match conn.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => break Some(verbs("ibv_poll_cq", e.to_string())),
            };
            let mut failed = None;
            for wc in &wcs[..got] {
                outstanding = outstanding.saturating_sub(1);
                finished += 1;
                if wc.status != sys::IBV_WC_SUCCESS && failed.is_none() {
                    let name = self.lib.status_name(wc.status);
                    failed = Some(completion_error(job, wc.status, wc.vendor_err, name));
                }
            }
            if failed.is_some() {
                break failed;
            }
            if got > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_POLLS {
                std::hint::spin_loop();
                continue;
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    break Some(RdmaError::Timeout {
                        pid: job.pid,
                        seconds: d.saturating_duration_since(start).as_secs_f64(),
                    });
                }
            }
            std::thread::yield_now();
        };
        match failure {
            None => Ok(()),
            Some(e) => {
                conn.abort(outstanding);
                Err(e)
            }
        }
    }
}

/// The error for a failed work completion.
fn completion_error(job: &Job, status: u32, vendor_err: u32, name: String) -> RdmaError {
    let hint = match status {
        sys::IBV_WC_REM_ACCESS_ERR => {
            return RdmaError::Dropped {
                pid: job.pid,
                id: job.id,
            }
        }
        sys::IBV_WC_RETRY_EXC_ERR => {
            "the owner's queue pair did not answer: the owner exited, or the RDMA fabric \
             between the two hosts is down (check the ports with `ibv_devinfo`; on RoCE \
             try another GID index with MONARCH_RDMA_IBVERBS_GID_INDEX)"
        }
        sys::IBV_WC_RNR_RETRY_EXC_ERR => "the owner's queue pair was not ready; retry",
        sys::IBV_WC_REM_INV_REQ_ERR => {
            "the owner refused the request: the range exceeds its registration or its \
             device's limits"
        }
        sys::IBV_WC_WR_FLUSH_ERR => "the connection had already failed; retry",
        _ => "the connection to this owner was reset; retry, and report the status if it persists",
    };
    RdmaError::Completion {
        pid: job.pid,
        op: job.op.name().to_string(),
        status: name,
        vendor_err,
        hint: hint.to_string(),
    }
}

/// A transfer's hold on a registration of its local buffer.
#[derive(Debug)]
struct LocalMr {
    device: &'static Device,
    lkey: u32,
    kind: LocalKind,
}

#[derive(Debug)]
enum LocalKind {
    /// A reference on a cached registration.
    Cached(u64),
    /// A registration for this transfer only.
    Temporary(CachedMr),
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        match &self.kind {
            LocalKind::Cached(id) => {
                let last = lock(&self.device.mrs).release(*id);
                if let Some(mr) = last {
                    self.device.dereg_mr(&mr);
                }
            }
            LocalKind::Temporary(mr) => self.device.dereg_mr(mr),
        }
    }
}

/// Installs the handler that answers connection requests ([`KIND_IBV_CONNECT`]) on
/// this process's transfer server. Call it once at start, whether or not the backend
/// is available here: where it is not, requesters are told why.
pub fn serve() {
    tcp::set_control_handler(KIND_IBV_CONNECT, Box::new(handle_connect));
}

fn handle_connect(payload: &[u8]) -> Result<Vec<u8>, String> {
    let theirs = QpInfo::decode(payload)?;
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
    PEER_REGIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
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
    check_sizes(remote, dst.len())?;
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
    check_sizes(remote, src.len())?;
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

fn check_sizes(remote: &RemoteRegion, local: usize) -> Result<(), RdmaError> {
    if remote.len != local {
        return Err(RdmaError::SizeMismatch {
            remote: remote.len,
            local,
        });
    }
    Ok(())
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
