//! The time series behind `GET /v1/series`: a sampler takes a snapshot every second
//! while someone watches (an event stream is open, or an API request came in the last
//! [`WATCH_FOR`]), and keeps [`KEEP`] of points. Nobody watching, it sleeps.

use hyperactor::sync::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::time::Duration;
use std::time::Instant;

use serde_json::json;
use serde_json::Value;
use tokio::sync::watch;
use tokio::sync::Notify;

use crate::snapshot::SnapshotCache;

/// Seconds between samples.
pub(crate) const STEP: Duration = Duration::from_secs(1);
/// How long after the last API request the sampler keeps sampling.
pub(crate) const WATCH_FOR: Duration = Duration::from_secs(30);
/// How many points are kept (15 minutes).
pub(crate) const KEEP: usize = 900;

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) t: f64,
    pub(crate) handled: u64,
    pub(crate) errors: u64,
    pub(crate) rate: f64,
    pub(crate) rss: u64,
    pub(crate) cpu_pct: f64,
    pub(crate) procs_alive: u64,
    pub(crate) actors_failed: u64,
}

impl Point {
    /// The totals of `snapshot`, with the rate against `previous`.
    pub(crate) fn of(snapshot: &Value, t: f64, previous: Option<&Point>) -> Point {
        let items = |key: &str| snapshot[key].as_array().cloned().unwrap_or_default();
        let actors = items("actors");
        let procs = items("procs");
        let u = |v: &Value| v.as_u64().unwrap_or(0);
        let handled: u64 = actors.iter().map(|a| u(&a["handled"])).sum();
        let errors = actors.iter().map(|a| u(&a["errors"])).sum();
        let rss = procs.iter().map(|p| u(&p["rss"])).sum();
        let cpu_pct = procs
            .iter()
            .map(|p| p["cpu_pct"].as_f64().unwrap_or(0.0))
            .sum();
        let procs_alive = procs.iter().filter(|p| p["status"] == "running").count() as u64;
        let actors_failed = actors.iter().filter(|a| a["status"] == "failed").count() as u64;
        let rate = match previous {
            Some(p) if t > p.t => handled.saturating_sub(p.handled) as f64 / (t - p.t),
            _ => 0.0,
        };
        Point {
            t,
            handled,
            errors,
            rate,
            rss,
            cpu_pct,
            procs_alive,
            actors_failed,
        }
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "t": self.t, "handled": self.handled, "errors": self.errors, "rate": self.rate,
            "rss": self.rss, "cpu_pct": self.cpu_pct, "procs_alive": self.procs_alive,
            "actors_failed": self.actors_failed,
        })
    }
}

/// The sampled points and what decides whether to sample.
#[derive(Debug)]
pub(crate) struct Series {
    points: Mutex<VecDeque<Point>>,
    streams: AtomicUsize,
    /// Milliseconds since `epoch` of the last API request, plus one (0: never).
    last_request_ms: AtomicU64,
    epoch: Instant,
    wake: Notify,
}

impl Series {
    pub(crate) fn new() -> Series {
        Series {
            points: Mutex::new(VecDeque::new()),
            streams: AtomicUsize::new(0),
            last_request_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: Notify::new(),
        }
    }

    /// Notes an API request: sampling goes on for [`WATCH_FOR`].
    pub(crate) fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let before = self.last_request_ms.swap(now, Ordering::Relaxed);
        if before == 0 || now.saturating_sub(before) > WATCH_FOR.as_millis() as u64 / 2 {
            self.wake.notify_one();
        }
    }

    /// Notes an event stream opening; sampling goes on while the guard lives.
    pub(crate) fn stream_opened(self: &Arc<Self>) -> StreamGuard {
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        StreamGuard(Arc::clone(self))
    }

    fn watched(&self) -> bool {
        if self.streams.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let last = self.last_request_ms.load(Ordering::Relaxed);
        last != 0
            && (self.epoch.elapsed().as_millis() as u64 + 1).saturating_sub(last)
                <= WATCH_FOR.as_millis() as u64
    }

    /// The message rate of the newest point (computed from the last two samples).
    pub(crate) fn last_rate(&self) -> Option<f64> {
        let points = self.points.lock();
        points.back().map(|p| p.rate)
    }

    /// The points of the last `window` seconds, oldest first.
    pub(crate) fn window(&self, window: f64) -> Vec<Value> {
        let points = self.points.lock();
        let Some(last) = points.back() else {
            return Vec::new();
        };
        let since = last.t - window;
        points
            .iter()
            .filter(|p| p.t > since)
            .map(|p| p.to_json())
            .collect()
    }

    fn push(&self, snapshot: &Value) {
        let mut points = self.points.lock();
        let point = Point::of(
            snapshot,
            hyperactor_mesh::monitor::unix_now(),
            points.back(),
        );
        if points.len() == KEEP {
            points.pop_front();
        }
        points.push_back(point);
    }

    /// Samples while watched, sleeps otherwise, until `shutdown` turns true.
    pub(crate) async fn run(
        self: Arc<Self>,
        cache: Arc<SnapshotCache>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            if *shutdown.borrow() {
                return;
            }
            if !self.watched() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.changed() => return,
                }
                continue;
            }
            if let Ok(snapshot) = cache.get().await {
                self.push(&snapshot);
            }
            tokio::select! {
                _ = tokio::time::sleep(STEP) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Keeps the sampler awake while an event stream is open.
#[derive(Debug)]
pub(crate) struct StreamGuard(Arc<Series>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_sums_and_rates() {
        let snap = json!({
            "actors": [{"handled": 10, "errors": 1, "status": "idle"},
                       {"handled": 5, "errors": 0, "status": "failed"}],
            "procs": [{"rss": 100, "cpu_pct": 1.5, "status": "running"},
                      {"rss": 50, "cpu_pct": 0.5, "status": "failed"}],
        });
        let first = Point::of(&snap, 10.0, None);
        assert_eq!((first.handled, first.errors, first.rss), (15, 1, 150));
        assert_eq!((first.procs_alive, first.actors_failed), (1, 1));
        assert_eq!(first.cpu_pct, 2.0);
        let before = Point {
            handled: 5,
            t: 8.0,
            ..first
        };
        assert_eq!(Point::of(&snap, 10.0, Some(&before)).rate, 5.0);
    }
}
