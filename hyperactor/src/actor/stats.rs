//! Always-on counters of one actor: messages handled, errors, busy time, the endpoint it
//! is in now, and per endpoint a count, errors, total time and a latency histogram.
//!
//! Recording costs a few relaxed atomic operations, one `Instant::now()` at the start
//! and one at the end of each message, and an uncontended lock for the per-endpoint
//! table. Nothing is collected while nobody asks: [`ActorStats::snapshot`] copies the
//! counters when a monitor wants them. `MONARCH_ACTOR_STATS=0` (read once per process)
//! turns the per-message recording off, for A/B benchmarks.

use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::id::ActorId;
use crate::supervision::ActorStatus;

/// The environment variable that turns recording off when set to `0`.
pub const ACTOR_STATS_ENV: &str = "MONARCH_ACTOR_STATS";

/// The upper bounds of the histogram's buckets, in microseconds: 1, 2, 4, ..., 2^24.
/// A histogram has one more bucket (over the last bound).
pub const BUCKET_BOUNDS_US: [u64; 25] = {
    let mut bounds = [0u64; 25];
    let mut i = 0;
    while i < 25 {
        bounds[i] = 1 << i;
        i += 1;
    }
    bounds
};

/// The number of buckets of a histogram (the bounds and one over the last).
pub const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

/// Whether per-message recording is on (`MONARCH_ACTOR_STATS` is not `0`); read once.
pub fn stats_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var(ACTOR_STATS_ENV).map_or(true, |v| v.trim() != "0"))
}

/// The bucket of a handler that took `elapsed`: the first bound it does not exceed.
pub fn bucket_of(elapsed: Duration) -> usize {
    let us = elapsed.as_nanos().div_ceil(1000);
    BUCKET_BOUNDS_US
        .iter()
        .position(|&bound| us <= u128::from(bound))
        .unwrap_or(BUCKETS - 1)
}

/// The counters of one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointStats {
    /// Messages handled.
    pub count: u64,
    /// Of which failed (the handler raised or returned an error).
    pub errors: u64,
    /// Time spent handling them.
    pub total: Duration,
    /// How many took at most each bound of [`BUCKET_BOUNDS_US`] (not cumulative), and
    /// the last: longer.
    pub buckets: [u64; BUCKETS],
}

impl Default for EndpointStats {
    fn default() -> Self {
        Self {
            count: 0,
            errors: 0,
            total: Duration::ZERO,
            buckets: [0; BUCKETS],
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    /// Endpoint name to its index in `endpoints`.
    index: HashMap<Box<str>, usize>,
    endpoints: Vec<(Box<str>, EndpointStats)>,
    /// The endpoint being handled, when it started, and whether it failed so far.
    current: Option<(usize, Instant, bool)>,
}

/// The counters of one actor (see the [module docs](self)).
#[derive(Debug)]
pub struct ActorStats {
    enabled: bool,
    handled: AtomicU64,
    errors: AtomicU64,
    busy_ns: AtomicU64,
    table: Mutex<Table>,
}

/// What is being handled now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentEndpoint {
    /// The endpoint.
    pub endpoint: String,
    /// For how long.
    pub since: Duration,
}

/// A copy of an actor's counters, taken by
/// [`Proc::actor_stats`](crate::router::Proc::actor_stats).
#[derive(Debug, Clone)]
pub struct ActorStatsSnapshot {
    /// The actor.
    pub actor_id: ActorId,
    /// Its status.
    pub status: ActorStatus,
    /// Messages waiting in its queue.
    pub queue: usize,
    /// Messages handled.
    pub handled: u64,
    /// Of which failed.
    pub errors: u64,
    /// Time spent handling messages.
    pub busy: Duration,
    /// The endpoint being handled now, if any.
    pub current: Option<CurrentEndpoint>,
    /// Per endpoint, in the order first seen.
    pub endpoints: Vec<(String, EndpointStats)>,
}

impl Default for ActorStats {
    fn default() -> Self {
        Self::with_recording(stats_enabled())
    }
}

impl ActorStats {
    /// Counters that record messages only if `enabled` (the default follows
    /// [`stats_enabled`]).
    pub fn with_recording(enabled: bool) -> Self {
        Self {
            enabled,
            handled: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            table: Mutex::default(),
        }
    }

    /// Starts handling a message of endpoint `label` (ends the previous one if it was
    /// not ended).
    pub fn begin(&self, label: &str) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let mut table = self.table.lock();
        if let Some(current) = table.current.take() {
            self.close(&mut table, current, now);
        }
        let index = match table.index.get(label) {
            Some(&i) => i,
            None => {
                let i = table.endpoints.len();
                table
                    .endpoints
                    .push((label.into(), EndpointStats::default()));
                table.index.insert(label.into(), i);
                i
            }
        };
        table.current = Some((index, now, false));
    }

    /// The message being handled failed (counted when it ends).
    pub fn note_error(&self) {
        if !self.enabled {
            return;
        }
        if let Some(current) = self.table.lock().current.as_mut() {
            current.2 = true;
        }
    }

    /// The message being handled is done (nothing happens if none is).
    pub fn end(&self) {
        if !self.enabled {
            return;
        }
        let mut table = self.table.lock();
        if let Some(current) = table.current.take() {
            self.close(&mut table, current, Instant::now());
        }
    }

    fn close(
        &self,
        table: &mut Table,
        (index, start, failed): (usize, Instant, bool),
        now: Instant,
    ) {
        let elapsed = now.saturating_duration_since(start);
        if let Some((_, e)) = table.endpoints.get_mut(index) {
            e.count += 1;
            e.errors += u64::from(failed);
            e.total += elapsed;
            e.buckets[bucket_of(elapsed)] += 1;
        }
        self.handled.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A copy of the counters, for `actor_id` in `status` with `queue` messages queued.
    pub fn snapshot(
        &self,
        actor_id: ActorId,
        status: ActorStatus,
        queue: usize,
    ) -> ActorStatsSnapshot {
        let now = Instant::now();
        let table = self.table.lock();
        let current = table.current.and_then(|(i, start, _)| {
            table.endpoints.get(i).map(|(name, _)| CurrentEndpoint {
                endpoint: name.to_string(),
                since: now.saturating_duration_since(start),
            })
        });
        let endpoints = table
            .endpoints
            .iter()
            .map(|(name, e)| (name.to_string(), e.clone()))
            .collect();
        drop(table);
        ActorStatsSnapshot {
            actor_id,
            status,
            queue,
            handled: self.handled.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
            current,
            endpoints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ActorId {
        match "p@local:1/a[0]".parse() {
            Ok(id) => id,
            Err(e) => panic!("bad test id: {e}"),
        }
    }

    #[test]
    fn bounds_and_buckets() {
        assert_eq!(BUCKET_BOUNDS_US[0], 1);
        assert_eq!(BUCKET_BOUNDS_US[24], 1 << 24);
        assert_eq!(BUCKETS, 26);
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_nanos(1)), 0);
        assert_eq!(bucket_of(Duration::from_micros(1)), 0);
        assert_eq!(bucket_of(Duration::from_nanos(1001)), 1);
        assert_eq!(bucket_of(Duration::from_micros(3)), 2);
        assert_eq!(bucket_of(Duration::from_micros(4)), 2);
        assert_eq!(bucket_of(Duration::from_micros(5)), 3);
        assert_eq!(bucket_of(Duration::from_secs(16)), 24);
        assert_eq!(bucket_of(Duration::from_secs(17)), 25);
    }

    #[test]
    fn counts_errors_and_current() {
        let stats = ActorStats::default();
        for _ in 0..3 {
            stats.begin("a");
            stats.end();
        }
        stats.begin("b");
        stats.note_error();
        stats.end();
        stats.begin("b");
        std::thread::sleep(Duration::from_millis(5));
        let s = stats.snapshot(id(), ActorStatus::Processing, 2);
        let current = s.current.as_ref().map(|c| (c.endpoint.as_str(), c.since));
        assert!(matches!(current, Some(("b", since)) if since >= Duration::from_millis(5)));
        stats.end();
        let s = stats.snapshot(id(), ActorStatus::Idle, 0);
        assert_eq!(s.handled, 5);
        assert_eq!(s.errors, 1);
        assert!(s.current.is_none());
        assert!(s.busy >= Duration::from_millis(5));
        let a = &s.endpoints[0];
        assert_eq!((a.0.as_str(), a.1.count, a.1.errors), ("a", 3, 0));
        let b = &s.endpoints[1];
        assert_eq!((b.0.as_str(), b.1.count, b.1.errors), ("b", 2, 1));
        assert_eq!(b.1.buckets.iter().sum::<u64>(), 2);
        // The 5 ms one lands in the bucket of 8192 µs (index 13) or later.
        assert_eq!(b.1.buckets[13..].iter().sum::<u64>(), 1);
        // An end without a begin counts nothing.
        stats.end();
        assert_eq!(stats.snapshot(id(), ActorStatus::Idle, 0).handled, 5);
    }

    #[test]
    fn off_records_nothing() {
        let stats = ActorStats::with_recording(false);
        stats.begin("a");
        stats.note_error();
        stats.end();
        let s = stats.snapshot(id(), ActorStatus::Idle, 0);
        assert_eq!((s.handled, s.errors, s.endpoints.len()), (0, 0, 0));
        assert!(s.current.is_none());
    }

    mod typed {
        use serde::{Deserialize, Serialize};

        use crate::actor::{Actor, Binder, Context, Handler};
        use crate::channel::ChannelTransport;
        use crate::context::SendContext;
        use crate::error::BoxError;
        use crate::port::OncePortRef;
        use crate::router::Proc;

        #[derive(Debug)]
        struct Worker;

        #[derive(Serialize, Deserialize)]
        struct Work(u64, OncePortRef<u64>);

        #[derive(Serialize, Deserialize)]
        struct Other(OncePortRef<()>);

        impl Actor for Worker {
            type Params = ();
            async fn new((): ()) -> Result<Self, BoxError> {
                Ok(Worker)
            }
            fn bind(binder: &mut Binder<Self>) {
                binder.handle::<Work>();
                binder.handle::<Other>();
            }
        }

        impl Handler<Work> for Worker {
            async fn handle(
                &mut self,
                cx: &Context<Self>,
                Work(n, reply): Work,
            ) -> Result<(), BoxError> {
                reply.send(cx, n)?;
                Ok(())
            }
        }

        impl Handler<Other> for Worker {
            async fn handle(
                &mut self,
                cx: &Context<Self>,
                Other(reply): Other,
            ) -> Result<(), BoxError> {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                reply.send(cx, ())?;
                Ok(())
            }
        }

        #[tokio::test]
        async fn counts_equal_messages_handled() -> Result<(), Box<dyn std::error::Error>> {
            let proc = Proc::serve(ChannelTransport::Local, "stats").await?;
            let client = proc.client("main")?;
            let worker = client.spawn::<Worker>("worker", ())?;
            for i in 0..7 {
                client
                    .call(&worker.bind().port::<Work>(), |r| Work(i, r))
                    .await?;
            }
            for _ in 0..3 {
                client.call(&worker.bind().port::<Other>(), Other).await?;
            }
            let all = proc.actor_stats();
            let Some(s) = all.iter().find(|s| s.actor_id.name() == "worker") else {
                panic!("worker not listed: {all:?}");
            };
            assert_eq!((s.handled, s.errors, s.queue), (10, 0, 0));
            let by_name: std::collections::HashMap<_, _> = s
                .endpoints
                .iter()
                .map(|(n, e)| (n.as_str(), e.count))
                .collect();
            assert_eq!(by_name.get("Work"), Some(&7), "{by_name:?}");
            assert_eq!(by_name.get("Other"), Some(&3), "{by_name:?}");
            assert!(s.busy >= std::time::Duration::from_millis(6));
            Ok(())
        }

        /// The per-message cost of the counters: run once with `MONARCH_ACTOR_STATS=0`
        /// and once without, and compare (`cargo test -p hyperactor --lib
        /// stats_cost -- --ignored --nocapture`).
        #[tokio::test]
        #[ignore = "a measurement, not a test"]
        async fn stats_cost() -> Result<(), Box<dyn std::error::Error>> {
            let proc = Proc::serve(ChannelTransport::Local, "stats-cost").await?;
            let client = proc.client("main")?;
            let worker = client.spawn::<Worker>("worker", ())?;
            let port = worker.bind().port::<Work>();
            let mut best = std::time::Duration::MAX;
            for _ in 0..5 {
                let n = 20_000u64;
                let start = std::time::Instant::now();
                for i in 0..n {
                    client.call(&port, |r| Work(i, r)).await?;
                }
                best = best.min(start.elapsed() / n as u32);
            }
            println!(
                "recording {}: {best:?} per call round trip (best of 5 x 20000)",
                if super::super::stats_enabled() {
                    "on"
                } else {
                    "off"
                }
            );
            Ok(())
        }
    }
}
