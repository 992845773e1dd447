//! The server over a live-like source: coalesced snapshots, the sampler, and TLS.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::future::FutureExt;
use hyperactor_mesh::monitor::{ActorRecord, ActorState, ProcRecord, ProcStatus};
use monarch_admin::AdminConfig;
use monarch_admin::AdminServer;
use monarch_admin::Event;
use monarch_admin::LogQuery;
use monarch_admin::LogRecord;
use monarch_admin::Snapshot;
use monarch_admin::Source;
use monarch_admin::SourceError;
use monarch_admin::StackDump;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

/// A source whose snapshot takes 50 ms and counts one more handled message each time.
struct Counting {
    collections: AtomicUsize,
    events: broadcast::Sender<Event>,
}

impl Source for Counting {
    fn snapshot(&self, _timeout: Duration) -> BoxFuture<'static, Result<Snapshot, SourceError>> {
        let n = self.collections.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut proc = ProcRecord::bare("p".into(), ProcStatus::Running);
            (proc.rss, proc.cpu_pct) = (10, 1.0);
            let mut actor = ActorRecord::bare("a".into(), "p".into(), ActorState::Idle);
            actor.handled = n as u64 * 10;
            Ok(Snapshot {
                time: 0.0,
                collected_ms: 50.0,
                bucket_bounds_us: Vec::new(),
                procs: vec![proc],
                actors: vec![actor],
                ..Snapshot::empty()
            })
        }
        .boxed()
    }
    fn events_since(&self, _since: u64, _limit: usize) -> Vec<Event> {
        Vec::new()
    }
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
    fn logs(&self, _q: &LogQuery) -> Vec<LogRecord> {
        Vec::new()
    }
    fn stack(
        &self,
        _proc: &str,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<StackDump, SourceError>> {
        futures::future::ready(Err(SourceError::Unavailable("no stacks here".to_string()))).boxed()
    }
    fn kill_proc(&self, _proc: &str) -> BoxFuture<'static, Result<(), SourceError>> {
        futures::future::ready(Ok(())).boxed()
    }
}

fn counting() -> Arc<Counting> {
    Arc::new(Counting {
        collections: AtomicUsize::new(0),
        events: broadcast::channel(16).0,
    })
}

#[tokio::test]
async fn concurrent_requests_share_one_collection() {
    let source = counting();
    let server = AdminServer::start(AdminConfig::default(), source.clone()).unwrap();
    let requests = (0..8).map(|_| common::get(&server, "/v1/snapshot"));
    let replies = futures::future::join_all(requests).await;
    assert!(replies.iter().all(|r| r.status == 200));
    // The sampler, woken by the first request, may share it or start one more.
    let n = source.collections.load(Ordering::SeqCst);
    assert!(n <= 2, "{n} collections for 8 concurrent requests");
    server.shutdown().await;
}

#[tokio::test]
async fn sampler_runs_while_watched() {
    let source = counting();
    let server = AdminServer::start(AdminConfig::default(), source.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        source.collections.load(Ordering::SeqCst),
        0,
        "sampled while nobody watched"
    );
    assert_eq!(
        common::get(&server, "/v1/series").await.json()["points"],
        json!([])
    );
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let series = common::get(&server, "/v1/series").await.json();
    let points = series["points"].as_array().unwrap();
    assert!(points.len() >= 2, "{series}");
    let last = &points[points.len() - 1];
    assert!(last["rate"].as_f64().unwrap() > 0.0, "{series}");
    assert_eq!(
        (last["rss"].as_u64(), last["procs_alive"].as_u64()),
        (Some(10), Some(1))
    );
    let summary = common::get(&server, "/v1/summary").await.json();
    assert_eq!(summary["health"], "ok");
    assert!(
        summary["messages"]["rate"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    assert_eq!(summary["pid"], std::process::id());
    let stack = common::get(&server, "/v1/stack?proc=p").await;
    assert_eq!(stack.status, 500);
    assert!(stack.body.contains("no stacks here"));
    server.shutdown().await;
}

#[tokio::test]
async fn serves_https_with_the_given_certificate() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!("monarch_admin_tls_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let config = AdminConfig {
        tls: Some((cert.clone(), key.clone())),
        ..AdminConfig::default()
    };
    let source = Arc::new(monarch_admin::RecordedSource::from_file(&common::fixture()).unwrap());
    let server = AdminServer::start(config, source).unwrap();
    assert!(server.url().starts_with("https://127.0.0.1:"));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let head = format!(
        "GET /?token={} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n",
        server.token(),
        server.local_addr().port()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify; what was read is enough.
    let _ = tls.read_to_end(&mut raw).await;
    let reply = common::parse(&raw);
    assert_eq!(reply.status, 303);
    assert!(reply.header("set-cookie").unwrap().ends_with("; Secure"));
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
