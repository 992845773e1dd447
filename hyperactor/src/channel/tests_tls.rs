//! Tests of mutual TLS ([`auth::tls`]): links over TLS, and the peers it refuses.
//!
//! The CAs and node certificates are made here with rcgen. Nothing sets the process's
//! mode: servers and dials are given theirs ([`serve_tcp_with_auth`],
//! [`dial_with_auth`]), so these tests run beside the others. Every async test runs
//! under [`within`]; nothing synchronises by sleeping.

use crate::sync::Mutex;
use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::auth::{self, TcpAuth, TlsConfig, TlsError, TlsFiles};
use super::*;

async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("test timed out")
}

/// A certificate authority.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    cert: CertificateDer<'static>,
    cert_pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            params,
            key,
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
        }
    }

    /// A node's certificate and key, signed by this CA (valid for TLS servers and
    /// clients, for a name no peer dials: names are not checked).
    fn node(&self, name: &str) -> Node {
        let mut params = CertificateParams::new(vec![format!("{name}.invalid")]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        Node {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key,
        }
    }
}

/// A node's certificate and key.
struct Node {
    cert: CertificateDer<'static>,
    cert_pem: String,
    key: KeyPair,
}

impl Node {
    fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }

    /// The mode of a node that trusts `trusts`.
    fn auth(&self, trusts: &Ca) -> TcpAuth {
        let config = TlsConfig::new(
            vec![trusts.cert.clone()],
            vec![self.cert.clone()],
            self.key_der(),
        )
        .unwrap();
        TcpAuth::Tls(Arc::new(config))
    }

    /// A TLS server of this node (trusting `trusts`) accepting on one end of an
    /// in-memory stream: the other end, and the server's refusal reason, if any.
    fn accept_in_memory(
        &self,
        trusts: &Ca,
    ) -> (
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<Option<String>>,
    ) {
        let TcpAuth::Tls(server) = self.auth(trusts) else {
            unreachable!()
        };
        let (a, b) = tokio::io::duplex(64 << 10);
        let accepting = tokio::spawn(async move {
            auth::tls::accept(a, &server)
                .await
                .err()
                .map(|e| e.to_string())
        });
        (b, accepting)
    }
}

fn localhost() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
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

fn secret(text: &str) -> TcpAuth {
    TcpAuth::secret(text)
}

/// Frames of assorted sizes: empty, small parts, and a part larger than a TLS record
/// and the link's write buffer.
fn assorted() -> Vec<Frame> {
    let mut frames: Vec<Frame> = (0..5u64)
        .map(|i| {
            let parts = (0..i)
                .map(|p| Bytes::from(vec![p as u8; (p * 1000 + 1) as usize]))
                .collect();
            numbered(i, parts)
        })
        .collect();
    let large: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    frames.push(numbered(5, vec![Bytes::from(large)]));
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_round_trip_over_tls_both_ways() {
    within(async {
        let ca = Ca::new("cluster");
        let (a, b) = (ca.node("a"), ca.node("b"));
        let mut rx_a = serve_tcp_with_auth(localhost(), a.auth(&ca)).await.unwrap();
        let mut rx_b = serve_tcp_with_auth(localhost(), b.auth(&ca)).await.unwrap();
        let (on_return, returned) = recorder();
        let a_to_b = dial_with_auth(rx_b.addr(), Arc::clone(&on_return), Some(a.auth(&ca)));
        let b_to_a = dial_with_auth(rx_a.addr(), on_return, Some(b.auth(&ca)));
        for (tx, rx) in [(&a_to_b, &mut rx_b), (&b_to_a, &mut rx_a)] {
            let frames = assorted();
            for frame in &frames[..3] {
                tx.send(frame.clone()).await.unwrap();
            }
            for frame in &frames[3..] {
                tx.post(frame.clone()).unwrap();
            }
            tx.send(Frame::default()).await.unwrap();
            for frame in &frames {
                assert_eq!(&rx.recv().await.unwrap(), frame, "to {}", rx.addr());
            }
            assert!(rx.recv().await.unwrap().is_empty());
            assert!(tx.error().is_none(), "{:?}", tx.error());
        }
        assert!(returned.lock().is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_tls_receiver_mid_stream_accounts_for_every_frame() {
    const TOTAL: u64 = 100;
    within(async {
        let ca = Ca::new("cluster");
        let (a, b) = (ca.node("a"), ca.node("b"));
        let mut rx = serve_tcp_with_auth(localhost(), a.auth(&ca)).await.unwrap();
        let (on_return, returned) = recorder();
        let tx = dial_with_auth(rx.addr(), on_return, Some(b.auth(&ca)));
        let part = Bytes::from(vec![1u8; 1 << 20]);
        let sender = tokio::spawn({
            let tx = tx.clone();
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
        let returned = returned.lock().clone();
        let all: Vec<u64> = received
            .iter()
            .chain(&returned)
            .chain(&failed)
            .copied()
            .collect();
        let unique: BTreeSet<u64> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len(), "duplicates ({err})");
        assert_eq!(unique, (0..TOTAL).collect(), "frames lost ({err})");
    })
    .await;
}

#[tokio::test]
async fn an_idle_tls_sender_notices_the_receiver_drop() {
    within(async {
        let ca = Ca::new("cluster");
        let (a, b) = (ca.node("a"), ca.node("b"));
        let mut rx = serve_tcp_with_auth(localhost(), a.auth(&ca)).await.unwrap();
        let (on_return, returned) = recorder();
        let tx = dial_with_auth(rx.addr(), on_return, Some(b.auth(&ca)));
        tx.send(numbered(1, vec![])).await.unwrap();
        assert_eq!(number(&rx.recv().await.unwrap()), 1);
        drop(rx);
        let err = tx.closed().await;
        assert!(matches!(err, ChannelError::Closed { .. }), "{err}");
        assert!(returned.lock().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_dropped_tls_sender_still_delivers_its_queued_frames() {
    within(async {
        let ca = Ca::new("cluster");
        let (a, b) = (ca.node("a"), ca.node("b"));
        let mut rx = serve_tcp_with_auth(localhost(), a.auth(&ca)).await.unwrap();
        let (on_return, returned) = recorder();
        let tx = dial_with_auth(rx.addr(), on_return, Some(b.auth(&ca)));
        for i in 0..500 {
            tx.post(numbered(i, vec![Bytes::from_static(b"payload")]))
                .unwrap();
        }
        drop(tx);
        for i in 0..500 {
            assert_eq!(number(&rx.recv().await.unwrap()), i);
        }
        assert!(returned.lock().is_empty());
    })
    .await;
}

/// Dials `rx` with `auth`, sends three frames, and returns the link's error once the
/// link failed, after checking that every frame came back to the sender.
async fn refused(rx: &ChannelRx, auth: TcpAuth) -> String {
    let (on_return, returned) = recorder();
    let tx = dial_with_auth(rx.addr(), on_return, Some(auth));
    for i in 0..3 {
        tx.post(numbered(100 + i, vec![Bytes::from_static(b"payload")]))
            .unwrap();
    }
    let err = tx.closed().await;
    assert_eq!(*returned.lock(), [100, 101, 102], "{err}");
    err.to_string()
}

/// Checks that nothing the refused peers sent reached `rx`: a frame a member sends
/// now is the first it receives.
async fn nothing_was_decoded(rx: &mut ChannelRx, member: TcpAuth) {
    let (on_return, _) = recorder();
    let tx = dial_with_auth(rx.addr(), on_return, Some(member));
    tx.send(numbered(7, vec![])).await.unwrap();
    tokio::select! {
        frame = rx.recv() => assert_eq!(number(&frame.unwrap()), 7),
        err = tx.closed() => panic!("the member was refused too: {err}"),
    }
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused_by_the_server() {
    within(async {
        let (ca, other) = (Ca::new("cluster"), Ca::new("intruder"));
        let server = ca.node("server");
        let mut rx = serve_tcp_with_auth(localhost(), server.auth(&ca))
            .await
            .unwrap();
        // The intruder trusts the cluster's CA, so it accepts the server: only the
        // server's check of the client's certificate stops it.
        let err = refused(&rx, other.node("intruder").auth(&ca)).await;
        assert!(err.contains("TLS authentication failed"), "{err}");
        assert!(err.contains("refused this process's certificate"), "{err}");
        nothing_was_decoded(&mut rx, ca.node("member").auth(&ca)).await;
    })
    .await;
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused_by_the_client() {
    within(async {
        let (ca, other) = (Ca::new("cluster"), Ca::new("impostor"));
        // The impostor trusts the cluster's CA, so only the client's check of the
        // server's certificate stops the client.
        let mut rx = serve_tcp_with_auth(localhost(), other.node("impostor").auth(&ca))
            .await
            .unwrap();
        let err = refused(&rx, ca.node("client").auth(&ca)).await;
        assert!(err.contains("TLS authentication failed"), "{err}");
        assert!(err.contains("not signed by this process's CA"), "{err}");
        assert!(err.contains(&rx.addr().to_string()), "{err}");
        // A client that trusts the impostor's CA (with a certificate the impostor
        // accepts) talks to it.
        nothing_was_decoded(&mut rx, ca.node("member").auth(&other)).await;
    })
    .await;
}

#[tokio::test]
async fn the_server_logs_why_it_refused_a_certificate() {
    within(async {
        let (ca, other) = (Ca::new("cluster"), Ca::new("intruder"));
        let TcpAuth::Tls(client) = other.node("intruder").auth(&ca) else {
            unreachable!()
        };
        let (b, accepting) = ca.node("server").accept_in_memory(&ca);
        let err = auth::tls::connect(b, &client, IpAddr::V4(Ipv4Addr::LOCALHOST))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        let reason = accepting.await.unwrap().expect("the server accepted");
        assert!(
            reason.contains("not signed by this process's CA"),
            "{reason}"
        );
    })
    .await;
}

#[tokio::test]
async fn cluster_secret_and_tls_peers_fail_at_once_naming_both_modes() {
    within(async {
        let ca = Ca::new("cluster");
        let node = ca.node("node");
        // A cluster-secret client at a TLS server.
        let rx = serve_tcp_with_auth(localhost(), node.auth(&ca))
            .await
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), refused(&rx, secret("k")))
            .await
            .expect("did not fail at once");
        assert!(err.contains("authentication failed"), "{err}");
        assert!(err.contains("requires mutual TLS"), "{err}");
        // A TLS client at a cluster-secret server.
        let rx = serve_tcp_with_auth(localhost(), secret("k")).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), refused(&rx, node.auth(&ca)))
            .await
            .expect("did not fail at once");
        assert!(err.contains("TLS authentication failed"), "{err}");
        assert!(err.contains("requires a cluster secret"), "{err}");
        // What the TLS server logs about the cluster-secret client.
        let (mut b, accepting) = node.accept_in_memory(&ca);
        assert!(auth::connect(&mut b, &secret("k")).await.is_err());
        drop(b);
        let reason = accepting.await.unwrap().expect("the server accepted");
        assert!(
            reason.contains("did not complete the TLS handshake"),
            "{reason}"
        );
    })
    .await;
}

#[tokio::test]
async fn garbage_at_a_tls_server_is_refused_before_anything_is_decoded() {
    within(async {
        let ca = Ca::new("cluster");
        let (mut b, accepting) = ca.node("server").accept_in_memory(&ca);
        let mut hello = [0u8; 41];
        b.read_exact(&mut hello).await.unwrap();
        // A pickle, as an attacker would send to a worker port.
        let mut pickle =
            b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00cos\nsystem\n(S'id'\ntR.".to_vec();
        pickle.resize(128, b'.');
        b.write_all(&pickle).await.unwrap();
        let reason = accepting.await.unwrap().expect("the server accepted");
        assert!(reason.contains("TLS handshake failed"), "{reason}");
    })
    .await;
}

/// A directory for one test's files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("monarch-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn credentials_load_from_pem_files() {
    let dir = TempDir::new("load");
    let (ca, other) = (Ca::new("cluster"), Ca::new("other"));
    let node = ca.node("node");
    let ca_file = dir.write("ca.pem", &ca.cert_pem);
    let key_and_cert = format!("{}{}", node.key.serialize_pem(), node.cert_pem);
    let key_file = dir.write("node.pem", &key_and_cert);
    let files = TlsFiles {
        ca: ca_file.clone(),
        cert: None,
        key: key_file.clone(),
    };
    let config = TlsConfig::load(&files).unwrap();
    assert_eq!(config.files(), Some(&files));

    // The chain in a file of its own.
    let key_only = dir.write("key.pem", &node.key.serialize_pem());
    let cert_file = dir.write("cert.pem", &node.cert_pem);
    let split = TlsFiles {
        ca: ca_file.clone(),
        cert: Some(cert_file),
        key: key_only.clone(),
    };
    assert!(TlsConfig::load(&split).is_ok());

    let load_err = |files: TlsFiles| TlsConfig::load(&files).unwrap_err().to_string();
    // A key without its certificate.
    let err = load_err(TlsFiles {
        cert: None,
        key: key_only,
        ..files.clone()
    });
    assert!(
        err.contains("key.pem") && err.contains("holds no certificate"),
        "{err}"
    );
    // A file that is not there.
    let err = load_err(TlsFiles {
        ca: dir.0.join("missing.pem"),
        ..files.clone()
    });
    assert!(
        err.contains("missing.pem") && err.contains("cannot read"),
        "{err}"
    );
    // A certificate of another CA.
    let stranger = other.node("stranger");
    let stranger_file = dir.write(
        "stranger.pem",
        &format!("{}{}", stranger.key.serialize_pem(), stranger.cert_pem),
    );
    let err = TlsConfig::load(&TlsFiles {
        key: stranger_file,
        ..files.clone()
    })
    .unwrap_err();
    assert!(matches!(err, TlsError::Config { .. }), "{err}");
    assert!(
        err.to_string().contains("not accepted under the CA"),
        "{err}"
    );
    // A key that is not the certificate's.
    let mismatched = dir.write(
        "mismatched.pem",
        &format!("{}{}", stranger.key.serialize_pem(), node.cert_pem),
    );
    assert!(TlsConfig::load(&TlsFiles {
        key: mismatched,
        ..files
    })
    .is_err());
}

/// A gateway of `node` (trusting `trusts`) that keeps the links of the clients that
/// attach, and the client's frames it receives.
async fn tls_gateway(auth: TcpAuth) -> (ChannelServer, Arc<Mutex<Vec<ChannelTx>>>) {
    let links = Arc::new(Mutex::new(Vec::<ChannelTx>::new()));
    let keep = Arc::clone(&links);
    let handler = AttachHandler {
        accept: Arc::new(move |_uid: &str, link: ChannelTx| {
            keep.lock().push(link);
            Ok("tcp:10.0.0.1:26600".parse().unwrap())
        }),
        on_return: Arc::new(|_, _| {}),
    };
    let server = serve_gateway_tcp_with_auth(localhost(), Arc::new(|_| {}), handler, auth)
        .await
        .unwrap();
    (server, links)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_client_receives_frames_over_tls_from_its_gateway() {
    within(async {
        let ca = Ca::new("cluster");
        let (gw, client) = (ca.node("gateway"), ca.node("client"));
        let (server, links) = tls_gateway(gw.auth(&ca)).await;
        let (queue, mut received) = tokio::sync::mpsc::unbounded_channel();
        let deliver: DeliverFn = Arc::new(move |frame| {
            let _ = queue.send(frame);
        });
        let attachment = net::attach::attach_with_auth(
            server.addr(),
            "client-1",
            deliver,
            Some(client.auth(&ca)),
        )
        .await
        .unwrap();
        assert_eq!(attachment.advertised().to_string(), "tcp:10.0.0.1:26600");
        let link = links
            .lock()
            .pop()
            .expect("the gateway registered the client's link");
        let frames = assorted();
        for frame in &frames {
            link.send(frame.clone()).await.unwrap();
        }
        for frame in &frames {
            assert_eq!(&received.recv().await.unwrap(), frame);
        }
        // The client goes away: the gateway's link fails (ATT-3).
        drop(attachment);
        let error = link.closed().await;
        assert!(error.to_string().contains("127.0.0.1"), "{error}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_refuses_a_client_of_another_ca_or_secret_and_the_client_says_why() {
    within(async {
        let ca = Ca::new("cluster");
        let other = Ca::new("other");
        let (server, links) = tls_gateway(ca.node("gateway").auth(&ca)).await;
        let stranger = other.node("stranger").auth(&other);
        let err =
            net::attach::attach_with_auth(server.addr(), "c", Arc::new(|_| {}), Some(stranger))
                .await
                .unwrap_err();
        assert!(matches!(err, AttachError::Connect { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("TLS authentication failed"), "{text}");
        assert!(
            text.contains(&server.addr().to_string()),
            "names the gateway: {text}"
        );
        assert!(links.lock().is_empty(), "nothing attached");

        let (server, links) = tls_gateway(secret("right")).await;
        let err = net::attach::attach_with_auth(
            server.addr(),
            "c",
            Arc::new(|_| {}),
            Some(secret("wrong")),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("authentication failed"), "{text}");
        assert!(
            text.contains(&server.addr().to_string()),
            "names the gateway: {text}"
        );
        assert!(links.lock().is_empty(), "nothing attached");
    })
    .await;
}
