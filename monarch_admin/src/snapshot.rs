//! Coalesced snapshots: concurrent requests share one collection, and a result at most
//! [`REUSE_FOR`] old is reused, so an open dashboard costs the job little. Neither is
//! used across an event: a collection that started before the source's latest event
//! may not show it (a page refreshing on an `actor_failed` event must see the failure),
//! so a request after an event gets a collection that started after it.

use hyperactor::sync::Mutex;
use std::sync::Arc;

use std::time::Duration;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::future::FutureExt;
use futures::future::Shared;
use hyperactor_mesh::monitor::Snapshot;

use crate::source::Source;

/// How long a collected snapshot is served again.
pub(crate) const REUSE_FOR: Duration = Duration::from_millis(250);

/// How long a collection may take before requests get a 504.
pub(crate) const COLLECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A snapshot, or why there is none (`timed_out`, message).
pub(crate) type Collected = Result<Arc<Snapshot>, (bool, String)>;

type InFlight = Shared<BoxFuture<'static, Collected>>;

#[derive(Default)]
struct State {
    /// The last snapshot: when it was collected, the latest event seq when its
    /// collection started, and the snapshot.
    last: Option<(Instant, u64, Arc<Snapshot>)>,
    /// The running collection: its generation, the latest event seq when it started.
    in_flight: Option<(u64, u64, InFlight)>,
    generation: u64,
}

/// The cache in front of [`Source::snapshot`].
pub(crate) struct SnapshotCache {
    source: Arc<dyn Source>,
    state: Mutex<State>,
}

impl std::fmt::Debug for SnapshotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCache").finish_non_exhaustive()
    }
}

impl SnapshotCache {
    pub(crate) fn new(source: Arc<dyn Source>) -> SnapshotCache {
        SnapshotCache {
            source,
            state: Mutex::new(State::default()),
        }
    }

    /// A snapshot at most [`REUSE_FOR`] old and not older than the latest event,
    /// collecting one if needed (shared with a collection already running that started
    /// after that event).
    pub(crate) async fn get(&self) -> Collected {
        let latest = self.source.latest_event_seq();
        let (generation, future) = {
            let mut state = self.state.lock();
            if let Some((at, seq, snapshot)) = &state.last {
                if at.elapsed() <= REUSE_FOR && *seq >= latest {
                    return Ok(Arc::clone(snapshot));
                }
            }
            match &state.in_flight {
                Some((generation, seq, future)) if *seq >= latest => (*generation, future.clone()),
                _ => {
                    state.generation += 1;
                    let collect = self.source.snapshot(COLLECT_TIMEOUT);
                    let future: BoxFuture<'static, Collected> = async move {
                        match tokio::time::timeout(
                            COLLECT_TIMEOUT + Duration::from_secs(1),
                            collect,
                        )
                        .await
                        {
                            Ok(Ok(value)) => Ok(Arc::new(value)),
                            Ok(Err(e)) => Err((false, e.to_string())),
                            Err(_) => Err((
                                true,
                                format!(
                                    "collecting the snapshot took longer than {} s",
                                    COLLECT_TIMEOUT.as_secs()
                                ),
                            )),
                        }
                    }
                    .boxed();
                    let shared = future.shared();
                    state.in_flight = Some((state.generation, latest, shared.clone()));
                    (state.generation, shared)
                }
            }
        };
        let result = future.await;
        let mut state = self.state.lock();
        if matches!(&state.in_flight, Some((g, _, _)) if *g == generation) {
            state.in_flight = None;
            if let Ok(snapshot) = &result {
                state.last = Some((Instant::now(), latest, Arc::clone(snapshot)));
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use hyperactor_mesh::monitor::{Event, LogQuery, LogRecord, StackDump};
    use tokio::sync::broadcast;

    use super::*;
    use crate::source::SourceError;

    /// Each collection returns the number of collections so far (as its
    /// `collected_ms`); `seq` is the latest event.
    #[derive(Default)]
    struct Counting {
        collections: AtomicU64,
        seq: AtomicU64,
    }

    impl Source for Counting {
        fn snapshot(
            &self,
            _timeout: Duration,
        ) -> BoxFuture<'static, Result<Snapshot, SourceError>> {
            let n = self.collections.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok(Snapshot {
                    collected_ms: n as f64,
                    ..Snapshot::empty()
                })
            }
            .boxed()
        }
        fn events_since(&self, _since: u64, _limit: usize) -> Vec<Event> {
            Vec::new()
        }
        fn subscribe(&self) -> broadcast::Receiver<Event> {
            broadcast::channel(1).1
        }
        fn logs(&self, _q: &LogQuery) -> Vec<LogRecord> {
            Vec::new()
        }
        fn stack(
            &self,
            _proc: &str,
            _t: Duration,
        ) -> BoxFuture<'static, Result<StackDump, SourceError>> {
            async { Err(SourceError::Unavailable("no stacks here".to_string())) }.boxed()
        }
        fn kill_proc(&self, _proc: &str) -> BoxFuture<'static, Result<(), SourceError>> {
            async { Ok(()) }.boxed()
        }
        fn latest_event_seq(&self) -> u64 {
            self.seq.load(Ordering::SeqCst)
        }
    }

    fn n(collected: Collected) -> u64 {
        match collected {
            Ok(v) => v.collected_ms as u64,
            Err((_, e)) => panic!("no snapshot: {e}"),
        }
    }

    #[tokio::test]
    async fn a_snapshot_is_reused_until_an_event_happens() {
        let source = Arc::new(Counting::default());
        let cache = SnapshotCache::new(Arc::clone(&source) as Arc<dyn Source>);
        assert_eq!(n(cache.get().await), 1);
        assert_eq!(n(cache.get().await), 1, "reused within REUSE_FOR");
        source.seq.store(7, Ordering::SeqCst);
        assert_eq!(
            n(cache.get().await),
            2,
            "an event makes the next request collect"
        );
        assert_eq!(n(cache.get().await), 2, "reused again until the next event");
    }
}
