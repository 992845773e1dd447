//! The event stream, `/metrics`, and shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;
use std::time::Instant;

use common::get;
use common::start;
use std::collections::BTreeMap;

use hyperactor_mesh::monitor::{
    ActorRecord, ActorState, EndpointRecord, GpuRecord, HostRecord, HostStatus, MeshRecord,
    MeshStatus, ProcRecord, ProcStatus,
};
use monarch_admin::AdminConfig;
use monarch_admin::AdminServer;
use monarch_admin::Event;
use monarch_admin::Snapshot;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Opens the event stream, resuming after `last_id` if given.
async fn open_stream(server: &AdminServer, last_id: Option<u64>) -> TcpStream {
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let resume = last_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    let head = format!(
        "GET /v1/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n{resume}\r\n",
        server.local_addr().port(),
        server.token()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Reads until `text` holds `needle`; the text read so far.
async fn read_until(stream: &mut TcpStream, text: &mut String, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    while !text.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} within 5 s; got {text:?}"))
            .unwrap();
        assert!(n > 0, "stream ended before {needle:?}; got {text:?}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// The `data:` payloads of the SSE frames in `text`.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn sse_sends_backlog_then_new_events_and_resumes() {
    let (server, source) = start(AdminConfig::default());
    let mut stream = open_stream(&server, None).await;
    let mut text = String::new();
    read_until(&mut stream, &mut text, "id: 4\n").await;
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    assert!(text.contains("event: monarch\n"));
    let mut hit = Event::new("breakpoint", "hit");
    hit.time = 1.0;
    let seq = source.publish(hit);
    assert_eq!(seq, 5);
    read_until(&mut stream, &mut text, "id: 5\n").await;
    let seqs: Vec<u64> = events(&text)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);

    let mut resumed = open_stream(&server, Some(4)).await;
    let mut text = String::new();
    read_until(&mut resumed, &mut text, "id: 5\n").await;
    let seqs: Vec<u64> = events(&text)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![5], "resumes after Last-Event-ID");
}

#[tokio::test]
async fn shutdown_ends_streams_and_stops_accepting() {
    let (server, _) = start(AdminConfig::default());
    let addr = server.local_addr();
    let mut stream = open_stream(&server, None).await;
    let mut text = String::new();
    read_until(&mut stream, &mut text, "id: 4\n").await;
    let started = Instant::now();
    server.shutdown().await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("the stream did not end on shutdown")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

/// Checks the text format's line grammar: `# HELP`/`# TYPE` before each family's
/// samples, names and labels well-formed, values numbers; returns the families.
fn check_exposition(text: &str) -> Vec<(String, String)> {
    let mut families: Vec<(String, String)> = Vec::new();
    let mut helped = std::collections::HashSet::new();
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            assert!(name_ok(name) && !help.is_empty(), "{line}");
            helped.insert(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                !families.iter().any(|(n, _)| n == name),
                "family twice: {name}"
            );
            families.push((name.into(), kind.into()));
        } else {
            assert!(
                !line.starts_with('#') && !line.is_empty(),
                "stray line {line:?}"
            );
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(
                value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
                "{line}"
            );
            let name = series.split('{').next().unwrap();
            assert!(name_ok(name), "{line}");
            let (family, kind) = families
                .last()
                .unwrap_or_else(|| panic!("sample before TYPE: {line}"));
            let base = if kind == "histogram" {
                name.strip_suffix("_bucket")
                    .or(name.strip_suffix("_sum"))
                    .or(name.strip_suffix("_count"))
                    .unwrap_or(name)
            } else {
                name
            };
            assert_eq!(base, family, "sample outside its family: {line}");
            if let Some(labels) = series.strip_prefix(name) {
                if !labels.is_empty() {
                    check_labels(labels, line);
                }
            }
        }
    }
    families
}

fn check_labels(labels: &str, line: &str) {
    let inner = labels
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("{line}"));
    let mut chars = inner.chars().peekable();
    loop {
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        assert_eq!(
            (chars.next(), chars.next()),
            (Some('='), Some('"')),
            "{line}"
        );
        loop {
            match chars.next() {
                Some('\\') => assert!(
                    matches!(chars.next(), Some('\\' | '"' | 'n')),
                    "bad escape: {line}"
                ),
                Some('"') => break,
                Some('\n') | None => panic!("unterminated label value: {line}"),
                Some(_) => {}
            }
        }
        match chars.next() {
            None => break,
            Some(',') => {}
            Some(c) => panic!("unexpected {c:?} in {line}"),
        }
    }
}

#[tokio::test]
async fn metrics_parse_and_have_the_families() {
    let (server, _) = start(AdminConfig::default());
    let reply = get(&server, "/metrics").await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let families = check_exposition(&reply.body);
    let names: Vec<&str> = families.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "monarch_actor_messages_total",
        "monarch_actor_errors_total",
        "monarch_actor_busy_seconds_total",
        "monarch_actor_queue_depth",
        "monarch_endpoint_duration_seconds",
        "monarch_proc_up",
        "monarch_proc_resident_memory_bytes",
        "monarch_proc_cpu_seconds_total",
        "monarch_proc_threads",
        "monarch_proc_link_sent_bytes_total",
        "monarch_proc_link_received_bytes_total",
        "monarch_proc_log_lines_dropped_total",
        "monarch_host_load1",
        "monarch_host_memory_available_bytes",
        "monarch_host_heartbeat_age_seconds",
        "monarch_gpu_memory_used_bytes",
        "monarch_gpu_utilization_ratio",
        "monarch_events_total",
    ] {
        assert!(names.contains(&name), "missing family {name}");
    }
    let body = &reply.body;
    assert!(body.contains(r#"monarch_endpoint_duration_seconds_bucket{mesh="trainers",class="Trainer",endpoint="step",le="+Inf"} "#));
    assert!(body.contains(r#"le="0.000001""#) && body.contains(r#"le="16.777216""#));
    assert!(body.contains(r#"monarch_events_total{kind="actor_failed"} 1"#));
    assert!(body.contains(r#"monarch_proc_up{proc="proc-11a1@unix:@/tmp/hyperactor-0/p4103",host="host-1",mesh="trainer_procs",rank="3"} 0"#), "{body}");
}

/// A snapshot with `n` actors over `n / 8` procs, each with two endpoints.
fn big_snapshot(n: usize) -> Snapshot {
    let bounds: Vec<u64> = (0..25).map(|i| 1u64 << i).collect();
    let buckets: Vec<u64> = (0..26).map(|i| i as u64).collect();
    let endpoint = EndpointRecord {
        count: 325,
        errors: 0,
        total_ms: 10.0,
        buckets,
    };
    let actors: Vec<ActorRecord> = (0..n)
        .map(|i| ActorRecord {
            mesh: Some("2".into()),
            name: "trainers".into(),
            class: Some("Trainer".into()),
            rank: Some(i),
            handled: i as u64 * 10,
            busy_ms: 1.5,
            endpoints: BTreeMap::from([
                ("step".to_string(), endpoint.clone()),
                ("eval".to_string(), endpoint.clone()),
            ]),
            ..ActorRecord::bare(
                format!("proc-{}@tcp:10.0.0.1:26600/trainer\"s\\[{i}]", i / 8),
                format!("proc-{}", i / 8),
                ActorState::Idle,
            )
        })
        .collect();
    let procs: Vec<ProcRecord> = (0..n / 8)
        .map(|i| ProcRecord {
            host: Some("host-0".into()),
            pid: Some(i as u32),
            rss: 1,
            cpu_s: 1.0,
            threads: 1,
            link_sent: 1,
            link_received: 1,
            mesh: Some("p".into()),
            rank: Some(i),
            ..ProcRecord::bare(format!("proc-{i}"), ProcStatus::Running)
        })
        .collect();
    let mesh = MeshRecord {
        id: "2".into(),
        name: "trainers".into(),
        kind: "actor".into(),
        class: None,
        extent: BTreeMap::new(),
        proc_mesh: None,
        status: MeshStatus::Running,
        system: false,
        created: 0.0,
    };
    let host = HostRecord {
        load: [1.0, 0.0, 0.0],
        mem_available: 1,
        heartbeat_age_ms: Some(1.0),
        gpus: vec![GpuRecord {
            index: 0,
            name: String::new(),
            mem_total: 0,
            mem_used: 1,
            util_pct: 50.0,
            procs: Vec::new(),
        }],
        ..HostRecord::bare("host-0".into(), String::new(), HostStatus::Alive)
    };
    Snapshot {
        bucket_bounds_us: bounds,
        actors,
        procs,
        meshes: vec![mesh],
        hosts: vec![host],
        ..Snapshot::empty()
    }
}

/// 1,000 actors render into valid exposition text with every actor in it. How fast is
/// for benches/monitoring_bench.py (`/metrics` with 1,000 actors, release build, against
/// its 20 ms budget), not for a test: this one runs in the unoptimised test profile.
#[test]
fn metrics_render_1000_actors() {
    let snapshot = big_snapshot(1000);
    let events: Vec<Event> = (0..100)
        .map(|i| Event {
            seq: i,
            ..Event::new("mesh_spawned", "")
        })
        .collect();
    let text = monarch_admin::render_metrics(&snapshot, &events);
    check_exposition(&text);
    for i in [0, 1, 499, 998, 999] {
        let id = format!("trainer\\\"s\\\\[{i}]");
        assert!(
            text.contains(&id),
            "actor {i} ({id}) is missing from the render"
        );
    }
    println!("render_metrics, 1000 actors: {} bytes", text.len());
}
