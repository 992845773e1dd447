//! Monitoring: the records of an on-demand snapshot (hosts, procs, meshes, actors),
//! the events ring, the logs ring, and stack dumps.
//!
//! The records serialize (with `serde_json`) to exactly the JSON shapes of the
//! monitoring API, version 1: a [`Snapshot`] is the body of `GET /v1/snapshot`, an
//! [`Event`] one event, a [`LogRecord`] one log record. They also travel between agents
//! (bincode), so every field is always present (`null` for nothing, never skipped).
//!
//! A snapshot is gathered only when asked ([`crate::agent::ProcAgent::monitor_snapshot`]): the
//! client asks each host agent it knows, each host agent asks each live proc it spawned
//! (with a timeout) and adds its host's stats and the procs that exited. Events
//! ([`events`]) and log lines ([`logs`]) are recorded when they happen, into bounded
//! process-global rings.

pub mod error;
pub mod events;
pub mod failures;
pub mod logs;
pub mod stack;
mod status;
pub mod system;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyperactor::actor::stats::{ActorStatsSnapshot, BUCKET_BOUNDS_US};
use hyperactor::ActorStatus;
use serde::{Deserialize, Serialize};

pub use error::{MonitorError, StackError};
pub use events::Event;
pub use logs::{LogQuery, LogRecord};
pub use status::{ActorState, HostStatus, MeshStatus, ProcStatus};

/// The version of the JSON API these records follow.
pub const API_VERSION: u32 = 1;

/// Now, in Unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `value` as JSON text.
///
/// # Errors
///
/// If it does not serialize (a map with non-string keys; none of these records).
pub fn to_json<T: Serialize>(value: &T) -> Result<String, MonitorError> {
    Ok(serde_json::to_string(value)?)
}

/// The body of `GET /v1/events`: `{"version", "items", "next"}` with the events of
/// `seq > since` (oldest first, at most `limit`); `next` is the last one's `seq`.
pub fn events_json(since: u64, limit: usize) -> Result<String, MonitorError> {
    let items = events::since(since, limit);
    let next = items.last().map_or(since, |e| e.seq);
    to_json(&serde_json::json!({"version": API_VERSION, "items": items, "next": next}))
}

/// The body of `GET /v1/logs`: `{"version", "items"}` with the lines matching `q`.
pub fn logs_json(q: &LogQuery) -> Result<String, MonitorError> {
    let items = logs::query(q);
    to_json(&serde_json::json!({"version": API_VERSION, "items": items}))
}

/// The whole tree, gathered now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Always [`API_VERSION`].
    pub version: u32,
    /// When it was gathered (Unix seconds).
    pub time: f64,
    /// How long gathering took.
    pub collected_ms: f64,
    /// The histogram bounds of every `buckets` list (µs).
    pub bucket_bounds_us: Vec<u64>,
    /// The hosts.
    pub hosts: Vec<HostRecord>,
    /// The procs.
    pub procs: Vec<ProcRecord>,
    /// The meshes this process spawned.
    pub meshes: Vec<MeshRecord>,
    /// The actors.
    pub actors: Vec<ActorRecord>,
}

impl Snapshot {
    /// An empty snapshot taken now.
    pub fn empty() -> Self {
        Self {
            version: API_VERSION,
            time: unix_now(),
            collected_ms: 0.0,
            bucket_bounds_us: BUCKET_BOUNDS_US.to_vec(),
            hosts: Vec::new(),
            procs: Vec::new(),
            meshes: Vec::new(),
            actors: Vec::new(),
        }
    }
}

/// One GPU of a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// Its index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Memory, bytes.
    pub mem_total: u64,
    /// Memory in use, bytes.
    pub mem_used: u64,
    /// Utilization, percent.
    pub util_pct: f64,
    /// The processes using it.
    pub procs: Vec<GpuProcRecord>,
}

/// A process using a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcRecord {
    /// Its pid.
    pub pid: u32,
    /// Its memory on the GPU, bytes.
    pub mem_used: u64,
}

/// A host: the machine of a host agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostRecord {
    /// The host agent's proc id.
    pub id: String,
    /// The host agent's address.
    pub addr: String,
    /// The machine's name.
    pub hostname: String,
    /// `alive` or `lost`.
    pub status: HostStatus,
    /// How long ago its agent last answered a heartbeat of this process, if watched.
    pub heartbeat_age_ms: Option<f64>,
    /// Load averages over 1, 5 and 15 minutes.
    pub load: [f64; 3],
    /// CPUs.
    pub cpus: usize,
    /// Memory, bytes.
    pub mem_total: u64,
    /// Memory available, bytes.
    pub mem_available: u64,
    /// GPUs (empty without NVML).
    pub gpus: Vec<GpuRecord>,
    /// Its procs' ids.
    pub procs: Vec<String>,
}

impl HostRecord {
    /// A host known only by its id and address (it did not answer), in `status`.
    pub fn bare(id: String, addr: String, status: HostStatus) -> Self {
        HostRecord {
            id,
            addr,
            hostname: String::new(),
            status,
            heartbeat_age_ms: None,
            load: [0.0; 3],
            cpus: 0,
            mem_total: 0,
            mem_available: 0,
            gpus: Vec::new(),
            procs: Vec::new(),
        }
    }
}

/// How a proc ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// In words.
    pub reason: String,
}

/// A proc: one OS process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// Its id.
    pub id: String,
    /// Its host's id.
    pub host: Option<String>,
    /// Its pid.
    pub pid: Option<u32>,
    /// `running`, `stopped`, `exited`, `failed` or `lost`.
    pub status: ProcStatus,
    /// How it ended, once it did.
    pub exit: Option<ExitRecord>,
    /// Resident memory, bytes.
    pub rss: u64,
    /// CPU time, seconds.
    pub cpu_s: f64,
    /// CPU use since the previous snapshot (or since it started), percent of one CPU.
    pub cpu_pct: f64,
    /// Threads.
    pub threads: u64,
    /// Bytes written to links.
    pub link_sent: u64,
    /// Bytes read from links.
    pub link_received: u64,
    /// Log lines of it dropped on the way.
    pub log_lines_dropped: u64,
    /// The proc mesh it belongs to.
    pub mesh: Option<String>,
    /// Its rank there.
    pub rank: Option<usize>,
    /// Its coordinates there.
    pub point: BTreeMap<String, usize>,
}

impl ProcRecord {
    /// A record with nothing measured.
    pub fn bare(id: String, status: ProcStatus) -> Self {
        Self {
            id,
            host: None,
            pid: None,
            status,
            exit: None,
            rss: 0,
            cpu_s: 0.0,
            cpu_pct: 0.0,
            threads: 0,
            link_sent: 0,
            link_received: 0,
            log_lines_dropped: 0,
            mesh: None,
            rank: None,
            point: BTreeMap::new(),
        }
    }
}

/// A mesh this process spawned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeshRecord {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// `proc` or `actor`.
    pub kind: String,
    /// The actor class (actor meshes).
    #[serde(rename = "class")]
    pub class: Option<String>,
    /// Its sizes.
    pub extent: BTreeMap<String, usize>,
    /// The proc mesh it lives on (actor meshes).
    pub proc_mesh: Option<String>,
    /// `running`, `stopped` or `failed`.
    pub status: MeshStatus,
    /// A mesh of the runtime's own.
    pub system: bool,
    /// When it was spawned (Unix seconds).
    pub created: f64,
}

/// What is being handled now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentRecord {
    /// The endpoint.
    pub endpoint: String,
    /// For how long.
    pub since_ms: f64,
}

/// The counters of one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// Messages handled.
    pub count: u64,
    /// Of which failed.
    pub errors: u64,
    /// Time spent.
    pub total_ms: f64,
    /// Durations per bucket of `bucket_bounds_us` (non-cumulative, one more: +Inf).
    pub buckets: Vec<u64>,
}

/// Why an actor failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// In words.
    pub reason: String,
    /// `user`, `resource`, `infrastructure` or `spawn`.
    #[serde(rename = "class")]
    pub class: String,
    /// The chain of causes, outermost first.
    pub cause: Vec<String>,
}

/// An actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorRecord {
    /// Its id.
    pub id: String,
    /// Its proc's id.
    pub proc: String,
    /// Its mesh's id.
    pub mesh: Option<String>,
    /// Its name (its mesh's name, for a mesh member).
    pub name: String,
    /// Its class.
    #[serde(rename = "class")]
    pub class: Option<String>,
    /// Its rank in its mesh.
    pub rank: Option<usize>,
    /// Its coordinates in its mesh.
    pub point: BTreeMap<String, usize>,
    /// `initializing`, `idle`, `processing`, `stopping`, `stopped` or `failed`.
    pub status: ActorState,
    /// One of the runtime's own actors.
    pub system: bool,
    /// Messages handled.
    pub handled: u64,
    /// Of which failed.
    pub errors: u64,
    /// Time spent handling messages.
    pub busy_ms: f64,
    /// Messages queued.
    pub queue: usize,
    /// What it handles now.
    pub current: Option<CurrentRecord>,
    /// Per endpoint.
    pub endpoints: BTreeMap<String, EndpointRecord>,
    /// Why it failed.
    pub failure: Option<FailureRecord>,
}

impl ActorRecord {
    /// A record with nothing counted: an actor known by its id, its proc's id and its
    /// state (its name empty, in no mesh).
    pub fn bare(id: String, proc: String, status: ActorState) -> Self {
        Self {
            id,
            proc,
            mesh: None,
            name: String::new(),
            class: None,
            rank: None,
            point: BTreeMap::new(),
            status,
            system: false,
            handled: 0,
            errors: 0,
            busy_ms: 0.0,
            queue: 0,
            current: None,
            endpoints: BTreeMap::new(),
            failure: None,
        }
    }

    /// The record of an actor's counters (no mesh: see the fields to fill in).
    pub fn from_stats(s: &ActorStatsSnapshot) -> Self {
        let failure = match &s.status {
            ActorStatus::Failed(reason) => Some(FailureRecord {
                reason: reason.clone(),
                class: "user".to_string(),
                cause: vec![reason.clone()],
            }),
            _ => None,
        };
        Self {
            id: s.actor_id.to_string(),
            proc: s.actor_id.proc_id().to_string(),
            mesh: None,
            name: s.actor_id.name().to_string(),
            class: None,
            rank: None,
            point: BTreeMap::new(),
            status: ActorState::from(&s.status),
            system: false,
            handled: s.handled,
            errors: s.errors,
            busy_ms: ms(s.busy),
            queue: s.queue,
            current: s.current.as_ref().map(|c| CurrentRecord {
                endpoint: c.endpoint.clone(),
                since_ms: ms(c.since),
            }),
            endpoints: s
                .endpoints
                .iter()
                .map(|(name, e)| {
                    (
                        name.clone(),
                        EndpointRecord {
                            count: e.count,
                            errors: e.errors,
                            total_ms: ms(e.total),
                            buckets: e.buckets.to_vec(),
                        },
                    )
                })
                .collect(),
            failure,
        }
    }
}

/// What one proc's agent answers: its own record and its actors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcReport {
    /// The proc.
    pub proc: ProcRecord,
    /// Its actors.
    pub actors: Vec<ActorRecord>,
}

/// What one host agent answers: its host, its procs (live and ended) and their actors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// The host.
    pub host: HostRecord,
    /// Its procs, the host agent's own first.
    pub procs: Vec<ProcRecord>,
    /// Their actors.
    pub actors: Vec<ActorRecord>,
}

/// A stack dump of one proc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackDump {
    /// The proc.
    pub proc: String,
    /// Its pid.
    pub pid: u32,
    /// `py-spy` or `faulthandler`.
    pub method: String,
    /// The stacks of every thread.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_json_shape() -> Result<(), Box<dyn std::error::Error>> {
        let mut snap = Snapshot::empty();
        let mut proc = ProcRecord::bare("p@unix:@x".into(), ProcStatus::Failed);
        proc.exit = Some(ExitRecord {
            code: None,
            signal: Some(9),
            reason: "killed".into(),
        });
        snap.procs.push(proc);
        snap.meshes.push(MeshRecord {
            id: "1".into(),
            name: "trainers".into(),
            kind: "actor".into(),
            class: Some("Trainer".into()),
            extent: BTreeMap::from([("gpus".to_string(), 2)]),
            proc_mesh: Some("procs".into()),
            status: MeshStatus::Running,
            system: false,
            created: 1.0,
        });
        let json = serde_json::to_value(&snap)?;
        assert_eq!(json["version"], 1);
        assert_eq!(json["bucket_bounds_us"].as_array().map(Vec::len), Some(25));
        assert_eq!(json["procs"][0]["exit"]["signal"], 9);
        assert!(json["procs"][0]["exit"]["code"].is_null());
        assert!(json["procs"][0]["mesh"].is_null());
        assert_eq!(json["meshes"][0]["class"], "Trainer");
        assert_eq!(json["meshes"][0]["extent"]["gpus"], 2);
        assert_eq!(json["procs"][0]["status"], "failed");
        assert_eq!(json["meshes"][0]["status"], "running");
        let keys: Vec<&str> = json
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
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
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
        // And it travels between agents.
        let bytes = bincode::serialize(&snap)?;
        let back: Snapshot = bincode::deserialize(&bytes)?;
        assert_eq!(back, snap);
        Ok(())
    }

    #[test]
    fn actor_record_from_stats() -> Result<(), Box<dyn std::error::Error>> {
        let stats = hyperactor::actor::ActorStats::with_recording(true);
        stats.begin("step");
        stats.end();
        stats.begin("step");
        let id: hyperactor::ActorId = "p@local:1/trainer[0]".parse()?;
        let record = ActorRecord::from_stats(&stats.snapshot(id, ActorStatus::Processing, 3));
        let json = serde_json::to_value(&record)?;
        assert_eq!(json["status"], "processing");
        assert_eq!(json["handled"], 1);
        assert_eq!(json["queue"], 3);
        assert_eq!(json["current"]["endpoint"], "step");
        assert_eq!(json["endpoints"]["step"]["count"], 1);
        assert_eq!(
            json["endpoints"]["step"]["buckets"]
                .as_array()
                .map(Vec::len),
            Some(26)
        );
        assert!(json["failure"].is_null());
        assert!(json["class"].is_null());
        Ok(())
    }
}
