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

use hyperactor_mesh::monitor::{ActorState, ProcStatus, Snapshot};
use tokio::sync::watch;
use tokio::sync::Notify;

use crate::snapshot::SnapshotCache;
use crate::source::SeriesPoint;

/// Seconds between samples.
pub(crate) const STEP: Duration = Duration::from_secs(1);
/// How long after the last API request the sampler keeps sampling.
pub(crate) const WATCH_FOR: Duration = Duration::from_secs(30);
/// How many points are kept (15 minutes).
pub(crate) const KEEP: usize = 900;

// The record is the source's (a recording serves its own points); how one is
// taken from a snapshot is the sampler's.
impl SeriesPoint {
    /// The totals of `snapshot`, with the rate against `previous`.
    pub(crate) fn of(snapshot: &Snapshot, t: f64, previous: Option<&SeriesPoint>) -> SeriesPoint {
        let (actors, procs) = (&snapshot.actors, &snapshot.procs);
        let handled: u64 = actors.iter().map(|a| a.handled).sum();
        let errors = actors.iter().map(|a| a.errors).sum();
        let rss = procs.iter().map(|p| p.rss).sum();
        let cpu_pct = procs.iter().map(|p| p.cpu_pct).sum();
        let procs_alive = procs
            .iter()
            .filter(|p| p.status == ProcStatus::Running)
            .count() as u64;
        let actors_failed = actors
            .iter()
            .filter(|a| a.status == ActorState::Failed)
            .count() as u64;
        let rate = match previous {
            Some(p) if t > p.t => handled.saturating_sub(p.handled) as f64 / (t - p.t),
            _ => 0.0,
        };
        SeriesPoint {
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
}

/// The sampled points and what decides whether to sample.
#[derive(Debug)]
pub(crate) struct Series {
    points: Mutex<VecDeque<SeriesPoint>>,
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
    pub(crate) fn window(&self, window: f64) -> Vec<SeriesPoint> {
        let points = self.points.lock();
        let Some(last) = points.back() else {
            return Vec::new();
        };
        let since = last.t - window;
        points.iter().filter(|p| p.t > since).copied().collect()
    }

    fn push(&self, snapshot: &Snapshot) {
        let mut points = self.points.lock();
        let point = SeriesPoint::of(
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
    use hyperactor_mesh::monitor::{ActorRecord, ProcRecord};

    use super::*;

    #[test]
    fn point_sums_and_rates() {
        let mut snap = Snapshot::empty();
        for (handled, errors, status) in [(10, 1, ActorState::Idle), (5, 0, ActorState::Failed)] {
            let mut actor = ActorRecord::bare("a".into(), "p".into(), status);
            (actor.handled, actor.errors) = (handled, errors);
            snap.actors.push(actor);
        }
        for (rss, cpu_pct, status) in [
            (100, 1.5, ProcStatus::Running),
            (50, 0.5, ProcStatus::Failed),
        ] {
            let mut proc = ProcRecord::bare("p".into(), status);
            (proc.rss, proc.cpu_pct) = (rss, cpu_pct);
            snap.procs.push(proc);
        }
        let first = SeriesPoint::of(&snap, 10.0, None);
        assert_eq!((first.handled, first.errors, first.rss), (15, 1, 150));
        assert_eq!((first.procs_alive, first.actors_failed), (1, 1));
        assert_eq!(first.cpu_pct, 2.0);
        let before = SeriesPoint {
            handled: 5,
            t: 8.0,
            ..first
        };
        assert_eq!(SeriesPoint::of(&snap, 10.0, Some(&before)).rate, 5.0);
    }

    #[test]
    fn a_point_has_the_api_keys() -> Result<(), serde_json::Error> {
        let point = SeriesPoint::of(&Snapshot::empty(), 1.0, None);
        let json = serde_json::to_value(point)?;
        let keys: Vec<&str> = json
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "actors_failed",
                "cpu_pct",
                "errors",
                "handled",
                "procs_alive",
                "rate",
                "rss",
                "t"
            ]
        );
        Ok(())
    }
}
