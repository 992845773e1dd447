//! Coalesced snapshots: concurrent requests share one collection, and a result at most
//! [`REUSE_FOR`] old is reused, so an open dashboard costs the job little.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::future::FutureExt;
use futures::future::Shared;

use crate::Source;

/// How long a collected snapshot is served again.
pub(crate) const REUSE_FOR: Duration = Duration::from_millis(250);

/// How long a collection may take before requests get a 504.
pub(crate) const COLLECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A snapshot, or why there is none (`timed_out`, message).
pub(crate) type Collected = Result<Arc<serde_json::Value>, (bool, String)>;

type InFlight = Shared<BoxFuture<'static, Collected>>;

#[derive(Default)]
struct State {
    last: Option<(Instant, Arc<serde_json::Value>)>,
    in_flight: Option<(u64, InFlight)>,
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

    /// A snapshot at most [`REUSE_FOR`] old, collecting one if needed (shared with any
    /// collection already running).
    pub(crate) async fn get(&self) -> Collected {
        let (generation, future) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, snapshot)) = &state.last {
                if at.elapsed() <= REUSE_FOR {
                    return Ok(Arc::clone(snapshot));
                }
            }
            match &state.in_flight {
                Some((generation, future)) => (*generation, future.clone()),
                None => {
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
                            Ok(Err(e)) => Err((false, e)),
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
                    state.in_flight = Some((state.generation, shared.clone()));
                    (state.generation, shared)
                }
            }
        };
        let result = future.await;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(&state.in_flight, Some((g, _)) if *g == generation) {
            state.in_flight = None;
            if let Ok(snapshot) = &result {
                state.last = Some((Instant::now(), Arc::clone(snapshot)));
            }
        }
        result
    }
}
