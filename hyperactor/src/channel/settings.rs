//! Process-wide settings of the channel layer, set once at start by the process's
//! configuration (Monarch's `message_delivery_timeout`, `channel_tcp_keepalive_idle` and
//! `channel_tcp_congestion` keys).
//!
//! - [`delivery_timeout`]: a link whose oldest unacknowledged frame waited this long,
//!   with nothing acknowledged nor written in the meantime, fails with
//!   [`ChannelError::DeliveryTimeout`](super::ChannelError::DeliveryTimeout), returning
//!   its frames; connecting may take at most this long. Unset: no limit.
//! - [`tcp_keepalive_idle`]: TCP keepalive on every TCP connection a link makes or a
//!   server accepts (first probe after this idle time, then [`KEEPALIVE_INTERVAL`]
//!   apart, [`KEEPALIVE_PROBES`] in all). Unset: the kernel's default (usually off).
//! - [`tcp_congestion`]: the congestion control algorithm of those connections. Unset:
//!   the kernel's default. A name the kernel refuses is logged once, and the
//!   connection keeps the default.
//!
//! Each applies to links started (connections made) after it is set.
//!
//! ```
//! use std::time::Duration;
//! use hyperactor::channel::{delivery_timeout, set_delivery_timeout};
//! set_delivery_timeout(Some(Duration::from_secs(30)));
//! assert_eq!(delivery_timeout(), Some(Duration::from_secs(30)));
//! # set_delivery_timeout(None);
//! ```

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::sync::StaticMutex;

/// The time between keepalive probes after the first one.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How many unanswered keepalive probes end a connection.
pub const KEEPALIVE_PROBES: u32 = 3;

/// [`delivery_timeout`] in nanoseconds; `u64::MAX`: none.
static DELIVERY_TIMEOUT_NS: AtomicU64 = AtomicU64::new(u64::MAX);
/// [`tcp_keepalive_idle`] in nanoseconds; `u64::MAX`: none.
static KEEPALIVE_IDLE_NS: AtomicU64 = AtomicU64::new(u64::MAX);
/// [`tcp_congestion`].
static CONGESTION: StaticMutex<Option<String>> = StaticMutex::new(None);
/// Whether the refusal of the congestion algorithm was logged already.
static CONGESTION_REFUSED: AtomicBool = AtomicBool::new(false);

fn store(cell: &AtomicU64, value: Option<Duration>) {
    let ns = value.map_or(u64::MAX, |d| {
        u64::try_from(d.as_nanos())
            .unwrap_or(u64::MAX - 1)
            .min(u64::MAX - 1)
    });
    cell.store(ns, Ordering::Relaxed);
}

fn load(cell: &AtomicU64) -> Option<Duration> {
    match cell.load(Ordering::Relaxed) {
        u64::MAX => None,
        ns => Some(Duration::from_nanos(ns)),
    }
}

/// Sets [`delivery_timeout`] for links started from now on (`None`: no limit).
pub fn set_delivery_timeout(timeout: Option<Duration>) {
    store(&DELIVERY_TIMEOUT_NS, timeout);
}

/// How long a frame may stay unacknowledged, with no progress on its link, before the
/// link fails and returns its frames; also the longest a link may take to connect.
/// `None` (the default): no limit.
pub fn delivery_timeout() -> Option<Duration> {
    load(&DELIVERY_TIMEOUT_NS)
}

/// Sets [`tcp_keepalive_idle`] for TCP connections made from now on (`None`: the
/// kernel's default).
pub fn set_tcp_keepalive_idle(idle: Option<Duration>) {
    store(&KEEPALIVE_IDLE_NS, idle);
}

/// The idle time before the first TCP keepalive probe of a channel connection;
/// `None` (the default): keepalive as the kernel sets it.
pub fn tcp_keepalive_idle() -> Option<Duration> {
    load(&KEEPALIVE_IDLE_NS)
}

/// Sets [`tcp_congestion`] for TCP connections made from now on (`None` or an empty
/// name: the kernel's default).
pub fn set_tcp_congestion(name: Option<&str>) {
    *CONGESTION.lock() = name.filter(|n| !n.is_empty()).map(str::to_string);
}

/// The TCP congestion control algorithm of channel connections (`None`, the default:
/// the kernel's).
pub fn tcp_congestion() -> Option<String> {
    CONGESTION.lock().clone()
}

fn set_int(fd: i32, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` lives for the call and its size is passed; setsockopt reads at most
    // that many bytes and fails on a descriptor that is not a socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Applies the keepalive and congestion settings to the TCP connection `socket`. Best
/// effort: an option the kernel refuses is logged (the congestion algorithm once per
/// process) and the connection keeps its default.
pub(crate) fn tune_tcp(socket: &impl AsRawFd) {
    let fd = socket.as_raw_fd();
    if let Some(idle) = tcp_keepalive_idle() {
        let secs =
            |d: Duration| libc::c_int::try_from(d.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
        let probes = libc::c_int::try_from(KEEPALIVE_PROBES).unwrap_or(libc::c_int::MAX);
        let set = set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
            .and_then(|()| set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(idle)))
            .and_then(|()| {
                set_int(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_KEEPINTVL,
                    secs(KEEPALIVE_INTERVAL),
                )
            })
            .and_then(|()| set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes));
        if let Err(err) = set {
            tracing::debug!(%err, "could not set TCP keepalive on a channel connection");
        }
    }
    if let Some(name) = tcp_congestion() {
        // SAFETY: `name` lives for the call and its length is passed; setsockopt reads at
        // most that many bytes.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_ptr().cast(),
                name.len() as libc::socklen_t,
            )
        };
        if rc != 0 && !CONGESTION_REFUSED.swap(true, Ordering::Relaxed) {
            let err = io::Error::last_os_error();
            tracing::warn!(
                "the kernel refused the TCP congestion control algorithm {name:?} \
                 (channel_tcp_congestion, HYPERACTOR_CHANNEL_TCP_CONGESTION): {err}; channel \
                 connections keep the kernel's default. See \
                 /proc/sys/net/ipv4/tcp_available_congestion_control for the algorithms it has"
            );
        }
    }
}

/// Reads back an integer option of `socket` (for tests).
#[cfg(test)]
pub(crate) fn get_int(
    socket: &impl AsRawFd,
    level: libc::c_int,
    option: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
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

/// Reads back the congestion control algorithm of `socket` (for tests).
#[cfg(test)]
pub(crate) fn get_congestion(socket: &impl AsRawFd) -> io::Result<String> {
    let mut buf = [0u8; 32];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let text = &buf[..len as usize];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    Ok(String::from_utf8_lossy(&text[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::{
        dial_link, serve, ChannelAddr, ChannelError, ChannelTransport, Frame, ReturnFn,
    };
    use super::*;
    use crate::sync::Mutex;

    async fn within<F: std::future::Future>(fut: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("test timed out")
    }

    /// A `ReturnFn` that records the errors frames were returned with.
    fn recorder() -> (ReturnFn, Arc<Mutex<Vec<String>>>) {
        let returned = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&returned);
        let on_return: ReturnFn = Arc::new(move |_frame: Frame, err: &ChannelError| {
            sink.lock().push(err.to_string());
        });
        (on_return, returned)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_that_takes_nothing_gets_its_frames_returned_after_the_timeout() {
        let limit = Duration::from_millis(200);
        for transport in [
            ChannelTransport::Local,
            ChannelTransport::Unix,
            ChannelTransport::Tcp,
        ] {
            // Served, but `recv` is never called: nothing is acknowledged.
            let rx = serve(&ChannelAddr::any(transport)).await.unwrap();
            let (on_return, returned) = recorder();
            let tx = dial_link(rx.addr(), on_return, None, Some(limit));
            let start = Instant::now();
            for i in 0..3u8 {
                tx.post(Frame::new(Bytes::from(vec![i]), vec![])).unwrap();
            }
            let error = within(tx.closed()).await;
            assert!(
                matches!(error, ChannelError::DeliveryTimeout { timeout, .. } if timeout == limit),
                "{transport}: {error}"
            );
            assert!(start.elapsed() >= limit, "{transport}");
            let message = error.to_string();
            assert!(message.contains(&rx.addr().to_string()), "{message}");
            assert!(
                message.contains("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT"),
                "{message}"
            );
            // Every frame came back, once, with that error; later sends fail.
            assert_eq!(returned.lock().len(), 3, "{transport}");
            assert!(returned.lock().iter().all(|e| *e == message));
            assert!(tx.post(Frame::default()).is_err());
            drop(rx);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_goes_silent_fails_the_link_and_without_a_timeout_it_waits() {
        let dir = std::env::temp_dir().join(format!("hyperactor-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("silent.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let addr = ChannelAddr::Unix(path.clone());
        let held = Arc::new(Mutex::new(Vec::new()));
        let holder = Arc::clone(&held);
        let accept = tokio::spawn(async move {
            // Accepts and holds each connection, reading and acknowledging nothing.
            while let Ok((conn, _)) = listener.accept().await {
                holder.lock().push(conn);
            }
        });
        let (on_return, returned) = recorder();
        let tx = dial_link(&addr, on_return, None, Some(Duration::from_millis(200)));
        tx.post(Frame::new(Bytes::from_static(b"hello"), vec![]))
            .unwrap();
        let error = within(tx.closed()).await;
        assert!(
            matches!(error, ChannelError::DeliveryTimeout { .. }),
            "{error}"
        );
        assert_eq!(returned.lock().len(), 1);
        // Without a delivery timeout the frame stays unacknowledged.
        let (on_return, returned) = recorder();
        let waiting = dial_link(&addr, on_return, None, None);
        waiting
            .post(Frame::new(Bytes::from_static(b"hello"), vec![]))
            .unwrap();
        let still_open = tokio::time::timeout(Duration::from_millis(600), waiting.closed()).await;
        assert!(
            still_open.is_err(),
            "the link failed without a delivery timeout"
        );
        assert!(returned.lock().is_empty());
        accept.abort();
        drop(waiting);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_transfer_that_keeps_moving_is_not_cut() {
        const SIZE: usize = 8 << 20;
        let limit = Duration::from_millis(150);
        let dir = std::env::temp_dir().join(format!("hyperactor-slow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slow.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Reads 128 KiB every 10 ms (the whole frame takes several timeouts), then
        // acknowledges the frame and closes.
        let peer = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 128 << 10];
            let mut total = 0;
            while total < SIZE {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the link closed mid-frame");
                total += n;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The rest of the frame's header, if any.
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(100), conn.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
            }
            conn.write_all(&1u64.to_le_bytes()).await.unwrap();
            conn.shutdown().await.unwrap();
        });
        let (on_return, returned) = recorder();
        let tx = dial_link(&ChannelAddr::Unix(path), on_return, None, Some(limit));
        let start = Instant::now();
        tx.post(Frame::new(Bytes::new(), vec![Bytes::from(vec![7u8; SIZE])]))
            .unwrap();
        // The peer acknowledged the frame, then closed: the link ends as closed, with
        // nothing returned, long after the timeout.
        let error = within(tx.closed()).await;
        assert!(matches!(error, ChannelError::Closed { .. }), "{error}");
        assert!(start.elapsed() > 3 * limit, "{:?}", start.elapsed());
        assert!(returned.lock().is_empty(), "{:?}", returned.lock());
        within(peer).await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// One test for the process-wide TCP settings (tests run in parallel threads).
    #[tokio::test]
    async fn tcp_connections_get_the_keepalive_and_congestion_settings() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut serve = super::super::net::tcp::TcpServe::new(listener, None);
        set_tcp_keepalive_idle(Some(Duration::from_secs(7)));
        set_tcp_congestion(Some("reno"));
        let dialed = std::net::TcpStream::connect(addr).unwrap();
        use super::super::net::Listener;
        let accepted = serve.next_conn().await.unwrap();
        // An algorithm the kernel does not have leaves the connection's default.
        let before = get_congestion(&dialed).unwrap();
        set_tcp_congestion(Some("no-such-algorithm"));
        tune_tcp(&dialed);
        assert_eq!(get_congestion(&dialed).unwrap(), before);
        set_tcp_keepalive_idle(None);
        set_tcp_congestion(Some(""));
        assert_eq!(tcp_congestion(), None);
        assert_eq!(tcp_keepalive_idle(), None);
        let get = |level, option| get_int(&accepted, level, option).unwrap();
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 7);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 5);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 3);
        assert_eq!(get_congestion(&accepted).unwrap(), "reno");
    }

    #[test]
    fn durations_are_stored_and_read_back() {
        let cell = AtomicU64::new(u64::MAX);
        assert_eq!(load(&cell), None);
        store(&cell, Some(Duration::from_millis(1500)));
        assert_eq!(load(&cell), Some(Duration::from_millis(1500)));
        store(&cell, Some(Duration::MAX));
        assert!(load(&cell).is_some());
        store(&cell, None);
        assert_eq!(load(&cell), None);
    }
}
