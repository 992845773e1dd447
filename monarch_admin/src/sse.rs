//! `GET /v1/events/stream`: Server-Sent Events. The backlog after `Last-Event-ID` first,
//! then each new event from the source's broadcast channel, a `: keepalive` comment
//! every [`KEEPALIVE`], and the end of the stream when the server shuts down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyperactor_mesh::monitor::Event;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio::sync::watch;

use crate::http::Body;
use crate::series::Series;
use crate::source::Source;

/// How often an idle stream sends a comment (keeps proxies and the client's timeout
/// from closing it, and finds out when the client is gone).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);

/// The most backlog events sent on connect or after falling behind.
const BACKLOG: usize = 10_000;

/// The SSE frame of `event`: its JSON (through a `Value`, so its keys are sorted as in
/// every other response) on one `data:` line, with its seq as the id. An event that
/// does not serialize (none of the API's records) is left out.
fn frame(event: &Event) -> Option<(u64, Bytes)> {
    let seq = event.seq;
    let data = serde_json::to_value(event).ok()?;
    Some((
        seq,
        Bytes::from(format!("id: {seq}\nevent: monarch\ndata: {data}\n\n")),
    ))
}

/// The body of an event stream that resumes after `last_id`.
pub(crate) fn stream(
    source: Arc<dyn Source>,
    series: &Arc<Series>,
    last_id: u64,
    mut shutdown: watch::Receiver<bool>,
) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let guard = series.stream_opened();
    tokio::spawn(async move {
        let _guard = guard;
        if *shutdown.borrow_and_update() {
            return;
        }
        // Subscribe before reading the backlog so nothing falls between the two.
        let mut live = source.subscribe();
        let mut last = last_id;
        let send_after = |last: &mut u64, events: Vec<Event>| {
            let mut out = Vec::new();
            for event in events {
                if let Some((seq, bytes)) = frame(&event) {
                    if seq > *last {
                        *last = seq;
                        out.push(bytes);
                    }
                }
            }
            out
        };
        let mut pending = vec![Bytes::from_static(b"retry: 2000\n\n")];
        let backlog = source.events_since(last, BACKLOG);
        pending.extend(send_after(&mut last, backlog));
        for bytes in pending {
            if tx.send(bytes).await.is_err() {
                return;
            }
        }
        let mut keepalive =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        loop {
            let out = tokio::select! {
                _ = shutdown.changed() => return,
                _ = keepalive.tick() => vec![Bytes::from_static(b": keepalive\n\n")],
                received = live.recv() => match received {
                    Ok(event) => send_after(&mut last, vec![event]),
                    Err(RecvError::Lagged(_)) => {
                        let missed = source.events_since(last, BACKLOG);
                        send_after(&mut last, missed)
                    }
                    Err(RecvError::Closed) => return,
                },
            };
            for bytes in out {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    sent = tx.send(bytes) => if sent.is_err() { return },
                }
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    StreamBody::new(frames).boxed()
}
