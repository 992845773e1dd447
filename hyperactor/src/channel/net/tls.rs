//! The dialing side of a TCP connection in mutual TLS mode
//! ([`auth::tls`](crate::channel::auth::tls)): frames flow through the TLS session.
//!
//! [`run_link`] writes batches of frames through a buffer into the session and flushes
//! it, and reads acknowledgements from it. There are no direct writes by senders (see
//! `tx::Direct`): they would need the session's lock on their own threads, so every
//! frame goes through the link task. When the link ends, it sends `close_notify`. (The
//! accepting side is [`super::tcp::TcpConn`].)
//!
//! ```ignore
//! run_link(connect(addr, config), queue, link).await; // run by `dial` in its own task
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::super::addr::ChannelAddr;
use super::super::auth;
use super::super::auth::TlsConfig;
use super::super::error::ChannelError;
use super::super::frame;
use super::super::frame::Frame;
use super::super::link;
use super::super::link::{AckSource, FrameSink};
use super::super::tx::{LinkShared, Queued};

/// The dialing side's write buffer: small chunks of a batch are gathered into TLS
/// records this large; larger chunks go to the session as they are.
const WRITE_BUFFER: usize = 64 << 10;
/// How long a link that ended waits to send `close_notify`.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// Whether `err` is a TCP end of file without TLS's `close_notify`.
pub(super) fn is_unclean_eof(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::UnexpectedEof
}

/// Connects to `addr` with `TCP_NODELAY` set and runs the TLS handshake
/// ([`auth::tls::connect`]).
///
/// # Errors
///
/// The connection's error, or the handshake's ("TLS authentication failed: ...").
pub(crate) async fn connect(addr: SocketAddr, config: Arc<TlsConfig>) -> io::Result<ClientTls> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    super::super::settings::tune_tcp(&stream);
    auth::tls::connect(stream, &config, addr.ip()).await
}

/// Runs a link over the TLS session `connect` yields.
pub(crate) async fn run_link(
    connect: impl Future<Output = io::Result<ClientTls>>,
    queue: mpsc::UnboundedReceiver<Queued>,
    link: Arc<LinkShared>,
) {
    let stream = match super::connect_within(&link, connect).await {
        Ok(stream) => stream,
        Err(err) => {
            let error = ChannelError::Connect {
                addr: link.addr.clone(),
                source: Arc::new(err),
            };
            return link::fail_unconnected(&link, error, queue);
        }
    };
    let addr = link.addr.clone();
    let (read, write) = tokio::io::split(stream);
    let mut write = BufWriter::with_capacity(WRITE_BUFFER, write);
    let sink = TlsSink {
        write: &mut write,
        addr: addr.clone(),
        progress: Arc::clone(&link.progress),
    };
    let acks = TlsAcks { read, addr };
    link::drive(sink, acks, queue, link).await;
    // Tell the peer the link ended here, rather than being cut (if it is still there).
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, write.shutdown()).await;
}

/// The dialing side's writer: the session's write half, behind a buffer.
#[derive(Debug)]
struct TlsSink<'a> {
    write: &'a mut BufWriter<WriteHalf<ClientTls>>,
    addr: ChannelAddr,
    /// The link's progress (see `link.rs`): each write that moves bytes counts.
    progress: Arc<std::sync::atomic::AtomicU64>,
}

impl FrameSink for TlsSink<'_> {
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
        let write = &mut *self.write;
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

/// Reads acknowledgements from the session's read half.
#[derive(Debug)]
struct TlsAcks {
    read: ReadHalf<ClientTls>,
    addr: ChannelAddr,
}

impl AckSource for TlsAcks {
    async fn next_ack(&mut self) -> Result<u64, ChannelError> {
        let mut ack = [0u8; 8];
        match self.read.read_exact(&mut ack).await {
            Ok(_) => Ok(u64::from_le_bytes(ack)),
            Err(err) if is_unclean_eof(&err) => Err(ChannelError::closed(&self.addr)),
            Err(err) => Err(ChannelError::io(&self.addr, err)),
        }
    }
}
