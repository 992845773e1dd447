//! Channels: one-directional, ordered, flow-controlled links that carry
//! [`Frame`]s between endpoints, in process or over Unix or TCP sockets.
//!
//! [`serve`] binds a [`ChannelAddr`] and returns a [`ChannelRx`], which
//! merges the frames of every link to it. [`dial`] returns a [`ChannelTx`]
//! at once; the connection is made in the background and frames queue
//! until then. Each `dial` makes a separate link (one connection).
//!
//! Invariants:
//! - frames of one link are delivered in send order, each at most once;
//! - a frame counts as delivered when [`ChannelRx::recv`] yields it; the
//!   receiver acknowledges deliveries (batched), and the sender keeps
//!   every frame until then, charged against the link's byte budget
//!   ([`LINK_BUDGET_BYTES`]), so a sender's memory stays bounded when the
//!   receiver stops pulling;
//! - a link that fails (cannot connect, the peer closes or dies, I/O
//!   error) is dead for good (no reconnect): every frame it could not
//!   prove delivered goes to the dial's [`ReturnFn`] exactly once, later
//!   sends hand their frame back in a [`SendError`], and
//!   [`ChannelTx::closed`] resolves.
//!
//! Peers are not trusted to be well formed: an incoming connection that
//! sends a malformed frame (bad magic, too many parts, longer than
//! [`max_frame_len`], which `HYPERACTOR_CODEC_MAX_FRAME_LENGTH` sets, or
//! cut off mid-frame) is closed with one log line, and those lines are
//! rate-limited process-wide (one per second per kind, the next one saying
//! how many were left out). Whatever lengths a peer claims, the receiver
//! holds at most about twice the bytes it really sent.
//!
//! Gateways: an endpoint served with [`serve_gateway`] also takes *attachments*
//! ([`attach`]): a client that can dial it but cannot be dialed back (behind NAT, a
//! `kubectl port-forward`, an SSH tunnel) turns a connection it dialed, authenticated
//! like any other, into a link from the gateway to itself (ATT-1..3 in the docs of
//! [`Attachment`]'s module).
//!
//! Unix sockets of [`ChannelAddr::any`] live in the per-user [`socket_dir`]
//! (mode 0700, checked before use). Each socket file is removed when its
//! endpoint is dropped, or earlier by [`remove_socket_files`] (for exit
//! hooks).
//!
//! # Configuration
//!
//! | environment variable | default | meaning |
//! |---|---|---|
//! | `HYPERACTOR_CODEC_MAX_FRAME_LENGTH` | `10737418240` (10 GiB) | the largest frame, in bytes, this process sends or accepts ([`max_frame_len`]); read once per process |
//!
//! The delivery timeout, TCP keepalive and congestion control of links are set
//! with [`set_delivery_timeout`], [`set_tcp_keepalive_idle`] and
//! [`set_tcp_congestion`] (Monarch's config sets them when a process starts).
//! | `XDG_RUNTIME_DIR`, `TMPDIR` | unset, `/tmp` | where the per-user [`socket_dir`] is made |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use hyperactor::channel::{dial, serve, ChannelAddr, ChannelTransport, Frame};
//!
//! let mut rx = serve(&ChannelAddr::any(ChannelTransport::Unix)).await.unwrap();
//! let tx = dial(rx.addr(), Arc::new(|_frame, err| eprintln!("returned: {err}")));
//! tx.send(Frame::new(Bytes::from_static(b"hi"), vec![])).await.unwrap();
//! assert_eq!(rx.recv().await.unwrap().header, Bytes::from_static(b"hi"));
//! # }
//! ```

mod ack;
mod addr;
pub mod auth;
pub(crate) mod backpressure;
pub mod buffer_pool;
mod error;
mod frame;
mod inbox;
mod link;
mod local;
pub mod log_limit;
mod net;
mod settings;
mod socket_dir;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_codec;
#[cfg(test)]
mod tests_tls;
mod tx;

use std::fmt;
use std::sync::Arc;

use tokio::sync::mpsc;

use self::inbox::Inbox;

pub use self::addr::ChannelAddr;
pub use self::addr::ChannelTransport;
pub use self::addr::Listen;
pub use self::addr::{advertised, primary_ip};
pub use self::error::ChannelError;
pub use self::error::InheritedFdError;
pub use self::error::SendError;
pub use self::error::{AttachRefusal, NoRoute};
pub use self::frame::max_frame_len;
pub use self::frame::set_max_frame_len;
pub use self::frame::Frame;
pub use self::frame::FrameError;
pub use self::frame::MAX_FRAME_LEN;
pub use self::frame::MAX_FRAME_LEN_ENV;
pub use self::frame::MAX_FRAME_PARTS;
pub use self::inbox::{AttachFn, AttachHandler, DeliverFn};
pub use self::net::attach::{attach, AttachError, Attachment, ATTACH_TIMEOUT};
pub use self::settings::{
    delivery_timeout, set_delivery_timeout, set_tcp_congestion, set_tcp_keepalive_idle,
    tcp_congestion, tcp_keepalive_idle, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES,
};
pub use self::socket_dir::remove_socket_files;
pub use self::socket_dir::socket_dir;
pub use self::socket_dir::MAX_SOCKET_DIR_LEN;
pub use self::tx::any_link_over_budget;
pub use self::tx::ChannelTx;
pub use self::tx::QueueWrites;
pub use self::tx::ReturnFn;
pub use self::tx::FRAME_COST_OVERHEAD;
pub use self::tx::LINK_BUDGET_BYTES;

/// Capacity, in frames, of a [`ChannelRx`] queue.
const RX_QUEUE_FRAMES: usize = 256;

/// Binds `addr` and starts accepting links.
///
/// `Local(0)`, a TCP port 0 and [`ChannelAddr::any`] bind a fresh
/// endpoint; [`ChannelRx::addr`] tells which.
///
/// # Errors
/// [`ChannelError::AddrInUse`] if something is served there already
/// (local ids, live Unix sockets); [`ChannelError::Bind`] if binding fails.
///
/// # Cancel safety
/// Cancel safe: if cancelled, nothing stays bound.
pub async fn serve(addr: &ChannelAddr) -> Result<ChannelRx, ChannelError> {
    let (queue, frames) = mpsc::channel(RX_QUEUE_FRAMES);
    let (addr, guard) = bind(addr, Inbox::Queue(queue)).await?;
    Ok(ChannelRx {
        addr,
        frames,
        _guard: guard,
    })
}

/// Binds `addr` like [`serve`], but hands every frame to `deliver`, called
/// by the task that read it, in each link's order. This saves the hop
/// through a queue on the receive path; `deliver` must therefore never
/// block (push into a queue of its own, or finish quickly). A frame counts
/// as delivered, and is acknowledged, once `deliver` returned.
///
/// The endpoint serves until the returned [`ChannelServer`] is dropped.
///
/// # Errors
/// As [`serve`].
///
/// # Cancel safety
/// Cancel safe: if cancelled, nothing stays bound.
pub async fn serve_with(
    addr: &ChannelAddr,
    deliver: DeliverFn,
) -> Result<ChannelServer, ChannelError> {
    serve_listen_with(&Listen::Addr(addr.clone()), deliver).await
}

/// Serves like [`serve_with`] where `listen` says: an address to bind, or a listening
/// TCP socket this process inherited ([`Listen::InheritedFd`]), which is adopted
/// (non-blocking, closed on exec so that children do not inherit it) once checked.
/// [`ChannelServer::addr`] is then the socket's own address (its real port).
///
/// # Errors
/// As [`serve`]; [`ChannelError::InheritedFd`] if the descriptor is not open, not a
/// listening TCP socket, or was adopted already.
///
/// # Cancel safety
/// Cancel safe: if cancelled, nothing stays bound (an adopted socket is closed).
pub async fn serve_listen_with(
    listen: &Listen,
    deliver: DeliverFn,
) -> Result<ChannelServer, ChannelError> {
    serve_direct(listen, inbox::Direct::new(deliver)).await
}

/// Serves like [`serve_listen_with`] as a *gateway*: besides links, the endpoint takes
/// attachments of clients that cannot be dialed back ([`attach`]), and hands each to
/// `handler`, which registers the link to the client (see `net::attach`).
///
/// # Errors
/// As [`serve_listen_with`].
///
/// # Cancel safety
/// Cancel safe: if cancelled, nothing stays bound (an adopted socket is closed).
pub async fn serve_gateway(
    listen: &Listen,
    deliver: DeliverFn,
    handler: AttachHandler,
) -> Result<ChannelServer, ChannelError> {
    serve_direct(listen, inbox::Direct::with_attach(deliver, Some(handler))).await
}

async fn serve_direct(
    listen: &Listen,
    direct: Arc<inbox::Direct>,
) -> Result<ChannelServer, ChannelError> {
    let inbox = Inbox::Direct(Arc::clone(&direct));
    let (addr, guard) = match listen {
        Listen::Addr(addr) => bind(addr, inbox).await?,
        Listen::InheritedFd(fd) => {
            let (addr, guard) = net::serve_inherited_tcp(*fd, inbox, None)?;
            (addr, Guard::Net(guard))
        }
    };
    Ok(ChannelServer {
        addr,
        direct,
        _guard: guard,
    })
}

async fn bind(addr: &ChannelAddr, inbox: Inbox) -> Result<(ChannelAddr, Guard), ChannelError> {
    Ok(match addr {
        ChannelAddr::Local(id) => {
            let id = local::register(*id, inbox)?;
            (ChannelAddr::Local(id), Guard::Local(id))
        }
        ChannelAddr::Unix(path) => {
            let (addr, guard) = net::serve_unix(path, inbox).await?;
            (addr, Guard::Net(guard))
        }
        ChannelAddr::Tcp(sockaddr) => {
            let (addr, guard) = net::serve_tcp(*sockaddr, inbox, None).await?;
            (addr, Guard::Net(guard))
        }
    })
}

/// An endpoint served with [`serve_with`]. Dropping it stops accepting,
/// closes its links (their senders get back every frame not yet handed to
/// the delivery function) and removes its Unix socket file.
pub struct ChannelServer {
    addr: ChannelAddr,
    direct: Arc<inbox::Direct>,
    _guard: Guard,
}

impl ChannelServer {
    /// The bound address: the real TCP port, the socket path, the
    /// allocated local id.
    pub fn addr(&self) -> &ChannelAddr {
        &self.addr
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.direct.close();
    }
}

impl fmt::Debug for ChannelServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelServer")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Bytes this process wrote to and read from its links so far, frame prefixes included:
/// `(sent, received)`. Frames of the `local` transport are not counted (they are not
/// encoded).
pub fn link_bytes() -> (u64, u64) {
    use std::sync::atomic::Ordering;
    (
        frame::LINK_SENT.load(Ordering::Relaxed),
        frame::LINK_RECEIVED.load(Ordering::Relaxed),
    )
}

/// Starts a link to `addr` and returns its sending end.
///
/// Never blocks: the connection is made by a runtime task, and frames
/// queue until then. If the link fails, `on_return` is called (from a
/// runtime task) once for every frame it could not prove delivered, with
/// the error. Outside a Tokio runtime the link fails at once with
/// [`ChannelError::NoRuntime`].
pub fn dial(addr: &ChannelAddr, on_return: ReturnFn) -> ChannelTx {
    dial_with_auth(addr, on_return, None)
}

/// As [`dial`], authenticating a TCP link with `auth` (`None`: the process's mode,
/// [`auth::tcp_auth`], when the link connects).
pub(crate) fn dial_with_auth(
    addr: &ChannelAddr,
    on_return: ReturnFn,
    auth: Option<auth::TcpAuth>,
) -> ChannelTx {
    dial_link(addr, on_return, auth, delivery_timeout())
}

/// As [`dial_with_auth`], with the link's delivery timeout given (tests give their own
/// rather than change the process's).
pub(crate) fn dial_link(
    addr: &ChannelAddr,
    on_return: ReturnFn,
    auth: Option<auth::TcpAuth>,
    delivery_timeout: Option<std::time::Duration>,
) -> ChannelTx {
    let (tx, link, queue) = ChannelTx::new(addr, on_return, delivery_timeout);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        let error = ChannelError::NoRuntime { addr: addr.clone() };
        link::fail_unconnected(&link, error, queue);
        return tx;
    };
    let guard = link::ClosedOnDrop(Arc::clone(&link));
    let addr = addr.clone();
    runtime.spawn(async move {
        let _guard = guard;
        match addr {
            ChannelAddr::Local(id) => local::run_link(id, queue, link).await,
            ChannelAddr::Unix(path) => {
                let connect = tokio::net::UnixStream::connect(path);
                net::run_link(connect, queue, link).await;
            }
            ChannelAddr::Tcp(sockaddr) => {
                let auth = auth.unwrap_or_else(auth::tcp_auth);
                net::tcp::run_tcp_link(sockaddr, auth, queue, link).await;
            }
        }
    });
    tx
}

/// As [`serve`] for a TCP address, authenticating connections with `auth`.
#[cfg(test)]
pub(crate) async fn serve_tcp_with_auth(
    addr: std::net::SocketAddr,
    auth: auth::TcpAuth,
) -> Result<ChannelRx, ChannelError> {
    let (queue, frames) = mpsc::channel(RX_QUEUE_FRAMES);
    let (addr, guard) = net::serve_tcp(addr, Inbox::Queue(queue), Some(auth)).await?;
    Ok(ChannelRx {
        addr,
        frames,
        _guard: Guard::Net(guard),
    })
}

/// As [`serve_gateway`] for a TCP address, authenticating connections with `auth`.
#[cfg(test)]
pub(crate) async fn serve_gateway_tcp_with_auth(
    addr: std::net::SocketAddr,
    deliver: DeliverFn,
    handler: AttachHandler,
    auth: auth::TcpAuth,
) -> Result<ChannelServer, ChannelError> {
    let direct = inbox::Direct::with_attach(deliver, Some(handler));
    let inbox = Inbox::Direct(Arc::clone(&direct));
    let (addr, guard) = net::serve_tcp(addr, inbox, Some(auth)).await?;
    Ok(ChannelServer {
        addr,
        direct,
        _guard: Guard::Net(guard),
    })
}

/// Releases what a [`ChannelRx`] holds when it drops.
#[derive(Debug)]
enum Guard {
    Local(u64),
    Net(#[expect(dead_code, reason = "held only for its Drop")] net::NetGuard),
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Guard::Local(id) = self {
            local::unregister(*id);
        }
    }
}

/// The receiving end of a channel: frames from all its links, merged.
///
/// Dropping it stops accepting, closes its links (their senders see them
/// fail and get back every frame `recv` did not yield) and removes its
/// Unix socket file.
pub struct ChannelRx {
    addr: ChannelAddr,
    frames: mpsc::Receiver<ack::Delivery>,
    _guard: Guard,
}

impl fmt::Debug for ChannelRx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelRx")
            .field("addr", &self.addr)
            .field("queued", &self.frames.len())
            .finish()
    }
}

impl ChannelRx {
    /// The bound address: the real TCP port, the socket path, the
    /// allocated local id.
    pub fn addr(&self) -> &ChannelAddr {
        &self.addr
    }

    /// The next frame from any link; frames of one link come in send order.
    /// Returns `None` only if the endpoint can receive nothing more (its
    /// accept task ended), which does not happen in normal operation.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled call loses no frame.
    pub async fn recv(&mut self) -> Option<Frame> {
        let delivery = self.frames.recv().await?;
        Some(delivery.deliver())
    }
}
