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
//! TCP connections are authenticated first ([`tcp`], [`auth`]). With a
//! cluster secret or none, frames then flow on the raw socket as above; with
//! mutual TLS they flow through the TLS session, on both sides (the accepted
//! [`tcp::TcpConn`], and a link of its own on the dialing side, [`tls`],
//! without direct writes).
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
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;
use tokio::io::Interest;
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
use super::error::InheritedFdError;
use super::frame;
use super::frame::Frame;
use super::frame::FrameError;
use super::frame::SharedWrite;
use super::inbox::Inbox;
use super::link;
use super::link::AckSource;
use super::link::FrameSink;
use super::log_limit::LogLimit;
use super::socket_dir;
use super::tx::DirectWrite;
use super::tx::LinkShared;
use super::tx::Queued;

pub(crate) mod attach;
pub(crate) mod tcp;
mod tls;

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
    type Write: AsyncWrite + Unpin + Send + 'static;
    /// Splits the stream.
    fn into_halves(self) -> (Self::Read, Self::Write);
    /// The stream as a standard (non-blocking) socket, out of the runtime's reactor.
    fn into_socket(self) -> io::Result<Socket>;
    /// The peer's address, where the transport has one (TCP).
    fn peer(&self) -> Option<ChannelAddr> {
        None
    }
}

impl Stream for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn into_socket(self) -> io::Result<Socket> {
        self.into_std().map(Socket::Tcp)
    }
    fn peer(&self) -> Option<ChannelAddr> {
        self.peer_addr().ok().map(ChannelAddr::Tcp)
    }
}

impl Stream for UnixStream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn into_socket(self) -> io::Result<Socket> {
        self.into_std().map(Socket::Unix)
    }
}

/// A dialed connection as a standard non-blocking socket.
///
/// The dialing side reads only acknowledgements and writes frames, which its peer
/// reads at once. Registered with the reactor the way tokio's streams are (for reading
/// *and* writing, edge-triggered), every frame read by the peer would raise a write-
/// readiness edge and wake the runtime for nothing: a wake-up per message. So the
/// socket is registered for readability only ([`AckReader`]); writes are non-blocking
/// and, when one would block, a duplicate descriptor is registered for writability
/// just for that wait ([`SocketWriter::writable`]).
#[derive(Debug)]
pub(crate) enum Socket {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

impl Socket {
    /// Registers the socket with the current runtime's reactor for `interest`.
    fn register(self, interest: Interest) -> io::Result<AsyncFd<Self>> {
        // SAFETY: a `Socket` owns its descriptor (a standard stream): it stays open
        // until the socket is dropped, and `as_raw_fd` always returns that one.
        let fd = unsafe { AsyncFd::register_with_interest(self, interest) }?;
        Ok(fd)
    }

    fn try_clone(&self) -> io::Result<Self> {
        match self {
            Socket::Unix(s) => s.try_clone().map(Socket::Unix),
            Socket::Tcp(s) => s.try_clone().map(Socket::Tcp),
        }
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        match self {
            Socket::Unix(s) => (&*s).read(buf),
            Socket::Tcp(s) => (&*s).read(buf),
        }
    }

    fn write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        use std::io::Write;
        match self {
            Socket::Unix(s) => (&*s).write_vectored(bufs),
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
        }
    }
}

impl std::os::fd::AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// The write side of a dialed [`Socket`], shared by the link task and direct writers.
/// Every write that moves bytes counts as progress of the link (see `link.rs`).
#[derive(Debug)]
struct SocketWriter {
    socket: Socket,
    progress: Arc<std::sync::atomic::AtomicU64>,
}

impl SocketWriter {
    fn write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let written = self.socket.write_vectored(bufs);
        if matches!(written, Ok(n) if n > 0) {
            super::tx::touch(&self.progress);
        }
        written
    }
}

impl DirectWrite for SocketWriter {
    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored(bufs)
    }
}

impl SharedWrite for SocketWriter {
    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored(bufs)
    }

    async fn writable(&self) -> io::Result<()> {
        // Registered only for this wait; an edge-triggered registration reports a
        // socket that is writable already at once, so no wake-up is missed.
        let fd = self.socket.try_clone()?.register(Interest::WRITABLE)?;
        fd.writable().await?.retain_ready();
        Ok(())
    }
}

/// Reads acknowledgements from a dialed [`Socket`] registered for readability only.
#[derive(Debug)]
struct AckReader {
    fd: AsyncFd<Socket>,
    buf: [u8; 8],
    filled: usize,
}

impl AckReader {
    async fn read_u64_le(&mut self) -> io::Result<u64> {
        while self.filled < 8 {
            let mut guard = self.fd.readable().await?;
            let (buf, filled) = (&mut self.buf, self.filled);
            match guard.try_io(|fd| fd.get_ref().read(&mut buf[filled..])) {
                Ok(Ok(0)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(Ok(n)) => self.filled += n,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        self.filled = 0;
        Ok(u64::from_le_bytes(self.buf))
    }
}

/// A bound listener of [`Stream`]s.
pub(crate) trait Listener: Send + 'static {
    /// The accepted connection type.
    type Accepted: Send + 'static;
    /// The admitted connection type, that frames are read from.
    type Stream: Stream;
    /// Why [`admit`](Listener::admit) refused a connection (logged, with the address).
    type Rejected: std::fmt::Display + Send + 'static;
    /// Accepts the next connection. Cancel safe.
    fn next_conn(&mut self) -> impl Future<Output = io::Result<Self::Accepted>> + Send;
    /// Admits an accepted connection before any frame is read from it (TCP: the
    /// [`auth`](super::auth) handshake); an error says why the peer was rejected.
    fn admit(
        &self,
        conn: Self::Accepted,
    ) -> impl Future<Output = Result<Self::Stream, Self::Rejected>> + Send + 'static;
}

impl Listener for UnixListener {
    type Accepted = UnixStream;
    type Stream = UnixStream;
    /// A Unix connection needs no handshake (see [`socket_dir`]): none is refused.
    type Rejected = std::convert::Infallible;
    async fn next_conn(&mut self) -> io::Result<UnixStream> {
        Ok(self.accept().await?.0)
    }
    fn admit(
        &self,
        stream: UnixStream,
    ) -> impl Future<Output = Result<UnixStream, std::convert::Infallible>> + Send + 'static {
        std::future::ready(Ok(stream))
    }
}

/// Stops the accept task and removes the socket file (unless
/// [`socket_dir::remove_socket_files`] did) when dropped.
#[derive(Debug)]
pub(crate) struct NetGuard {
    accept: JoinHandle<()>,
    /// The socket file, and its token in [`socket_dir::SERVED`].
    unix_path: Option<(PathBuf, u64)>,
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some((path, token)) = &self.unix_path {
            socket_dir::SERVED.remove(path, *token);
        }
    }
}

/// Binds a TCP listener at `addr` and starts accepting into `frames`, authenticating
/// connections with `auth` (`None`: the process's mode,
/// [`tcp_auth`](super::auth::tcp_auth), at each connection).
///
/// # Errors
/// [`ChannelError::Bind`] if binding fails.
pub(crate) async fn serve_tcp(
    addr: std::net::SocketAddr,
    frames: Inbox,
    auth: Option<super::auth::TcpAuth>,
) -> Result<(ChannelAddr, NetGuard), ChannelError> {
    let bind_err = |err| ChannelError::Bind {
        addr: ChannelAddr::Tcp(addr),
        source: Arc::new(err),
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let bound = ChannelAddr::Tcp(listener.local_addr().map_err(bind_err)?);
    let listener = tcp::TcpServe::new(listener, auth);
    let accept = tokio::spawn(accept_loop(listener, frames, bound.clone()));
    Ok((
        bound,
        NetGuard {
            accept,
            unix_path: None,
        },
    ))
}

/// The file descriptors [`serve_inherited_tcp`] adopted: each is adopted once (a
/// second adoption would close it twice).
static ADOPTED: crate::sync::StaticMutex<std::collections::BTreeSet<i32>> =
    crate::sync::StaticMutex::new(std::collections::BTreeSet::new());

/// An integer socket option of `fd`.
fn socket_option(fd: i32, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given; getsockopt
    // writes at most `len` bytes and fails on a descriptor that is not a socket.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            std::ptr::addr_of_mut!(value).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes ownership of `fd` once it is checked to be an open, listening TCP socket that
/// was not adopted before: non-blocking and closed on exec from now on.
fn adopt_listening_tcp(fd: i32) -> Result<std::net::TcpListener, InheritedFdError> {
    use std::os::fd::FromRawFd;
    let os_error = || Arc::new(io::Error::last_os_error());
    if fd < 0 {
        return Err(InheritedFdError::Negative);
    }
    let mut adopted = ADOPTED.lock();
    if adopted.contains(&fd) {
        return Err(InheritedFdError::AlreadyServed);
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails if `fd` is not open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(InheritedFdError::NotOpen {
            fd,
            source: os_error(),
        });
    }
    let kind = socket_option(fd, libc::SO_TYPE).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTSOCK) {
            InheritedFdError::NotASocket
        } else {
            InheritedFdError::SocketType(Arc::new(e))
        }
    })?;
    if kind != libc::SOCK_STREAM {
        return Err(InheritedFdError::NotAStream { kind });
    }
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` is valid for writes of `len` bytes, the largest socket address.
    let rc = unsafe { libc::getsockname(fd, std::ptr::addr_of_mut!(storage).cast(), &mut len) };
    if rc != 0 {
        return Err(InheritedFdError::Address(os_error()));
    }
    let family = i32::from(storage.ss_family);
    if family == libc::AF_UNIX {
        return Err(InheritedFdError::UnixSocket);
    }
    if family != libc::AF_INET && family != libc::AF_INET6 {
        return Err(InheritedFdError::AddressFamily { family });
    }
    let listening = socket_option(fd, libc::SO_ACCEPTCONN)
        .map_err(|e| InheritedFdError::Listening(Arc::new(e)))?;
    if listening == 0 {
        return Err(InheritedFdError::NotListening);
    }
    if flags & libc::FD_CLOEXEC == 0 {
        // SAFETY: F_SETFD only sets the descriptor's flags.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } != 0 {
            return Err(InheritedFdError::CloseOnExec(os_error()));
        }
    }
    // SAFETY: `fd` is open and a listening TCP socket; from now on the listener alone
    // owns (and closes) it: ADOPTED keeps this process from adopting it twice.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    adopted.insert(fd);
    listener
        .set_nonblocking(true)
        .map_err(|e| InheritedFdError::NonBlocking(Arc::new(e)))?;
    Ok(listener)
}

/// Serves on the listening TCP socket this process inherited as `fd` (see
/// [`Listen::InheritedFd`](super::Listen::InheritedFd)), accepting into `frames` like
/// [`serve_tcp`]. The address returned is the socket's own (its real port).
///
/// # Errors
/// [`ChannelError::InheritedFd`] naming `fd` and what is wrong with it.
pub(crate) fn serve_inherited_tcp(
    fd: i32,
    frames: Inbox,
    auth: Option<super::auth::TcpAuth>,
) -> Result<(ChannelAddr, NetGuard), ChannelError> {
    let problem = |problem: InheritedFdError| ChannelError::InheritedFd { fd, problem };
    let listener = adopt_listening_tcp(fd).map_err(problem)?;
    let bound = listener
        .local_addr()
        .map_err(|e| problem(InheritedFdError::Address(Arc::new(e))))?;
    let listener = TcpListener::from_std(listener)
        .map_err(|e| problem(InheritedFdError::Register(Arc::new(e))))?;
    let bound = ChannelAddr::Tcp(bound);
    let listener = tcp::TcpServe::new(listener, auth);
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
/// listens on) and starts accepting into `frames`. A path in
/// [`socket_dir::socket_dir`] gets that directory prepared first
/// ([`socket_dir::prepare`]).
///
/// # Errors
/// [`ChannelError::SocketDir`] if the socket directory is not private;
/// [`ChannelError::AddrInUse`] if something listens there;
/// [`ChannelError::Bind`] if binding fails.
pub(crate) async fn serve_unix(
    path: &Path,
    frames: Inbox,
) -> Result<(ChannelAddr, NetGuard), ChannelError> {
    let addr = ChannelAddr::Unix(path.to_path_buf());
    let dir = socket_dir::socket_dir();
    if path.parent() == Some(dir) {
        socket_dir::prepare(dir)?;
    }
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
    let token = socket_dir::SERVED.register(path);
    let accept = tokio::spawn(accept_loop(listener, frames, addr.clone()));
    Ok((
        addr,
        NetGuard {
            accept,
            unix_path: Some((path.to_path_buf(), token)),
        },
    ))
}

async fn accept_loop<L: Listener>(mut listener: L, frames: Inbox, addr: ChannelAddr) {
    loop {
        tokio::select! {
            () = frames.closed() => return,
            res = listener.next_conn() => match res {
                Ok(stream) => {
                    let (frames, addr) = (frames.clone(), addr.clone());
                    let admit = listener.admit(stream);
                    tokio::spawn(async move {
                        match admit.await {
                            Ok(stream) => serve_conn(stream, frames, addr).await,
                            Err(reason) => {
                                static REJECTED: LogLimit = LogLimit::per_second();
                                if let Some(suppressed) = REJECTED.check() {
                                    tracing::warn!(%addr, suppressed, "{reason}");
                                }
                            }
                        }
                    });
                }
                Err(err) => {
                    static ACCEPT_FAILED: LogLimit = LogLimit::per_second();
                    if let Some(suppressed) = ACCEPT_FAILED.check() {
                        tracing::warn!(%addr, %err, suppressed, "failed to accept a connection");
                    }
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

/// Serves one incoming connection until it ends. On an endpoint that takes
/// attachments (see [`attach`]) a connection whose first byte starts one is handed to
/// its handler instead.
async fn serve_conn<S: Stream>(stream: S, frames: Inbox, addr: ChannelAddr) {
    let peer = attach::peer_of(&stream, &addr);
    let (read, write) = stream.into_halves();
    let mut reader = BufReader::with_capacity(READ_BUFFER, read);
    if let Some(handler) = frames.attach_handler() {
        use tokio::io::AsyncBufReadExt;
        let first = match reader.fill_buf().await {
            Ok(buf) => buf.first().copied(),
            Err(err) => {
                log_bad_connection(&addr, &FrameError::Io(Arc::new(err)));
                return;
            }
        };
        if first.is_some_and(attach::is_attachment) {
            return attach::serve_attachment(reader, write, handler, peer, addr).await;
        }
    }
    let _ = serve_halves(reader, write, frames, addr).await;
}

/// Reads frames from `reader` into `frames` and writes their acknowledgements to
/// `write` until the connection ends; returns why it ended (a bad connection is also
/// logged).
pub(crate) async fn serve_halves<R, W>(
    mut reader: BufReader<R>,
    mut write: W,
    frames: Inbox,
    addr: ChannelAddr,
) -> ChannelError
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let ack = Arc::new(AckState::default());
    {
        let reading = read_frames(&mut reader, &frames, &ack);
        let acking = write_acks(&mut write, &frames, &ack);
        tokio::pin!(reading);
        tokio::pin!(acking);
        tokio::select! {
            end = &mut reading => match end {
                ReadEnd::Eof => return ChannelError::closed(&addr),
                ReadEnd::Failed(err) => {
                    log_bad_connection(&addr, &err);
                    return ChannelError::frame(&addr, err);
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
    ChannelError::closed(&addr)
}

/// Logs, rate-limited per kind of error (see [`LogLimit`]), that a
/// connection to `addr` is closed because of `err`.
fn log_bad_connection(addr: &ChannelAddr, err: &FrameError) {
    static BAD_MAGIC: LogLimit = LogLimit::per_second();
    static TOO_MANY_PARTS: LogLimit = LogLimit::per_second();
    static TOO_LARGE: LogLimit = LogLimit::per_second();
    static TRUNCATED: LogLimit = LogLimit::per_second();
    static IO: LogLimit = LogLimit::per_second();
    let (limit, what) = match err {
        FrameError::BadMagic { .. } => (&BAD_MAGIC, "it sent a malformed frame"),
        FrameError::TooManyParts { .. } => (&TOO_MANY_PARTS, "it sent a malformed frame"),
        FrameError::TooLarge { .. } => (&TOO_LARGE, "it sent a frame over the maximum length"),
        FrameError::Truncated => (&TRUNCATED, "it ended in the middle of a frame"),
        FrameError::Io(_) => (&IO, "reading it failed"),
    };
    // A peer that dies resets its connections: routine while procs stop or are
    // killed, so only visible at debug level.
    if let FrameError::Io(e) = err {
        if matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        ) {
            tracing::debug!(%addr, %err, "closing an incoming connection: {what}");
            return;
        }
    }
    if let Some(suppressed) = limit.check() {
        tracing::warn!(
            %addr,
            %err,
            suppressed,
            "closing an incoming connection: {what}"
        );
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
                // The flush is free on a socket; a TLS session needs it to send the
                // record now.
                let written = async {
                    write.write_all(&next.to_le_bytes()).await?;
                    write.flush().await
                };
                if written.await.is_err() {
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
    // Shutting down flushes first.
    let _ = write.shutdown().await;
}

/// `connect`, bounded by the link's delivery timeout (see [`super::delivery_timeout`]):
/// a connection that does not complete within it fails with `TimedOut`.
pub(crate) async fn connect_within<S>(
    link: &LinkShared,
    connect: impl Future<Output = io::Result<S>>,
) -> io::Result<S> {
    let Some(limit) = link.delivery_timeout else {
        return connect.await;
    };
    match tokio::time::timeout(limit, connect).await {
        Ok(connected) => connected,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no connection within the message delivery timeout ({limit:?}); raise \
                 message_delivery_timeout (HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT) if the peer \
                 is only slow to accept"
            ),
        )),
    }
}

/// Runs a link over the stream `connect` yields.
pub(crate) async fn run_link<S: Stream>(
    connect: impl Future<Output = io::Result<S>>,
    queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    let stream = match connect_within(&link, connect).await {
        Ok(stream) => stream,
        Err(err) => {
            let error = ChannelError::Connect {
                addr: link.addr.clone(),
                source: Arc::new(err),
            };
            return link::fail_unconnected(&link, error, queue);
        }
    };
    let sockets = stream
        .into_socket()
        .and_then(|socket| Ok((socket.try_clone()?, socket)))
        .and_then(|(read, write)| Ok((read.register(Interest::READABLE)?, write)));
    let (read, write) = match sockets {
        Ok(sockets) => sockets,
        Err(err) => {
            let error = ChannelError::io(&link.addr, err);
            return link::fail_unconnected(&link, error, queue);
        }
    };
    let write = Arc::new(SocketWriter {
        socket: write,
        progress: Arc::clone(&link.progress),
    });
    // Senders may now write to the socket themselves while the link is idle.
    link.lock_direct().writer = Some(Arc::clone(&write) as Arc<dyn DirectWrite>);
    let sink = NetSink {
        write,
        addr: link.addr.clone(),
    };
    let acks = NetAcks {
        read: AckReader {
            fd: read,
            buf: [0; 8],
            filled: 0,
        },
        addr: link.addr.clone(),
    };
    link::drive(sink, acks, queue, link).await;
}

/// The dialing side's writer: shares the socket with senders' direct writes (see
/// `tx::Direct`), so it writes through `&self` without blocking.
#[derive(Debug)]
struct NetSink {
    write: Arc<SocketWriter>,
    addr: ChannelAddr,
}

impl FrameSink for NetSink {
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
struct NetAcks {
    read: AckReader,
    addr: ChannelAddr,
}

impl AckSource for NetAcks {
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
