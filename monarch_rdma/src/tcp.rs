//! The backend between hosts without an RDMA device: transfers over TCP, served by the
//! owner of the memory.
//!
//! A process whose registered memory peers on other hosts may reach runs one transfer
//! server ([`serve`]): a listening socket with an accept thread, and one thread per
//! connection (named `rdma-tcp`). A peer reads or writes a region ([`read()`],
//! [`write()`]) by sending requests to the owner's server. On both sides the kernel
//! copies straight between the socket and the memory: the server sends from and
//! receives into the registered memory itself, the client into and from the caller's
//! slice, so a transfer costs the one copy per side that any TCP transfer costs.
//!
//! A transfer is split into pieces of about `len / parallelism` bytes (at least
//! [`MIN_PIECE`] unless the transfer is smaller, at most [`TcpOptions::chunk_bytes`]),
//! moved over up to [`TcpOptions::parallelism`] connections at once, each connection
//! taking the next piece when it finished one. Connections are kept in a pool per
//! server address, so repeated transfers do not reconnect.
//!
//! The same servers answer control requests ([`request`]) for other backends (the
//! ibverbs backend exchanges queue-pair information this way): a handler registered
//! with [`set_control_handler`] answers each request of its kind.
//!
//! # Protocol
//!
//! A connection carries requests one after the other; each is answered in full before
//! the next is sent. Integers are little-endian.
//!
//! A request is a 48-byte header, followed for `WRITE` and `CONTROL` by `len` bytes:
//!
//! | bytes  | field                                                        |
//! |--------|--------------------------------------------------------------|
//! | 0..4   | magic `MRT1`                                                 |
//! | 4      | op: 0 `PING`, 1 `READ`, 2 `WRITE`, 3 `DROP`, 4 `CONTROL`     |
//! | 5      | the control kind (`CONTROL`), else 0                         |
//! | 6..8   | 0                                                            |
//! | 8..12  | the pid the client believes owns the region                  |
//! | 12..16 | 0                                                            |
//! | 16..24 | the registration id                                          |
//! | 24..32 | the registration key (REG-3 of [`crate::region`])            |
//! | 32..40 | the start address, in the owner's address space              |
//! | 40..48 | the length: of the range (`READ`, `WRITE`), of the payload (`CONTROL`) |
//!
//! A reply is a 16-byte header — magic `MRTR`, a status byte, 3 zero bytes, and the
//! length of the body that follows — and its body:
//!
//! - `OK` (0): the answer. `READ`: the `len` bytes of the range, then a second reply
//!   header (the *trailer*, body included) that says whether the copy is valid (the
//!   registration may have ended during it). `WRITE`, `PING`: empty. `DROP`: one byte,
//!   1 if the registration existed. `CONTROL`: the handler's answer.
//! - `DROPPED` (1): the id is not registered, or the key is wrong (which the server does
//!   not tell apart, REG-3). Empty body.
//! - `OUT_OF_RANGE` (2): the range does not fit in the registration; the body is the
//!   offset, length and registration size, three `u64`.
//! - `REFUSED` (3): any other refusal; the body is the owner's message (UTF-8).
//! - `OWNER_GONE` (4): as `DROPPED`, from a server that is not the pid the request
//!   names: the owner exited and another process listens at its address.
//! - `BAD_REQUEST` (5): a malformed request (bad magic, unknown op, oversized payload);
//!   the body says what, and the server then closes the connection.
//!
//! A refused `WRITE` is refused after its payload was received (and discarded), so
//! the two sides never disagree about where the next request starts.
//!
//! # Invariants
//!
//! - TCP-1 (checked ranges): the server touches `[addr, addr + len)` only after
//!   [`Registry::lookup`] found the registration under the presented id and key and the
//!   range lies inside it; after the copy it checks again, and answers `DROPPED` (in
//!   the trailer, for a `READ`) when the registration ended meanwhile: the bytes moved
//!   then mean nothing. (As with [`crate::cma`], an owner must not drop memory that is
//!   being transferred; this check only reports that it did.)
//! - TCP-2 (no fault in the owner): the server moves registered memory only with
//!   `send(2)` and `recv(2)` on its raw address, never through a Rust reference, so
//!   memory unmapped behind the registry's back (an owner that broke REG-1) or not
//!   writable makes the kernel report `EFAULT`, which the server answers with a
//!   refusal (padding a `READ` with zeros to keep the framing) instead of crashing.
//! - TCP-3 (framing): a client returns a connection to the pool only after a request on
//!   it completed successfully; any failure, refusal or malformed reply closes it, so a
//!   connection never carries a half-read answer into the next request. The server
//!   closes a connection whose request is malformed and keeps serving the others.
//! - TCP-4 (bounded waits): every blocking step of a client is bounded by
//!   [`TcpOptions::deadline`] when one is given (its expiry is [`RdmaError::Timeout`]).
//!   Without one, a dead owner process resets its connections at once, and keep-alive
//!   probes with `TCP_USER_TIMEOUT` notice a dead or cut-off host within about 30 s
//!   ([`RdmaError::Unreachable`]). The server gives up a request that makes no
//!   progress for [`SERVER_STALL`], and waits for the next request without limit.
//! - TCP-5 (one retry): a request is retried once, on a fresh connection, only when it
//!   failed on a connection taken from the pool before any byte of the reply arrived
//!   and not because the deadline passed: the idle connection had died (the server
//!   restarted, a middlebox dropped it), so the request most likely did not run.
//!   (`READ`, `WRITE` and `DROP` are idempotent anyway; control handlers should be
//!   too.) A fresh connection that fails is final. Pooled connections that already
//!   read as closed are discarded without a request.
//!
//! # Threads
//!
//! The server: one accept thread per listening socket and one thread per connection,
//! each serving its connection's requests in turn (a client with `parallelism` 4 keeps
//! 4 server threads busy). A client transfer runs on the calling thread and, with more
//! than one piece, on up to `parallelism - 1` scoped threads that end with the call.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::region::{Registry, RemoteRegion};
use crate::RdmaError;

/// The smallest piece a transfer is split into for parallelism (unless the transfer,
/// or [`TcpOptions::chunk_bytes`], is smaller): below it, a request's round trip costs
/// more than a second connection gains.
pub const MIN_PIECE: usize = 1 << 20;

/// The largest control request or answer, in bytes.
pub const MAX_CONTROL_BYTES: usize = 64 << 20;

/// How long a server waits for progress (a byte received or sent) within a request
/// before it gives the connection up.
pub const SERVER_STALL: Duration = Duration::from_secs(120);

/// How long a client waits for a connection when the deadline allows more (or there is
/// none): longer means the host is cut off, not slow.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest error message a client accepts.
const MAX_MESSAGE_BYTES: u64 = 64 << 10;

/// The most idle connections the pool keeps per server address.
const POOL_PER_SERVER: usize = 64;

/// The most bytes one system call is asked to move.
const MAX_SYSCALL: usize = 1 << 30;

/// The first control kind free for other modules; lower kinds belong to this module.
const FIRST_FREE_KIND: u8 = 16;

const REQUEST_MAGIC: [u8; 4] = *b"MRT1";
const REPLY_MAGIC: [u8; 4] = *b"MRTR";
const REQUEST_BYTES: usize = 48;
const REPLY_BYTES: usize = 16;

const OP_PING: u8 = 0;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_DROP: u8 = 3;
const OP_CONTROL: u8 = 4;

const OK: u8 = 0;
const DROPPED: u8 = 1;
const OUT_OF_RANGE: u8 = 2;
const REFUSED: u8 = 3;
const OWNER_GONE: u8 = 4;
const BAD_REQUEST: u8 = 5;

/// Options of one transfer.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// The most connections the transfer uses at once (at least 1).
    pub parallelism: usize,
    /// The largest piece one request moves, in bytes.
    pub chunk_bytes: usize,
    /// When the transfer must have finished; past it, [`RdmaError::Timeout`]. `None`
    /// waits as long as the connection lives (TCP-4).
    pub deadline: Option<Instant>,
}

impl Default for TcpOptions {
    /// 4 connections, pieces of at most 64 MiB, no deadline.
    fn default() -> Self {
        Self {
            parallelism: 4,
            chunk_bytes: 64 << 20,
            deadline: None,
        }
    }
}

// ---------------------------------------------------------------------------------
// Wire format.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    op: u8,
    kind: u8,
    pid: u32,
    id: u64,
    key: u64,
    addr: u64,
    len: u64,
}

impl Request {
    fn for_region(op: u8, remote: &RemoteRegion, offset: u64, len: usize) -> Self {
        Self {
            op,
            kind: 0,
            pid: remote.pid,
            id: remote.id,
            key: remote.key,
            addr: remote.addr.wrapping_add(offset),
            len: len as u64,
        }
    }

    fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = self.op;
        b[5] = self.kind;
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn decode(b: &[u8; REQUEST_BYTES]) -> Option<Self> {
        if b[0..4] != REQUEST_MAGIC {
            return None;
        }
        Some(Self {
            op: b[4],
            kind: b[5],
            pid: u32_at(b, 8),
            id: u64_at(b, 16),
            key: u64_at(b, 24),
            addr: u64_at(b, 32),
            len: u64_at(b, 40),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    status: u8,
    len: u64,
}

impl Reply {
    fn encode(&self) -> [u8; REPLY_BYTES] {
        let mut b = [0u8; REPLY_BYTES];
        b[0..4].copy_from_slice(&REPLY_MAGIC);
        b[4] = self.status;
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn decode(b: &[u8; REPLY_BYTES]) -> Option<Self> {
        if b[0..4] != REPLY_MAGIC {
            return None;
        }
        Some(Self {
            status: b[4],
            len: u64_at(b, 8),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

// ---------------------------------------------------------------------------------
// Socket steps.

/// The error of a step that the client's deadline cut short.
#[derive(Debug)]
struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the transfer's deadline passed")
    }
}

impl std::error::Error for DeadlinePassed {}

fn deadline_passed() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, DeadlinePassed)
}

fn is_deadline(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<DeadlinePassed>())
}

/// How a socket step is bounded in time.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// By the socket's timeouts as they are (the server's [`SERVER_STALL`], or none).
    Keep,
    /// By this instant: each system call gets the time left.
    Until(Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Recv,
}

/// Sets the socket's timeout of `direction` to what is left of `limit`.
fn arm(stream: &TcpStream, direction: Direction, limit: Limit) -> io::Result<()> {
    let Limit::Until(deadline) = limit else {
        return Ok(());
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(deadline_passed());
    }
    match direction {
        Direction::Send => stream.set_write_timeout(Some(left)),
        Direction::Recv => stream.set_read_timeout(Some(left)),
    }
}

/// Moves `len` bytes between the socket and the memory at `ptr` (sends from it, or
/// receives into it with `MSG_WAITALL`), counting the bytes moved in `done`. Returns
/// `Ok(false)` when the kernel found the memory at `ptr + done` unreachable (`EFAULT`),
/// with the socket still in order.
///
/// # Safety
///
/// For [`Direction::Recv`], nothing else may be reading or writing `[ptr, ptr + len)`
/// through a Rust reference (the kernel writes it); the memory need not be mapped
/// (TCP-2).
unsafe fn move_bytes(
    stream: &TcpStream,
    direction: Direction,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
    limit: Limit,
    done: &mut usize,
) -> io::Result<bool> {
    let fd = stream.as_raw_fd();
    while *done < len {
        arm(stream, direction, limit)?;
        let want = (len - *done).min(MAX_SYSCALL);
        let at = ptr.wrapping_add(*done).cast::<libc::c_void>();
        // SAFETY: the kernel reads or writes at most `want` bytes at `at`, inside
        // `[ptr, ptr + len)`, which the caller lends for this (see # Safety); memory it
        // cannot reach yields EFAULT rather than a fault in this process.
        let n = unsafe {
            match direction {
                Direction::Send => libc::send(fd, at, want, flags | libc::MSG_NOSIGNAL),
                Direction::Recv => libc::recv(fd, at, want, flags | libc::MSG_WAITALL),
            }
        };
        if n > 0 {
            *done += n.unsigned_abs();
            continue;
        }
        if n == 0 {
            return Err(match direction {
                Direction::Recv => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ),
                Direction::Send => io::ErrorKind::WriteZero.into(),
            });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                return Err(match limit {
                    Limit::Until(_) => deadline_passed(),
                    Limit::Keep => io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no progress within the socket's timeout",
                    ),
                })
            }
            Some(libc::EFAULT) => return Ok(false),
            _ => return Err(e),
        }
    }
    Ok(true)
}

/// Sends all of `bytes`.
fn send_all(stream: &TcpStream, bytes: &[u8], flags: libc::c_int, limit: Limit) -> io::Result<()> {
    let mut done = 0;
    // SAFETY: the kernel only reads the slice (send never writes the memory).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Send,
            bytes.as_ptr().cast_mut(),
            bytes.len(),
            flags,
            limit,
            &mut done,
        )
    }?;
    whole
        .then_some(())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Fills all of `bytes`, counting the bytes received in `done`.
fn recv_all(
    stream: &TcpStream,
    bytes: &mut [u8],
    limit: Limit,
    done: &mut usize,
) -> io::Result<()> {
    // SAFETY: the slice is borrowed mutably, so nothing else accesses it.
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Recv,
            bytes.as_mut_ptr(),
            bytes.len(),
            0,
            limit,
            done,
        )
    }?;
    whole
        .then_some(())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Receives and discards `len` bytes.
fn drain(stream: &TcpStream, mut len: u64) -> io::Result<()> {
    let mut sink = vec![0u8; (len.min(1 << 20)) as usize];
    while len > 0 {
        let piece = len.min(sink.len() as u64) as usize;
        recv_all(stream, &mut sink[..piece], Limit::Keep, &mut 0)?;
        len -= piece as u64;
    }
    Ok(())
}

/// Sends `len` zero bytes.
fn pad(stream: &TcpStream, mut len: usize) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let piece = len.min(ZEROS.len());
        send_all(stream, &ZEROS[..piece], libc::MSG_MORE, Limit::Keep)?;
        len -= piece;
    }
    Ok(())
}

fn set_int_option(stream: &TcpStream, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: passes a live c_int and its size; setsockopt only reads it.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "rdma tcp: setsockopt({level}, {name}, {value}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// Prepares a connection (either side): no Nagle delay, and keep-alive probes with a
/// user timeout so that a dead or cut-off peer host is noticed within about 30 s
/// (TCP-4). Socket buffers are left to the kernel's auto-tuning, which grows them
/// beyond what `SO_SNDBUF`/`SO_RCVBUF` may ask for (`net.core.[rw]mem_max`) and
/// measured as fast.
fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!("rdma tcp: TCP_NODELAY failed: {e}");
    }
    set_int_option(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 30_000);
    if let Some(bytes) = socket_buffer() {
        set_int_option(stream, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
        set_int_option(stream, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes);
    }
}

/// The socket buffer size from `MONARCH_RDMA_TCP_SOCKET_BUFFER` (bytes), if set:
/// for experiments, since fixed buffers turn the kernel's auto-tuning off.
fn socket_buffer() -> Option<libc::c_int> {
    static BYTES: LazyLock<Option<libc::c_int>> = LazyLock::new(|| {
        std::env::var("MONARCH_RDMA_TCP_SOCKET_BUFFER")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&b: &libc::c_int| b > 0)
    });
    *BYTES
}

// ---------------------------------------------------------------------------------
// The server.

/// Starts (once per process; later calls return the same address) the transfer server
/// for [`Registry::global`], listening on `0.0.0.0:0` (or `MONARCH_RDMA_TCP_BIND`,
/// `IP:PORT`), and returns the address peers must dial: the listening port at
/// [`hyperactor::channel::primary_ip`] (or `MONARCH_RDMA_TCP_ADVERTISE_IP`;
/// `127.0.0.1` when the machine has no other address). With a specific bind IP and no
/// advertised one, the bind IP is advertised.
///
/// # Errors
///
/// A malformed environment variable, or the socket's error (e.g. the port is taken).
/// A failed start may be retried.
pub fn serve() -> io::Result<SocketAddr> {
    static SERVED: Mutex<Option<SocketAddr>> = Mutex::new(None);
    let mut served = lock(&SERVED);
    if let Some(addr) = *served {
        return Ok(addr);
    }
    let invalid = |name: &str, value: &str, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name}={value:?} is malformed: {e}"),
        )
    };
    let mut bind = match std::env::var("MONARCH_RDMA_TCP_BIND") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<SocketAddr>()
            .map_err(|e| invalid("MONARCH_RDMA_TCP_BIND", &v, &e))?,
        _ => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
    };
    let advertise = match std::env::var("MONARCH_RDMA_TCP_ADVERTISE_IP") {
        Ok(v) if !v.trim().is_empty() => Some(
            v.trim()
                .parse::<IpAddr>()
                .map_err(|e| invalid("MONARCH_RDMA_TCP_ADVERTISE_IP", &v, &e))?,
        ),
        _ if bind.ip().is_unspecified() => {
            let ip = hyperactor::channel::primary_ip().unwrap_or(Ipv4Addr::LOCALHOST.into());
            // A host with only IPv6 addresses: listen on IPv6 (and IPv4) too.
            if ip.is_ipv6() && bind.is_ipv4() {
                bind = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), bind.port());
            }
            Some(ip)
        }
        _ => None,
    };
    let addr = serve_registry(Registry::global(), bind, advertise)?;
    *served = Some(addr);
    Ok(addr)
}

/// Starts a transfer server for `registry`, listening on `bind`, and returns the
/// address to advertise: the listening port at `advertise`, or at the bound IP.
///
/// # Errors
///
/// The socket's error, or the thread's when it cannot be started.
pub fn serve_registry(
    registry: &'static Registry,
    bind: SocketAddr,
    advertise: Option<IpAddr>,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(bind)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("rdma-tcp-accept".into())
        .spawn(move || accept_loop(listener, registry))?;
    Ok(SocketAddr::new(
        advertise.unwrap_or(bound.ip()),
        bound.port(),
    ))
}

fn accept_loop(listener: TcpListener, registry: &'static Registry) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let spawned = std::thread::Builder::new()
                    .name("rdma-tcp".into())
                    .spawn(move || serve_connection(stream, registry, peer));
                if let Err(e) = spawned {
                    // The connection was dropped with the closure: the client sees a
                    // reset and reports it.
                    tracing::warn!("rdma tcp: no thread for a connection from {peer}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                // Out of descriptors or memory: wait for some to be released rather
                // than spin.
                tracing::warn!("rdma tcp: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn serve_connection(stream: TcpStream, registry: &'static Registry, peer: SocketAddr) {
    tune(&stream);
    if let Err(e) = stream.set_write_timeout(Some(SERVER_STALL)) {
        tracing::debug!("rdma tcp: connection from {peer}: {e}");
        return;
    }
    let mut head = [0u8; REQUEST_BYTES];
    loop {
        // Idle: wait for the next request as long as the client lives (TCP-4).
        let mut got = 0;
        let received = stream
            .set_read_timeout(None)
            .and_then(|()| recv_all(&stream, &mut head, Limit::Keep, &mut got));
        if let Err(e) = received {
            if got > 0 {
                tracing::debug!("rdma tcp: connection from {peer}: {e}");
            }
            return;
        }
        let Some(request) = Request::decode(&head) else {
            let message = "malformed request: bad magic (is this a monarch rdma tcp client?)";
            let _ = send_reply(&stream, BAD_REQUEST, message.as_bytes());
            tracing::debug!("rdma tcp: connection from {peer}: {message}");
            return;
        };
        let served = stream
            .set_read_timeout(Some(SERVER_STALL))
            .and_then(|()| serve_request(&stream, registry, &request));
        if let Err(e) = served {
            tracing::debug!("rdma tcp: connection from {peer}: {e}");
            return;
        }
    }
}

/// Serves one request; an error closes the connection.
fn serve_request(stream: &TcpStream, registry: &Registry, request: &Request) -> io::Result<()> {
    match request.op {
        OP_PING => send_reply(stream, OK, &[]),
        OP_READ => serve_read(stream, registry, request),
        OP_WRITE => serve_write(stream, registry, request),
        OP_DROP => {
            let existed =
                registry.lookup(request.id, request.key).is_ok() && registry.deregister(request.id);
            send_reply(stream, OK, &[u8::from(existed)])
        }
        OP_CONTROL => serve_control(stream, request),
        op => {
            let message = format!("malformed request: unknown operation {op}");
            let _ = send_reply(stream, BAD_REQUEST, message.as_bytes());
            Err(io::Error::new(io::ErrorKind::InvalidData, message))
        }
    }
}

/// A server's answer other than OK.
#[derive(Debug)]
struct Refusal {
    status: u8,
    body: Vec<u8>,
}

impl Refusal {
    fn refused(message: String) -> Self {
        Self {
            status: REFUSED,
            body: message.into_bytes(),
        }
    }
}

/// Checks a READ or WRITE (TCP-1); returns the range's length.
fn check(registry: &Registry, request: &Request) -> Result<usize, Refusal> {
    let Ok(region) = registry.lookup(request.id, request.key) else {
        let status = if request.pid == std::process::id() {
            DROPPED
        } else {
            OWNER_GONE
        };
        return Err(Refusal {
            status,
            body: Vec::new(),
        });
    };
    let start = region.addr;
    let end = start.saturating_add(region.len as u64);
    if request.addr < start || request.addr > end {
        return Err(Refusal::refused(format!(
            "address {:#x} is outside buffer {} ({} bytes at {:#x})",
            request.addr, region.id, region.len, start
        )));
    }
    let offset = request.addr - start;
    let fits = offset
        .checked_add(request.len)
        .is_some_and(|e| e <= region.len as u64);
    match usize::try_from(request.len) {
        Ok(len) if fits => Ok(len),
        _ => {
            let mut body = Vec::with_capacity(24);
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&request.len.to_le_bytes());
            body.extend_from_slice(&(region.len as u64).to_le_bytes());
            Err(Refusal {
                status: OUT_OF_RANGE,
                body,
            })
        }
    }
}

/// What to answer after a copy (TCP-1, TCP-2).
fn after_copy(registry: &Registry, request: &Request, whole: bool) -> Result<(), Refusal> {
    check(registry, request)?;
    if whole {
        return Ok(());
    }
    let verb = if request.op == OP_WRITE {
        "writable"
    } else {
        "readable"
    };
    Err(Refusal::refused(format!(
        "the memory of buffer {} ({:#x}, {} bytes) is not {verb} in pid {}: the owner freed \
         or protected it without dropping the registration",
        request.id,
        request.addr,
        request.len,
        std::process::id()
    )))
}

fn send_reply(stream: &TcpStream, status: u8, body: &[u8]) -> io::Result<()> {
    let head = Reply {
        status,
        len: body.len() as u64,
    }
    .encode();
    if body.len() <= 4096 {
        let mut message = Vec::with_capacity(REPLY_BYTES + body.len());
        message.extend_from_slice(&head);
        message.extend_from_slice(body);
        send_all(stream, &message, 0, Limit::Keep)
    } else {
        send_all(stream, &head, libc::MSG_MORE, Limit::Keep)?;
        send_all(stream, body, 0, Limit::Keep)
    }
}

fn send_outcome(stream: &TcpStream, outcome: Result<(), Refusal>) -> io::Result<()> {
    match outcome {
        Ok(()) => send_reply(stream, OK, &[]),
        Err(refusal) => send_reply(stream, refusal.status, &refusal.body),
    }
}

/// The registered memory at `addr`, as a pointer the kernel may use (TCP-2).
fn registered_ptr(addr: u64) -> io::Result<*mut u8> {
    let addr = usize::try_from(addr).map_err(|_| io::ErrorKind::InvalidData)?;
    Ok(std::ptr::with_exposed_provenance_mut(addr))
}

fn serve_read(stream: &TcpStream, registry: &Registry, request: &Request) -> io::Result<()> {
    let len = match check(registry, request) {
        Ok(len) => len,
        Err(refusal) => return send_reply(stream, refusal.status, &refusal.body),
    };
    let head = Reply {
        status: OK,
        len: request.len,
    };
    send_all(stream, &head.encode(), libc::MSG_MORE, Limit::Keep)?;
    let mut done = 0;
    // SAFETY: send only reads the memory; `check` found `[addr, addr + len)` inside a
    // live registration, and memory the owner unmapped regardless gives EFAULT (TCP-2).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Send,
            registered_ptr(request.addr)?,
            len,
            libc::MSG_MORE,
            Limit::Keep,
            &mut done,
        )
    }?;
    if !whole {
        pad(stream, len - done)?;
    }
    send_outcome(stream, after_copy(registry, request, whole))
}

fn serve_write(stream: &TcpStream, registry: &Registry, request: &Request) -> io::Result<()> {
    let len = match check(registry, request) {
        Ok(len) => len,
        Err(refusal) => {
            // Keep the framing: the payload follows the header regardless.
            drain(stream, request.len)?;
            return send_reply(stream, refusal.status, &refusal.body);
        }
    };
    let mut done = 0;
    // SAFETY: `check` found `[addr, addr + len)` inside a live registration, whose
    // owner lets peers write it at any time (REG-1) and holds no reference to it that
    // this write could invalidate; memory it unmapped regardless gives EFAULT (TCP-2).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Recv,
            registered_ptr(request.addr)?,
            len,
            0,
            Limit::Keep,
            &mut done,
        )
    }?;
    if !whole {
        drain(stream, (len - done) as u64)?;
    }
    send_outcome(stream, after_copy(registry, request, whole))
}

/// A handler of control requests (see [`set_control_handler`]): the request's payload
/// in, the answer or an error message (sent to the client as [`RdmaError::Refused`])
/// out.
pub type ControlHandler = dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync;

static HANDLERS: RwLock<BTreeMap<u8, Arc<ControlHandler>>> = RwLock::new(BTreeMap::new());

fn serve_control(stream: &TcpStream, request: &Request) -> io::Result<()> {
    let len = match usize::try_from(request.len) {
        Ok(len) if len <= MAX_CONTROL_BYTES => len,
        _ => {
            let message = format!(
                "malformed request: a control payload of {} bytes (at most {MAX_CONTROL_BYTES})",
                request.len
            );
            let _ = send_reply(stream, BAD_REQUEST, message.as_bytes());
            return Err(io::Error::new(io::ErrorKind::InvalidData, message));
        }
    };
    let mut payload = vec![0u8; len];
    recv_all(stream, &mut payload, Limit::Keep, &mut 0)?;
    let handler = HANDLERS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&request.kind)
        .cloned();
    let pid = std::process::id();
    let Some(handler) = handler else {
        let message = format!(
            "pid {pid} has no handler for control requests of kind {}",
            request.kind
        );
        return send_reply(stream, REFUSED, message.as_bytes());
    };
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&payload)));
    match answer {
        Ok(Ok(answer)) if answer.len() <= MAX_CONTROL_BYTES => send_reply(stream, OK, &answer),
        Ok(Ok(answer)) => {
            let message = format!(
                "the handler of control kind {} answered {} bytes (at most {MAX_CONTROL_BYTES})",
                request.kind,
                answer.len()
            );
            send_reply(stream, REFUSED, message.as_bytes())
        }
        Ok(Err(message)) => send_reply(stream, REFUSED, message.as_bytes()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let message = format!(
                "the handler of control kind {} in pid {pid} panicked: {what}",
                request.kind
            );
            send_reply(stream, REFUSED, message.as_bytes())
        }
    }
}

/// Registers the handler of control requests of `kind` in this process's server(s),
/// replacing any earlier one. Kinds 0..=15 are reserved for this module: a handler for
/// one of them is refused (and logged).
pub fn set_control_handler(kind: u8, handler: Box<ControlHandler>) {
    if kind < FIRST_FREE_KIND {
        tracing::error!(
            "rdma tcp: control kind {kind} is reserved (use {FIRST_FREE_KIND} or more); \
             the handler is ignored"
        );
        return;
    }
    HANDLERS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(kind, Arc::from(handler));
}

// ---------------------------------------------------------------------------------
// The client.

static POOL: LazyLock<Mutex<HashMap<SocketAddr, Vec<TcpStream>>>> = LazyLock::new(Default::default);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// An idle connection to `server` from the pool, if one is still open.
fn checkout(server: SocketAddr) -> Option<TcpStream> {
    loop {
        let stream = lock(&POOL).get_mut(&server)?.pop()?;
        if idle_and_open(&stream) {
            return Some(stream);
        }
    }
}

/// Returns a connection whose requests all succeeded to the pool (TCP-3).
fn checkin(server: SocketAddr, stream: TcpStream) {
    let mut pool = lock(&POOL);
    let idle = pool.entry(server).or_default();
    if idle.len() < POOL_PER_SERVER {
        idle.push(stream);
    }
}

/// Whether an idle connection is still open with nothing unread: a closed one reads
/// EOF or an error, one with unread bytes is out of step.
fn idle_and_open(stream: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv writes at most one byte, into `byte`.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
}

/// What a request moves besides its header.
#[derive(Debug)]
enum Body<'a> {
    /// Nothing (`DROP`, `PING`).
    Empty,
    /// A payload sent after the header (`WRITE`, `CONTROL`).
    Send(&'a [u8]),
    /// The destination of a `READ`'s bytes.
    Recv(&'a mut [u8]),
}

impl Body<'_> {
    fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Send(bytes) => bytes.len(),
            Body::Recv(bytes) => bytes.len(),
        }
    }
}

/// How a request failed.
#[derive(Debug)]
enum Failure {
    /// The connection failed; `replied` once any byte of the reply had arrived.
    Io { error: io::Error, replied: bool },
    /// The server refused, or answered something malformed.
    Answer(RdmaError),
}

/// One call of the public API: where, for whom, and until when.
#[derive(Debug)]
struct Call {
    server: SocketAddr,
    pid: u32,
    deadline: Option<Instant>,
    /// The time the caller gave, in seconds, for [`RdmaError::Timeout`].
    budget: f64,
}

impl Call {
    fn new(server: SocketAddr, pid: u32, opts: &TcpOptions) -> Self {
        let budget = opts.deadline.map_or(0.0, |d| {
            d.saturating_duration_since(Instant::now()).as_secs_f64()
        });
        Self {
            server,
            pid,
            deadline: opts.deadline,
            budget,
        }
    }

    fn timeout(&self) -> RdmaError {
        RdmaError::Timeout {
            pid: self.pid,
            seconds: (self.budget * 1000.0).round() / 1000.0,
        }
    }

    fn unreachable(&self, source: io::Error) -> RdmaError {
        RdmaError::Unreachable {
            pid: self.pid,
            addr: self.server.to_string(),
            source,
        }
    }

    fn refused(&self, message: String) -> RdmaError {
        RdmaError::Refused {
            pid: self.pid,
            message,
        }
    }

    fn malformed(&self, what: &str) -> Failure {
        Failure::Answer(self.refused(format!(
            "malformed reply from {} ({what}): is it a monarch rdma tcp server of the same \
             version?",
            self.server
        )))
    }

    fn error(&self, failure: Failure) -> RdmaError {
        match failure {
            Failure::Io { error, .. } if is_deadline(&error) => self.timeout(),
            Failure::Io { error, .. } => self.unreachable(error),
            Failure::Answer(e) => e,
        }
    }

    fn connect(&self) -> Result<TcpStream, RdmaError> {
        let timeout = match self.deadline {
            None => CONNECT_TIMEOUT,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.timeout());
                }
                left.min(CONNECT_TIMEOUT)
            }
        };
        match TcpStream::connect_timeout(&self.server, timeout) {
            Ok(stream) => {
                tune(&stream);
                Ok(stream)
            }
            Err(_) if self.deadline.is_some_and(|d| Instant::now() >= d) => Err(self.timeout()),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    /// Runs `request` on `conn` (or on a connection from the pool, or a new one),
    /// retrying once per TCP-5; leaves a connection that succeeded in `conn`.
    fn run(
        &self,
        conn: &mut Option<TcpStream>,
        request: &Request,
        body: &mut Body<'_>,
    ) -> Result<Vec<u8>, RdmaError> {
        let (stream, pooled) = match conn.take() {
            Some(stream) => (stream, false),
            None => match checkout(self.server) {
                Some(stream) => (stream, true),
                None => (self.connect()?, false),
            },
        };
        let failure = match self.exchange(&stream, request, body) {
            Ok(answer) => {
                *conn = Some(stream);
                return Ok(answer);
            }
            Err(failure) => failure,
        };
        drop(stream);
        match failure {
            Failure::Io {
                error,
                replied: false,
            } if pooled && !is_deadline(&error) => {
                tracing::debug!(
                    "rdma tcp: an idle connection to {} failed ({error}); retrying on a new one",
                    self.server
                );
                let stream = self.connect()?;
                let answer = self
                    .exchange(&stream, request, body)
                    .map_err(|f| self.error(f))?;
                *conn = Some(stream);
                Ok(answer)
            }
            failure => Err(self.error(failure)),
        }
    }

    /// Runs one request on one connection that was given back.
    fn once(&self, request: &Request, body: &mut Body<'_>) -> Result<Vec<u8>, RdmaError> {
        let mut conn = None;
        let answer = self.run(&mut conn, request, body)?;
        if let Some(stream) = conn {
            checkin(self.server, stream);
        }
        Ok(answer)
    }

    /// Sends `request` and its body on `stream` and receives the answer: the reply's
    /// body, or for a `READ` the bytes into the body's slice.
    fn exchange(
        &self,
        stream: &TcpStream,
        request: &Request,
        body: &mut Body<'_>,
    ) -> Result<Vec<u8>, Failure> {
        let io = |error| Failure::Io {
            error,
            replied: false,
        };
        let limit = match self.deadline {
            Some(deadline) => Limit::Until(deadline),
            None => {
                // A pooled connection may still hold an earlier call's timeouts.
                stream.set_read_timeout(None).map_err(io)?;
                stream.set_write_timeout(None).map_err(io)?;
                Limit::Keep
            }
        };
        let head = request.encode();
        match body {
            Body::Send(payload) if payload.len() > 4096 => {
                send_all(stream, &head, libc::MSG_MORE, limit).map_err(io)?;
                send_all(stream, payload, 0, limit).map_err(io)?;
            }
            Body::Send(payload) => {
                let mut message = Vec::with_capacity(REQUEST_BYTES + payload.len());
                message.extend_from_slice(&head);
                message.extend_from_slice(payload);
                send_all(stream, &message, 0, limit).map_err(io)?;
            }
            _ => send_all(stream, &head, 0, limit).map_err(io)?,
        }
        let mut got = 0;
        let reply = self.recv_reply(stream, request, limit, &mut got)?;
        let replied = |error| Failure::Io {
            error,
            replied: true,
        };
        match body {
            Body::Recv(dst) => {
                if reply.len != dst.len() as u64 {
                    return Err(self.malformed("a READ answer of the wrong length"));
                }
                recv_all(stream, dst, limit, &mut 0).map_err(replied)?;
                // The trailer: whether the bytes are valid (TCP-1).
                self.recv_reply(stream, request, limit, &mut 1)?;
                Ok(Vec::new())
            }
            _ => {
                let len = usize::try_from(reply.len)
                    .ok()
                    .filter(|&len| len <= MAX_CONTROL_BYTES)
                    .ok_or_else(|| self.malformed("an oversized answer"))?;
                let mut answer = vec![0u8; len];
                recv_all(stream, &mut answer, limit, &mut 0).map_err(replied)?;
                Ok(answer)
            }
        }
    }

    /// Receives a reply header; an OK one is returned, a refusal (with its body) is
    /// turned into its error. `got` counts the bytes received (> 0: the reply began).
    fn recv_reply(
        &self,
        stream: &TcpStream,
        request: &Request,
        limit: Limit,
        got: &mut usize,
    ) -> Result<Reply, Failure> {
        let mut head = [0u8; REPLY_BYTES];
        let mut done = 0;
        let received = recv_all(stream, &mut head, limit, &mut done);
        *got += done;
        received.map_err(|error| Failure::Io {
            error,
            replied: *got > 0,
        })?;
        let reply = Reply::decode(&head).ok_or_else(|| self.malformed("bad magic"))?;
        if reply.status == OK {
            return Ok(reply);
        }
        if reply.len > MAX_MESSAGE_BYTES {
            return Err(self.malformed("an oversized error message"));
        }
        let mut body = vec![0u8; reply.len as usize];
        recv_all(stream, &mut body, limit, &mut 0).map_err(|error| Failure::Io {
            error,
            replied: true,
        })?;
        Err(Failure::Answer(self.refusal(request, reply.status, &body)))
    }

    fn refusal(&self, request: &Request, status: u8, body: &[u8]) -> RdmaError {
        match status {
            DROPPED => RdmaError::Dropped {
                pid: self.pid,
                id: request.id,
            },
            OWNER_GONE => RdmaError::OwnerGone { pid: self.pid },
            OUT_OF_RANGE if body.len() == 24 => RdmaError::OutOfRange {
                offset: u64_at(body, 0) as usize,
                len: u64_at(body, 8) as usize,
                size: u64_at(body, 16) as usize,
            },
            _ if body.is_empty() => self.refused(format!("status {status}")),
            _ => self.refused(String::from_utf8_lossy(body).into_owned()),
        }
    }

    /// Moves `pieces` of `remote` (their offsets in it, and their bodies) over up to
    /// `parallelism` connections; `count` is how many pieces there are.
    fn transfer<'a>(
        &self,
        remote: &RemoteRegion,
        op: u8,
        pieces: impl Iterator<Item = (u64, Body<'a>)> + Send,
        count: usize,
        parallelism: usize,
    ) -> Result<(), RdmaError> {
        let workers = parallelism.max(1).min(count.max(1));
        let queue = Mutex::new(pieces);
        let failed = AtomicBool::new(false);
        let first_error = Mutex::new(None);
        let work = || {
            let mut conn = None;
            while !failed.load(Ordering::Relaxed) {
                let Some((offset, mut body)) = lock(&queue).next() else {
                    break;
                };
                let request = Request::for_region(op, remote, offset, body.len());
                if let Err(e) = self.run(&mut conn, &request, &mut body) {
                    failed.store(true, Ordering::Relaxed);
                    lock(&first_error).get_or_insert(e);
                    return;
                }
            }
            if let Some(stream) = conn {
                checkin(self.server, stream);
            }
        };
        if workers == 1 {
            work();
        } else {
            std::thread::scope(|scope| {
                for _ in 1..workers {
                    let spawned = std::thread::Builder::new()
                        .name("rdma-tcp-client".into())
                        .spawn_scoped(scope, work);
                    if let Err(e) = spawned {
                        // Fewer connections; the pieces are still all moved.
                        tracing::debug!("rdma tcp: no thread for a connection: {e}");
                        break;
                    }
                }
                work();
            });
        }
        match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The size of the pieces a transfer of `len` bytes is split into.
fn piece_bytes(len: usize, opts: &TcpOptions) -> usize {
    len.div_ceil(opts.parallelism.max(1))
        .max(MIN_PIECE)
        .min(opts.chunk_bytes)
        .max(1)
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

/// Copies the whole `remote` region (served at `server`) into `dst`.
///
/// # Errors
///
/// [`RdmaError::SizeMismatch`] unless `dst.len() == remote.len`;
/// [`RdmaError::Dropped`] if the registration ended (or the key is wrong);
/// [`RdmaError::OutOfRange`] or [`RdmaError::Refused`] for a range the registration
/// does not hold; [`RdmaError::OwnerGone`] if another process serves the address;
/// [`RdmaError::Unreachable`] if the server cannot be reached or the connection broke;
/// [`RdmaError::Timeout`] past the deadline. After an error, `dst` holds an unspecified
/// mix of old and new bytes.
pub fn read(
    server: SocketAddr,
    remote: &RemoteRegion,
    dst: &mut [u8],
    opts: &TcpOptions,
) -> Result<(), RdmaError> {
    check_sizes(remote, dst.len())?;
    let call = Call::new(server, remote.pid, opts);
    if dst.is_empty() {
        let pieces = std::iter::once((0, Body::Recv(dst)));
        return call.transfer(remote, OP_READ, pieces, 1, 1);
    }
    let piece = piece_bytes(dst.len(), opts);
    let count = dst.len().div_ceil(piece);
    let pieces = dst
        .chunks_mut(piece)
        .enumerate()
        .map(|(i, chunk)| ((i * piece) as u64, Body::Recv(chunk)));
    call.transfer(remote, OP_READ, pieces, count, opts.parallelism)
}

/// Copies `src` into the whole `remote` region (served at `server`).
///
/// # Errors
///
/// As [`read()`]; after an error the remote region holds an unspecified mix of old and
/// new bytes.
pub fn write(
    server: SocketAddr,
    remote: &RemoteRegion,
    src: &[u8],
    opts: &TcpOptions,
) -> Result<(), RdmaError> {
    check_sizes(remote, src.len())?;
    let call = Call::new(server, remote.pid, opts);
    if src.is_empty() {
        let pieces = std::iter::once((0, Body::Send(src)));
        return call.transfer(remote, OP_WRITE, pieces, 1, 1);
    }
    let piece = piece_bytes(src.len(), opts);
    let count = src.len().div_ceil(piece);
    let pieces = src
        .chunks(piece)
        .enumerate()
        .map(|(i, chunk)| ((i * piece) as u64, Body::Send(chunk)));
    call.transfer(remote, OP_WRITE, pieces, count, opts.parallelism)
}

/// Asks the owner to deregister the region (the whole registration `remote` is part
/// of). Returns `Ok(true)` if it was registered, `Ok(false)` if it was already gone
/// (or the key is wrong).
///
/// # Errors
///
/// [`RdmaError::Unreachable`] or [`RdmaError::Timeout`] as in [`read()`].
pub fn drop_remote(
    server: SocketAddr,
    remote: &RemoteRegion,
    opts: &TcpOptions,
) -> Result<bool, RdmaError> {
    let call = Call::new(server, remote.pid, opts);
    let request = Request::for_region(OP_DROP, remote, 0, 0);
    match call.once(&request, &mut Body::Empty)?.as_slice() {
        [existed] => Ok(*existed == 1),
        _ => Err(call.error(call.malformed("a DROP answer of the wrong length"))),
    }
}

/// Sends `payload` to the control handler of `kind` at `server` (see
/// [`set_control_handler`]) and returns its answer. `pid` is the owner's pid, for
/// errors.
///
/// # Errors
///
/// [`RdmaError::Refused`] with the handler's message when it fails, when there is no
/// handler, or when the payload exceeds [`MAX_CONTROL_BYTES`];
/// [`RdmaError::Unreachable`] or [`RdmaError::Timeout`] as in [`read()`].
pub fn request(
    server: SocketAddr,
    pid: u32,
    kind: u8,
    payload: &[u8],
    opts: &TcpOptions,
) -> Result<Vec<u8>, RdmaError> {
    let call = Call::new(server, pid, opts);
    if payload.len() > MAX_CONTROL_BYTES {
        return Err(call.refused(format!(
            "a control payload of {} bytes exceeds the limit of {MAX_CONTROL_BYTES}",
            payload.len()
        )));
    }
    let request = Request {
        op: OP_CONTROL,
        kind,
        pid,
        id: 0,
        key: 0,
        addr: 0,
        len: payload.len() as u64,
    };
    call.once(&request, &mut Body::Send(payload))
}

/// Checks that the server at `server` answers.
#[cfg(test)]
fn ping(server: SocketAddr, opts: &TcpOptions) -> Result<(), RdmaError> {
    let call = Call::new(server, 0, opts);
    let request = Request {
        op: OP_PING,
        kind: 0,
        pid: 0,
        id: 0,
        key: 0,
        addr: 0,
        len: 0,
    };
    call.once(&request, &mut Body::Empty).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn start() -> (SocketAddr, &'static Registry) {
        let registry: &'static Registry = Box::leak(Box::new(Registry::new()));
        let addr = serve_registry(registry, "127.0.0.1:0".parse().unwrap(), None).unwrap();
        (addr, registry)
    }

    /// Registers leaked memory holding `bytes`, starting `skew` bytes into its
    /// allocation (to test unaligned addresses).
    fn register(registry: &Registry, bytes: &[u8], skew: usize) -> RemoteRegion {
        let mut backing = vec![0u8; bytes.len() + skew];
        backing[skew..].copy_from_slice(bytes);
        let memory: &'static mut [u8] = Box::leak(backing.into_boxed_slice());
        registry.register_slice(&mut memory[skew..]).unwrap()
    }

    /// The registered memory's current bytes (no transfer may be in flight).
    fn contents(region: &RemoteRegion) -> Vec<u8> {
        let mut copy = vec![0u8; region.len];
        // SAFETY: test regions are leaked memory, valid for ever, and no transfer to
        // them is in flight.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::with_exposed_provenance::<u8>(region.addr as usize),
                copy.as_mut_ptr(),
                region.len,
            );
        }
        copy
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
            .collect()
    }

    fn opts(parallelism: usize, chunk_bytes: usize) -> TcpOptions {
        TcpOptions {
            parallelism,
            chunk_bytes,
            deadline: Some(Instant::now() + Duration::from_secs(60)),
        }
    }

    fn pooled(server: SocketAddr) -> usize {
        lock(&POOL).get(&server).map_or(0, Vec::len)
    }

    #[test]
    fn reads_and_writes_single_bytes_odd_lengths_and_sub_ranges() {
        let (server, registry) = start();
        let o = opts(4, 64 << 20);

        let one = register(registry, &[42], 0);
        let mut byte = [0u8];
        read(server, &one, &mut byte, &o).unwrap();
        assert_eq!(byte, [42]);
        write(server, &one, &[7], &o).unwrap();
        assert_eq!(contents(&one), [7]);

        let initial = pattern(100_003, 1);
        let odd = register(registry, &initial, 3);
        assert_eq!(odd.addr % 2, 1, "unaligned start");
        let mut copy = vec![0u8; odd.len];
        read(server, &odd, &mut copy, &o).unwrap();
        assert_eq!(copy, initial);
        let fresh = pattern(odd.len, 9);
        write(server, &odd, &fresh, &o).unwrap();
        assert_eq!(contents(&odd), fresh);

        let sub = odd.range(1001, 5003).unwrap();
        let mut part = vec![0u8; sub.len];
        read(server, &sub, &mut part, &o).unwrap();
        assert_eq!(part, fresh[1001..6004]);
        let patch = pattern(sub.len, 77);
        write(server, &sub, &patch, &o).unwrap();
        let mut expected = fresh.clone();
        expected[1001..6004].copy_from_slice(&patch);
        assert_eq!(contents(&odd), expected, "only the sub-range changed");

        let mut small = vec![0u8; sub.len - 1];
        let err = read(server, &sub, &mut small, &o).unwrap_err();
        assert!(matches!(err, RdmaError::SizeMismatch { .. }), "{err}");

        // An empty sub-range moves nothing but is still checked.
        read(server, &odd.range(5, 0).unwrap(), &mut [], &o).unwrap();
        ping(server, &o).unwrap();
    }

    #[test]
    fn multi_piece_transfers_run_over_parallel_pooled_connections() {
        let (server, registry) = start();
        let len = 20 << 20;
        let initial = pattern(len, 3);
        let region = register(registry, &initial, 0);
        let o = opts(4, 1 << 20);
        let mut copy = vec![0u8; len];
        read(server, &region, &mut copy, &o).unwrap();
        assert!(copy == initial, "read content");
        let fresh = pattern(len, 200);
        write(server, &region, &fresh, &o).unwrap();
        assert!(contents(&region) == fresh, "write content");
        let idle = pooled(server);
        assert!((1..=4).contains(&idle), "{idle} pooled connections");

        // Pieces of uneven sizes: the last one is shorter.
        let uneven = region.range(12345, (5 << 20) + 17).unwrap();
        let mut part = vec![0u8; uneven.len];
        read(server, &uneven, &mut part, &opts(3, 1 << 20)).unwrap();
        assert!(part == fresh[12345..12345 + uneven.len]);
        assert!(pooled(server) <= 4, "connections are reused");
    }

    #[test]
    fn stale_handles_and_bad_ranges_are_refused() {
        let (server, registry) = start();
        let o = opts(2, 1 << 20);
        let region = register(registry, &pattern(4096, 5), 0);
        let mut dst = vec![0u8; 4096];

        let wrong_key = RemoteRegion {
            key: region.key ^ 1,
            ..region
        };
        let err = read(server, &wrong_key, &mut dst, &o).unwrap_err();
        assert!(
            matches!(err, RdmaError::Dropped { id, .. } if id == region.id),
            "{err}"
        );
        let err = write(server, &wrong_key, &dst, &o).unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");

        let beyond = RemoteRegion {
            len: region.len + 1,
            ..region
        };
        let err = read(server, &beyond, &mut vec![0u8; 4097], &o).unwrap_err();
        assert!(
            matches!(
                err,
                RdmaError::OutOfRange {
                    offset: 0,
                    len: 4097,
                    size: 4096
                }
            ),
            "{err}"
        );
        let err = write(server, &beyond, &vec![1u8; 4097], &o).unwrap_err();
        assert!(matches!(err, RdmaError::OutOfRange { .. }), "{err}");
        assert_eq!(
            contents(&region),
            pattern(4096, 5),
            "a refused write writes nothing"
        );

        let below = RemoteRegion {
            addr: region.addr - 1,
            ..region
        };
        let err = read(server, &below, &mut dst, &o).unwrap_err();
        assert!(matches!(err, RdmaError::Refused { .. }), "{err}");

        // The server goes on serving after refusals.
        read(server, &region, &mut dst, &o).unwrap();
        assert_eq!(dst, pattern(4096, 5));

        assert!(!drop_remote(server, &wrong_key, &o).unwrap());
        assert!(drop_remote(server, &region.range(10, 10).unwrap(), &o).unwrap());
        assert!(!drop_remote(server, &region, &o).unwrap());
        assert_eq!(registry.get(region.id), None);
        let err = read(server, &region, &mut dst, &o).unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
        assert!(err.to_string().contains(&region.pid.to_string()), "{err}");

        // A request naming another pid: the owner is gone, another process listens.
        let other = RemoteRegion {
            pid: region.pid + 1,
            ..region
        };
        let err = read(server, &other, &mut dst, &o).unwrap_err();
        assert!(matches!(err, RdmaError::OwnerGone { .. }), "{err}");
    }

    #[test]
    fn control_handlers_answer_and_refuse() {
        let (server, _) = start();
        let o = opts(1, 1 << 20);
        let pid = std::process::id();
        set_control_handler(
            200,
            Box::new(|payload| Ok(payload.iter().rev().copied().collect())),
        );
        set_control_handler(
            201,
            Box::new(|payload| Err(format!("cannot handle {} bytes", payload.len()))),
        );
        set_control_handler(202, Box::new(|_| panic!("handler bug")));
        set_control_handler(3, Box::new(|_| Ok(b"reserved".to_vec())));

        assert_eq!(request(server, pid, 200, b"abc", &o).unwrap(), b"cba");
        assert_eq!(request(server, pid, 200, b"", &o).unwrap(), b"");
        let big = pattern(3 << 20, 4);
        let answer = request(server, pid, 200, &big, &o).unwrap();
        assert!(answer.iter().rev().eq(big.iter()));

        let err = request(server, pid, 201, b"xy", &o).unwrap_err();
        assert!(
            matches!(&err, RdmaError::Refused { message, .. } if message == "cannot handle 2 bytes"),
            "{err}"
        );
        let err = request(server, pid, 202, b"", &o).unwrap_err();
        assert!(err.to_string().contains("handler bug"), "{err}");
        let err = request(server, pid, 203, b"", &o).unwrap_err();
        assert!(err.to_string().contains("no handler"), "{err}");
        let err = request(server, pid, 3, b"", &o).unwrap_err();
        assert!(
            err.to_string().contains("no handler"),
            "reserved kinds: {err}"
        );
        let err = request(server, pid, 200, &vec![0u8; MAX_CONTROL_BYTES + 1], &o).unwrap_err();
        assert!(matches!(err, RdmaError::Refused { .. }), "{err}");
        // Still serving.
        assert_eq!(request(server, pid, 200, b"ok", &o).unwrap(), b"ko");
    }

    #[test]
    fn an_address_without_a_listener_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        drop(listener);
        let region = RemoteRegion {
            pid: 4242,
            id: 1,
            addr: 0x1000,
            len: 10,
            key: 1,
            slot: 0,
        };
        let started = Instant::now();
        let err = read(server, &region, &mut [0u8; 10], &opts(4, 1 << 20)).unwrap_err();
        assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("4242") && message.contains(&server.to_string()),
            "{message}"
        );
        let err = request(server, 4242, 100, b"", &TcpOptions::default()).unwrap_err();
        assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_server_that_never_answers_times_out() {
        // The kernel accepts connections into the backlog; nobody ever answers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let region = RemoteRegion {
            pid: 4243,
            id: 1,
            addr: 0x1000,
            len: 3 << 20,
            key: 1,
            slot: 0,
        };
        let budget = Duration::from_millis(300);
        for parallelism in [1, 3] {
            let o = TcpOptions {
                parallelism,
                chunk_bytes: 1 << 20,
                deadline: Some(Instant::now() + budget),
            };
            let started = Instant::now();
            let err = read(server, &region, &mut vec![0u8; region.len], &o).unwrap_err();
            assert!(
                matches!(err, RdmaError::Timeout { pid: 4243, seconds } if (0.2..=0.3).contains(&seconds)),
                "{err}"
            );
            let elapsed = started.elapsed();
            assert!(
                elapsed >= budget && elapsed < Duration::from_secs(5),
                "{elapsed:?}"
            );
        }
        // A write larger than the socket buffers blocks in sending, and times out too.
        let o = TcpOptions {
            deadline: Some(Instant::now() + budget),
            ..opts(1, 64 << 20)
        };
        let big = RemoteRegion {
            len: 64 << 20,
            ..region
        };
        let err = write(server, &big, &vec![0u8; big.len], &o).unwrap_err();
        assert!(matches!(err, RdmaError::Timeout { .. }), "{err}");
        let err = request(server, 4243, 100, b"x", &o).unwrap_err();
        assert!(
            matches!(err, RdmaError::Timeout { .. }),
            "an expired deadline: {err}"
        );
        drop(listener);
    }

    /// A fake server: accepts one connection and runs `script` on it.
    fn fake_server(
        script: impl FnOnce(TcpStream) + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            script(stream);
        });
        (addr, thread)
    }

    #[test]
    fn a_connection_that_breaks_mid_transfer_is_unreachable() {
        let len = 1 << 20;
        let (server, thread) = fake_server(move |mut stream| {
            let mut head = [0u8; REQUEST_BYTES];
            stream.read_exact(&mut head).unwrap();
            let request = Request::decode(&head).unwrap();
            assert_eq!((request.op, request.len), (OP_READ, len as u64));
            let reply = Reply {
                status: OK,
                len: request.len,
            };
            stream.write_all(&reply.encode()).unwrap();
            stream.write_all(&vec![1u8; len / 2]).unwrap();
            // Dies: the connection closes half-way.
        });
        let region = RemoteRegion {
            pid: 4244,
            id: 1,
            addr: 0x1000,
            len,
            key: 1,
            slot: 0,
        };
        let err = read(server, &region, &mut vec![0u8; len], &opts(1, len)).unwrap_err();
        assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
        thread.join().unwrap();
        assert_eq!(pooled(server), 0, "a broken connection is not pooled");
    }

    #[test]
    fn a_pooled_connection_closed_by_the_server_is_retried_on_a_new_one() {
        let (server, registry) = start();
        let region = register(registry, &pattern(1000, 8), 0);
        // A connection that looks idle and open, but whose peer closes it as soon as
        // a request arrives, without answering.
        let (fake, thread) = fake_server(|mut stream| {
            let mut head = [0u8; REQUEST_BYTES];
            let _ = stream.read_exact(&mut head);
        });
        let stale = TcpStream::connect(fake).unwrap();
        checkin(server, stale);
        let mut dst = vec![0u8; 1000];
        read(server, &region, &mut dst, &opts(1, 1 << 20)).unwrap();
        assert_eq!(dst, pattern(1000, 8));
        thread.join().unwrap();
        // A pooled connection already closed is skipped without a request.
        let (fake, thread) = fake_server(|_| {});
        let closed = TcpStream::connect(fake).unwrap();
        thread.join().unwrap();
        checkin(server, closed);
        assert!(drop_remote(server, &region, &opts(1, 1 << 20)).unwrap());
    }

    #[test]
    fn memory_freed_or_protected_behind_the_registry_is_refused_without_a_crash() {
        let (server, registry) = start();
        let page = 4096;
        // SAFETY: a fresh anonymous mapping, owned by this test alone.
        let memory = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(memory, libc::MAP_FAILED);
        let addr = memory as u64;
        // SAFETY: the memory is only ever accessed by the server, through the kernel
        // (TCP-2), which is what this test checks.
        let region = unsafe { registry.register(addr, 2 * page, None) }.unwrap();
        let o = opts(2, 1 << 20);
        write(server, &region, &vec![3u8; 2 * page], &o).unwrap();

        // Read-only: reads work, writes are refused.
        // SAFETY: changes the protection of the test's own mapping.
        let rc = unsafe { libc::mprotect(memory, 2 * page, libc::PROT_READ) };
        assert_eq!(rc, 0);
        let err = write(server, &region, &vec![4u8; 2 * page], &o).unwrap_err();
        assert!(
            matches!(&err, RdmaError::Refused { message, .. } if message.contains("not writable")),
            "{err}"
        );
        let mut dst = vec![0u8; 2 * page];
        read(server, &region, &mut dst, &o).unwrap();
        assert!(dst.iter().all(|&b| b == 3));

        // The second page unmapped: refused, the framing kept, the server alive.
        // SAFETY: unmaps the test's own page, which nothing references.
        let rc = unsafe { libc::munmap(memory.cast::<u8>().add(page).cast(), page) };
        assert_eq!(rc, 0);
        let err = read(server, &region, &mut dst, &o).unwrap_err();
        assert!(
            matches!(&err, RdmaError::Refused { message, .. } if message.contains("not readable")),
            "{err}"
        );
        let first = region.range(0, page).unwrap();
        read(server, &first, &mut dst[..page], &o).unwrap();
        assert!(dst[..page].iter().all(|&b| b == 3));
        // SAFETY: unmaps the rest of the test's mapping.
        let rc = unsafe { libc::munmap(memory, page) };
        assert_eq!(rc, 0);
        let err = write(server, &first, &vec![5u8; page], &o).unwrap_err();
        assert!(matches!(err, RdmaError::Refused { .. }), "{err}");
        ping(server, &o).unwrap();
    }

    #[test]
    fn a_dead_owner_is_reported_promptly_even_over_a_pooled_connection() {
        // A server that answers one PING, then exits: its sockets close.
        let (server, thread) = fake_server(|mut stream| {
            let mut head = [0u8; REQUEST_BYTES];
            stream.read_exact(&mut head).unwrap();
            let reply = Reply { status: OK, len: 0 };
            stream.write_all(&reply.encode()).unwrap();
        });
        ping(server, &opts(1, 1 << 20)).unwrap();
        assert_eq!(pooled(server), 1);
        thread.join().unwrap();
        // No deadline: the closed connection and the refused reconnection end it.
        let started = Instant::now();
        let err = ping(server, &TcpOptions::default()).unwrap_err();
        assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(pooled(server), 0);
    }

    #[test]
    fn a_malformed_request_closes_only_its_connection() {
        let (server, registry) = start();
        let region = register(registry, &pattern(100, 2), 0);
        let mut bad = TcpStream::connect(server).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        bad.write_all(&[0xAB; REQUEST_BYTES]).unwrap();
        let mut answer = Vec::new();
        bad.read_to_end(&mut answer).unwrap();
        let reply = Reply::decode(answer[..REPLY_BYTES].try_into().unwrap()).unwrap();
        assert_eq!(reply.status, BAD_REQUEST);
        assert!(String::from_utf8_lossy(&answer[REPLY_BYTES..]).contains("magic"));

        let mut unknown = Request::for_region(OP_READ, &region, 0, 100);
        unknown.op = 99;
        let mut bad = TcpStream::connect(server).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        bad.write_all(&unknown.encode()).unwrap();
        let mut answer = Vec::new();
        bad.read_to_end(&mut answer).unwrap();
        assert!(String::from_utf8_lossy(&answer).contains("unknown operation 99"));

        let mut dst = vec![0u8; 100];
        read(server, &region, &mut dst, &opts(1, 1 << 20)).unwrap();
        assert_eq!(dst, pattern(100, 2));
    }

    #[test]
    fn concurrent_transfers_to_one_region() {
        let (server, registry) = start();
        let slice = 256 << 10;
        let threads = 8;
        let region = register(registry, &vec![0u8; slice * threads], 0);
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    let mine = region.range(t * slice, slice).unwrap();
                    let data = pattern(slice, t as u8);
                    let o = opts(1 + t % 3, 64 << 10);
                    for _ in 0..5 {
                        write(server, &mine, &data, &o).unwrap();
                        let mut back = vec![0u8; slice];
                        read(server, &mine, &mut back, &o).unwrap();
                        assert!(back == data, "thread {t}");
                        // Whole-region reads alongside the others' writes.
                        let mut whole = vec![0u8; region.len];
                        read(server, &region, &mut whole, &o).unwrap();
                        assert!(whole[t * slice..(t + 1) * slice] == data[..]);
                    }
                });
            }
        });
        let expected: Vec<u8> = (0..threads).flat_map(|t| pattern(slice, t as u8)).collect();
        assert!(contents(&region) == expected);
    }

    #[test]
    fn serve_is_started_once_and_serves_the_global_registry() {
        let addr = serve().unwrap();
        assert_eq!(serve().unwrap(), addr);
        let region = register(Registry::global(), &pattern(5000, 6), 0);
        let mut dst = vec![0u8; 5000];
        read(addr, &region, &mut dst, &opts(2, 1 << 20)).unwrap();
        assert_eq!(dst, pattern(5000, 6));
        assert!(Registry::global().deregister(region.id));
    }

    #[test]
    fn pieces_are_about_even_and_bounded() {
        let o = |parallelism, chunk_bytes| TcpOptions {
            parallelism,
            chunk_bytes,
            deadline: None,
        };
        assert_eq!(piece_bytes(64 << 20, &o(4, 64 << 20)), 16 << 20);
        assert_eq!(piece_bytes(64 << 20, &o(1, 8 << 20)), 8 << 20);
        assert_eq!(piece_bytes(3 << 20, &o(8, 64 << 20)), MIN_PIECE);
        assert_eq!(piece_bytes(100, &o(8, 64 << 20)), MIN_PIECE);
        assert_eq!(piece_bytes(100, &o(8, 10)), 10);
        assert_eq!(piece_bytes(100, &o(0, 0)), 1);
        let request = Request {
            op: OP_CONTROL,
            kind: 17,
            pid: 9,
            id: 1 << 40,
            key: u64::MAX,
            addr: 0xdead_beef,
            len: 12,
        };
        assert_eq!(Request::decode(&request.encode()), Some(request));
    }

    /// Throughput over loopback (or, with `MONARCH_RDMA_TCP_BENCH_NETNS=A,B,IP`,
    /// between network namespaces A and B, the server in A listening at IP). Run with
    /// `cargo test --release -p monarch_rdma tcp::tests::bench -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bench() {
        let registry: &'static Registry = Box::leak(Box::new(Registry::new()));
        let netns = std::env::var("MONARCH_RDMA_TCP_BENCH_NETNS")
            .ok()
            .filter(|v| !v.is_empty());
        let enter = |name: &str| {
            let file = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
            // SAFETY: moves this thread into the namespace of an open file.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {name}: {}", io::Error::last_os_error());
        };
        let server = match &netns {
            Some(spec) => {
                let parts: Vec<String> = spec.split(',').map(str::to_owned).collect();
                let (a, b, ip) = (parts[0].clone(), parts[1].clone(), parts[2].clone());
                let server = std::thread::spawn(move || {
                    enter(&a);
                    serve_registry(registry, SocketAddr::new(ip.parse().unwrap(), 0), None).unwrap()
                })
                .join()
                .unwrap();
                enter(&b);
                server
            }
            None => serve_registry(registry, "127.0.0.1:0".parse().unwrap(), None).unwrap(),
        };
        let len = 64 << 20;
        let region = register(registry, &pattern(len, 1), 0);
        let mut local = pattern(len, 2);
        let rounds = 10;
        for parallelism in [1, 2, 4] {
            let o = TcpOptions {
                parallelism,
                ..TcpOptions::default()
            };
            // Warm up: connections into the pool, pages touched.
            read(server, &region, &mut local, &o).unwrap();
            write(server, &region, &local, &o).unwrap();
            let started = Instant::now();
            for _ in 0..rounds {
                read(server, &region, &mut local, &o).unwrap();
            }
            let read_gbs = (rounds * len) as f64 / started.elapsed().as_secs_f64() / 1e9;
            let started = Instant::now();
            for _ in 0..rounds {
                write(server, &region, &local, &o).unwrap();
            }
            let write_gbs = (rounds * len) as f64 / started.elapsed().as_secs_f64() / 1e9;
            println!(
                "64 MiB, parallelism {parallelism}: read {read_gbs:.2} GB/s, write {write_gbs:.2} GB/s"
            );
        }
    }
}
