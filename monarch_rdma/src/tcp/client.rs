//! The client: pooled connections to each server, one request at a time on each,
//! and transfers split into pieces over several connections.

use super::wire::*;
use super::*;

pub(super) static POOL: LazyLock<Mutex<HashMap<SocketAddr, Vec<TcpStream>>>> =
    LazyLock::new(Default::default);

/// An idle connection to `server` from the pool, if one is still open.
pub(super) fn checkout(server: SocketAddr) -> Option<TcpStream> {
    loop {
        let stream = POOL.lock().get_mut(&server)?.pop()?;
        if idle_and_open(&stream) {
            return Some(stream);
        }
    }
}

/// Returns a connection whose requests all succeeded to the pool (TCP-3).
pub(super) fn checkin(server: SocketAddr, stream: TcpStream) {
    let mut pool = POOL.lock();
    let idle = pool.entry(server).or_default();
    if idle.len() < POOL_PER_SERVER {
        idle.push(stream);
    }
}

/// Whether an idle connection is still open with nothing unread: a closed one reads
/// EOF or an error, one with unread bytes is out of step.
pub(super) fn idle_and_open(stream: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv writes at most one byte, into `byte`.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
}

/// What a request moves besides its header.
#[derive(Debug)]
pub(super) enum Body<'a> {
    /// Nothing (`DROP`, `PING`).
    Empty,
    /// A payload sent after the header (`WRITE`, `CONTROL`).
    Send(&'a [u8]),
    /// The destination of a `READ`'s bytes.
    Recv(&'a mut [u8]),
}

impl Body<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Send(bytes) => bytes.len(),
            Body::Recv(bytes) => bytes.len(),
        }
    }
}

/// How a request failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The connection failed; `replied` once any byte of the reply had arrived.
    Io { error: io::Error, replied: bool },
    /// The server refused, or answered something malformed.
    Answer(RdmaError),
}

/// One call of the public API: where, for whom, and until when.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) server: SocketAddr,
    pub(super) pid: u32,
    pub(super) deadline: Option<Instant>,
    /// The time the caller gave, in seconds, for [`RdmaError::Timeout`].
    pub(super) budget: f64,
}

impl Call {
    pub(super) fn new(server: SocketAddr, pid: u32, opts: &TcpOptions) -> Self {
        let budget = opts.deadline.map_or(0.0, |d| {
            d.saturating_duration_since(Instant::now()).as_secs_f64()
        });
        Self {
            server,
            pid,
            deadline: opts.deadline,
            budget,
        }
    }

    pub(super) fn timeout(&self) -> RdmaError {
        RdmaError::Timeout {
            pid: self.pid,
            seconds: (self.budget * 1000.0).round() / 1000.0,
        }
    }

    pub(super) fn unreachable(&self, source: io::Error) -> RdmaError {
        RdmaError::Unreachable {
            pid: self.pid,
            addr: self.server.to_string(),
            source,
        }
    }

    pub(super) fn refused(&self, message: String) -> RdmaError {
        RdmaError::Refused {
            pid: self.pid,
            message,
        }
    }

    pub(super) fn malformed(&self, what: &str) -> Failure {
        Failure::Answer(self.refused(format!(
            "malformed reply from {} ({what}): is it a monarch rdma tcp server of the same \
             version?",
            self.server
        )))
    }

    pub(super) fn error(&self, failure: Failure) -> RdmaError {
        match failure {
            Failure::Io { error, .. } if is_deadline(&error) => self.timeout(),
            Failure::Io { error, .. } => self.unreachable(error),
            Failure::Answer(e) => e,
        }
    }

    pub(super) fn connect(&self) -> Result<TcpStream, RdmaError> {
        let timeout = match self.deadline {
            None => CONNECT_TIMEOUT,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.timeout());
                }
                left.min(CONNECT_TIMEOUT)
            }
        };
        match TcpStream::connect_timeout(&self.server, timeout) {
            Ok(stream) => {
                tune(&stream);
                Ok(stream)
            }
            Err(_) if self.deadline.is_some_and(|d| Instant::now() >= d) => Err(self.timeout()),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    /// Runs `request` on `conn` (or on a connection from the pool, or a new one),
    /// retrying once per TCP-5; leaves a connection that succeeded in `conn`.
    pub(super) fn run(
        &self,
        conn: &mut Option<TcpStream>,
        request: &Request,
        body: &mut Body<'_>,
    ) -> Result<Vec<u8>, RdmaError> {
        let (stream, pooled) = match conn.take() {
            Some(stream) => (stream, false),
            None => match checkout(self.server) {
                Some(stream) => (stream, true),
                None => (self.connect()?, false),
            },
        };
        let failure = match self.exchange(&stream, request, body) {
            Ok(answer) => {
                *conn = Some(stream);
                return Ok(answer);
            }
            Err(failure) => failure,
        };
        drop(stream);
        match failure {
            Failure::Io {
                error,
                replied: false,
            } if pooled && !is_deadline(&error) => {
                tracing::debug!(
                    "rdma tcp: an idle connection to {} failed ({error}); retrying on a new one",
                    self.server
                );
                let stream = self.connect()?;
                let answer = self
                    .exchange(&stream, request, body)
                    .map_err(|f| self.error(f))?;
                *conn = Some(stream);
                Ok(answer)
            }
            failure => Err(self.error(failure)),
        }
    }

    /// Runs one request on one connection that was given back.
    pub(super) fn once(
        &self,
        request: &Request,
        body: &mut Body<'_>,
    ) -> Result<Vec<u8>, RdmaError> {
        let mut conn = None;
        let answer = self.run(&mut conn, request, body)?;
        if let Some(stream) = conn {
            checkin(self.server, stream);
        }
        Ok(answer)
    }

    /// Sends `request` and its body on `stream` and receives the answer: the reply's
    /// body, or for a `READ` the bytes into the body's slice.
    pub(super) fn exchange(
        &self,
        stream: &TcpStream,
        request: &Request,
        body: &mut Body<'_>,
    ) -> Result<Vec<u8>, Failure> {
        let io = |error| Failure::Io {
            error,
            replied: false,
        };
        let limit = match self.deadline {
            Some(deadline) => Limit::Until(deadline),
            None => {
                // A pooled connection may still hold an earlier call's timeouts.
                stream.set_read_timeout(None).map_err(io)?;
                stream.set_write_timeout(None).map_err(io)?;
                Limit::Keep
            }
        };
        let head = request.encode();
        match body {
            Body::Send(payload) if payload.len() > 4096 => {
                send_all(stream, &head, libc::MSG_MORE, limit).map_err(io)?;
                send_all(stream, payload, 0, limit).map_err(io)?;
            }
            Body::Send(payload) => {
                let mut message = Vec::with_capacity(REQUEST_BYTES + payload.len());
                message.extend_from_slice(&head);
                message.extend_from_slice(payload);
                send_all(stream, &message, 0, limit).map_err(io)?;
            }
            _ => send_all(stream, &head, 0, limit).map_err(io)?,
        }
        let mut got = 0;
        let reply = self.recv_reply(stream, request, limit, &mut got)?;
        let replied = |error| Failure::Io {
            error,
            replied: true,
        };
        match body {
            Body::Recv(dst) => {
                if reply.len != dst.len() as u64 {
                    return Err(self.malformed("a READ answer of the wrong length"));
                }
                recv_all(stream, dst, limit, &mut 0).map_err(replied)?;
                // The trailer: whether the bytes are valid (TCP-1).
                self.recv_reply(stream, request, limit, &mut 1)?;
                Ok(Vec::new())
            }
            _ => {
                let len = usize::try_from(reply.len)
                    .ok()
                    .filter(|&len| len <= MAX_CONTROL_BYTES)
                    .ok_or_else(|| self.malformed("an oversized answer"))?;
                let mut answer = vec![0u8; len];
                recv_all(stream, &mut answer, limit, &mut 0).map_err(replied)?;
                Ok(answer)
            }
        }
    }

    /// Receives a reply header; an OK one is returned, a refusal (with its body) is
    /// turned into its error. `got` counts the bytes received (> 0: the reply began).
    pub(super) fn recv_reply(
        &self,
        stream: &TcpStream,
        request: &Request,
        limit: Limit,
        got: &mut usize,
    ) -> Result<Reply, Failure> {
        let mut head = [0u8; REPLY_BYTES];
        let mut done = 0;
        let received = recv_all(stream, &mut head, limit, &mut done);
        *got += done;
        received.map_err(|error| Failure::Io {
            error,
            replied: *got > 0,
        })?;
        let reply = Reply::decode(&head).ok_or_else(|| self.malformed("bad magic"))?;
        if reply.status == OK {
            return Ok(reply);
        }
        if reply.len > MAX_MESSAGE_BYTES {
            return Err(self.malformed("an oversized error message"));
        }
        let mut body = vec![0u8; reply.len as usize];
        recv_all(stream, &mut body, limit, &mut 0).map_err(|error| Failure::Io {
            error,
            replied: true,
        })?;
        Err(Failure::Answer(self.refusal(request, reply.status, &body)))
    }

    pub(super) fn refusal(&self, request: &Request, status: u8, body: &[u8]) -> RdmaError {
        match status {
            DROPPED => RdmaError::Dropped {
                pid: self.pid,
                id: request.id,
            },
            OWNER_GONE => RdmaError::OwnerGone { pid: self.pid },
            OUT_OF_RANGE if body.len() == 24 => RdmaError::OutOfRange {
                offset: u64_at(body, 0) as usize,
                len: u64_at(body, 8) as usize,
                size: u64_at(body, 16) as usize,
            },
            _ if body.is_empty() => self.refused(format!("status {status}")),
            _ => self.refused(String::from_utf8_lossy(body).into_owned()),
        }
    }

    /// Moves `pieces` of `remote` (their offsets in it, and their bodies) over up to
    /// `parallelism` connections; `count` is how many pieces there are.
    pub(super) fn transfer<'a>(
        &self,
        remote: &RemoteRegion,
        op: u8,
        pieces: impl Iterator<Item = (u64, Body<'a>)> + Send,
        count: usize,
        parallelism: usize,
    ) -> Result<(), RdmaError> {
        let workers = parallelism.max(1).min(count.max(1));
        let queue = Mutex::new(pieces);
        let failed = AtomicBool::new(false);
        let first_error = Mutex::new(None);
        let work = || {
            let mut conn = None;
            while !failed.load(Ordering::Relaxed) {
                let Some((offset, mut body)) = queue.lock().next() else {
                    break;
                };
                let request = Request::for_region(op, remote, offset, body.len());
                if let Err(e) = self.run(&mut conn, &request, &mut body) {
                    failed.store(true, Ordering::Relaxed);
                    first_error.lock().get_or_insert(e);
                    return;
                }
            }
            if let Some(stream) = conn {
                checkin(self.server, stream);
            }
        };
        if workers == 1 {
            work();
        } else {
            std::thread::scope(|scope| {
                for _ in 1..workers {
                    let spawned = std::thread::Builder::new()
                        .name("rdma-tcp-client".into())
                        .spawn_scoped(scope, work);
                    if let Err(e) = spawned {
                        // Fewer connections; the pieces are still all moved.
                        tracing::debug!("rdma tcp: no thread for a connection: {e}");
                        break;
                    }
                }
                work();
            });
        }
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The size of the pieces a transfer of `len` bytes is split into.
pub(super) fn piece_bytes(len: usize, opts: &TcpOptions) -> usize {
    len.div_ceil(opts.parallelism.max(1))
        .max(MIN_PIECE)
        .min(opts.chunk_bytes)
        .max(1)
}

/// Copies the whole `remote` region (served at `server`) into `dst`.
///
/// # Errors
///
/// [`RdmaError::SizeMismatch`] unless `dst.len() == remote.len`;
/// [`RdmaError::Dropped`] if the registration ended (or the key is wrong);
/// [`RdmaError::OutOfRange`] or [`RdmaError::Refused`] for a range the registration
/// does not hold; [`RdmaError::OwnerGone`] if another process serves the address;
/// [`RdmaError::Unreachable`] if the server cannot be reached or the connection broke;
/// [`RdmaError::Timeout`] past the deadline. After an error, `dst` holds an unspecified
/// mix of old and new bytes.
pub fn read(
    server: SocketAddr,
    remote: &RemoteRegion,
    dst: &mut [u8],
    opts: &TcpOptions,
) -> Result<(), RdmaError> {
    remote.check_len(dst.len())?;
    let call = Call::new(server, remote.pid, opts);
    if dst.is_empty() {
        let pieces = std::iter::once((0, Body::Recv(dst)));
        return call.transfer(remote, OP_READ, pieces, 1, 1);
    }
    let piece = piece_bytes(dst.len(), opts);
    let count = dst.len().div_ceil(piece);
    let pieces = dst
        .chunks_mut(piece)
        .enumerate()
        .map(|(i, chunk)| ((i * piece) as u64, Body::Recv(chunk)));
    call.transfer(remote, OP_READ, pieces, count, opts.parallelism)
}

/// Copies `src` into the whole `remote` region (served at `server`).
///
/// # Errors
///
/// As [`read()`]; after an error the remote region holds an unspecified mix of old and
/// new bytes.
pub fn write(
    server: SocketAddr,
    remote: &RemoteRegion,
    src: &[u8],
    opts: &TcpOptions,
) -> Result<(), RdmaError> {
    remote.check_len(src.len())?;
    let call = Call::new(server, remote.pid, opts);
    if src.is_empty() {
        let pieces = std::iter::once((0, Body::Send(src)));
        return call.transfer(remote, OP_WRITE, pieces, 1, 1);
    }
    let piece = piece_bytes(src.len(), opts);
    let count = src.len().div_ceil(piece);
    let pieces = src
        .chunks(piece)
        .enumerate()
        .map(|(i, chunk)| ((i * piece) as u64, Body::Send(chunk)));
    call.transfer(remote, OP_WRITE, pieces, count, opts.parallelism)
}

/// Asks the owner to deregister the region (the whole registration `remote` is part
/// of). Returns `Ok(true)` if it was registered, `Ok(false)` if it was already gone
/// (or the key is wrong).
///
/// # Errors
///
/// [`RdmaError::Unreachable`] or [`RdmaError::Timeout`] as in [`read()`].
pub fn drop_remote(
    server: SocketAddr,
    remote: &RemoteRegion,
    opts: &TcpOptions,
) -> Result<bool, RdmaError> {
    let call = Call::new(server, remote.pid, opts);
    let request = Request::for_region(OP_DROP, remote, 0, 0);
    match call.once(&request, &mut Body::Empty)?.as_slice() {
        [existed] => Ok(*existed == 1),
        _ => Err(call.error(call.malformed("a DROP answer of the wrong length"))),
    }
}

/// Sends `payload` to the control handler of `kind` at `server` (see
/// [`set_control_handler`]) and returns its answer. `pid` is the owner's pid, for
/// errors.
///
/// # Errors
///
/// [`RdmaError::Refused`] with the handler's message when it fails, when there is no
/// handler, or when the payload exceeds [`MAX_CONTROL_BYTES`];
/// [`RdmaError::Unreachable`] or [`RdmaError::Timeout`] as in [`read()`].
pub fn request(
    server: SocketAddr,
    pid: u32,
    kind: u8,
    payload: &[u8],
    opts: &TcpOptions,
) -> Result<Vec<u8>, RdmaError> {
    let call = Call::new(server, pid, opts);
    if payload.len() > MAX_CONTROL_BYTES {
        return Err(call.refused(format!(
            "a control payload of {} bytes exceeds the limit of {MAX_CONTROL_BYTES}",
            payload.len()
        )));
    }
    let request = Request {
        op: OP_CONTROL,
        kind,
        pid,
        id: 0,
        key: 0,
        addr: 0,
        len: payload.len() as u64,
    };
    call.once(&request, &mut Body::Send(payload))
}

/// Checks that the server at `server` answers.
#[cfg(test)]
pub(super) fn ping(server: SocketAddr, opts: &TcpOptions) -> Result<(), RdmaError> {
    let call = Call::new(server, 0, opts);
    let request = Request {
        op: OP_PING,
        kind: 0,
        pid: 0,
        id: 0,
        key: 0,
        addr: 0,
        len: 0,
    };
    call.once(&request, &mut Body::Empty).map(|_| ())
}
