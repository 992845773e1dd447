//! Attached connections: a client whose network reaches one endpoint only (a
//! *gateway*) receives its frames over a connection it dialed itself.
//!
//! Links are one-directional (see [`crate::channel`]): whoever sends dials. A client
//! behind NAT, a `kubectl port-forward` or an SSH tunnel can dial its gateway but
//! cannot be dialed back, so [`attach`] turns one connection it dials into a link
//! *from* the gateway *to* the client:
//!
//! ```text
//! client -> gateway: (the transport's authentication handshake, as for any link)
//! client -> gateway: b"GWATTACH" | u16 uid length | uid
//! gateway -> client: b"GWACCEPT" | u16 length | the gateway's advertised address
//!                or: b"GWREFUSE" | u16 length | why
//! then, once accepted: frames gateway -> client, cumulative acknowledgements
//! client -> gateway (the link protocol, with the roles of the two ends swapped)
//! ```
//!
//! All integers are little-endian, texts UTF-8. The gateway tells the two kinds of
//! connections apart by their first byte after the handshake: a frame starts with
//! `H` (its magic, `HYF1`), an attachment with `G`. Only an endpoint served with an
//! [`AttachHandler`] (see [`crate::channel::serve_gateway`]) reads attachments; any
//! other closes such a connection as a malformed frame.
//!
//! On the gateway the attached link is an ordinary [`ChannelTx`] (its address is the
//! client's socket address), with a budget, acknowledgements, a delivery timeout and
//! undelivered frames returned; on the client the connection delivers like a served
//! endpoint's (acknowledging what it handed over). Invariants:
//!
//! - ATT-1: the client sends nothing but acknowledgements on the attached connection,
//!   and receives no frame before the gateway's answer;
//! - ATT-2: an attachment is authenticated exactly like a link to the same address
//!   (the process's mode, [`crate::channel::auth`]), before a byte of it is read;
//! - ATT-3: when the connection ends, the gateway's link fails (its unacknowledged
//!   frames go back to their senders) and [`Attachment::closed`] resolves on the
//!   client.
//!
//! ```ignore
//! let attachment = attach(&gateway_addr, "client-1f2e", deliver).await?;
//! println!("reached at {}", attachment.advertised());
//! ```

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
    ReadBuf, ReadHalf, WriteHalf,
};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::super::addr::ChannelAddr;
use super::super::auth::{self, TcpAuth, HANDSHAKE_TIMEOUT};
use super::super::error::ChannelError;
use super::super::frame;
use super::super::frame::Frame;
use super::super::inbox::{AttachHandler, DeliverFn, Direct, Inbox};
use super::super::link;
use super::super::link::{AckSource, FrameSink};
use super::super::log_limit::LogLimit;
use super::super::tx::ChannelTx;
use super::{serve_halves, Stream, READ_BUFFER};

/// The first bytes of an attachment request.
const ATTACH: &[u8; 8] = b"GWATTACH";
/// The gateway's answer when it takes the client.
const ACCEPT: &[u8; 8] = b"GWACCEPT";
/// The gateway's answer when it does not.
const REFUSE: &[u8; 8] = b"GWREFUSE";
/// The longest text (uid, address, reason) either side sends.
const MAX_TEXT: usize = 4096;
/// How long either side waits for the other's part of the attachment, once the
/// transport's handshake is done.
pub const ATTACH_TIMEOUT: Duration = HANDSHAKE_TIMEOUT;
/// The gateway's write buffer on an attached link: small frames are gathered into
/// writes this large.
const WRITE_BUFFER: usize = 64 << 10;

/// Whether `first`, the first byte read from a connection, starts an attachment.
pub(crate) fn is_attachment(first: u8) -> bool {
    first == ATTACH[0]
}

/// Why a client could not attach to a gateway ([`attach`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The gateway's transport cannot carry an attachment.
    #[error(
        "cannot attach through {gateway}: a gateway is reached over tcp (or a unix socket \
         of this machine), not the in-process transport"
    )]
    Transport {
        /// The gateway's address.
        gateway: ChannelAddr,
    },
    /// Connecting to the gateway, or authenticating, failed.
    #[error(
        "cannot attach to the gateway {gateway}: {source}; check that a monarch worker \
         serves there, that this machine reaches that address, and that this client uses \
         the gateway's credentials (certificates of the same CA, the same cluster secret, \
         or ca=\"trust_all_connections\" on both)"
    )]
    Connect {
        /// The gateway's address.
        gateway: ChannelAddr,
        /// Why connecting or authenticating failed (the handshake's reason).
        #[source]
        source: Arc<io::Error>,
    },
    /// The gateway refused the client.
    #[error("the gateway {gateway} refused to attach this client: {reason}")]
    Refused {
        /// The gateway's address.
        gateway: ChannelAddr,
        /// The gateway's reason.
        reason: String,
    },
    /// The gateway answered with something that is not an attachment's answer.
    #[error(
        "the gateway {gateway} did not answer the attachment as a monarch gateway does \
         ({reason}); check that the address is a monarch worker's, of the same monarch \
         version as this client"
    )]
    Protocol {
        /// The gateway's address.
        gateway: ChannelAddr,
        /// What was wrong with the answer.
        reason: String,
    },
    /// The gateway did not answer in time.
    #[error(
        "the gateway {gateway} did not answer the attachment within {after:?}; check that \
         the address is a monarch worker's"
    )]
    Timeout {
        /// The gateway's address.
        gateway: ChannelAddr,
        /// How long this client waited.
        after: Duration,
    },
}

/// A client's attachment to its gateway: the connection that delivers the frames the
/// gateway sends it. Dropping it closes the connection (the gateway returns what it had
/// not delivered).
pub struct Attachment {
    gateway: ChannelAddr,
    advertised: ChannelAddr,
    direct: Arc<Direct>,
    ended: watch::Receiver<Option<ChannelError>>,
    _task: JoinHandle<()>,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("gateway", &self.gateway)
            .field("advertised", &self.advertised)
            .finish()
    }
}

impl Attachment {
    /// The address the client dialed.
    pub fn gateway(&self) -> &ChannelAddr {
        &self.gateway
    }

    /// The address the gateway advertises: where its peers reach it, and through it
    /// this client.
    pub fn advertised(&self) -> &ChannelAddr {
        &self.advertised
    }

    /// Resolves, with why, once the connection to the gateway ended: nothing reaches
    /// this client any more.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn closed(&self) -> ChannelError {
        self.end().await
    }

    /// As [`Attachment::closed`], as a future that does not borrow the attachment.
    pub fn end(&self) -> impl std::future::Future<Output = ChannelError> + Send + 'static {
        let mut ended = self.ended.clone();
        let gateway = self.gateway.clone();
        async move {
            let error = match ended.wait_for(Option::is_some).await {
                Ok(error) => error.clone(),
                Err(_) => None,
            };
            error.unwrap_or_else(|| ChannelError::closed(&gateway))
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.direct.close();
    }
}

/// A connection a client dialed: the raw socket (Unix, or TCP with a cluster secret or
/// none), or a TLS session.
enum Dialed {
    Unix(tokio::net::UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// The read half of a [`Dialed`] connection.
enum DialedRead {
    Unix(tokio::net::unix::OwnedReadHalf),
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Tls(ReadHalf<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// The write half of a [`Dialed`] connection.
enum DialedWrite {
    Unix(tokio::net::unix::OwnedWriteHalf),
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Tls(WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Dialed {
    fn into_halves(self) -> (DialedRead, DialedWrite) {
        match self {
            Dialed::Unix(s) => {
                let (r, w) = s.into_split();
                (DialedRead::Unix(r), DialedWrite::Unix(w))
            }
            Dialed::Tcp(s) => {
                let (r, w) = s.into_split();
                (DialedRead::Tcp(r), DialedWrite::Tcp(w))
            }
            Dialed::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (DialedRead::Tls(r), DialedWrite::Tls(w))
            }
        }
    }
}

impl AsyncRead for DialedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DialedRead::Unix(r) => Pin::new(r).poll_read(cx, buf),
            DialedRead::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            // The frame reader tells an end between frames from a truncated frame.
            DialedRead::Tls(r) => match Pin::new(r).poll_read(cx, buf) {
                Poll::Ready(Err(err)) if super::tls::is_unclean_eof(&err) => Poll::Ready(Ok(())),
                other => other,
            },
        }
    }
}

impl AsyncWrite for DialedWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            DialedWrite::Unix(w) => Pin::new(w).poll_write(cx, buf),
            DialedWrite::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            DialedWrite::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DialedWrite::Unix(w) => Pin::new(w).poll_flush(cx),
            DialedWrite::Tcp(w) => Pin::new(w).poll_flush(cx),
            DialedWrite::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DialedWrite::Unix(w) => Pin::new(w).poll_shutdown(cx),
            DialedWrite::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            DialedWrite::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// Connects to `gateway` and authenticates the way a link to it would (with `auth`,
/// or the process's mode).
async fn dial(gateway: &ChannelAddr, auth: Option<TcpAuth>) -> Result<Dialed, AttachError> {
    let failed = |source: io::Error| AttachError::Connect {
        gateway: gateway.clone(),
        source: Arc::new(source),
    };
    match gateway {
        ChannelAddr::Local(_) => Err(AttachError::Transport {
            gateway: gateway.clone(),
        }),
        ChannelAddr::Unix(path) => tokio::net::UnixStream::connect(path)
            .await
            .map(Dialed::Unix)
            .map_err(failed),
        ChannelAddr::Tcp(addr) => match auth.unwrap_or_else(auth::tcp_auth) {
            TcpAuth::Tls(config) => super::tls::connect(*addr, config)
                .await
                .map(|s| Dialed::Tls(Box::new(s)))
                .map_err(failed),
            auth => super::tcp::connect_tcp(*addr, auth)
                .await
                .map(Dialed::Tcp)
                .map_err(failed),
        },
    }
}

/// Writes `magic`, then `text` with its length.
async fn write_message<W: AsyncWrite + Unpin>(
    write: &mut W,
    magic: &[u8; 8],
    text: &str,
) -> io::Result<()> {
    let bytes = &text.as_bytes()[..text.len().min(MAX_TEXT)];
    let mut message = Vec::with_capacity(10 + bytes.len());
    message.extend_from_slice(magic);
    // At most MAX_TEXT, which fits in u16.
    message.extend_from_slice(&u16::try_from(bytes.len()).unwrap_or(u16::MAX).to_le_bytes());
    message.extend_from_slice(bytes);
    write.write_all(&message).await?;
    write.flush().await
}

/// Reads a text with its length (after its magic).
async fn read_text<R: AsyncRead + Unpin>(read: &mut R) -> Result<String, TextError> {
    let len = read.read_u16_le().await.map_err(|e| TextError::Read {
        what: "a length",
        source: Arc::new(e),
    })?;
    let len = usize::from(len);
    if len > MAX_TEXT {
        return Err(TextError::TooLong { len });
    }
    let mut bytes = vec![0u8; len];
    read.read_exact(&mut bytes)
        .await
        .map_err(|e| TextError::Read {
            what: "a text",
            source: Arc::new(e),
        })?;
    String::from_utf8(bytes).map_err(|_| TextError::NotUtf8)
}

/// A text of the attachment protocol that could not be read.
#[derive(Debug, Clone, thiserror::Error)]
enum TextError {
    #[error("reading {what} failed: {source}")]
    Read {
        what: &'static str,
        source: Arc<std::io::Error>,
    },
    #[error("a text of {len} bytes, over the limit of {MAX_TEXT}")]
    TooLong { len: usize },
    #[error("a text that is not UTF-8")]
    NotUtf8,
}

/// Attaches this process to the gateway at `gateway` as the client `uid`: dials it,
/// authenticates (ATT-2), asks to attach, and from then on hands every frame the
/// gateway sends this client to `deliver` (which must not block), in order.
///
/// # Errors
///
/// An [`AttachError`] naming the gateway: it cannot be reached or authenticated
/// (wrong credentials), it refused (not a gateway, the uid is taken), or it did not
/// answer in time.
///
/// # Cancel safety
///
/// Cancel safe: nothing stays connected.
pub async fn attach(
    gateway: &ChannelAddr,
    uid: &str,
    deliver: DeliverFn,
) -> Result<Attachment, AttachError> {
    attach_with_auth(gateway, uid, deliver, None).await
}

/// As [`attach`], authenticating a TCP connection with `auth` (`None`: the process's
/// mode).
pub(crate) async fn attach_with_auth(
    gateway: &ChannelAddr,
    uid: &str,
    deliver: DeliverFn,
    auth: Option<TcpAuth>,
) -> Result<Attachment, AttachError> {
    let handshake = async {
        let stream = dial(gateway, auth).await?;
        let (read, mut write) = stream.into_halves();
        let mut reader = BufReader::with_capacity(READ_BUFFER, read);
        let protocol = |reason: String| AttachError::Protocol {
            gateway: gateway.clone(),
            reason,
        };
        write_message(&mut write, ATTACH, uid)
            .await
            .map_err(|e| AttachError::Connect {
                gateway: gateway.clone(),
                source: Arc::new(e),
            })?;
        let mut magic = [0u8; 8];
        reader.read_exact(&mut magic).await.map_err(|e| {
            protocol(format!(
                "it closed the connection instead of answering ({e}); a monarch proc that \
                 is not a gateway (not a worker) does that"
            ))
        })?;
        let text = read_text(&mut reader)
            .await
            .map_err(|e| protocol(e.to_string()))?;
        match &magic {
            m if m == ACCEPT => {
                let advertised = text
                    .parse::<ChannelAddr>()
                    .map_err(|e| protocol(format!("its address {text:?} does not parse: {e}")))?;
                Ok((reader, write, advertised))
            }
            m if m == REFUSE => Err(AttachError::Refused {
                gateway: gateway.clone(),
                reason: text,
            }),
            other => Err(protocol(format!("it answered {other:?}"))),
        }
    };
    let (reader, write, advertised) = tokio::time::timeout(ATTACH_TIMEOUT, handshake)
        .await
        .unwrap_or_else(|_| {
            Err(AttachError::Timeout {
                gateway: gateway.clone(),
                after: ATTACH_TIMEOUT,
            })
        })?;
    let direct = Direct::new(deliver);
    let inbox = Inbox::Direct(Arc::clone(&direct));
    let (ended_tx, ended) = watch::channel(None);
    let addr = gateway.clone();
    let task = tokio::spawn(async move {
        let error = serve_halves(reader, write, inbox, addr).await;
        ended_tx.send_replace(Some(error));
    });
    Ok(Attachment {
        gateway: gateway.clone(),
        advertised,
        direct,
        ended,
        _task: task,
    })
}

/// The gateway's side of an attachment, on a connection whose first byte said so
/// ([`is_attachment`]): reads the request, asks `handler`, answers, and runs the link
/// to the client until it ends.
pub(crate) async fn serve_attachment<R, W>(
    mut reader: BufReader<R>,
    mut write: W,
    handler: AttachHandler,
    peer: ChannelAddr,
    addr: ChannelAddr,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    static BAD_REQUEST: LogLimit = LogLimit::per_second();
    let request = async {
        let mut magic = [0u8; 8];
        reader
            .read_exact(&mut magic)
            .await
            .map_err(|e| format!("reading its request failed: {e}"))?;
        if &magic != ATTACH {
            return Err(format!("its request starts with {magic:?}"));
        }
        read_text(&mut reader).await.map_err(|e| e.to_string())
    };
    let uid = match tokio::time::timeout(ATTACH_TIMEOUT, request).await {
        Ok(Ok(uid)) => uid,
        Ok(Err(reason)) => {
            if let Some(suppressed) = BAD_REQUEST.check() {
                tracing::warn!(%addr, %peer, suppressed, "closing a malformed attachment: {reason}");
            }
            return;
        }
        Err(_) => {
            if let Some(suppressed) = BAD_REQUEST.check() {
                tracing::warn!(
                    %addr,
                    %peer,
                    suppressed,
                    "closing an attachment whose request did not arrive within {ATTACH_TIMEOUT:?}"
                );
            }
            return;
        }
    };
    let (tx, link, queue) = ChannelTx::new(
        &peer,
        handler.on_return.clone(),
        super::super::delivery_timeout(),
    );
    let _closed = link::ClosedOnDrop(Arc::clone(&link));
    match (handler.accept)(&uid, tx) {
        Ok(advertised) => {
            if let Err(e) = write_message(&mut write, ACCEPT, &advertised.to_string()).await {
                let error = ChannelError::io(&peer, e);
                return link::fail_unconnected(&link, error, queue);
            }
            tracing::info!(%addr, %peer, client = %uid, "a client attached through this gateway");
            let sink = StreamSink {
                write: BufWriter::with_capacity(WRITE_BUFFER, write),
                addr: peer.clone(),
                progress: Arc::clone(&link.progress),
            };
            let acks = StreamAcks {
                read: reader,
                addr: peer.clone(),
            };
            link::drive(sink, acks, queue, link).await;
            tracing::info!(%addr, %peer, client = %uid, "a client's attachment ended");
        }
        Err(reason) => {
            tracing::warn!(%addr, %peer, client = %uid, "refused an attachment: {reason}");
            let _ = tokio::time::timeout(
                ATTACH_TIMEOUT,
                write_message(&mut write, REFUSE, &reason.to_string()),
            )
            .await;
            let _ = write.shutdown().await;
            link::fail_unconnected(&link, ChannelError::closed(&peer), queue);
        }
    }
}

/// The gateway's writer on an attached link: the connection's write half, behind a
/// buffer.
struct StreamSink<W> {
    write: BufWriter<W>,
    addr: ChannelAddr,
    /// The link's progress (see `link.rs`): each write that moves bytes counts.
    progress: Arc<std::sync::atomic::AtomicU64>,
}

impl<W: AsyncWrite + Unpin + Send> FrameSink for StreamSink<W> {
    async fn write(&mut self, frames: Vec<Frame>, _first_seq: u64) -> Result<(), ChannelError> {
        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        for frame in &frames {
            frame::encode(frame, &mut chunks)
                .map_err(|err| ChannelError::frame(&self.addr, err))?;
        }
        self.write_rest(chunks).await
    }

    async fn write_rest(&mut self, chunks: VecDeque<Bytes>) -> Result<(), ChannelError> {
        let progress = &self.progress;
        let write = &mut self.write;
        let written = async {
            for chunk in chunks {
                let mut rest = &chunk[..];
                while !rest.is_empty() {
                    let n = write.write(rest).await?;
                    if n == 0 {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    super::super::tx::touch(progress);
                    rest = &rest[n..];
                }
            }
            write.flush().await
        };
        written
            .await
            .map_err(|err| ChannelError::io(&self.addr, err))
    }
}

/// The gateway's reader of acknowledgements on an attached link.
struct StreamAcks<R> {
    read: R,
    addr: ChannelAddr,
}

impl<R: AsyncBufRead + Unpin + Send> AckSource for StreamAcks<R> {
    async fn next_ack(&mut self) -> Result<u64, ChannelError> {
        let mut ack = [0u8; 8];
        match self.read.read_exact(&mut ack).await {
            Ok(_) => Ok(u64::from_le_bytes(ack)),
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                Err(ChannelError::closed(&self.addr))
            }
            Err(err) => Err(ChannelError::io(&self.addr, err)),
        }
    }
}

/// The peer address of an accepted connection, for the link to an attached client.
pub(crate) fn peer_of<S: Stream>(stream: &S, served: &ChannelAddr) -> ChannelAddr {
    stream.peer().unwrap_or_else(|| served.clone())
}
