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
//! - the decoder reads each part into its own buffer of exactly that part's
//!   size, and checks every length against [`MAX_FRAME_LEN`] and
//!   [`MAX_FRAME_PARTS`] *before* allocating, so a corrupt length cannot
//!   make it allocate unbounded memory.
//!
//! ```
//! use bytes::Bytes;
//! use hyperactor::channel::Frame;
//! let frame = Frame::new(Bytes::from_static(b"hdr"), vec![Bytes::from_static(b"body")]);
//! assert_eq!(frame.len(), 7);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::sync::Arc;

use bytes::Buf;
use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use tokio::io::AsyncBufRead;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;

/// The largest frame (header plus parts) a channel carries: 10 GiB.
pub const MAX_FRAME_LEN: u64 = 10 << 30;

/// The most payload parts a frame may have.
pub const MAX_FRAME_PARTS: usize = 1 << 16;

/// Marks the start of every frame on the wire ("HYF1").
const MAGIC: u32 = u32::from_le_bytes(*b"HYF1");

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
    /// The frame is longer than [`MAX_FRAME_LEN`].
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
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
    if len > MAX_FRAME_LEN || u32::try_from(frame.header.len()).is_err() {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME_LEN,
        });
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
    let mut prefix = BytesMut::with_capacity(FIXED_PREFIX_LEN + 8 * frame.parts.len());
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

/// Reads one frame. Returns `Ok(None)` on a clean end of stream (before
/// the first byte of a frame).
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
    let mut lens = Vec::with_capacity(nparts);
    let mut total = header_len;
    for _ in 0..nparts {
        let len = reader.read_u64_le().await?;
        total = total.saturating_add(len);
        lens.push(len);
    }
    if total > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            len: total,
            max: MAX_FRAME_LEN,
        });
    }
    let header = read_exactly(reader, header_len).await?;
    let mut parts = Vec::with_capacity(nparts);
    for len in lens {
        parts.push(read_exactly(reader, len).await?);
    }
    Ok(Some(Frame { header, parts }))
}

/// Reads exactly `len` bytes into a buffer of exactly that capacity,
/// without zero-filling it first.
async fn read_exactly<R: AsyncRead + Unpin>(reader: &mut R, len: u64) -> Result<Bytes, FrameError> {
    // `len` is at most MAX_FRAME_LEN, checked by the caller.
    let len = usize::try_from(len).map_err(|_| FrameError::TooLarge {
        len,
        max: MAX_FRAME_LEN,
    })?;
    if len == 0 {
        return Ok(Bytes::new());
    }
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *reader).take(want).read_buf(&mut buf).await? == 0 {
            return Err(FrameError::Truncated);
        }
    }
    Ok(buf.freeze())
}
