//! Events, pushed when they happen: a process-global bounded ring (the last
//! [`RING_CAPACITY`] events, sequence numbers from 1) and a broadcast channel for
//! subscribers. Recording takes one short lock and never blocks on subscribers (a slow
//! subscriber misses events and sees `Lagged`).

use hyperactor::sync::Mutex;
use std::collections::VecDeque;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::unix_now;

/// How many events the ring keeps.
pub const RING_CAPACITY: usize = 10_000;

/// One event (the API's event record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Its sequence number (from 1, in recording order).
    pub seq: u64,
    /// When it happened (Unix seconds).
    pub time: f64,
    /// `mesh_spawned`, `mesh_stopped`, `actor_failed`, `proc_exited`, `proc_lost`,
    /// `host_lost` or `breakpoint`.
    pub kind: String,
    /// One line a human reads.
    pub message: String,
    /// The mesh's name.
    pub mesh: Option<String>,
    /// The actor's id.
    pub actor: Option<String>,
    /// The proc's id.
    pub proc: Option<String>,
    /// The host's id.
    pub host: Option<String>,
    /// The rank.
    pub rank: Option<usize>,
    /// The failure class: `user`, `resource`, `infrastructure` or `spawn`.
    #[serde(rename = "class")]
    pub class: Option<String>,
    /// The chain of causes, outermost first.
    pub cause: Vec<String>,
}

impl Event {
    /// An event of `kind` saying `message`, to be filled in and [`record`]ed.
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        Self {
            seq: 0,
            time: 0.0,
            kind: kind.to_string(),
            message: message.into(),
            mesh: None,
            actor: None,
            proc: None,
            host: None,
            rank: None,
            class: None,
            cause: Vec::new(),
        }
    }
}

struct Ring {
    next_seq: u64,
    events: VecDeque<Event>,
}

struct Events {
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Event>,
}

fn events() -> &'static Events {
    static EVENTS: OnceLock<Events> = OnceLock::new();
    EVENTS.get_or_init(|| Events {
        ring: Mutex::new(Ring {
            next_seq: 1,
            events: VecDeque::new(),
        }),
        tx: broadcast::channel(1024).0,
    })
}

/// Records `event` (its `seq` and `time` are set here) and returns its sequence number.
pub fn record(mut event: Event) -> u64 {
    let events = events();
    let mut ring = events.ring.lock();
    event.seq = ring.next_seq;
    ring.next_seq += 1;
    if event.time == 0.0 {
        event.time = unix_now();
    }
    if ring.events.len() == RING_CAPACITY {
        ring.events.pop_front();
    }
    ring.events.push_back(event.clone());
    // Sent under the lock so subscribers see events in sequence order; a send never
    // blocks (no subscriber is fine).
    let _ = events.tx.send(event);
    ring.events.back().map_or(0, |e| e.seq)
}

/// The events with `seq > since`, oldest first, at most `limit`.
pub fn since(since: u64, limit: usize) -> Vec<Event> {
    let ring = events().ring.lock();
    ring.events
        .iter()
        .filter(|e| e.seq > since)
        .take(limit)
        .cloned()
        .collect()
}

/// The sequence number of the latest event (0 if none).
pub fn latest_seq() -> u64 {
    events().ring.lock().next_seq - 1
}

/// New events as they are recorded.
pub fn subscribe() -> broadcast::Receiver<Event> {
    events().tx.subscribe()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_orders_and_bounds() {
        let mut rx = subscribe();
        let start = latest_seq();
        let first = record(Event::new("breakpoint", "one"));
        assert!(first > start);
        let mut e = Event::new("actor_failed", "two");
        e.rank = Some(3);
        let second = record(e);
        assert!(second > first);
        let got = since(first - 1, 100);
        let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
        assert!(seqs.starts_with(&[first]), "{seqs:?}");
        assert!(seqs.contains(&second));
        assert!(got.iter().all(|e| e.time > 0.0));
        assert_eq!(since(first - 1, 1).len(), 1);
        // Subscribers see them (other tests may record too: look for ours).
        let mut seen = Vec::new();
        while let Ok(e) = rx.try_recv() {
            seen.push(e.seq);
        }
        assert!(seen.contains(&first) && seen.contains(&second), "{seen:?}");
        for i in 0..RING_CAPACITY + 5 {
            record(Event::new("breakpoint", format!("{i}")));
        }
        let all = since(0, usize::MAX);
        assert_eq!(all.len(), RING_CAPACITY);
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        let json = match serde_json::to_value(&all[0]) {
            Ok(json) => json,
            Err(e) => panic!("{e}"),
        };
        for key in [
            "seq", "time", "kind", "message", "mesh", "actor", "proc", "host", "rank", "class",
            "cause",
        ] {
            assert!(json.get(key).is_some(), "{key} missing");
        }
    }
}
