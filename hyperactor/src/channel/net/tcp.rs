//! TCP specifics of the socket transport: every connection is authenticated
//! ([`auth`]) before a frame is read or written.
//!
//! - Accepting: [`TcpServe`] admits a connection with the handshake of the mode in
//!   force, and yields a [`TcpConn`]: the raw socket (cluster secret, trust all), or
//!   the TLS session. A peer that closes the TCP connection of a TLS session without
//!   TLS's `close_notify` between two frames ends it the way a raw socket's end of file
//!   does (cut off inside a frame, it is still a truncated frame).
//! - Dialing: [`run_tcp_link`] authenticates the new connection, then runs the raw
//!   socket's link (with direct writes) or the TLS one ([`tls::run_link`]).
//!
//! ```ignore
//! run_tcp_link(addr, auth::tcp_auth(), queue, link).await; // run by `dial`
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::super::auth;
use super::super::auth::{AuthError, TcpAuth};
use super::super::tx::{LinkShared, Queued};
use super::tls;
use super::{run_link, Listener, Socket, Stream};

type ServerTls = tokio_rustls::server::TlsStream<TcpStream>;

/// A TCP listener, and the authentication mode of its connections.
#[derive(Debug)]
pub(crate) struct TcpServe {
    listener: TcpListener,
    /// The mode of every connection; `None`: the process's mode at the time
    /// ([`auth::tcp_auth`]).
    auth: Option<TcpAuth>,
}

impl TcpServe {
    /// Accepts from `listener`, authenticating with `auth`.
    pub(crate) fn new(listener: TcpListener, auth: Option<TcpAuth>) -> Self {
        TcpServe { listener, auth }
    }
}

/// A TCP connection that [`TcpServe`] refused: who connected, and why the handshake
/// rejected it.
#[derive(Debug, thiserror::Error)]
#[error("rejected a TCP connection from {}: {reason}", peer_name(.peer.as_ref()))]
pub(crate) struct TcpRejected {
    /// The peer's address, if it could be read.
    peer: Option<std::net::SocketAddr>,
    /// Why the handshake rejected it.
    #[source]
    reason: AuthError,
}

fn peer_name(peer: Option<&std::net::SocketAddr>) -> String {
    peer.map_or_else(|| "an unknown peer".to_string(), |a| a.to_string())
}

impl Listener for TcpServe {
    type Accepted = TcpStream;
    type Stream = TcpConn;
    type Rejected = TcpRejected;
    async fn next_conn(&mut self) -> io::Result<TcpStream> {
        let (stream, _) = self.listener.accept().await?;
        stream.set_nodelay(true)?;
        super::super::settings::tune_tcp(&stream);
        Ok(stream)
    }
    fn admit(
        &self,
        mut stream: TcpStream,
    ) -> impl Future<Output = Result<TcpConn, TcpRejected>> + Send + 'static {
        let auth = self.auth.clone().unwrap_or_else(auth::tcp_auth);
        async move {
            let peer = stream.peer_addr().ok();
            let rejected = |reason| TcpRejected { peer, reason };
            match auth {
                TcpAuth::Tls(config) => auth::tls::accept(stream, &config)
                    .await
                    .map(|stream| TcpConn::Tls(Box::new(stream)))
                    .map_err(rejected),
                auth => {
                    auth::accept(&mut stream, &auth).await.map_err(rejected)?;
                    Ok(TcpConn::Plain(stream))
                }
            }
        }
    }
}

/// An admitted TCP connection.
#[derive(Debug)]
pub(crate) enum TcpConn {
    /// Authenticated by the [`auth`] handshake; frames on the raw socket.
    Plain(TcpStream),
    /// A mutual TLS session.
    Tls(Box<ServerTls>),
}

/// The read half of a [`TcpConn`].
#[derive(Debug)]
pub(crate) enum TcpRead {
    /// The socket's.
    Plain(tokio::net::tcp::OwnedReadHalf),
    /// The session's.
    Tls(ReadHalf<ServerTls>),
}

/// The write half of a [`TcpConn`].
#[derive(Debug)]
pub(crate) enum TcpWrite {
    /// The socket's.
    Plain(tokio::net::tcp::OwnedWriteHalf),
    /// The session's.
    Tls(WriteHalf<ServerTls>),
}

impl Stream for TcpConn {
    type Read = TcpRead;
    type Write = TcpWrite;
    fn into_halves(self) -> (TcpRead, TcpWrite) {
        match self {
            TcpConn::Plain(stream) => {
                let (read, write) = stream.into_split();
                (TcpRead::Plain(read), TcpWrite::Plain(write))
            }
            TcpConn::Tls(stream) => {
                let (read, write) = tokio::io::split(*stream);
                (TcpRead::Tls(read), TcpWrite::Tls(write))
            }
        }
    }
    fn into_socket(self) -> io::Result<Socket> {
        match self {
            TcpConn::Plain(stream) => stream.into_socket(),
            TcpConn::Tls(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS connection is written through its session, not its socket",
            )),
        }
    }
    fn peer(&self) -> Option<super::super::addr::ChannelAddr> {
        let peer = match self {
            TcpConn::Plain(stream) => stream.peer_addr(),
            TcpConn::Tls(stream) => stream.get_ref().0.peer_addr(),
        };
        peer.ok().map(super::super::addr::ChannelAddr::Tcp)
    }
}

impl AsyncRead for TcpRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpRead::Plain(read) => Pin::new(read).poll_read(cx, buf),
            // The frame reader tells an end between frames from a truncated frame.
            TcpRead::Tls(read) => match Pin::new(read).poll_read(cx, buf) {
                Poll::Ready(Err(err)) if tls::is_unclean_eof(&err) => Poll::Ready(Ok(())),
                other => other,
            },
        }
    }
}

impl AsyncWrite for TcpWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            TcpWrite::Plain(write) => Pin::new(write).poll_write(cx, buf),
            TcpWrite::Tls(write) => Pin::new(write).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpWrite::Plain(write) => Pin::new(write).poll_flush(cx),
            TcpWrite::Tls(write) => Pin::new(write).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TcpWrite::Plain(write) => Pin::new(write).poll_shutdown(cx),
            TcpWrite::Tls(write) => Pin::new(write).poll_shutdown(cx),
        }
    }
}

/// Runs a link to the TCP address `addr`, authenticated with `auth`: over the raw
/// socket ([`run_link`]), or through a TLS session ([`tls::run_link`]).
pub(crate) async fn run_tcp_link(
    addr: std::net::SocketAddr,
    auth: TcpAuth,
    queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    match auth {
        TcpAuth::Tls(config) => tls::run_link(tls::connect(addr, config), queue, link).await,
        auth => run_link(connect_tcp(addr, auth), queue, link).await,
    }
}

/// Connects a TCP stream with `TCP_NODELAY` set, and authenticates it ([`auth`]).
pub(super) async fn connect_tcp(
    addr: std::net::SocketAddr,
    auth: TcpAuth,
) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    super::super::settings::tune_tcp(&stream);
    auth::connect(&mut stream, &auth).await?;
    Ok(stream)
}
