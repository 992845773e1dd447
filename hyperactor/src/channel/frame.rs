//! Frames and their wire codec.
//!
//! A [`Frame`] is the unit a channel carries: a small header plus payload
//! parts, all [`Bytes`]. On the Unix and TCP transports a frame is written
//! as a fixed prefix followed by the header bytes and then each part:
//!
//! ```text
//! u32 MAGIC | u32 number of parts | u32 header length | u64 part length * n
//! header bytes | part 0 bytes | part 1 bytes | ...
//! ```
//!
//! All integers are little-endian. Invariants:
//! - the encoder never concatenates: it produces a list of [`Bytes`]
//!   (prefix, header, parts) that the link writes with vectored writes;
//! - the decoder checks every length against [`max_frame_len`] and
//!   [`MAX_FRAME_PARTS`] *before* allocating, and then allocates only as
//!   bytes arrive: each part is read into a buffer of its own that starts
//!   at [`INITIAL_PART_RESERVE`] bytes at most and doubles when full, ending
//!   exactly sized. So a peer makes the decoder hold at most about twice the
//!   bytes it really sent (plus one initial reservation per connection),
//!   whatever lengths it claims. Large parts reuse idle buffers from the
//!   [receive buffer pool](super::buffer_pool) when one fits.
//!
//! # Maximum frame length
//!
//! A frame (header plus parts) may be at most [`max_frame_len`] bytes, on
//! both the sending and the receiving side. It is [`MAX_FRAME_LEN`]
//! (10 GiB) unless the environment variable
//! `HYPERACTOR_CODEC_MAX_FRAME_LENGTH` holds another positive number of
//! bytes (plain decimal digits, such as `1073741824` for 1 GiB). The
//! variable is read once per process, at the first frame; a value that is
//! not a positive integer is ignored with a warning. Processes that talk to
//! each other should use the same value: a receiver closes a connection
//! that sends a frame over its own maximum.
//!
//! ```
//! use bytes::Bytes;
//! use hyperactor::channel::{max_frame_len, Frame, MAX_FRAME_LEN};
//! let frame = Frame::new(Bytes::from_static(b"hdr"), vec![Bytes::from_static(b"body")]);
//! assert_eq!(frame.len(), 7);
//! // Without HYPERACTOR_CODEC_MAX_FRAME_LENGTH, the default applies.
//! if std::env::var_os("HYPERACTOR_CODEC_MAX_FRAME_LENGTH").is_none() {
//!     assert_eq!(max_frame_len(), MAX_FRAME_LEN);
//! }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

use bytes::Buf;
use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use tokio::io::AsyncBufRead;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;

use super::buffer_pool;

/// The default of [`max_frame_len`], the largest frame (header plus parts) a
/// channel carries: 10 GiB.
pub const MAX_FRAME_LEN: u64 = 10 << 30;

/// The environment variable that sets [`max_frame_len`], in bytes.
pub const MAX_FRAME_LEN_ENV: &str = "HYPERACTOR_CODEC_MAX_FRAME_LENGTH";

/// The most bytes the decoder reserves for a part before its bytes arrive;
/// the buffer then doubles as it fills. A little over 1 MiB, so that a
/// 1 MiB payload plus its serialization header still gets a single buffer.
pub(crate) const INITIAL_PART_RESERVE: usize = (1 << 20) + (64 << 10);

/// The most payload parts a frame may have.
pub const MAX_FRAME_PARTS: usize = 1 << 16;

/// Marks the start of every frame on the wire ("HYF1").
const MAGIC: u32 = u32::from_le_bytes(*b"HYF1");

/// The largest frame (header plus parts) this process sends or accepts, in
/// bytes: the value of the environment variable
/// `HYPERACTOR_CODEC_MAX_FRAME_LENGTH` ([`MAX_FRAME_LEN_ENV`]) if it is a
/// positive number of bytes in plain decimal digits, else [`MAX_FRAME_LEN`]
/// (10 GiB). A value that is set but invalid is ignored with a warning.
///
/// Read once per process, at the first call (the first frame sent or
/// received). Processes that talk to each other should use the same value:
/// a sender hands back a frame over its own maximum, and a receiver closes
/// a connection that sends a frame over its own.
pub fn max_frame_len() -> u64 {
    *MAX_FRAME.get_or_init(|| {
        let value = std::env::var_os(MAX_FRAME_LEN_ENV);
        match parse_max_frame_len(value.as_deref()) {
            Ok(max) => max,
            Err(problem) => {
                tracing::warn!(
                    "ignoring {MAX_FRAME_LEN_ENV}: {problem}; expected a positive number of \
                     bytes such as 1073741824; using the default of {MAX_FRAME_LEN} bytes"
                );
                MAX_FRAME_LEN
            }
        }
    })
}

static MAX_FRAME: OnceLock<u64> = OnceLock::new();

/// Sets [`max_frame_len`] for this process, in place of the environment
/// variable: for embedders with a configuration of their own. Only before the
/// first frame (or the first call of [`max_frame_len`]).
///
/// # Errors
///
/// The maximum in force, if it was already fixed at another value; `len` is
/// then ignored.
pub fn set_max_frame_len(len: u64) -> Result<(), u64> {
    let len = len.max(1);
    match MAX_FRAME.set(len) {
        Ok(()) => Ok(()),
        Err(_) if max_frame_len() == len => Ok(()),
        Err(_) => Err(max_frame_len()),
    }
}

/// Why a value of [`MAX_FRAME_LEN_ENV`] does not set [`max_frame_len`]: it must
/// be a positive number of bytes in plain decimal digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameLenError {
    /// The value is not valid unicode.
    #[error("{value:?} is not valid unicode")]
    NotUnicode {
        /// The value.
        value: std::ffi::OsString,
    },
    /// The value is not made of decimal digits only (or is empty).
    #[error("{text:?} is not a number of bytes")]
    NotANumber {
        /// The value.
        text: String,
    },
    /// The value is zero.
    #[error("0 would refuse every frame")]
    Zero,
    /// The value is larger than `u64::MAX`.
    #[error("{text:?} does not fit in 64 bits")]
    TooLarge {
        /// The value.
        text: String,
    },
}

/// The maximum frame length that `value` (of [`MAX_FRAME_LEN_ENV`]) sets:
/// [`MAX_FRAME_LEN`] if unset.
///
/// # Errors
/// A [`FrameLenError`] saying what is wrong with a value that is not a positive
/// integer.
pub(crate) fn parse_max_frame_len(value: Option<&std::ffi::OsStr>) -> Result<u64, FrameLenError> {
    let Some(value) = value else {
        return Ok(MAX_FRAME_LEN);
    };
    let text = value.to_str().ok_or_else(|| FrameLenError::NotUnicode {
        value: value.to_os_string(),
    })?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FrameLenError::NotANumber { text: text.into() });
    }
    match text.parse::<u64>() {
        Ok(0) => Err(FrameLenError::Zero),
        Ok(max) => Ok(max),
        Err(_) => Err(FrameLenError::TooLarge { text: text.into() }),
    }
}

/// Bytes of the fixed part of the prefix (magic, part count, header length).
const FIXED_PREFIX_LEN: usize = 12;

/// How many buffers one vectored write passes at most (Linux allows 1024).
pub(crate) const MAX_IOV: usize = 512;

/// A header plus payload parts, carried as one unit.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// A small header, interpreted by the layer above.
    pub header: Bytes,
    /// Payload parts; written with vectored writes, never concatenated.
    pub parts: Vec<Bytes>,
}

impl Frame {
    /// A frame of `header` and `parts`.
    pub fn new(header: Bytes, parts: Vec<Bytes>) -> Frame {
        Frame { header, parts }
    }

    /// The total number of bytes of the header and all parts.
    pub fn len(&self) -> usize {
        self.header.len() + self.parts.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether the header and all parts are empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Frame {
    /// Shows lengths only: a frame may hold many megabytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<usize> = self.parts.iter().map(Bytes::len).collect();
        f.debug_struct("Frame")
            .field("header_len", &self.header.len())
            .field("part_lens", &parts)
            .finish()
    }
}

/// What is wrong with a frame, on encode or decode.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame is longer than [`max_frame_len`].
    #[error(
        "frame of {len} bytes exceeds the maximum of {max} bytes; send less per message, or \
         raise HYPERACTOR_CODEC_MAX_FRAME_LENGTH on both sides"
    )]
    TooLarge {
        /// The (claimed) length; saturated at `u64::MAX`.
        len: u64,
        /// The maximum.
        max: u64,
    },
    /// The frame has more than [`MAX_FRAME_PARTS`] parts.
    #[error("frame of {parts} parts exceeds the maximum of {max} parts")]
    TooManyParts {
        /// The (claimed) number of parts.
        parts: u64,
        /// The maximum.
        max: usize,
    },
    /// The stream does not start a frame where one is expected.
    #[error("bad frame magic {found:#010x}")]
    BadMagic {
        /// The four bytes found instead, as a little-endian integer.
        found: u32,
    },
    /// The stream ended in the middle of a frame.
    #[error("stream ended in the middle of a frame")]
    Truncated,
    /// Reading the stream failed.
    #[error("i/o error: {0}")]
    Io(#[source] Arc<io::Error>),
}

impl From<io::Error> for FrameError {
    fn from(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(Arc::new(err))
        }
    }
}

/// Checks that `frame` can be encoded.
///
/// # Errors
/// [`FrameError::TooLarge`] or [`FrameError::TooManyParts`].
pub(crate) fn check(frame: &Frame) -> Result<(), FrameError> {
    if frame.parts.len() > MAX_FRAME_PARTS {
        return Err(FrameError::TooManyParts {
            parts: frame.parts.len() as u64,
            max: MAX_FRAME_PARTS,
        });
    }
    let len = frame.len() as u64;
    let max = max_frame_len();
    if len > max || u32::try_from(frame.header.len()).is_err() {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(())
}

/// Appends the wire form of `frame` to `out` as a list of buffers: the
/// prefix, then the header and parts themselves (shared, not copied).
///
/// # Errors
/// As [`check`]; nothing is appended then.
pub(crate) fn encode(frame: &Frame, out: &mut VecDeque<Bytes>) -> Result<(), FrameError> {
    check(frame)?;
    let prefix_len = FIXED_PREFIX_LEN + 8 * frame.parts.len();
    LINK_SENT.fetch_add((prefix_len + frame.len()) as u64, Ordering::Relaxed);
    let mut prefix = BytesMut::with_capacity(prefix_len);
    prefix.put_u32_le(MAGIC);
    // Both fit: `check` bounds the part count and the header length.
    prefix.put_u32_le(frame.parts.len() as u32);
    prefix.put_u32_le(frame.header.len() as u32);
    for part in &frame.parts {
        prefix.put_u64_le(part.len() as u64);
    }
    out.push_back(prefix.freeze());
    out.extend(
        std::iter::once(&frame.header)
            .chain(&frame.parts)
            .filter(|b| !b.is_empty())
            .cloned(),
    );
    Ok(())
}

/// Bytes of frames encoded for links of this process (prefixes included).
pub(crate) static LINK_SENT: AtomicU64 = AtomicU64::new(0);
/// Bytes of frames read from links of this process (prefixes included).
pub(crate) static LINK_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Drops the first `written` bytes of `chunks`.
pub(crate) fn advance(chunks: &mut VecDeque<Bytes>, written: usize) {
    let mut left = written;
    while left > 0 {
        let Some(front) = chunks.front_mut() else {
            break;
        };
        if front.len() <= left {
            left -= front.len();
            chunks.pop_front();
        } else {
            front.advance(left);
            left = 0;
        }
    }
}

/// Writes every buffer in `chunks` with vectored writes, without blocking: on
/// `WouldBlock` waits for `writer` to become writable. For a write half shared with
/// senders' direct writes (see `tx::Direct`).
///
/// # Errors
/// The first write error; `WriteZero` if the writer accepts nothing.
pub(crate) async fn write_chunks_shared<W: SharedWrite>(
    writer: &W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !chunks.is_empty() {
        let result = {
            let slices: Vec<IoSlice<'_>> = chunks
                .iter()
                .take(MAX_IOV)
                .map(|c| IoSlice::new(c))
                .collect();
            writer.try_write_vectored(&slices)
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(chunks, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writer.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A write half written to through `&self`: non-blocking writes plus readiness.
pub(crate) trait SharedWrite: Send + Sync + 'static {
    /// Writes what it can without blocking.
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Waits until the stream may be writable.
    fn writable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send;
}

/// Reads one frame of at most [`max_frame_len`] bytes. Returns `Ok(None)`
/// on a clean end of stream (before the first byte of a frame).
///
/// # Errors
/// [`FrameError::Truncated`] if the stream ends inside a frame; the
/// validation errors of [`FrameError`] for a corrupt prefix (before any
/// allocation of the claimed size); [`FrameError::Io`] for read errors.
///
/// # Cancel safety
/// Not cancel safe: a cancelled call may have consumed part of a frame.
pub(crate) async fn read_frame<R: AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Frame>, FrameError> {
    read_frame_limited(reader, max_frame_len()).await
}

/// As [`read_frame`], for frames of at most `max` bytes.
///
/// # Errors
/// As [`read_frame`].
///
/// # Cancel safety
/// Not cancel safe.
pub(crate) async fn read_frame_limited<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: u64,
) -> Result<Option<Frame>, FrameError> {
    if reader.fill_buf().await?.is_empty() {
        return Ok(None);
    }
    let mut fixed = [0u8; FIXED_PREFIX_LEN];
    reader.read_exact(&mut fixed).await?;
    let mut fixed = &fixed[..];
    let magic = fixed.get_u32_le();
    if magic != MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    let nparts = fixed.get_u32_le() as usize;
    if nparts > MAX_FRAME_PARTS {
        return Err(FrameError::TooManyParts {
            parts: nparts as u64,
            max: MAX_FRAME_PARTS,
        });
    }
    let header_len = u64::from(fixed.get_u32_le());
    let too_large = |len| FrameError::TooLarge { len, max };
    if header_len > max {
        return Err(too_large(header_len));
    }
    // The lengths list grows as its bytes arrive (8 per part).
    let mut lens = Vec::with_capacity(nparts.min(1024));
    let mut total = header_len;
    for _ in 0..nparts {
        let len = reader.read_u64_le().await?;
        total = total.saturating_add(len);
        if total > max {
            return Err(too_large(total));
        }
        lens.push(len);
    }
    let header = read_exactly(reader, header_len).await?;
    let mut parts = Vec::with_capacity(nparts);
    for len in lens {
        parts.push(read_exactly(reader, len).await?);
    }
    let read = FIXED_PREFIX_LEN as u64 + 8 * nparts as u64 + total;
    LINK_RECEIVED.fetch_add(read, Ordering::Relaxed);
    Ok(Some(Frame { header, parts }))
}

/// Reads exactly `len` bytes (already checked against the maximum) into a
/// buffer that grows with the bytes that arrive: at most
/// [`INITIAL_PART_RESERVE`] up front, then doubling, never past `len`, so it
/// ends exactly sized; or, for a part of at least
/// [`buffer_pool::POOLED_MIN`] bytes, into an idle pooled buffer that fits,
/// which the part gives back when dropped. The buffer is never zero-filled.
async fn read_exactly<R: AsyncRead + Unpin>(reader: &mut R, len: u64) -> Result<Bytes, FrameError> {
    // Cannot fail on 64-bit targets, where the maximum frame length fits.
    let len = usize::try_from(len).map_err(|_| FrameError::TooLarge {
        len,
        max: usize::MAX as u64,
    })?;
    if len == 0 {
        return Ok(Bytes::new());
    }
    // A large part lands in a pooled buffer, already mapped, when one fits.
    let mut buf: Vec<u8> =
        buffer_pool::take(len).unwrap_or_else(|| Vec::with_capacity(len.min(INITIAL_PART_RESERVE)));
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            // Large reallocations move pages (mremap), not bytes.
            buf.reserve_exact((len - buf.len()).min(buf.capacity()));
        }
        // A pooled buffer may be larger than the part: never read past it.
        let room = (buf.capacity().min(len) - buf.len()) as u64;
        if (&mut *reader).take(room).read_buf(&mut buf).await? == 0 {
            return Err(FrameError::Truncated);
        }
    }
    Ok(buffer_pool::freeze(buf))
}
