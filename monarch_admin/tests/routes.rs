//! Each route's shape over the recorded job, and the security checks.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::get;
use common::request;
use common::start;
use monarch_admin::AdminConfig;
use serde_json::Value;

#[tokio::test]
async fn summary_is_computed_from_the_snapshot() {
    let (server, _) = start(AdminConfig::default());
    let reply = get(&server, "/v1/summary").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let s = reply.json();
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixture()).unwrap()).unwrap();
    assert_eq!(s["version"], 1);
    assert_eq!(s["health"], "degraded");
    assert_eq!(s["counts"], recorded["summary"]["counts"]);
    assert_eq!(s["messages"], recorded["summary"]["messages"]);
    for key in ["session", "program", "pid", "started_at", "now"] {
        assert_eq!(s[key], recorded["summary"][key], "{key}");
    }
}

#[tokio::test]
async fn snapshot_and_lists() {
    let (server, _) = start(AdminConfig::default());
    let snap = get(&server, "/v1/snapshot").await.json();
    for key in [
        "version",
        "time",
        "collected_ms",
        "bucket_bounds_us",
        "hosts",
        "procs",
        "meshes",
        "actors",
    ] {
        assert!(snap.get(key).is_some(), "snapshot lacks {key}");
    }
    for (route, n) in [("/v1/hosts", 2), ("/v1/procs", 4), ("/v1/meshes", 2)] {
        let v = get(&server, route).await.json();
        assert_eq!(v["version"], 1);
        assert_eq!(v["items"].as_array().unwrap().len(), n, "{route}");
    }
}

#[tokio::test]
async fn actors_filter_and_page() {
    let (server, _) = start(AdminConfig::default());
    let count = |v: &Value| {
        (
            v["total"].as_u64().unwrap(),
            v["items"].as_array().unwrap().len(),
        )
    };
    assert_eq!(count(&get(&server, "/v1/actors").await.json()), (4, 4));
    assert_eq!(
        count(&get(&server, "/v1/actors?system=1").await.json()),
        (8, 8)
    );
    assert_eq!(
        count(&get(&server, "/v1/actors?status=failed").await.json()),
        (1, 1)
    );
    assert_eq!(
        count(&get(&server, "/v1/actors?mesh=2").await.json()),
        (4, 4)
    );
    assert_eq!(
        count(&get(&server, "/v1/actors?mesh=nope").await.json()),
        (0, 0)
    );
    let page = get(&server, "/v1/actors?offset=1&limit=2").await.json();
    assert_eq!((count(&page), page["offset"].as_u64()), ((4, 2), Some(1)));
    let bad = get(&server, "/v1/actors?limit=x").await;
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"].as_str().unwrap().contains("limit"));
}

#[tokio::test]
async fn actor_detail_with_its_logs() {
    let (server, _) = start(AdminConfig::default());
    let id = "proc-00a1@unix:@/tmp/hyperactor-0/p4100/trainers[0]";
    let encoded = "proc-00a1%40unix%3A%40%2Ftmp%2Fhyperactor-0%2Fp4100%2Ftrainers%5B0%5D";
    let v = get(&server, &format!("/v1/actor?id={encoded}"))
        .await
        .json();
    assert_eq!(v["actor"]["id"], id);
    let logs = v["logs"].as_array().unwrap();
    assert!(!logs.is_empty());
    assert!(logs.iter().all(|l| l["proc"] == v["actor"]["proc"]));
    assert_eq!(get(&server, "/v1/actor?id=missing").await.status, 404);
    assert_eq!(get(&server, "/v1/actor").await.status, 400);
}

#[tokio::test]
async fn events_logs_series_stack() {
    let (server, _) = start(AdminConfig::default());
    let v = get(&server, "/v1/events?since=2").await.json();
    let seqs: Vec<u64> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!((seqs, v["next"].as_u64()), (vec![3, 4], Some(4)));
    let v = get(&server, "/v1/events?since=1&limit=1").await.json();
    assert_eq!(v["next"], 2);

    let v = get(&server, "/v1/logs?q=STEP+39").await.json();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["line"], "step 39 loss 0.0250");
    let v = get(&server, "/v1/logs?limit=3").await.json();
    assert_eq!(v["items"].as_array().unwrap().len(), 3);
    assert_eq!(v["items"][2]["line"], "step 39 loss 0.0250", "newest last");

    let v = get(&server, "/v1/series?window=10").await.json();
    assert_eq!(v["step_s"], 1.0);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 10);
    for key in [
        "t",
        "handled",
        "errors",
        "rate",
        "rss",
        "cpu_pct",
        "procs_alive",
        "actors_failed",
    ] {
        assert!(points[0].get(key).is_some(), "point lacks {key}");
    }
    assert_eq!(
        get(&server, "/v1/series").await.json()["points"]
            .as_array()
            .unwrap()
            .len(),
        120
    );

    let proc = "proc-00a1%40unix%3A%40%2Ftmp%2Fhyperactor-0%2Fp4100";
    let v = get(&server, &format!("/v1/stack?proc={proc}")).await.json();
    assert_eq!(
        (v["pid"].as_u64(), v["method"].as_str()),
        (Some(4100), Some("faulthandler"))
    );
    assert_eq!(get(&server, "/v1/stack?proc=nope").await.status, 404);
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let (server, _) = start(AdminConfig::default());
    let reply = get(&server, "/v1/nope").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["version"], 1);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("/v1/summary"));
    let auth = format!("Bearer {}", server.token());
    let reply = request(
        server.local_addr(),
        "POST",
        "/v1/summary",
        &[("Authorization", &auth)],
    )
    .await;
    assert_eq!(reply.status, 405);
}

#[tokio::test]
async fn static_files_have_types_and_headers() {
    let (server, _) = start(AdminConfig::default());
    for (path, ty) in [
        ("/", "text/html; charset=utf-8"),
        ("/static/app.js", "text/javascript; charset=utf-8"),
        ("/static/app.css", "text/css; charset=utf-8"),
    ] {
        let reply = get(&server, path).await;
        assert_eq!(reply.status, 200, "{path}");
        assert_eq!(reply.header("content-type"), Some(ty));
        assert_eq!(reply.header("cache-control"), Some("no-cache"));
        assert!(reply
            .header("content-security-policy")
            .unwrap()
            .starts_with("default-src 'self'"));
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    }
}

#[tokio::test]
async fn token_cookie_and_bearer() {
    let (server, _) = start(AdminConfig::default());
    let addr = server.local_addr();
    assert!(server.url().starts_with("http://127.0.0.1:"));
    assert!(server
        .url()
        .ends_with(&format!("/?token={}", server.token())));
    assert_eq!(server.token().len(), 64);

    let reply = request(addr, "GET", "/v1/summary", &[]).await;
    assert_eq!(reply.status, 401);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("dashboard_url"));
    let reply = request(addr, "GET", "/", &[]).await;
    assert_eq!(reply.status, 401);
    assert!(reply
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(reply.body.contains("JobState.dashboard_url"));

    let reply = request(addr, "GET", &format!("/?token={}", server.token()), &[]).await;
    assert_eq!(reply.status, 303);
    assert_eq!(reply.header("location"), Some("/"));
    let cookie = reply.header("set-cookie").unwrap();
    assert_eq!(
        cookie,
        format!(
            "monarch_admin={}; HttpOnly; SameSite=Strict; Path=/",
            server.token()
        )
    );
    let reply = request(
        addr,
        "GET",
        &format!("/v1/actors?system=1&token={}", server.token()),
        &[],
    )
    .await;
    assert_eq!(reply.header("location"), Some("/v1/actors?system=1"));
    assert_eq!(request(addr, "GET", "/?token=wrong", &[]).await.status, 401);

    let cookie = format!("other=1; monarch_admin={}", server.token());
    assert_eq!(
        request(addr, "GET", "/v1/summary", &[("Cookie", &cookie)])
            .await
            .status,
        200
    );
    assert_eq!(
        request(addr, "GET", "/", &[("Cookie", &cookie)])
            .await
            .status,
        200
    );
    assert_eq!(
        request(
            addr,
            "GET",
            "/v1/summary",
            &[("Cookie", "monarch_admin=bad")]
        )
        .await
        .status,
        401
    );
    assert_eq!(
        request(
            addr,
            "GET",
            "/v1/summary",
            &[("Authorization", "Bearer bad")]
        )
        .await
        .status,
        401
    );
    assert_eq!(get(&server, "/v1/summary").await.status, 200);
}

#[tokio::test]
async fn host_and_origin_checks() {
    let (server, _) = start(AdminConfig {
        allowed_hosts: vec!["dash.example".into()],
        ..AdminConfig::default()
    });
    let addr = server.local_addr();
    let port = addr.port();
    let auth = format!("Bearer {}", server.token());
    let with = |extra: Vec<(&'static str, String)>| {
        let auth = auth.clone();
        async move {
            let mut headers: Vec<(&str, &str)> = vec![("Authorization", auth.as_str())];
            headers.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            request(addr, "GET", "/v1/summary", &headers).await
        }
    };
    let reply = with(vec![("Host", "evil.example".into())]).await;
    assert_eq!(reply.status, 403);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("allowed_hosts"));
    assert_eq!(
        with(vec![("Host", format!("localhost:{port}"))])
            .await
            .status,
        200
    );
    assert_eq!(
        with(vec![("Host", format!("[::1]:{port}"))]).await.status,
        200
    );
    assert_eq!(
        with(vec![("Host", "dash.example".into())]).await.status,
        200
    );
    assert_eq!(
        with(vec![("Host", format!("dash.example:{port}"))])
            .await
            .status,
        200
    );
    assert_eq!(with(vec![("Host", "localhost:1".into())]).await.status, 403);
    assert_eq!(
        with(vec![("Origin", "http://evil.example".into())])
            .await
            .status,
        403
    );
    assert_eq!(with(vec![("Origin", "null".into())]).await.status, 403);
    assert_eq!(
        with(vec![("Origin", format!("http://127.0.0.1:{port}"))])
            .await
            .status,
        200
    );
    assert_eq!(
        with(vec![("Origin", format!("http://localhost:{port}"))])
            .await
            .status,
        200
    );
    // The refusals come before the token check: no token needed to be refused.
    assert_eq!(
        request(addr, "GET", "/", &[("Host", "evil.example")])
            .await
            .status,
        403
    );
}

#[tokio::test]
async fn kill_proc_needs_actions() {
    let proc = "proc-11a1%40unix%3A%40%2Ftmp%2Fhyperactor-0%2Fp4103";
    let target = format!("/v1/actions/kill_proc?proc={proc}");
    let (server, source) = start(AdminConfig::default());
    let auth = format!("Bearer {}", server.token());
    let reply = request(
        server.local_addr(),
        "POST",
        &target,
        &[("Authorization", &auth)],
    )
    .await;
    assert_eq!(reply.status, 403);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("read-only"));
    assert!(source.killed().is_empty());

    let (server, source) = start(AdminConfig {
        actions: true,
        ..AdminConfig::default()
    });
    let auth = format!("Bearer {}", server.token());
    let addr = server.local_addr();
    let reply = request(addr, "POST", &target, &[("Authorization", &auth)]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        source.killed(),
        vec!["proc-11a1@unix:@/tmp/hyperactor-0/p4103".to_string()]
    );
    assert_eq!(
        request(addr, "GET", &target, &[("Authorization", &auth)])
            .await
            .status,
        405
    );
    assert_eq!(request(addr, "POST", &target, &[]).await.status, 401);
    let cross = [
        ("Authorization", auth.as_str()),
        ("Origin", "http://evil.example"),
    ];
    assert_eq!(request(addr, "POST", &target, &cross).await.status, 403);
    let unknown = request(
        addr,
        "POST",
        "/v1/actions/kill_proc?proc=x",
        &[("Authorization", &auth)],
    )
    .await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test]
async fn bad_tls_files_say_which() {
    let source =
        std::sync::Arc::new(monarch_admin::RecordedSource::from_file(&common::fixture()).unwrap());
    let config = AdminConfig {
        tls: Some((
            "/nonexistent/cert.pem".into(),
            "/nonexistent/key.pem".into(),
        )),
        ..AdminConfig::default()
    };
    let err = monarch_admin::AdminServer::start(config, source)
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let source =
        std::sync::Arc::new(monarch_admin::RecordedSource::from_file(&common::fixture()).unwrap());
    let err = monarch_admin::AdminServer::start(AdminConfig::default(), source).unwrap_err();
    assert!(err.to_string().contains("start_on"), "{err}");
}

#[test]
fn bad_recording_names_the_problem() {
    let err = monarch_admin::RecordedSource::from_file("/nonexistent.json".as_ref()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent.json"));
    let err =
        monarch_admin::RecordedSource::from_value(serde_json::json!({"summary": {}})).unwrap_err();
    assert!(err.to_string().contains("snapshot"), "{err}");
    assert_eq!(
        err,
        monarch_admin::RecordError::MissingKey { key: "snapshot" }
    );
}
