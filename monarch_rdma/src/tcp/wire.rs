//! The wire format (request and reply headers) and the socket steps both sides take:
//! deadlines armed on a socket, and sends and receives straight from and into memory.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) op: u8,
    pub(super) kind: u8,
    pub(super) pid: u32,
    pub(super) id: u64,
    pub(super) key: u64,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Request {
    pub(super) fn for_region(op: u8, remote: &RemoteRegion, offset: u64, len: usize) -> Self {
        Self {
            op,
            kind: 0,
            pid: remote.pid,
            id: remote.id,
            key: remote.key,
            addr: remote.addr.wrapping_add(offset),
            len: len as u64,
        }
    }

    pub(super) fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = self.op;
        b[5] = self.kind;
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; REQUEST_BYTES]) -> Option<Self> {
        if b[0..4] != REQUEST_MAGIC {
            return None;
        }
        Some(Self {
            op: b[4],
            kind: b[5],
            pid: u32_at(b, 8),
            id: u64_at(b, 16),
            key: u64_at(b, 24),
            addr: u64_at(b, 32),
            len: u64_at(b, 40),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) status: u8,
    pub(super) len: u64,
}

impl Reply {
    pub(super) fn encode(&self) -> [u8; REPLY_BYTES] {
        let mut b = [0u8; REPLY_BYTES];
        b[0..4].copy_from_slice(&REPLY_MAGIC);
        b[4] = self.status;
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; REPLY_BYTES]) -> Option<Self> {
        if b[0..4] != REPLY_MAGIC {
            return None;
        }
        Some(Self {
            status: b[4],
            len: u64_at(b, 8),
        })
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The error of a step that the client's deadline cut short.
#[derive(Debug)]
pub(super) struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the transfer's deadline passed")
    }
}

impl std::error::Error for DeadlinePassed {}

pub(super) fn deadline_passed() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, DeadlinePassed)
}

pub(super) fn is_deadline(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<DeadlinePassed>())
}

/// How a socket step is bounded in time.
#[derive(Debug, Clone, Copy)]
pub(super) enum Limit {
    /// By the socket's timeouts as they are (the server's [`SERVER_STALL`], or none).
    Keep,
    /// By this instant: each system call gets the time left.
    Until(Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Send,
    Recv,
}

/// Sets the socket's timeout of `direction` to what is left of `limit`.
pub(super) fn arm(stream: &TcpStream, direction: Direction, limit: Limit) -> io::Result<()> {
    let Limit::Until(deadline) = limit else {
        return Ok(());
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(deadline_passed());
    }
    match direction {
        Direction::Send => stream.set_write_timeout(Some(left)),
        Direction::Recv => stream.set_read_timeout(Some(left)),
    }
}

/// Moves `len` bytes between the socket and the memory at `ptr` (sends from it, or
/// receives into it with `MSG_WAITALL`), counting the bytes moved in `done`. Returns
/// `Ok(false)` when the kernel found the memory at `ptr + done` unreachable (`EFAULT`),
/// with the socket still in order.
///
/// # Safety
///
/// For [`Direction::Recv`], nothing else may be reading or writing `[ptr, ptr + len)`
/// through a Rust reference (the kernel writes it); the memory need not be mapped
/// (TCP-2).
pub(super) unsafe fn move_bytes(
    stream: &TcpStream,
    direction: Direction,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
    limit: Limit,
    done: &mut usize,
) -> io::Result<bool> {
    let fd = stream.as_raw_fd();
    while *done < len {
        arm(stream, direction, limit)?;
        let want = (len - *done).min(MAX_SYSCALL);
        let at = ptr.wrapping_add(*done).cast::<libc::c_void>();
        // SAFETY: the kernel reads or writes at most `want` bytes at `at`, inside
        // `[ptr, ptr + len)`, which the caller lends for this (see # Safety); memory it
        // cannot reach yields EFAULT rather than a fault in this process.
        let n = unsafe {
            match direction {
                Direction::Send => libc::send(fd, at, want, flags | libc::MSG_NOSIGNAL),
                Direction::Recv => libc::recv(fd, at, want, flags | libc::MSG_WAITALL),
            }
        };
        if n > 0 {
            *done += n.unsigned_abs();
            continue;
        }
        if n == 0 {
            return Err(match direction {
                Direction::Recv => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ),
                Direction::Send => io::ErrorKind::WriteZero.into(),
            });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                return Err(match limit {
                    Limit::Until(_) => deadline_passed(),
                    Limit::Keep => io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no progress within the socket's timeout",
                    ),
                })
            }
            Some(libc::EFAULT) => return Ok(false),
            _ => return Err(e),
        }
    }
    Ok(true)
}

/// Sends all of `bytes`.
pub(super) fn send_all(
    stream: &TcpStream,
    bytes: &[u8],
    flags: libc::c_int,
    limit: Limit,
) -> io::Result<()> {
    let mut done = 0;
    // SAFETY: the kernel only reads the slice (send never writes the memory).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Send,
            bytes.as_ptr().cast_mut(),
            bytes.len(),
            flags,
            limit,
            &mut done,
        )
    }?;
    whole
        .then_some(())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Fills all of `bytes`, counting the bytes received in `done`.
pub(super) fn recv_all(
    stream: &TcpStream,
    bytes: &mut [u8],
    limit: Limit,
    done: &mut usize,
) -> io::Result<()> {
    // SAFETY: the slice is borrowed mutably, so nothing else accesses it.
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Recv,
            bytes.as_mut_ptr(),
            bytes.len(),
            0,
            limit,
            done,
        )
    }?;
    whole
        .then_some(())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Receives and discards `len` bytes.
pub(super) fn drain(stream: &TcpStream, mut len: u64) -> io::Result<()> {
    let mut sink = vec![0u8; (len.min(1 << 20)) as usize];
    while len > 0 {
        let piece = len.min(sink.len() as u64) as usize;
        recv_all(stream, &mut sink[..piece], Limit::Keep, &mut 0)?;
        len -= piece as u64;
    }
    Ok(())
}

/// Sends `len` zero bytes.
pub(super) fn pad(stream: &TcpStream, mut len: usize) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let piece = len.min(ZEROS.len());
        send_all(stream, &ZEROS[..piece], libc::MSG_MORE, Limit::Keep)?;
        len -= piece;
    }
    Ok(())
}

pub(super) fn set_int_option(
    stream: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) {
    // SAFETY: passes a live c_int and its size; setsockopt only reads it.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "rdma tcp: setsockopt({level}, {name}, {value}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// Prepares a connection (either side): no Nagle delay, and keep-alive probes with a
/// user timeout so that a dead or cut-off peer host is noticed within about 30 s
/// (TCP-4). Socket buffers are left to the kernel's auto-tuning, which grows them
/// beyond what `SO_SNDBUF`/`SO_RCVBUF` may ask for (`net.core.[rw]mem_max`) and
/// measured as fast.
pub(super) fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!("rdma tcp: TCP_NODELAY failed: {e}");
    }
    set_int_option(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set_int_option(stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 30_000);
    if let Some(bytes) = socket_buffer() {
        set_int_option(stream, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
        set_int_option(stream, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes);
    }
}

/// The socket buffer size from `MONARCH_RDMA_TCP_SOCKET_BUFFER` (bytes), if set:
/// for experiments, since fixed buffers turn the kernel's auto-tuning off.
pub(super) fn socket_buffer() -> Option<libc::c_int> {
    static BYTES: LazyLock<Option<libc::c_int>> = LazyLock::new(|| {
        std::env::var("MONARCH_RDMA_TCP_SOCKET_BUFFER")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&b: &libc::c_int| b > 0)
    });
    *BYTES
}
