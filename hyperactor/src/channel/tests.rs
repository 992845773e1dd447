//! Tests of the channel module across all three transports.
//!
//! Every async test runs under [`within`] (a `tokio::time::timeout`), and
//! most loop over [`TRANSPORTS`]. Nothing synchronises by sleeping.

use crate::sync::Mutex;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;

use super::*;

const TRANSPORTS: [ChannelTransport; 3] = [
    ChannelTransport::Local,
    ChannelTransport::Unix,
    ChannelTransport::Tcp,
];

async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("test timed out")
}

/// A `ReturnFn` that records the numbers of returned frames.
fn recorder() -> (ReturnFn, Arc<Mutex<Vec<u64>>>) {
    let returned = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&returned);
    let on_return: ReturnFn = Arc::new(move |frame: Frame, _err: &ChannelError| {
        sink.lock().push(number(&frame));
    });
    (on_return, returned)
}

fn numbered(n: u64, parts: Vec<Bytes>) -> Frame {
    Frame::new(Bytes::copy_from_slice(&n.to_le_bytes()), parts)
}

fn number(frame: &Frame) -> u64 {
    u64::from_le_bytes(frame.header[..8].try_into().unwrap())
}

async fn serve_any(transport: ChannelTransport) -> ChannelRx {
    serve(&ChannelAddr::any(transport)).await.unwrap()
}

#[test]
fn addr_display_parse_round_trip() {
    for s in [
        "local:7",
        "local:0",
        "unix:/tmp/x.sock",
        "tcp:127.0.0.1:4000",
        "tcp:[::1]:4000",
        "tcp:[fe80::1]:1",
    ] {
        let addr: ChannelAddr = s.parse().unwrap();
        assert_eq!(addr.to_string(), s);
        assert_eq!(addr.to_string().parse::<ChannelAddr>().unwrap(), addr);
    }
    assert_eq!(
        "tcp:[::1]:4000".parse::<ChannelAddr>().unwrap().transport(),
        ChannelTransport::Tcp
    );
    for transport in TRANSPORTS {
        let any = ChannelAddr::any(transport);
        assert_eq!(any.transport(), transport);
        assert_eq!(any.to_string().parse::<ChannelAddr>().unwrap(), any);
        assert_eq!(
            transport.to_string().parse::<ChannelTransport>().unwrap(),
            transport
        );
    }
}

#[test]
fn addr_rejects_bad_strings() {
    for s in [
        "",
        "local",
        "local:",
        "local:-1",
        "local:x",
        "local: 7",
        "unix:",
        "tcp:",
        "tcp:127.0.0.1",
        "tcp:::1:4000",
        "tcp:host:80",
        "udp:127.0.0.1:4000",
        "127.0.0.1:4000",
    ] {
        let err = s.parse::<ChannelAddr>().unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ChannelError::InvalidAddr { .. }),
            "{s}: {msg}"
        );
        assert!(msg.contains("expected"), "{msg}");
        assert!(msg.contains(&format!("{s:?}")), "{msg}");
    }
    assert!("udp".parse::<ChannelTransport>().is_err());
}

#[test]
fn addr_serde_round_trip() {
    for s in [
        "local:42",
        "unix:/tmp/a b.sock",
        "tcp:10.0.0.1:80",
        "tcp:[::1]:4000",
    ] {
        let addr: ChannelAddr = s.parse().unwrap();
        // Binary formats use the compact form...
        let bytes = bincode::serialize(&addr).unwrap();
        assert_eq!(bincode::deserialize::<ChannelAddr>(&bytes).unwrap(), addr);
        // ...human-readable ones the printable form.
        let json = serde_json::to_string(&addr).unwrap();
        assert_eq!(json, format!("{s:?}"));
        assert_eq!(serde_json::from_str::<ChannelAddr>(&json).unwrap(), addr);
    }
    assert!(serde_json::from_str::<ChannelAddr>("\"nope:1\"").is_err());
}

#[tokio::test]
async fn serve_binds_fresh_endpoints() {
    within(async {
        let local = serve_any(ChannelTransport::Local).await;
        assert!(matches!(local.addr(), ChannelAddr::Local(id) if *id != 0));
        let tcp = serve_any(ChannelTransport::Tcp).await;
        assert!(matches!(tcp.addr(), ChannelAddr::Tcp(a) if a.port() != 0));
        let unix = serve_any(ChannelTransport::Unix).await;
        let ChannelAddr::Unix(path) = unix.addr().clone() else {
            panic!("not unix: {unix:?}")
        };
        assert!(path.exists());
        // Serving a live address again is refused.
        for rx in [&local, &unix] {
            let err = serve(rx.addr()).await.unwrap_err();
            assert!(matches!(err, ChannelError::AddrInUse { .. }), "{err}");
        }
        drop(unix);
        assert!(!path.exists(), "socket file not removed on drop");
    })
    .await;
}

#[tokio::test]
async fn stale_unix_socket_is_replaced() {
    within(async {
        let addr = ChannelAddr::any(ChannelTransport::Unix);
        let ChannelAddr::Unix(path) = &addr else {
            unreachable!()
        };
        // A socket file nobody listens on.
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
        assert!(path.exists());
        let mut rx = serve(&addr).await.unwrap();
        let (on_return, _) = recorder();
        let tx = dial(&addr, on_return);
        tx.send(numbered(1, vec![])).await.unwrap();
        assert_eq!(number(&rx.recv().await.unwrap()), 1);
    })
    .await;
}

#[tokio::test]
async fn send_recv_keeps_frames_intact_and_ordered() {
    within(async {
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, _) = recorder();
            let tx = dial(rx.addr(), on_return);
            assert_eq!(tx.addr(), rx.addr());
            let frames: Vec<Frame> = (0..5u64)
                .map(|i| {
                    let parts = (0..i)
                        .map(|p| Bytes::from(vec![p as u8; (p * 1000 + 1) as usize]))
                        .collect();
                    numbered(i, parts)
                })
                .collect();
            for frame in &frames[..3] {
                tx.send(frame.clone()).await.unwrap();
            }
            for frame in &frames[3..] {
                tx.post(frame.clone()).unwrap();
            }
            // An empty frame is carried too.
            tx.send(Frame::default()).await.unwrap();
            for frame in &frames {
                assert_eq!(&rx.recv().await.unwrap(), frame, "{transport}");
            }
            assert!(rx.recv().await.unwrap().is_empty());
            assert!(tx.error().is_none());
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frame_arrives_intact() {
    within(async {
        let len = 64 << 20;
        let data: Vec<u8> = (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let part = Bytes::from(data);
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, _) = recorder();
            let tx = dial(rx.addr(), on_return);
            tx.send(numbered(9, vec![part.clone()])).await.unwrap();
            let frame = rx.recv().await.unwrap();
            assert_eq!(number(&frame), 9);
            assert_eq!(frame.parts.len(), 1);
            assert_eq!(frame.parts[0].len(), len);
            assert!(frame.parts[0] == part, "{transport}: payload differs");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_link_is_fifo_under_concurrent_senders() {
    const SENDERS: u64 = 4;
    const FRAMES: u64 = 1000;
    within(async {
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            for s in 0..SENDERS {
                let (on_return, _) = recorder();
                let tx = dial(rx.addr(), on_return);
                tokio::spawn(async move {
                    for i in 0..FRAMES {
                        let body = Bytes::copy_from_slice(&s.to_le_bytes());
                        tx.send(numbered(i, vec![body])).await.unwrap();
                    }
                });
            }
            let mut next = vec![0u64; SENDERS as usize];
            for _ in 0..SENDERS * FRAMES {
                let frame = rx.recv().await.unwrap();
                let s = u64::from_le_bytes(frame.parts[0][..].try_into().unwrap()) as usize;
                assert_eq!(
                    number(&frame),
                    next[s],
                    "{transport}: sender {s} out of order"
                );
                next[s] += 1;
            }
            assert!(next.iter().all(|n| *n == FRAMES));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_waits_for_budget_until_receiver_drains() {
    const MIB: usize = 1 << 20;
    const TOTAL: u64 = 100;
    within(async {
        let part = Bytes::from(vec![7u8; MIB]);
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, _) = recorder();
            let tx = dial(rx.addr(), on_return);
            let mut accepted = 0u64;
            loop {
                let send = tx.send(numbered(accepted, vec![part.clone()]));
                match tokio::time::timeout(Duration::from_millis(200), send).await {
                    Ok(res) => res.unwrap(),
                    Err(_) => break, // pending: the budget is used up
                }
                accepted += 1;
                assert!(accepted <= (LINK_BUDGET_BYTES / MIB) as u64 + 1);
            }
            assert!(tx.outstanding_bytes() <= LINK_BUDGET_BYTES, "{transport}");
            assert!(
                accepted >= (LINK_BUDGET_BYTES / MIB / 2) as u64,
                "{transport}: {accepted}"
            );
            // Draining lets the sender finish.
            let sender = tokio::spawn({
                let tx = tx.clone();
                let part = part.clone();
                async move {
                    for i in accepted..TOTAL {
                        tx.send(numbered(i, vec![part.clone()])).await.unwrap();
                    }
                }
            });
            for i in 0..TOTAL {
                assert_eq!(number(&rx.recv().await.unwrap()), i, "{transport}");
            }
            sender.await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn dial_to_unserved_address_fails_and_returns_frames() {
    within(async {
        let local = serve_any(ChannelTransport::Local).await.addr().clone();
        let tcp = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            ChannelAddr::Tcp(listener.local_addr().unwrap())
        };
        for addr in [local, ChannelAddr::any(ChannelTransport::Unix), tcp] {
            let (on_return, returned) = recorder();
            let tx = dial(&addr, on_return);
            for i in 0..3 {
                tx.post(numbered(i, vec![])).unwrap();
            }
            let err = tx.closed().await;
            assert!(err.to_string().contains(&addr.to_string()), "{err}");
            assert!(tx.error().is_some());
            assert_eq!(*returned.lock(), vec![0, 1, 2], "{addr}");
            let failed = tx.send(numbered(3, vec![])).await.unwrap_err();
            assert_eq!(number(&failed.frame), 3);
            assert!(failed.to_string().contains(&addr.to_string()), "{failed}");
            let failed = tx.post(numbered(4, vec![])).unwrap_err();
            assert_eq!(number(&failed.frame), 4);
            assert_eq!(returned.lock().len(), 3);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_receiver_mid_stream_accounts_for_every_frame() {
    const TOTAL: u64 = 200;
    within(async {
        let part = Bytes::from(vec![1u8; 1 << 20]);
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, returned) = recorder();
            let tx = dial(rx.addr(), on_return);
            let sender = tokio::spawn({
                let tx = tx.clone();
                let part = part.clone();
                async move {
                    let mut failed = Vec::new();
                    for i in 0..TOTAL {
                        if let Err(err) = tx.send(numbered(i, vec![part.clone()])).await {
                            failed.push(number(&err.frame));
                        }
                    }
                    failed
                }
            });
            let mut received = Vec::new();
            for _ in 0..10 {
                received.push(number(&rx.recv().await.unwrap()));
            }
            drop(rx);
            let failed = sender.await.unwrap();
            let err = tx.closed().await;
            assert!(!failed.is_empty(), "{transport}: no send was refused");
            let returned = returned.lock().clone();
            let all: Vec<u64> = received
                .iter()
                .chain(&returned)
                .chain(&failed)
                .copied()
                .collect();
            let unique: BTreeSet<u64> = all.iter().copied().collect();
            assert_eq!(all.len(), unique.len(), "{transport}: duplicates ({err})");
            assert_eq!(
                unique,
                (0..TOTAL).collect(),
                "{transport}: frames lost ({err})"
            );
        }
    })
    .await;
}

/// A direct-delivery endpoint that forwards frame numbers to a queue.
async fn serve_direct(
    transport: ChannelTransport,
) -> (ChannelServer, tokio::sync::mpsc::UnboundedReceiver<u64>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let deliver: DeliverFn = Arc::new(move |frame: Frame| {
        let _ = tx.send(number(&frame));
    });
    let server = serve_with(&ChannelAddr::any(transport), deliver)
        .await
        .unwrap();
    (server, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_delivery_keeps_each_link_in_order() {
    within(async {
        for transport in TRANSPORTS {
            let (server, mut delivered) = serve_direct(transport).await;
            let (on_return, returned) = recorder();
            let tx = dial(server.addr(), on_return);
            for i in 0..1000 {
                tx.send(numbered(i, vec![Bytes::from_static(b"x")]))
                    .await
                    .unwrap();
            }
            for i in 0..1000 {
                assert_eq!(delivered.recv().await, Some(i), "{transport}");
            }
            assert!(returned.lock().is_empty(), "{transport}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_direct_server_accounts_for_every_frame() {
    const TOTAL: u64 = 2000;
    within(async {
        for transport in TRANSPORTS {
            let (server, mut delivered) = serve_direct(transport).await;
            let (on_return, returned) = recorder();
            let tx = dial(server.addr(), on_return);
            for i in 0..TOTAL {
                tx.post(numbered(i, vec![])).unwrap();
            }
            // Stop the server once some frames got through.
            let first = delivered.recv().await.unwrap();
            drop(server);
            let err = tx.closed().await;
            let mut all = vec![first];
            while let Ok(n) = delivered.try_recv() {
                all.push(n);
            }
            all.extend(returned.lock().iter().copied());
            let unique: BTreeSet<u64> = all.iter().copied().collect();
            assert_eq!(all.len(), unique.len(), "{transport}: duplicates ({err})");
            assert_eq!(
                unique,
                (0..TOTAL).collect(),
                "{transport}: frames lost ({err})"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn idle_sender_notices_receiver_drop() {
    within(async {
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, returned) = recorder();
            let tx = dial(rx.addr(), on_return);
            tx.send(numbered(1, vec![])).await.unwrap();
            assert_eq!(number(&rx.recv().await.unwrap()), 1);
            drop(rx);
            let err = tx.closed().await;
            assert!(
                matches!(err, ChannelError::Closed { .. }),
                "{transport}: {err}"
            );
            assert!(
                returned.lock().is_empty(),
                "{transport}: delivered frame returned"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn dropped_sender_still_delivers_queued_frames() {
    within(async {
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, returned) = recorder();
            let tx = dial(rx.addr(), on_return);
            for i in 0..500 {
                tx.post(numbered(i, vec![Bytes::from_static(b"payload")]))
                    .unwrap();
            }
            drop(tx);
            for i in 0..500 {
                assert_eq!(number(&rx.recv().await.unwrap()), i, "{transport}");
            }
            assert!(returned.lock().is_empty(), "{transport}");
        }
    })
    .await;
}

#[tokio::test]
async fn separate_dials_are_separate_links() {
    within(async {
        for transport in TRANSPORTS {
            let mut rx = serve_any(transport).await;
            let (on_return, _) = recorder();
            let a = dial(rx.addr(), Arc::clone(&on_return));
            let b = dial(rx.addr(), on_return);
            a.send(numbered(1, vec![])).await.unwrap();
            b.send(numbered(2, vec![])).await.unwrap();
            let got: BTreeSet<u64> = [rx.recv().await.unwrap(), rx.recv().await.unwrap()]
                .iter()
                .map(number)
                .collect();
            assert_eq!(got, BTreeSet::from([1, 2]));
            // Dropping one sender does not affect the other.
            drop(a);
            b.send(numbered(3, vec![])).await.unwrap();
            assert_eq!(number(&rx.recv().await.unwrap()), 3);
            assert!(b.error().is_none());
        }
    })
    .await;
}

#[tokio::test]
async fn oversized_frames_are_handed_back() {
    within(async {
        let rx = serve_any(ChannelTransport::Local).await;
        let (on_return, _) = recorder();
        let tx = dial(rx.addr(), on_return);
        let frame = Frame::new(Bytes::new(), vec![Bytes::new(); MAX_FRAME_PARTS + 1]);
        let err = tx.send(frame.clone()).await.unwrap_err();
        assert_eq!(err.frame, frame);
        assert!(matches!(err.error, ChannelError::Frame { .. }), "{err}");
        assert!(tx.post(frame).is_err());
        assert!(tx.error().is_none(), "a bad frame must not fail the link");
    })
    .await;
}

#[test]
fn dial_outside_a_runtime_fails_the_link() {
    let (on_return, returned) = recorder();
    let tx = dial(&"local:1".parse().unwrap(), on_return);
    assert!(matches!(tx.error(), Some(ChannelError::NoRuntime { .. })));
    assert_eq!(number(&tx.post(numbered(5, vec![])).unwrap_err().frame), 5);
    assert!(returned.lock().is_empty());
}

/// A direct-delivery endpoint on the listening socket inherited as `fd`.
async fn serve_inherited(
    fd: i32,
) -> Result<(ChannelServer, tokio::sync::mpsc::UnboundedReceiver<u64>), ChannelError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let deliver: DeliverFn = Arc::new(move |frame: Frame| {
        let _ = tx.send(number(&frame));
    });
    let server = serve_listen_with(&Listen::InheritedFd(fd), deliver).await?;
    Ok((server, rx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_listening_socket_is_served_at_its_own_port() {
    use std::os::fd::IntoRawFd;
    within(async {
        // As a parent would: bound to port 0 and listening, passed as a descriptor.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let bound = listener.local_addr().unwrap();
        let fd = listener.into_raw_fd();
        let (server, mut delivered) = serve_inherited(fd).await.unwrap();
        assert_eq!(server.addr(), &ChannelAddr::Tcp(bound));
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "children must not inherit it");
        let (on_return, returned) = recorder();
        let tx = dial(server.addr(), on_return);
        tx.send(numbered(7, Vec::new())).await.unwrap();
        assert_eq!(delivered.recv().await, Some(7));
        assert!(returned.lock().is_empty());
        // The endpoint owns it now: a second adoption would close it twice.
        let err = serve_inherited(fd).await.unwrap_err().to_string();
        assert!(
            err.contains(&format!("file descriptor {fd}")) && err.contains("already"),
            "{err}"
        );
        drop(server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_descriptor_that_is_not_a_listening_tcp_socket_is_refused_naming_it() {
    use std::os::fd::AsRawFd;
    within(async {
        let file = std::fs::File::open("/dev/null").unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let dir = tempfile_dir();
        let unix = std::os::unix::net::UnixListener::bind(dir.join("s.sock")).unwrap();
        for (fd, problem) in [
            (999_999, "not open"),
            (file.as_raw_fd(), "not a socket"),
            (udp.as_raw_fd(), "not a stream (TCP) socket"),
            (stream.as_raw_fd(), "not listening"),
            (unix.as_raw_fd(), "not a TCP socket (a Unix socket)"),
        ] {
            let err = serve_inherited(fd).await.unwrap_err().to_string();
            assert!(
                err.contains(&format!("the inherited file descriptor {fd}: "))
                    && err.contains(problem)
                    && err.contains("pass_fds"),
                "{problem}: {err}"
            );
        }
        // The reason is typed, for callers that match on it.
        let err = serve_inherited(stream.as_raw_fd()).await.unwrap_err();
        assert!(
            matches!(
                err,
                ChannelError::InheritedFd {
                    problem: InheritedFdError::NotListening,
                    ..
                }
            ),
            "{err:?}"
        );
        // Refused descriptors stay open, owned by the caller.
        // SAFETY: F_GETFD only reads the descriptor's flags.
        assert!(unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_GETFD) } >= 0);
        drop(unix);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// A fresh private directory under the system's temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hyperactor-fd-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir(&dir).unwrap();
    dir
}
