//! Errors of the channel layer.
//!
//! [`ChannelError`] is the one error type of this module: every variant
//! names the address involved (or, for parse errors, the input), so a
//! message is useful on its own in a log line. It is `Clone` because one
//! link failure is reported many times: to [`crate::channel::ChannelTx::error`],
//! to every pending `send`, and to every frame handed back to the
//! [`crate::channel::ReturnFn`]. [`SendError`] is a failed send: it hands
//! the frame back to the caller.
//!
//! Invariant: messages are lowercase and carry no trailing period.
//!
//! ```
//! use hyperactor::channel::ChannelAddr;
//! let err = "bogus".parse::<ChannelAddr>().unwrap_err();
//! assert!(err.to_string().starts_with("invalid channel address"));
//! ```

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::addr::ChannelAddr;
use super::frame::Frame;
use super::frame::FrameError;

/// Why a channel operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// A string is not a valid channel address or transport.
    #[error("invalid channel address {input:?}: expected {expected}")]
    InvalidAddr {
        /// The rejected input.
        input: String,
        /// What a valid input looks like.
        expected: &'static str,
    },
    /// A string is not a transport name.
    #[error(
        "unknown channel transport {input:?}: expected {}",
        super::addr::ChannelTransport::NAMES
    )]
    UnknownTransport {
        /// The rejected input.
        input: String,
    },
    /// Binding a listener failed.
    #[error("failed to bind {addr}: {source}")]
    Bind {
        /// The address being bound.
        addr: ChannelAddr,
        /// The underlying I/O error.
        #[source]
        source: Arc<io::Error>,
    },
    /// Something is already served at this address.
    #[error("address {addr} is already in use")]
    AddrInUse {
        /// The address.
        addr: ChannelAddr,
    },
    /// Connecting to the peer failed.
    #[error("failed to connect to {addr}: {source}")]
    Connect {
        /// The peer address.
        addr: ChannelAddr,
        /// The underlying I/O error.
        #[source]
        source: Arc<io::Error>,
    },
    /// No channel is served at this local address.
    #[error("nothing is served at {addr}")]
    NotServed {
        /// The local address.
        addr: ChannelAddr,
    },
    /// An I/O error on an established link.
    #[error("i/o error on the link to {addr}: {source}")]
    Io {
        /// The peer address.
        addr: ChannelAddr,
        /// The underlying I/O error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The peer closed the link (for example its `ChannelRx` was dropped).
    #[error("the link to {addr} was closed by the peer")]
    Closed {
        /// The peer address.
        addr: ChannelAddr,
    },
    /// The peer acknowledged nothing, and the link made no progress, for the delivery
    /// timeout (see [`delivery_timeout`](crate::channel::delivery_timeout)): the frames
    /// it had not acknowledged are returned.
    #[error(
        "no acknowledgement from {addr} within the message delivery timeout ({timeout:?}): \
         the peer stopped reading or cannot be reached, so the messages it did not \
         acknowledge are returned undeliverable; if it is only slow, raise \
         message_delivery_timeout (HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT)"
    )]
    DeliveryTimeout {
        /// The peer address.
        addr: ChannelAddr,
        /// The delivery timeout that ran out.
        timeout: std::time::Duration,
    },
    /// A frame could not be encoded or decoded.
    #[error("bad frame on the link to {addr}: {source}")]
    Frame {
        /// The peer address.
        addr: ChannelAddr,
        /// What was wrong with the frame.
        #[source]
        source: FrameError,
    },
    /// The peer broke the link protocol (for example acknowledged a frame
    /// that was never sent).
    #[error("protocol error on the link to {addr}: {reason}")]
    Protocol {
        /// The peer address.
        addr: ChannelAddr,
        /// What went wrong.
        reason: String,
    },
    /// The directory for Unix socket files (see
    /// [`socket_dir`](crate::channel::socket_dir)) cannot be created, or is
    /// not private to this user, so no socket is served in it.
    #[error("cannot use the socket directory {}: {problem}; to fix it, {fix}", path.display())]
    SocketDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// An inherited file descriptor cannot be served (see
    /// [`Listen::InheritedFd`](crate::channel::Listen::InheritedFd)).
    #[error(
        "cannot serve on the inherited file descriptor {fd}: {problem}; pass a TCP socket \
         that is bound and listening as that descriptor (in Python: \
         s = socket.create_server((host, 0)); subprocess.Popen(..., pass_fds=(s.fileno(),)) \
         with the address tcp://HOST:fd<s.fileno()>)"
    )]
    InheritedFd {
        /// The descriptor.
        fd: i32,
        /// What is wrong with it.
        #[source]
        problem: InheritedFdError,
    },
    /// `dial` was called outside a Tokio runtime, so no link task could run.
    #[error("cannot dial {addr}: not called from within a tokio runtime")]
    NoRuntime {
        /// The peer address.
        addr: ChannelAddr,
    },
}

impl ChannelError {
    pub(crate) fn io(addr: &ChannelAddr, err: io::Error) -> Self {
        ChannelError::Io {
            addr: addr.clone(),
            source: Arc::new(err),
        }
    }

    pub(crate) fn frame(addr: &ChannelAddr, err: FrameError) -> Self {
        match err {
            FrameError::Io(source) => ChannelError::Io {
                addr: addr.clone(),
                source,
            },
            source => ChannelError::Frame {
                addr: addr.clone(),
                source,
            },
        }
    }

    pub(crate) fn closed(addr: &ChannelAddr) -> Self {
        ChannelError::Closed { addr: addr.clone() }
    }
}

/// What is wrong with a file descriptor a process was asked to serve on (see
/// [`Listen::InheritedFd`](crate::channel::Listen::InheritedFd)): it must be an open,
/// listening TCP socket that this process does not serve on already.
/// [`ChannelError::InheritedFd`] carries it, with the descriptor and how to pass one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum InheritedFdError {
    /// The number is negative.
    #[error("a file descriptor is a number >= 0")]
    Negative,
    /// This process serves on the descriptor already.
    #[error("this process serves on it already (a descriptor serves one endpoint)")]
    AlreadyServed,
    /// The descriptor is not open in this process.
    #[error(
        "it is not open in this process ({source}); the parent must pass it (for example \
         subprocess.Popen(..., pass_fds=({fd},)))"
    )]
    NotOpen {
        /// The descriptor.
        fd: i32,
        /// Why `fcntl` failed.
        #[source]
        source: Arc<io::Error>,
    },
    /// The descriptor is not a socket.
    #[error("it is not a socket")]
    NotASocket,
    /// The socket's type cannot be read.
    #[error("cannot read its socket type: {0}")]
    SocketType(#[source] Arc<io::Error>),
    /// The socket is not a stream socket (for example UDP).
    #[error("it is not a stream (TCP) socket (socket type {kind})")]
    NotAStream {
        /// The socket type (`SO_TYPE`).
        kind: i32,
    },
    /// The socket's address cannot be read.
    #[error("cannot read its address: {0}")]
    Address(#[source] Arc<io::Error>),
    /// The socket is a Unix socket, not a TCP one.
    #[error("it is not a TCP socket (a Unix socket)")]
    UnixSocket,
    /// The socket is of another address family than IPv4 or IPv6.
    #[error("it is not a TCP socket (address family {family})")]
    AddressFamily {
        /// The address family (`ss_family`).
        family: i32,
    },
    /// Whether the socket listens cannot be read.
    #[error("cannot tell whether it listens: {0}")]
    Listening(#[source] Arc<io::Error>),
    /// The TCP socket does not listen.
    #[error(
        "it is a TCP socket that is not listening; call listen() on it before \
         passing it (socket.create_server does)"
    )]
    NotListening,
    /// The descriptor cannot be marked close-on-exec.
    #[error("cannot mark it close-on-exec: {0}")]
    CloseOnExec(#[source] Arc<io::Error>),
    /// The socket cannot be made non-blocking.
    #[error("cannot make it non-blocking: {0}")]
    NonBlocking(#[source] Arc<io::Error>),
    /// The socket cannot be registered with the Tokio runtime.
    #[error("cannot register it with the runtime: {0}")]
    Register(#[source] Arc<io::Error>),
}

/// A frame that could not be sent, handed back with the reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("failed to send a frame of {} bytes: {error}", frame.len())]
pub struct SendError {
    /// The frame, unchanged.
    pub frame: Frame,
    /// Why it could not be sent (its message names the address).
    #[source]
    pub error: ChannelError,
}

/// Why a gateway refuses a client that asks to attach; its text is the answer the client
/// receives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttachRefusal {
    /// The proc asked is not a gateway (it does not take attachments).
    #[error("proc {gateway} is not a gateway")]
    NotGateway {
        /// The proc asked.
        gateway: String,
    },
    /// The gateway is stopping.
    #[error("the gateway {gateway} is stopping")]
    Stopping {
        /// The gateway.
        gateway: String,
    },
    /// The gateway's proc is not running yet, or not any more.
    #[error("the gateway is starting or stopping; attach again")]
    NotRunning,
    /// The client's uid cannot name a proc.
    #[error("the client's uid {uid:?} cannot name a proc: {reason}")]
    BadUid {
        /// The uid given.
        uid: String,
        /// Why it cannot.
        reason: String,
    },
    /// The client's uid is the gateway's own.
    #[error("the client's uid {uid:?} is the gateway's own")]
    OwnUid {
        /// The uid given.
        uid: String,
    },
    /// A client with this uid is attached already.
    #[error("a client {client} is attached already; every client needs a uid of its own")]
    AlreadyAttached {
        /// The client's proc id.
        client: String,
    },
    /// The gateway's own policy refused the client.
    #[error("{reason}")]
    Refused {
        /// Why, in words.
        reason: String,
    },
}

/// A message for a proc that no route reaches from here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoRoute {
    /// The destination is at a gateway's address but is not a client attached to it.
    #[error("no client {dest} is attached to the gateway {gateway}")]
    NotAttached {
        /// The destination proc.
        dest: String,
        /// The gateway.
        gateway: String,
    },
}
