//! The failures of mesh ranks this process heard of (as an owner), each recorded once
//! as an `actor_failed` event, and kept (bounded) for snapshots: the actors of a dead
//! proc cannot answer for themselves.

use hyperactor::sync::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::events::{self, Event};
use super::FailureRecord;
use crate::supervision::{FailureCause, MeshFailure, ProcDeath, ProcEnd};

/// How many failures are kept for snapshots.
const KEPT: usize = 100_000;

struct Failures {
    by_rank: HashMap<(u64, usize), FailureRecord>,
    /// The class given to each dead proc, so its actors' failures get the same one.
    proc_classes: HashMap<String, &'static str>,
    oom_baseline: Option<u64>,
}

fn failures() -> &'static Mutex<Failures> {
    static FAILURES: OnceLock<Mutex<Failures>> = OnceLock::new();
    FAILURES.get_or_init(|| {
        Mutex::new(Failures {
            by_rank: HashMap::new(),
            proc_classes: HashMap::new(),
            oom_baseline: super::system::oom_kills(),
        })
    })
}

/// Starts watching this machine's cgroup OOM kill count (the baseline for
/// [`class_of`]); cheap, idempotent.
pub fn init() {
    let _ = failures();
}

/// Whether the OOM killer struck in this machine's cgroup since the last look.
fn oom_since_last() -> bool {
    let now = super::system::oom_kills();
    let mut f = failures().lock();
    let rose = matches!((f.oom_baseline, now), (Some(before), Some(after)) if after > before);
    if now.is_some() {
        f.oom_baseline = now;
    }
    rose
}

/// The failure class of `cause`: `user` (an error escaped user code), `spawn`,
/// `resource` (SIGKILL while this machine's cgroup counted a new OOM kill) or
/// `infrastructure` (lost, or killed by a signal).
pub fn class_of(cause: &FailureCause) -> &'static str {
    match cause {
        FailureCause::Actor { .. } | FailureCause::Unhandled { .. } => "user",
        FailureCause::SpawnFailed { .. } => "spawn",
        FailureCause::ProcExited { .. } => "user",
        FailureCause::ProcSignaled { signal } if *signal == libc::SIGKILL && oom_since_last() => {
            "resource"
        }
        FailureCause::ProcSignaled { .. } | FailureCause::ProcLost { .. } => "infrastructure",
    }
}

/// The record of `failure`: its reason, class and cause chain (outermost first).
pub fn record_of(failure: &MeshFailure) -> FailureRecord {
    let mut cause = vec![failure.to_string()];
    let mut next = failure.caused_by.as_deref();
    while let Some(c) = next {
        cause.push(c.to_string());
        next = c.caused_by.as_deref();
    }
    let proc_class = match failure.cause {
        FailureCause::ProcExited { .. }
        | FailureCause::ProcSignaled { .. }
        | FailureCause::ProcLost { .. } => failures()
            .lock()
            .proc_classes
            .get(&failure.proc_id.to_string())
            .copied(),
        _ => None,
    };
    FailureRecord {
        reason: failure.cause.to_string(),
        class: proc_class
            .unwrap_or_else(|| class_of(&failure.cause))
            .to_string(),
        cause,
    }
}

/// This process (an owner) heard of `failure`: the first time for its rank, it is kept
/// and recorded as an `actor_failed` event.
pub fn note_mesh_failure(failure: &MeshFailure) {
    let key = (failure.mesh.id, failure.rank);
    if failures().lock().by_rank.contains_key(&key) {
        return;
    }
    let record = record_of(failure);
    {
        let mut f = failures().lock();
        if f.by_rank.len() >= KEPT {
            f.by_rank.clear();
        }
        if f.by_rank.insert(key, record.clone()).is_some() {
            return;
        }
    }
    let mut event = Event::new("actor_failed", failure.headline());
    event.mesh = Some(failure.mesh.name.clone());
    event.actor = failure.actor_id.as_ref().map(ToString::to_string);
    event.proc = Some(failure.proc_id.to_string());
    event.rank = Some(failure.rank);
    event.class = Some(record.class);
    event.cause = record.cause;
    events::record(event);
}

/// The failure kept for rank `rank` of mesh `mesh`.
pub fn mesh_failure(mesh: u64, rank: usize) -> Option<FailureRecord> {
    failures().lock().by_rank.get(&(mesh, rank)).cloned()
}

/// Records the death of a proc as a `proc_exited` or `proc_lost` event.
pub fn note_proc_death(death: &ProcDeath, host: Option<String>) {
    let kind = match death.end {
        ProcEnd::Lost { .. } => "proc_lost",
        _ => "proc_exited",
    };
    let mut event = Event::new(kind, death.to_string());
    event.proc = Some(death.proc_id.to_string());
    event.host = host;
    if !death.expected {
        let class = match &death.end {
            ProcEnd::Exited { .. } => "user",
            ProcEnd::Signaled { .. } | ProcEnd::Lost { .. } => class_of(&death.end.cause()),
        };
        {
            let mut f = failures().lock();
            if f.proc_classes.len() >= KEPT {
                f.proc_classes.clear();
            }
            f.proc_classes.insert(death.proc_id.to_string(), class);
        }
        event.class = Some(class.to_string());
        event.cause = vec![death.end.to_string()];
    }
    events::record(event);
}
