//! Tests of the frame codec: examples, and properties checked on generated
//! input (proptest): valid frames round-trip, any byte stream decodes to
//! frames or an error (never a panic or a hang), and claimed lengths are
//! never allocated before their bytes arrive.
//!
//! Decoding reads through [`Chunked`], a reader that hands out a few bytes
//! at a time and is pending every other poll, like a socket; every decode
//! runs under a `tokio::time::timeout`. Allocations are measured by a
//! counting global allocator ([`largest_allocation`]), per thread.

use std::collections::VecDeque;

use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;

use super::frame;
use super::*;

fn encoded(frames: &[Frame]) -> Vec<u8> {
    let mut chunks = VecDeque::new();
    for f in frames {
        frame::encode(f, &mut chunks).unwrap();
    }
    chunks.iter().flat_map(|c| c.iter().copied()).collect()
}

async fn decode_all(mut wire: &[u8]) -> Result<Vec<Frame>, FrameError> {
    let mut frames = Vec::new();
    while let Some(f) = frame::read_frame(&mut wire).await? {
        frames.push(f);
    }
    Ok(frames)
}

fn sample() -> Vec<Frame> {
    vec![
        Frame::default(),
        Frame::new(Bytes::from_static(b"h"), vec![]),
        Frame::new(
            Bytes::from_static(b"header"),
            vec![
                Bytes::from_static(b"a"),
                Bytes::new(),
                Bytes::from(vec![3u8; 100_000]),
            ],
        ),
    ]
}

#[tokio::test]
async fn round_trip() {
    let frames = sample();
    let wire = encoded(&frames);
    assert_eq!(within(decode_all(&wire)).await.unwrap(), frames);
}

#[tokio::test]
async fn vectored_writer_round_trip() {
    let frames = sample();
    let mut chunks = VecDeque::new();
    for f in &frames {
        frame::encode(f, &mut chunks).unwrap();
    }
    let out = Trickle::default();
    within(frame::write_chunks_shared(&out, &mut chunks))
        .await
        .unwrap();
    assert!(chunks.is_empty());
    assert_eq!(*out.bytes.lock(), encoded(&frames));
}

/// A writer that takes at most 7 bytes per write and would block every other time.
#[derive(Default)]
struct Trickle {
    bytes: crate::sync::Mutex<Vec<u8>>,
    calls: std::sync::atomic::AtomicUsize,
}

impl frame::SharedWrite for Trickle {
    fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        let call = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if call.is_multiple_of(2) {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let mut out = self.bytes.lock();
        let mut n = 0;
        for buf in bufs {
            let take = buf.len().min(7 - n);
            out.extend_from_slice(&buf[..take]);
            n += take;
            if n == 7 {
                break;
            }
        }
        Ok(n)
    }
    async fn writable(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_pooled_buffer_larger_than_the_part_holds_just_the_part() {
    let big = super::buffer_pool::POOLED_MIN * 2;
    let part = |n: usize, byte: u8| Bytes::from(vec![byte; n]);
    // A decoded 2 MiB part gives its buffer to the pool when dropped...
    let first = Frame::new(Bytes::new(), vec![part(big, 1)]);
    drop(within(decode_all(&encoded(&[first]))).await.unwrap());
    // ...where the next 1.5 MiB part finds it: the part must end where it ends.
    let frames = vec![
        Frame::new(Bytes::from_static(b"a"), vec![part(big * 3 / 4, 2)]),
        Frame::new(Bytes::from_static(b"b"), vec![part(big * 3 / 4, 3)]),
    ];
    assert_eq!(within(decode_all(&encoded(&frames))).await.unwrap(), frames);
}

#[tokio::test]
async fn truncated_stream_is_an_error() {
    let wire = encoded(&sample());
    for cut in [1, 5, 11, 13, 20, 24, 26, wire.len() - 1] {
        let err = within(decode_all(&wire[..cut])).await.unwrap_err();
        assert!(matches!(err, FrameError::Truncated), "cut {cut}: {err}");
    }
}

#[tokio::test]
async fn oversize_lengths_are_rejected_before_allocating() {
    // A part claiming u64::MAX bytes: allocating it would abort.
    let mut wire = BytesMut::new();
    wire.put_slice(b"HYF1");
    wire.put_u32_le(1);
    wire.put_u32_le(0);
    wire.put_u64_le(u64::MAX);
    let err = within(decode_all(&wire)).await.unwrap_err();
    assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
    // Just over the maximum, spread over two parts.
    let mut wire = BytesMut::new();
    wire.put_slice(b"HYF1");
    wire.put_u32_le(2);
    wire.put_u32_le(0);
    wire.put_u64_le(MAX_FRAME_LEN);
    wire.put_u64_le(1);
    let err = within(decode_all(&wire)).await.unwrap_err();
    assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
    // Too many parts.
    let mut wire = BytesMut::new();
    wire.put_slice(b"HYF1");
    wire.put_u32_le(u32::MAX);
    wire.put_u32_le(0);
    let err = within(decode_all(&wire)).await.unwrap_err();
    assert!(matches!(err, FrameError::TooManyParts { .. }), "{err}");
}

#[tokio::test]
async fn bad_magic_is_rejected() {
    let mut wire = encoded(&sample());
    wire[0] ^= 0xff;
    let err = within(decode_all(&wire)).await.unwrap_err();
    assert!(matches!(err, FrameError::BadMagic { .. }), "{err}");
}

async fn within<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(30), fut)
        .await
        .expect("test timed out")
}

#[test]
fn max_frame_len_env_values() {
    use std::ffi::OsStr;
    let parse = |s: &str| frame::parse_max_frame_len(Some(OsStr::new(s)));
    assert_eq!(frame::parse_max_frame_len(None), Ok(MAX_FRAME_LEN));
    assert_eq!(parse("1"), Ok(1));
    assert_eq!(parse("1073741824"), Ok(1 << 30));
    assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
    for bad in [
        "",
        "0",
        "-1",
        "+5",
        " 5",
        "5 ",
        "1e9",
        "1GiB",
        "18446744073709551616",
    ] {
        let err = parse(bad).unwrap_err();
        assert!(!err.to_string().is_empty(), "{bad:?}");
    }
    assert_eq!(parse("0"), Err(frame::FrameLenError::Zero));
    assert!(parse("0").unwrap_err().to_string().contains("every frame"));
    assert_eq!(
        parse("18446744073709551616").unwrap_err().to_string(),
        "\"18446744073709551616\" does not fit in 64 bits"
    );
    assert_eq!(
        parse("1GiB").unwrap_err().to_string(),
        "\"1GiB\" is not a number of bytes"
    );
    // The process-wide value: this test binary does not set the variable.
    if std::env::var_os(MAX_FRAME_LEN_ENV).is_none() {
        assert_eq!(max_frame_len(), MAX_FRAME_LEN);
    }
}

// ---- measuring allocations ----

/// The global allocator of this test binary: the system's, noting the size
/// of the largest allocation per thread.
struct Counting;

thread_local! {
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: no panic while the thread's locals are torn down.
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; `note`
// only updates a thread-local integer (const-initialised, no destructor, so
// it never allocates).
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as `alloc`.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from the system allocator with `layout`.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: as `dealloc`, and the caller's contract on `new`.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f` and returns its result and the largest single allocation this
/// thread made meanwhile.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(0));
    let out = f();
    (out, LARGEST.with(std::cell::Cell::get))
}

// ---- a socket-like reader ----

/// Hands out `data` at most `chunk` bytes per read, and is pending (waking
/// itself) before every read, as a socket whose bytes trickle in.
struct Chunked {
    data: Vec<u8>,
    pos: usize,
    chunk: usize,
    ready: bool,
}

impl tokio::io::AsyncRead for Chunked {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !std::mem::replace(&mut self.ready, false) {
            self.ready = true;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        let n = self
            .chunk
            .min(buf.remaining())
            .min(self.data.len() - self.pos);
        buf.put_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        std::task::Poll::Ready(Ok(()))
    }
}

/// Decodes every frame of `wire` (frames of at most `max` bytes) as a
/// connection would, through a buffered reader of `buffer` bytes over
/// [`Chunked`] reads of `chunk` bytes, on a fresh current-thread runtime,
/// with a timeout. Returns the result and the largest allocation made.
fn decode_chunked(
    wire: Vec<u8>,
    chunk: usize,
    buffer: usize,
    max: u64,
) -> (Result<Vec<Frame>, FrameError>, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let reader = Chunked {
        data: wire,
        pos: 0,
        chunk,
        ready: false,
    };
    let mut reader = tokio::io::BufReader::with_capacity(buffer, reader);
    largest_allocation(|| {
        runtime.block_on(async {
            let decode = async {
                let mut frames = Vec::new();
                while let Some(f) = frame::read_frame_limited(&mut reader, max).await? {
                    frames.push(f);
                }
                Ok(frames)
            };
            tokio::time::timeout(std::time::Duration::from_secs(10), decode)
                .await
                .expect("decoding hung")
        })
    })
}

/// A prefix claiming a frame with a header of `header_len` bytes and parts
/// of `lens` bytes, followed by `body` (of any length).
fn claim(header_len: u32, lens: &[u64], body: &[u8]) -> Vec<u8> {
    let mut wire = BytesMut::new();
    wire.put_slice(b"HYF1");
    wire.put_u32_le(lens.len() as u32);
    wire.put_u32_le(header_len);
    for len in lens {
        wire.put_u64_le(*len);
    }
    wire.put_slice(body);
    wire.to_vec()
}

/// The bound on what decoding a claim may allocate: one initial part
/// reservation, the reader's buffer, and small things.
const CLAIM_ALLOC_BOUND: usize = frame::INITIAL_PART_RESERVE + (256 << 10);

#[test]
fn a_10_gib_claim_allocates_only_what_arrives() {
    for body in [0usize, 100, 3 << 20] {
        let wire = claim(0, &[10 << 30], &vec![7u8; body]);
        let (result, largest) = decode_chunked(wire, 1 << 16, 64 << 10, MAX_FRAME_LEN);
        assert!(matches!(result, Err(FrameError::Truncated)), "{result:?}");
        // The buffer doubles as bytes arrive: at most twice what came.
        let bound = CLAIM_ALLOC_BOUND.max(2 * body);
        assert!(largest <= bound, "{body} bytes sent: allocated {largest}");
    }
}

#[test]
fn parts_larger_than_the_initial_reservation_end_exactly_sized() {
    let initial = frame::INITIAL_PART_RESERVE;
    for len in [initial - 1, initial, initial + 1, 3 * initial + 5] {
        let part: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let frames = vec![Frame::new(Bytes::new(), vec![Bytes::from(part)])];
        let wire = encoded(&frames);
        let (result, largest) = decode_chunked(wire, 1 << 20, 64 << 10, MAX_FRAME_LEN);
        assert_eq!(result.unwrap(), frames, "part of {len} bytes");
        // Never more than the part itself (no rounding up past it); less when an
        // idle pooled buffer took it.
        assert!(largest <= len, "part of {len} bytes: allocated {largest}");
    }
}

// ---- properties ----

mod properties {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
        vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
    }

    /// Frames of zero to six parts, empty ones included.
    fn frame() -> impl Strategy<Value = Frame> {
        (bytes(64), vec(bytes(300), 0..6)).prop_map(|(header, parts)| Frame::new(header, parts))
    }

    /// How a stream is read: bytes per read, and the reader's buffer size.
    fn reading() -> impl Strategy<Value = (usize, usize)> {
        (1usize..2048, 1usize..=(64 << 10))
    }

    /// Where each frame of `frames` ends in their encoding.
    fn boundaries(frames: &[Frame]) -> Vec<usize> {
        let mut end = 0;
        frames
            .iter()
            .map(|f| {
                end += encoded(std::slice::from_ref(f)).len();
                end
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        #[test]
        fn valid_frames_round_trip(
            frames in vec(frame(), 0..4),
            (chunk, buffer) in reading(),
        ) {
            let (result, _) = decode_chunked(encoded(&frames), chunk, buffer, MAX_FRAME_LEN);
            prop_assert_eq!(result.unwrap(), frames);
        }

        #[test]
        fn truncated_frames_are_an_error(
            frames in vec(frame(), 1..4),
            cut in any::<prop::sample::Index>(),
            (chunk, buffer) in reading(),
        ) {
            let wire = encoded(&frames);
            let cut = cut.index(wire.len());
            let ends = boundaries(&frames);
            let (result, _) = decode_chunked(wire[..cut].to_vec(), chunk, buffer, MAX_FRAME_LEN);
            match ends.iter().position(|&end| end == cut) {
                // Cut between frames: the frames before it.
                Some(i) => prop_assert_eq!(result.unwrap(), frames[..=i].to_vec()),
                None if cut == 0 => prop_assert!(result.unwrap().is_empty()),
                None => prop_assert!(matches!(result, Err(FrameError::Truncated)), "{:?}", result),
            }
        }

        #[test]
        fn random_streams_decode_or_fail(
            magic in any::<bool>(),
            noise in vec(any::<u8>(), 0..2048),
            (chunk, buffer) in reading(),
            max in prop_oneof![Just(MAX_FRAME_LEN), 0u64..4096],
        ) {
            // Half the streams start like a frame, to get past the magic.
            let wire = if magic { [b"HYF1".as_slice(), &noise].concat() } else { noise };
            let len = wire.len();
            let (result, largest) = decode_chunked(wire, chunk, buffer, max);
            if let Ok(frames) = &result {
                let decoded: usize = frames.iter().map(Frame::len).sum();
                prop_assert!(decoded <= len);
            }
            prop_assert!(largest <= CLAIM_ALLOC_BOUND, "allocated {}", largest);
        }

        #[test]
        fn oversized_claims_are_rejected_without_allocating(
            header_len in any::<u32>(),
            lens in vec(any::<u64>(), 0..64),
            max in prop_oneof![Just(MAX_FRAME_LEN), 0u64..(1 << 40)],
            (chunk, buffer) in reading(),
        ) {
            let total = lens.iter().fold(u64::from(header_len), |a, &l| a.saturating_add(l));
            prop_assume!(total > max);
            let wire = claim(header_len, &lens, &[0u8; 64]);
            let (result, largest) = decode_chunked(wire, chunk, buffer, max);
            prop_assert!(
                matches!(result, Err(FrameError::TooLarge { .. })),
                "{:?}", result
            );
            // Nothing near the claimed size: only the reader's buffer and the
            // list of lengths.
            prop_assert!(largest <= (64 << 10) + 4096, "allocated {}", largest);
        }

        #[test]
        fn large_claims_within_the_maximum_allocate_only_what_arrives(
            lens in vec(1u64..=(10 << 30), 1..4),
            body in 0usize..4096,
            (chunk, buffer) in reading(),
        ) {
            let wire = claim(0, &lens, &vec![1u8; body]);
            let total: u64 = lens.iter().sum();
            let (result, largest) = decode_chunked(wire, chunk, buffer, total);
            if total > body as u64 {
                prop_assert!(matches!(result, Err(FrameError::Truncated)), "{:?}", result);
            }
            prop_assert!(largest <= CLAIM_ALLOC_BOUND, "allocated {}", largest);
        }
    }
}
