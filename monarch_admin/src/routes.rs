//! The routes of spec section 1, behind the checks of section 2.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header;
use hyper::header::HeaderValue;
use hyper::Method;
use hyper::Request;
use hyper::Response;
use hyper::StatusCode;
use serde_json::json;
use serde_json::Value;
use tokio::sync::watch;

use crate::auth;
use crate::auth::HostCheck;
use crate::http::percent_decode;
use crate::http::Body;
use crate::metrics::render_metrics;
use crate::series::Series;
use crate::snapshot::SnapshotCache;
use crate::source::{JobInfo, Source, SourceError};
use crate::static_files;
use hyperactor_mesh::monitor::{
    ActorRecord, ActorState, HostStatus, LogQuery, MonitorError, ProcStatus, Snapshot,
};

/// How long a stack dump may take.
const STACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines of its proc shown with an actor.
const ACTOR_LOG_LINES: usize = 200;
/// The most items one page may hold.
const MAX_LIMIT: usize = 100_000;

/// Everything a request needs.
pub(crate) struct App {
    pub(crate) source: Arc<dyn Source>,
    pub(crate) token: String,
    pub(crate) hosts: HostCheck,
    pub(crate) actions: bool,
    pub(crate) secure: bool,
    pub(crate) cache: Arc<SnapshotCache>,
    pub(crate) series: Arc<Series>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) started_at: f64,
}

struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: &str) -> Params {
        Params(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A number parameter, or a 400 saying what was wrong.
    fn number<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, Response<Body>> {
        match self.get(key) {
            None | Some("") => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| {
                error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "the query parameter {key}={v:?} is not a valid number; expected a \
                         non-negative number; fix or leave out {key}"
                    ),
                )
            }),
        }
    }

    fn required(&self, key: &str, what: &str) -> Result<&str, Response<Body>> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "the query parameter {key} is missing; expected {what}; add \
                     ?{key}=<percent-encoded id>"
                ),
            )),
        }
    }
}

fn with_common_headers(mut response: Response<Body>, cache: &'static str) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    with_common_headers(response, "no-store")
}

/// A JSON response; `"version": 1` is added to objects.
pub(crate) fn json_response(status: StatusCode, mut value: Value) -> Response<Body> {
    if let Some(object) = value.as_object_mut() {
        object.insert("version".into(), json!(1));
    }
    respond(status, "application/json", value.to_string())
}

/// A JSON error response.
pub(crate) fn error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, json!({ "error": message }))
}

/// `record` as a JSON value (the one place typed records become JSON), or a 500 saying
/// it does not serialize (none of the API's records fails to).
fn to_json<T: serde::Serialize>(record: &T) -> Result<Value, Response<Body>> {
    serde_json::to_value(record).map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "cannot write a monitoring record as JSON: {e}; expected every record to \
                 serialize; report this as a bug"
            ),
        )
    })
}

/// A JSON response of `record` (with `"version": 1`), or a 500 if it does not serialize.
fn record_response<T: serde::Serialize>(record: &T) -> Answer {
    Ok(json_response(StatusCode::OK, to_json(record)?))
}

const UNAUTHORIZED: &str = "this request carries no valid access token; expected the \
    monarch_admin cookie or an `Authorization: Bearer TOKEN` header; open the dashboard URL \
    with ?token=... that the program printed when it started (it is also in \
    JobState.dashboard_url), or send the token as a bearer token";

fn unauthorized(page: bool) -> Response<Body> {
    if !page {
        return error(StatusCode::UNAUTHORIZED, UNAUTHORIZED);
    }
    let html = "<!doctype html><html><head><meta charset=\"utf-8\"><title>Monarch: \
        sign-in needed</title></head><body><h1>Sign-in needed</h1><p>This dashboard needs \
        its access token. Open the URL that ends in <code>?token=...</code>: the program \
        printed it when it started, and it is in <code>JobState.dashboard_url</code>.</p>\
        </body></html>";
    respond(StatusCode::UNAUTHORIZED, "text/html; charset=utf-8", html)
}

/// Answers one request.
pub(crate) async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(route(&app, request).await)
}

async fn route(app: &Arc<App>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let method = request.method().clone();
    let headers = request.headers();
    let page = static_files::lookup(&path).is_some_and(|(ty, _)| ty.starts_with("text/html"));

    if let Err(rejected) = app.hosts.check(headers) {
        return error(StatusCode::FORBIDDEN, &rejected.to_string());
    }
    // Browsers ask for an icon on their own; the page has none (a data: URL would break
    // the Content-Security-Policy), so the answer is an empty one, not an error.
    if path == "/favicon.ico" {
        return respond(StatusCode::NO_CONTENT, "image/x-icon", "");
    }
    if method == Method::GET {
        let (token, rest) = auth::take_token(&query);
        if let Some(token) = token {
            if !auth::constant_time_eq(token.as_bytes(), app.token.as_bytes()) {
                return unauthorized(page);
            }
            let location = if rest.is_empty() {
                path.clone()
            } else {
                format!("{path}?{rest}")
            };
            let secure = if app.secure { "; Secure" } else { "" };
            let cookie = format!(
                "{}={}; HttpOnly; SameSite=Strict; Path=/{secure}",
                auth::COOKIE_NAME,
                app.token
            );
            let mut response = respond(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
            if let (Ok(location), Ok(cookie)) = (
                HeaderValue::from_str(&location),
                HeaderValue::from_str(&cookie),
            ) {
                response.headers_mut().insert(header::LOCATION, location);
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            return response;
        }
    }
    if !auth::authorized(headers, &app.token) {
        return unauthorized(page);
    }

    if let Some((content_type, bytes)) = static_files::lookup(&path) {
        if method != Method::GET && method != Method::HEAD {
            return not_allowed(&method, &path, "GET");
        }
        let response = Response::builder()
            .header(header::CONTENT_TYPE, content_type)
            .body(full(Bytes::from_static(bytes)));
        return match response {
            Ok(r) => with_common_headers(r, "no-cache"),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot build the response: {e}"),
            ),
        };
    }

    let params = Params::parse(&query);
    if path.starts_with("/v1/") {
        app.series.touch();
    }
    if path == "/v1/actions/kill_proc" {
        if method != Method::POST {
            return not_allowed(&method, &path, "POST");
        }
        return kill_proc(app, &params).await;
    }
    if method != Method::GET && method != Method::HEAD {
        return not_allowed(&method, &path, "GET");
    }
    let result = match path.as_str() {
        "/v1/summary" => summary(app).await,
        "/v1/snapshot" => snapshot(app).await.and_then(|s| record_response(&*s)),
        "/v1/hosts" => list(app, |s| to_json(&s.hosts)).await,
        "/v1/procs" => list(app, |s| to_json(&s.procs)).await,
        "/v1/meshes" => list(app, |s| to_json(&s.meshes)).await,
        "/v1/actors" => actors(app, &params).await,
        "/v1/actor" => actor(app, &params).await,
        "/v1/events" => events(app, &params),
        "/v1/events/stream" => Ok(event_stream(app, request.headers(), &params)),
        "/v1/logs" => logs(app, &params),
        "/v1/series" => series(app, &params),
        "/v1/stack" => stack(app, &params).await,
        "/metrics" => metrics(app).await,
        _ => Err(error(
            StatusCode::NOT_FOUND,
            &format!(
                "no route {path}; expected one of /, /v1/summary, /v1/snapshot, /v1/hosts, \
                 /v1/procs, /v1/meshes, /v1/actors, /v1/actor, /v1/events, \
                 /v1/events/stream, /v1/logs, /v1/series, /v1/stack, /metrics; check the URL"
            ),
        )),
    };
    result.unwrap_or_else(|e| e)
}

fn not_allowed(method: &Method, path: &str, allowed: &'static str) -> Response<Body> {
    let mut response = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{method} is not allowed on {path}; expected {allowed}; send a {allowed} request"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    response
}

type Answer = Result<Response<Body>, Response<Body>>;

async fn snapshot(app: &App) -> Result<Arc<Snapshot>, Response<Body>> {
    app.cache.get().await.map_err(|(timed_out, message)| {
        let status = if timed_out {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        error(
            status,
            &format!(
                "cannot collect the job's snapshot: {message}; expected the runtime to answer \
                 within seconds; retry, and if it persists, look at the program's output"
            ),
        )
    })
}

/// The summary of a snapshot (spec section 1): counts, health and message totals.
pub(crate) fn summarize(
    snapshot: &Snapshot,
    describe: &JobInfo,
    rate: f64,
    started_at: f64,
) -> Value {
    let (hosts, procs) = (&snapshot.hosts, &snapshot.procs);
    let (meshes, actors) = (&snapshot.meshes, &snapshot.actors);
    let failed_actors = actors
        .iter()
        .filter(|a| a.status == ActorState::Failed)
        .count();
    let failed_procs = procs
        .iter()
        .filter(|p| matches!(p.status, ProcStatus::Failed | ProcStatus::Lost))
        .count();
    let alive = procs.iter().any(|p| p.status == ProcStatus::Running);
    let hosts_lost = hosts.iter().any(|h| h.status == HostStatus::Lost);
    let health = if failed_procs > 0 && !alive {
        "failed"
    } else if failed_procs > 0 || failed_actors > 0 || hosts_lost {
        "degraded"
    } else {
        "ok"
    };
    let user_actors: Vec<&ActorRecord> = actors.iter().filter(|a| !a.system).collect();
    let handled: u64 = user_actors.iter().map(|a| a.handled).sum();
    let errors: u64 = user_actors.iter().map(|a| a.errors).sum();
    let program = describe.program.clone().unwrap_or_else(|| {
        std::env::args()
            .next()
            .map(|a| a.rsplit('/').next().unwrap_or("").to_string())
            .unwrap_or_default()
    });
    json!({
        "session": describe.session.clone().unwrap_or_default(),
        "program": program,
        "pid": describe.pid.unwrap_or_else(std::process::id),
        "started_at": describe.started_at.unwrap_or(started_at),
        "now": describe.now.unwrap_or_else(hyperactor_mesh::monitor::unix_now),
        "health": health,
        "counts": {
            "hosts": hosts.len(), "procs": procs.len(),
            "meshes": meshes.iter().filter(|m| !m.system).count(),
            "actors": user_actors.len(), "failed_actors": failed_actors,
            "failed_procs": failed_procs,
        },
        "messages": {"handled": handled, "errors": errors, "rate": rate},
    })
}

async fn summary(app: &App) -> Answer {
    let snapshot = snapshot(app).await?;
    let describe = app.source.describe();
    let rate = describe
        .rate
        .or_else(|| match app.source.recorded_series() {
            Some(points) => points.last().map(|p| p.rate),
            None => app.series.last_rate(),
        });
    let value = summarize(&snapshot, &describe, rate.unwrap_or(0.0), app.started_at);
    Ok(json_response(StatusCode::OK, value))
}

/// `{"items": ...}` with one list of the snapshot, as `items` writes it.
async fn list(app: &App, items: impl FnOnce(&Snapshot) -> Result<Value, Response<Body>>) -> Answer {
    let snapshot = snapshot(app).await?;
    Ok(json_response(
        StatusCode::OK,
        json!({ "items": items(&snapshot)? }),
    ))
}

async fn actors(app: &App, params: &Params) -> Answer {
    let offset: usize = params.number("offset", 0)?;
    let limit: usize = params.number("limit", 500)?;
    let limit = limit.min(MAX_LIMIT);
    let system = matches!(params.get("system"), Some("1" | "true"));
    let mesh = params.get("mesh").filter(|m| !m.is_empty());
    let status = params.get("status").filter(|s| !s.is_empty());
    let snapshot = snapshot(app).await?;
    let matching: Vec<&ActorRecord> = snapshot
        .actors
        .iter()
        .filter(|a| system || !a.system)
        .filter(|a| mesh.is_none_or(|m| a.mesh.as_deref() == Some(m) || a.name == m))
        .filter(|a| status.is_none_or(|s| a.status == s))
        .collect();
    let page: Vec<&ActorRecord> = matching.iter().skip(offset).take(limit).copied().collect();
    Ok(json_response(
        StatusCode::OK,
        json!({ "total": matching.len(), "offset": offset, "items": to_json(&page)? }),
    ))
}

async fn actor(app: &App, params: &Params) -> Answer {
    let id = params.required("id", "an actor id from GET /v1/actors")?;
    let snapshot = snapshot(app).await?;
    let Some(actor) = snapshot.actors.iter().find(|a| a.id == id) else {
        return Err(error(
            StatusCode::NOT_FOUND,
            &format!(
                "no actor {id:?} in the job; expected an id from GET /v1/actors (?system=1 \
                 lists system actors too); it may have stopped: reload the list"
            ),
        ));
    };
    let logs = app.source.logs(&LogQuery {
        proc: Some(actor.proc.clone()),
        limit: ACTOR_LOG_LINES,
        ..LogQuery::default()
    });
    Ok(json_response(
        StatusCode::OK,
        json!({ "actor": to_json(actor)?, "logs": to_json(&logs)? }),
    ))
}

fn events(app: &App, params: &Params) -> Answer {
    let since: u64 = params.number("since", 0)?;
    let limit: usize = params.number("limit", 500)?;
    let items = app.source.events_since(since, limit.min(MAX_LIMIT));
    let next = items.last().map_or(since, |e| e.seq);
    Ok(json_response(
        StatusCode::OK,
        json!({ "items": to_json(&items)?, "next": next }),
    ))
}

fn event_stream(app: &App, headers: &hyper::HeaderMap, params: &Params) -> Response<Body> {
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .or_else(|| params.get("since").and_then(|v| v.parse().ok()))
        .unwrap_or(0);
    let body = crate::sse::stream(
        Arc::clone(&app.source),
        &app.series,
        last_id,
        app.shutdown.clone(),
    );
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    with_common_headers(response, "no-cache")
}

fn logs(app: &App, params: &Params) -> Answer {
    let limit: usize = params.number("limit", 200)?;
    let text = |k: &str| params.get(k).filter(|v| !v.is_empty()).map(String::from);
    let query = LogQuery {
        text: text("q"),
        proc: text("proc"),
        actor: text("actor"),
        limit: limit.min(MAX_LIMIT),
    };
    Ok(json_response(
        StatusCode::OK,
        json!({ "items": to_json(&app.source.logs(&query))? }),
    ))
}

fn series(app: &App, params: &Params) -> Answer {
    let window: f64 = params.number("window", 900.0)?;
    let window = if window.is_finite() && window > 0.0 {
        window
    } else {
        900.0
    };
    let points = match app.source.recorded_series() {
        Some(mut points) => {
            let last = points.last().map_or(0.0, |p| p.t);
            points.retain(|p| p.t > last - window);
            points
        }
        None => app.series.window(window),
    };
    let step = crate::series::STEP.as_secs_f64();
    Ok(json_response(
        StatusCode::OK,
        json!({ "step_s": step, "points": to_json(&points)? }),
    ))
}

async fn known_proc<'a>(app: &App, params: &'a Params) -> Result<&'a str, Response<Body>> {
    let proc = params.required("proc", "a proc id from GET /v1/procs")?;
    let snapshot = snapshot(app).await?;
    if !snapshot.procs.iter().any(|p| p.id == proc) {
        return Err(error(
            StatusCode::NOT_FOUND,
            &format!(
                "no proc {proc:?} in the job; expected an id from GET /v1/procs; reload the list"
            ),
        ));
    }
    Ok(proc)
}

/// The status of a response that reports `error`.
fn status_of(error: &SourceError) -> StatusCode {
    match error {
        SourceError::BadProcId { .. } => StatusCode::BAD_REQUEST,
        SourceError::UnknownProc { .. } => StatusCode::NOT_FOUND,
        SourceError::Monitor(MonitorError::NoAnswer { .. }) => StatusCode::GATEWAY_TIMEOUT,
        SourceError::Monitor(MonitorError::UnknownHost { .. }) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn stack(app: &App, params: &Params) -> Answer {
    let proc = known_proc(app, params).await?;
    match tokio::time::timeout(STACK_TIMEOUT, app.source.stack(proc, STACK_TIMEOUT)).await {
        Ok(Ok(dump)) => record_response(&dump),
        Ok(Err(e)) => Err(error(
            status_of(&e),
            &format!("cannot dump the stacks of {proc}: {e}"),
        )),
        Err(_) => Err(error(
            StatusCode::GATEWAY_TIMEOUT,
            &format!(
                "the stack dump of {proc} took longer than {} s; expected the proc to answer; \
                 it may be stuck in native code: try again, or use py-spy on its pid",
                STACK_TIMEOUT.as_secs()
            ),
        )),
    }
}

async fn kill_proc(app: &App, params: &Params) -> Response<Body> {
    if !app.actions {
        return error(
            StatusCode::FORBIDDEN,
            "actions are disabled: this server is read-only; expected a server started with \
             actions enabled; restart the dashboard with actions turned on to kill procs",
        );
    }
    let proc = match known_proc(app, params).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    match app.source.kill_proc(proc).await {
        Ok(()) => json_response(StatusCode::OK, json!({ "ok": true, "proc": proc })),
        Err(e) => error(status_of(&e), &format!("cannot kill {proc}: {e}")),
    }
}

async fn metrics(app: &App) -> Answer {
    let snapshot = snapshot(app).await?;
    let events = app.source.events_since(0, usize::MAX);
    let text = render_metrics(&snapshot, &events);
    Ok(respond(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        text,
    ))
}
