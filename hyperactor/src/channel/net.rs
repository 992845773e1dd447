//! The socket transports: Unix domain sockets and TCP, one implementation.
//!
//! Both transports carry the same protocol over a byte stream, generic
//! over [`Stream`] (split into owned read and write halves) and
//! [`Listener`]:
//! - the dialing side writes frames ([`frame`] wire format), batching the
//!   frames queued at that moment into vectored writes, and reads 8-byte
//!   little-endian cumulative acknowledgements on the same socket, so it
//!   notices at once when the peer closes or dies, even when idle;
//! - the serving side reads frames (each large part into its own exactly
//!   sized buffer), pushes them into the bounded `ChannelRx` queue (so a
//!   receiver that stops pulling stops the reading, which fills the socket,
//!   which exhausts the sender's budget), and writes acknowledgements for
//!   the frames `recv` yielded (see [`super::ack`]).
//!
//! Invariant: when the `ChannelRx` is dropped each connection writes a
//! final acknowledgement of everything delivered, shuts down its write
//! side and discards input until the sender closes, so the sender returns
//! exactly the undelivered frames.
//!
//! ```
//! # async fn example() {
//! use hyperactor::channel::{serve, ChannelAddr, ChannelTransport};
//! let rx = serve(&ChannelAddr::any(ChannelTransport::Tcp)).await.unwrap();
//! assert!(matches!(rx.addr(), ChannelAddr::Tcp(a) if a.port() != 0));
//! # }
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWrite;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::net::UnixListener;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::ack::AckState;
use super::ack::Delivery;
use super::addr::ChannelAddr;
use super::error::ChannelError;
use super::frame;
use super::frame::Frame;
use super::frame::SharedWrite;
use super::inbox::Inbox;
use super::link;
use super::link::AckSource;
use super::link::FrameSink;
use super::tx::DirectWrite;
use super::tx::LinkShared;
use super::tx::Queued;

/// Capacity of the buffered reader for frames (small things are read
/// through it; large parts bypass it).
const READ_BUFFER: usize = 64 << 10;
/// How long a connection discards input after its `ChannelRx` is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed `accept` (for example out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A connected byte stream that splits into owned halves.
pub(crate) trait Stream: Send + 'static {
    /// The read half.
    type Read: AsyncRead + Unpin + Send + 'static;
    /// The write half.
    type Write: AsyncWrite + SharedWrite + DirectWrite + Unpin + Send + 'static;
    /// Splits the stream.
    fn into_halves(self) -> (Self::Read, Self::Write);
}

impl Stream for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

impl Stream for UnixStream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

macro_rules! shared_write {
    ($half:ty) => {
        impl SharedWrite for $half {
            fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                <$half>::try_write_vectored(self, bufs)
            }
            async fn writable(&self) -> io::Result<()> {
                <$half>::writable(self).await
            }
        }
        impl DirectWrite for $half {
            fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                <$half>::try_write_vectored(self, bufs)
            }
        }
    };
}

shared_write!(tokio::net::tcp::OwnedWriteHalf);
shared_write!(tokio::net::unix::OwnedWriteHalf);

/// A bound listener of [`Stream`]s.
pub(crate) trait Listener: Send + 'static {
    /// The accepted stream type.
    type Stream: Stream;
    /// Accepts the next connection. Cancel safe.
    fn next_conn(&mut self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn next_conn(&mut self) -> io::Result<TcpStream> {
        let (stream, _) = self.accept().await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    async fn next_conn(&mut self) -> io::Result<UnixStream> {
        Ok(self.accept().await?.0)
    }
}

/// Stops the accept task and removes the socket file when dropped.
#[derive(Debug)]
pub(crate) struct NetGuard {
    accept: JoinHandle<()>,
    unix_path: Option<PathBuf>,
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(path) = &self.unix_path {
            if let Err(err) = std::fs::remove_file(path) {
                tracing::debug!(path = %path.display(), %err, "failed to remove socket file");
            }
        }
    }
}

/// Binds a TCP listener at `addr` and starts accepting into `frames`.
///
/// # Errors
/// [`ChannelError::Bind`] if binding fails.
pub(crate) async fn serve_tcp(
    addr: std::net::SocketAddr,
    frames: Inbox,
) -> Result<(ChannelAddr, NetGuard), ChannelError> {
    let bind_err = |err| ChannelError::Bind {
        addr: ChannelAddr::Tcp(addr),
        source: Arc::new(err),
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let bound = ChannelAddr::Tcp(listener.local_addr().map_err(bind_err)?);
    let accept = tokio::spawn(accept_loop(listener, frames, bound.clone()));
    Ok((
        bound,
        NetGuard {
            accept,
            unix_path: None,
        },
    ))
}

/// Binds a Unix listener at `path` (removing a stale socket file nobody
/// listens on) and starts accepting into `frames`.
///
/// # Errors
/// [`ChannelError::AddrInUse`] if something listens there;
/// [`ChannelError::Bind`] if binding fails.
pub(crate) async fn serve_unix(
    path: &Path,
    frames: Inbox,
) -> Result<(ChannelAddr, NetGuard), ChannelError> {
    let addr = ChannelAddr::Unix(path.to_path_buf());
    let is_socket = std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if is_socket {
        match UnixStream::connect(path).await {
            Ok(_) => return Err(ChannelError::AddrInUse { addr }),
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
                // Stale: nothing listens. A failure shows up in bind below.
                let _ = std::fs::remove_file(path);
            }
            Err(_) => {}
        }
    }
    let listener = UnixListener::bind(path).map_err(|err| ChannelError::Bind {
        addr: addr.clone(),
        source: Arc::new(err),
    })?;
    let accept = tokio::spawn(accept_loop(listener, frames, addr.clone()));
    Ok((
        addr,
        NetGuard {
            accept,
            unix_path: Some(path.to_path_buf()),
        },
    ))
}

async fn accept_loop<L: Listener>(mut listener: L, frames: Inbox, addr: ChannelAddr) {
    loop {
        tokio::select! {
            () = frames.closed() => return,
            res = listener.next_conn() => match res {
                Ok(stream) => {
                    tokio::spawn(serve_conn(stream, frames.clone(), addr.clone()));
                }
                Err(err) => {
                    tracing::warn!(%addr, %err, "failed to accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// How reading a connection ended.
enum ReadEnd {
    /// The sender closed the stream between frames.
    Eof,
    /// The `ChannelRx` is gone.
    RxGone,
    /// A bad frame or an I/O error.
    Failed(frame::FrameError),
}

/// Serves one incoming connection until it ends.
async fn serve_conn<S: Stream>(stream: S, frames: Inbox, addr: ChannelAddr) {
    let (read, mut write) = stream.into_halves();
    let mut reader = BufReader::with_capacity(READ_BUFFER, read);
    let ack = Arc::new(AckState::default());
    {
        let reading = read_frames(&mut reader, &frames, &ack);
        let acking = write_acks(&mut write, &frames, &ack);
        tokio::pin!(reading);
        tokio::pin!(acking);
        tokio::select! {
            end = &mut reading => match end {
                ReadEnd::Eof => return,
                ReadEnd::Failed(err) => {
                    tracing::warn!(%addr, %err, "dropping a connection");
                    return;
                }
                // Let the ack writer send its final acknowledgement.
                ReadEnd::RxGone => acking.await,
            },
            () = &mut acking => {}
        }
    }
    if frames.is_closed() {
        // Discard input until the sender, seeing our shutdown, closes: a
        // close with unread input would reset the connection and could
        // lose the final acknowledgement.
        let mut sink = tokio::io::sink();
        let drain = tokio::io::copy(&mut reader, &mut sink);
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    }
}

async fn read_frames<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    frames: &Inbox,
    ack: &Arc<AckState>,
) -> ReadEnd {
    let mut seq = 0;
    loop {
        match frame::read_frame(reader).await {
            Ok(None) => return ReadEnd::Eof,
            Err(err) => return ReadEnd::Failed(err),
            Ok(Some(frame)) => {
                seq += 1;
                let delivery = Delivery {
                    frame,
                    seq,
                    ack: Arc::clone(ack),
                };
                if frames.send(delivery).await.is_err() {
                    return ReadEnd::RxGone;
                }
            }
        }
    }
}

/// Writes acknowledgements until the `ChannelRx` is gone (then writes the
/// final one and shuts down the write side) or writing fails.
async fn write_acks<W: AsyncWrite + Unpin>(write: &mut W, frames: &Inbox, ack: &AckState) {
    let mut sent = 0;
    loop {
        tokio::select! {
            next = ack.next() => {
                if write.write_all(&next.to_le_bytes()).await.is_err() {
                    return;
                }
                sent = next;
            }
            () = frames.closed() => break,
        }
    }
    let last = ack.delivered();
    if last > sent && write.write_all(&last.to_le_bytes()).await.is_err() {
        return;
    }
    let _ = write.shutdown().await;
}

/// Runs a link over the stream `connect` yields.
pub(crate) async fn run_link<S: Stream>(
    connect: impl Future<Output = io::Result<S>>,
    queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    let stream = match connect.await {
        Ok(stream) => stream,
        Err(err) => {
            let error = ChannelError::Connect {
                addr: link.addr.clone(),
                source: Arc::new(err),
            };
            return link::fail_unconnected(&link, error, queue);
        }
    };
    let (read, write) = stream.into_halves();
    let write = Arc::new(write);
    // Senders may now write to the stream themselves while the link is idle.
    link.lock_direct().writer = Some(Arc::clone(&write) as Arc<dyn DirectWrite>);
    let sink = NetSink {
        write,
        addr: link.addr.clone(),
    };
    let acks = NetAcks {
        read: BufReader::with_capacity(4096, read),
        addr: link.addr.clone(),
    };
    link::drive(sink, acks, queue, link).await;
}

/// Connects a TCP stream with `TCP_NODELAY` set.
pub(crate) async fn connect_tcp(addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The dialing side's writer: shares the write half with senders' direct writes
/// (see `tx::Direct`), so it writes through `&self` without blocking.
#[derive(Debug)]
struct NetSink<W> {
    write: Arc<W>,
    addr: ChannelAddr,
}

impl<W: SharedWrite> FrameSink for NetSink<W> {
    async fn write(&mut self, frames: Vec<Frame>, _first_seq: u64) -> Result<(), ChannelError> {
        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        for frame in &frames {
            frame::encode(frame, &mut chunks)
                .map_err(|err| ChannelError::frame(&self.addr, err))?;
        }
        self.write_rest(chunks).await
    }

    async fn write_rest(&mut self, mut chunks: VecDeque<Bytes>) -> Result<(), ChannelError> {
        frame::write_chunks_shared(&*self.write, &mut chunks)
            .await
            .map_err(|err| ChannelError::io(&self.addr, err))
    }
}

#[derive(Debug)]
struct NetAcks<R> {
    read: BufReader<R>,
    addr: ChannelAddr,
}

impl<R: AsyncRead + Unpin + Send> AckSource for NetAcks<R> {
    async fn next_ack(&mut self) -> Result<u64, ChannelError> {
        match self.read.read_u64_le().await {
            Ok(ack) => Ok(ack),
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                Err(ChannelError::closed(&self.addr))
            }
            Err(err) => Err(ChannelError::io(&self.addr, err)),
        }
    }
}
