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

use hyperactor::sync::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::error::RdmaError;
use crate::region::{Registry, RemoteRegion};

mod client;
mod server;
mod wire;

pub use self::client::{drop_remote, read, request, write};
pub use self::server::{serve, serve_registry, set_control_handler, ControlHandler};

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

#[cfg(test)]
mod tests;
