//! The transfer server: the listening socket, a thread per connection, and the
//! answers to each request.

use super::wire::*;
use super::*;

/// Starts (once per process; later calls return the same address) the transfer server
/// for [`Registry::global`], listening on `0.0.0.0:0` (or `MONARCH_RDMA_TCP_BIND`,
/// `IP:PORT`), and returns the address peers must dial: the listening port at
/// [`hyperactor::channel::primary_ip`] (or `MONARCH_RDMA_TCP_ADVERTISE_IP`;
/// `127.0.0.1` when the machine has no other address). With a specific bind IP and no
/// advertised one, the bind IP is advertised.
///
/// # Errors
///
/// A malformed environment variable, or the socket's error (e.g. the port is taken).
/// A failed start may be retried.
pub fn serve() -> io::Result<SocketAddr> {
    static SERVED: Mutex<Option<SocketAddr>> = Mutex::new(None);
    let mut served = SERVED.lock();
    if let Some(addr) = *served {
        return Ok(addr);
    }
    let invalid = |name: &str, value: &str, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name}={value:?} is malformed: {e}"),
        )
    };
    let mut bind = match std::env::var("MONARCH_RDMA_TCP_BIND") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<SocketAddr>()
            .map_err(|e| invalid("MONARCH_RDMA_TCP_BIND", &v, &e))?,
        _ => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
    };
    let advertise = match std::env::var("MONARCH_RDMA_TCP_ADVERTISE_IP") {
        Ok(v) if !v.trim().is_empty() => Some(
            v.trim()
                .parse::<IpAddr>()
                .map_err(|e| invalid("MONARCH_RDMA_TCP_ADVERTISE_IP", &v, &e))?,
        ),
        _ if bind.ip().is_unspecified() => {
            let ip = hyperactor::channel::primary_ip().unwrap_or(Ipv4Addr::LOCALHOST.into());
            // A host with only IPv6 addresses: listen on IPv6 (and IPv4) too.
            if ip.is_ipv6() && bind.is_ipv4() {
                bind = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), bind.port());
            }
            Some(ip)
        }
        _ => None,
    };
    let addr = serve_registry(Registry::global(), bind, advertise)?;
    *served = Some(addr);
    Ok(addr)
}

/// Starts a transfer server for `registry`, listening on `bind`, and returns the
/// address to advertise: the listening port at `advertise`, or at the bound IP.
///
/// # Errors
///
/// The socket's error, or the thread's when it cannot be started.
pub fn serve_registry(
    registry: &'static Registry,
    bind: SocketAddr,
    advertise: Option<IpAddr>,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(bind)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("rdma-tcp-accept".into())
        .spawn(move || accept_loop(listener, registry))?;
    Ok(SocketAddr::new(
        advertise.unwrap_or(bound.ip()),
        bound.port(),
    ))
}

pub(super) fn accept_loop(listener: TcpListener, registry: &'static Registry) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let spawned = std::thread::Builder::new()
                    .name("rdma-tcp".into())
                    .spawn(move || serve_connection(stream, registry, peer));
                if let Err(e) = spawned {
                    // The connection was dropped with the closure: the client sees a
                    // reset and reports it.
                    tracing::warn!("rdma tcp: no thread for a connection from {peer}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                // Out of descriptors or memory: wait for some to be released rather
                // than spin.
                tracing::warn!("rdma tcp: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

pub(super) fn serve_connection(stream: TcpStream, registry: &'static Registry, peer: SocketAddr) {
    tune(&stream);
    if let Err(e) = stream.set_write_timeout(Some(SERVER_STALL)) {
        tracing::debug!("rdma tcp: connection from {peer}: {e}");
        return;
    }
    let mut head = [0u8; REQUEST_BYTES];
    loop {
        // Idle: wait for the next request as long as the client lives (TCP-4).
        let mut got = 0;
        let received = stream
            .set_read_timeout(None)
            .and_then(|()| recv_all(&stream, &mut head, Limit::Keep, &mut got));
        if let Err(e) = received {
            if got > 0 {
                tracing::debug!("rdma tcp: connection from {peer}: {e}");
            }
            return;
        }
        let Some(request) = Request::decode(&head) else {
            let message = "malformed request: bad magic (is this a monarch rdma tcp client?)";
            let _ = send_reply(&stream, BAD_REQUEST, message.as_bytes());
            tracing::debug!("rdma tcp: connection from {peer}: {message}");
            return;
        };
        let served = stream
            .set_read_timeout(Some(SERVER_STALL))
            .and_then(|()| serve_request(&stream, registry, &request));
        if let Err(e) = served {
            tracing::debug!("rdma tcp: connection from {peer}: {e}");
            return;
        }
    }
}

/// Serves one request; an error closes the connection.
pub(super) fn serve_request(
    stream: &TcpStream,
    registry: &Registry,
    request: &Request,
) -> io::Result<()> {
    match request.op {
        OP_PING => send_reply(stream, OK, &[]),
        OP_READ => serve_read(stream, registry, request),
        OP_WRITE => serve_write(stream, registry, request),
        OP_DROP => {
            let existed =
                registry.lookup(request.id, request.key).is_ok() && registry.deregister(request.id);
            send_reply(stream, OK, &[u8::from(existed)])
        }
        OP_CONTROL => serve_control(stream, request),
        op => {
            let message = format!("malformed request: unknown operation {op}");
            let _ = send_reply(stream, BAD_REQUEST, message.as_bytes());
            Err(io::Error::new(io::ErrorKind::InvalidData, message))
        }
    }
}

/// A server's answer other than OK.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: u8,
    pub(super) body: Vec<u8>,
}

impl Refusal {
    pub(super) fn refused(message: String) -> Self {
        Self {
            status: REFUSED,
            body: message.into_bytes(),
        }
    }
}

/// Checks a READ or WRITE (TCP-1); returns the range's length.
pub(super) fn check(registry: &Registry, request: &Request) -> Result<usize, Refusal> {
    let Ok(region) = registry.lookup(request.id, request.key) else {
        let status = if request.pid == std::process::id() {
            DROPPED
        } else {
            OWNER_GONE
        };
        return Err(Refusal {
            status,
            body: Vec::new(),
        });
    };
    let start = region.addr;
    let end = start.saturating_add(region.len as u64);
    if request.addr < start || request.addr > end {
        return Err(Refusal::refused(format!(
            "address {:#x} is outside buffer {} ({} bytes at {:#x})",
            request.addr, region.id, region.len, start
        )));
    }
    let offset = request.addr - start;
    let fits = offset
        .checked_add(request.len)
        .is_some_and(|e| e <= region.len as u64);
    match usize::try_from(request.len) {
        Ok(len) if fits => Ok(len),
        _ => {
            let mut body = Vec::with_capacity(24);
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&request.len.to_le_bytes());
            body.extend_from_slice(&(region.len as u64).to_le_bytes());
            Err(Refusal {
                status: OUT_OF_RANGE,
                body,
            })
        }
    }
}

/// What to answer after a copy (TCP-1, TCP-2).
pub(super) fn after_copy(
    registry: &Registry,
    request: &Request,
    whole: bool,
) -> Result<(), Refusal> {
    check(registry, request)?;
    if whole {
        return Ok(());
    }
    let verb = if request.op == OP_WRITE {
        "writable"
    } else {
        "readable"
    };
    Err(Refusal::refused(format!(
        "the memory of buffer {} ({:#x}, {} bytes) is not {verb} in pid {}: the owner freed \
         or protected it without dropping the registration",
        request.id,
        request.addr,
        request.len,
        std::process::id()
    )))
}

pub(super) fn send_reply(stream: &TcpStream, status: u8, body: &[u8]) -> io::Result<()> {
    let head = Reply {
        status,
        len: body.len() as u64,
    }
    .encode();
    if body.len() <= 4096 {
        let mut message = Vec::with_capacity(REPLY_BYTES + body.len());
        message.extend_from_slice(&head);
        message.extend_from_slice(body);
        send_all(stream, &message, 0, Limit::Keep)
    } else {
        send_all(stream, &head, libc::MSG_MORE, Limit::Keep)?;
        send_all(stream, body, 0, Limit::Keep)
    }
}

pub(super) fn send_outcome(stream: &TcpStream, outcome: Result<(), Refusal>) -> io::Result<()> {
    match outcome {
        Ok(()) => send_reply(stream, OK, &[]),
        Err(refusal) => send_reply(stream, refusal.status, &refusal.body),
    }
}

/// The registered memory at `addr`, as a pointer the kernel may use (TCP-2).
pub(super) fn registered_ptr(addr: u64) -> io::Result<*mut u8> {
    let addr = usize::try_from(addr).map_err(|_| io::ErrorKind::InvalidData)?;
    Ok(std::ptr::with_exposed_provenance_mut(addr))
}

pub(super) fn serve_read(
    stream: &TcpStream,
    registry: &Registry,
    request: &Request,
) -> io::Result<()> {
    let len = match check(registry, request) {
        Ok(len) => len,
        Err(refusal) => return send_reply(stream, refusal.status, &refusal.body),
    };
    let head = Reply {
        status: OK,
        len: request.len,
    };
    send_all(stream, &head.encode(), libc::MSG_MORE, Limit::Keep)?;
    let mut done = 0;
    // SAFETY: send only reads the memory; `check` found `[addr, addr + len)` inside a
    // live registration, and memory the owner unmapped regardless gives EFAULT (TCP-2).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Send,
            registered_ptr(request.addr)?,
            len,
            libc::MSG_MORE,
            Limit::Keep,
            &mut done,
        )
    }?;
    if !whole {
        pad(stream, len - done)?;
    }
    send_outcome(stream, after_copy(registry, request, whole))
}

pub(super) fn serve_write(
    stream: &TcpStream,
    registry: &Registry,
    request: &Request,
) -> io::Result<()> {
    let len = match check(registry, request) {
        Ok(len) => len,
        Err(refusal) => {
            // Keep the framing: the payload follows the header regardless.
            drain(stream, request.len)?;
            return send_reply(stream, refusal.status, &refusal.body);
        }
    };
    let mut done = 0;
    // SAFETY: `check` found `[addr, addr + len)` inside a live registration, whose
    // owner lets peers write it at any time (REG-1) and holds no reference to it that
    // this write could invalidate; memory it unmapped regardless gives EFAULT (TCP-2).
    let whole = unsafe {
        move_bytes(
            stream,
            Direction::Recv,
            registered_ptr(request.addr)?,
            len,
            0,
            Limit::Keep,
            &mut done,
        )
    }?;
    if !whole {
        drain(stream, (len - done) as u64)?;
    }
    send_outcome(stream, after_copy(registry, request, whole))
}

/// A handler of control requests (see [`set_control_handler`]): the request's payload
/// in, the answer or an error message (sent to the client as [`RdmaError::Refused`])
/// out.
// String because: the error is text for the peer (it travels in the refusal and becomes
// the peer's `RdmaError::Refused` message); a handler of any kind renders its own error.
pub type ControlHandler = dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync;

pub(super) static HANDLERS: RwLock<BTreeMap<u8, Arc<ControlHandler>>> =
    RwLock::new(BTreeMap::new());

pub(super) fn serve_control(stream: &TcpStream, request: &Request) -> io::Result<()> {
    let len = match usize::try_from(request.len) {
        Ok(len) if len <= MAX_CONTROL_BYTES => len,
        _ => {
            let message = format!(
                "malformed request: a control payload of {} bytes (at most {MAX_CONTROL_BYTES})",
                request.len
            );
            let _ = send_reply(stream, BAD_REQUEST, message.as_bytes());
            return Err(io::Error::new(io::ErrorKind::InvalidData, message));
        }
    };
    let mut payload = vec![0u8; len];
    recv_all(stream, &mut payload, Limit::Keep, &mut 0)?;
    let handler = HANDLERS.read().get(&request.kind).cloned();
    let pid = std::process::id();
    let Some(handler) = handler else {
        let message = format!(
            "pid {pid} has no handler for control requests of kind {}",
            request.kind
        );
        return send_reply(stream, REFUSED, message.as_bytes());
    };
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&payload)));
    match answer {
        Ok(Ok(answer)) if answer.len() <= MAX_CONTROL_BYTES => send_reply(stream, OK, &answer),
        Ok(Ok(answer)) => {
            let message = format!(
                "the handler of control kind {} answered {} bytes (at most {MAX_CONTROL_BYTES})",
                request.kind,
                answer.len()
            );
            send_reply(stream, REFUSED, message.as_bytes())
        }
        Ok(Err(message)) => send_reply(stream, REFUSED, message.as_bytes()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let message = format!(
                "the handler of control kind {} in pid {pid} panicked: {what}",
                request.kind
            );
            send_reply(stream, REFUSED, message.as_bytes())
        }
    }
}

/// Registers the handler of control requests of `kind` in this process's server(s),
/// replacing any earlier one. Kinds 0..=15 are reserved for this module: a handler for
/// one of them is refused (and logged).
pub fn set_control_handler(kind: u8, handler: Box<ControlHandler>) {
    if kind < FIRST_FREE_KIND {
        tracing::error!(
            "rdma tcp: control kind {kind} is reserved (use {FIRST_FREE_KIND} or more); \
             the handler is ignored"
        );
        return;
    }
    HANDLERS.write().insert(kind, Arc::from(handler));
}
