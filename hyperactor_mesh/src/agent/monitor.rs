//! Monitoring over the control path: snapshots gathered per host, stack dumps and the
//! kill action (see [`crate::monitor`]).
//!
//! The client asks each host agent it knows for a [`HostReport`]
//! ([`Control::MonitorHost`]); a host agent asks each live proc it spawned for a
//! [`ProcReport`] ([`Control::MonitorProc`]), waits for them up to a timeout (a proc
//! that does not answer appears with what the host knows of it, and no actors), adds its
//! host's stats and the procs that exited, and answers once. The client then adds what
//! only it knows: the meshes it spawned, the failures it heard of, the heartbeat ages of
//! the hosts it watches.

use hyperactor::sync::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor::{PortId, PortRef, ProcId, SendContext};

use super::control::{Control, HostService};
use super::supervise::OwnedKind;
use super::{Inner, ProcAgent};
use crate::monitor::{
    failures, stack, system, unix_now, ActorRecord, ActorState, ExitRecord, FailureRecord,
    HostRecord, HostReport, HostStatus, MeshRecord, MeshStatus, MonitorError, ProcRecord,
    ProcReport, ProcStatus, Snapshot, StackDump, StackError,
};
use crate::supervision::{ProcDeath, ProcEnd};

/// Extra time a host gets over the procs' timeout to answer the client.
const HOST_SLACK: Duration = Duration::from_millis(500);

/// Class names of the runtime's own actors (Python modules of Monarch itself).
const SYSTEM_CLASS_PREFIXES: [&str; 2] = ["monarch._src.", "monarch."];

fn is_system_class(class: &str) -> bool {
    SYSTEM_CLASS_PREFIXES.iter().any(|p| class.starts_with(p))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Coordinates of `rank` (row-major) in `labels` × `sizes`.
fn point_of(labels: &[String], sizes: &[usize], rank: usize) -> BTreeMap<String, usize> {
    let mut point = BTreeMap::new();
    let mut rest = rank;
    for (label, &size) in labels.iter().zip(sizes).rev() {
        let size = size.max(1);
        point.insert(label.clone(), rest % size);
        rest /= size;
    }
    point
}

/// The status and exit of a proc that ended as `death` says.
fn ended(death: &ProcDeath) -> (ProcStatus, ExitRecord) {
    let status = match (&death.end, death.expected) {
        (_, true) => ProcStatus::Stopped,
        (ProcEnd::Lost { .. }, false) => ProcStatus::Lost,
        (ProcEnd::Exited { code: 0 }, false) => ProcStatus::Exited,
        (_, false) => ProcStatus::Failed,
    };
    let (code, signal) = match death.end {
        ProcEnd::Exited { code } => (Some(code), None),
        ProcEnd::Signaled { signal } => (None, Some(signal)),
        ProcEnd::Lost { .. } => (None, None),
    };
    let exit = ExitRecord {
        code,
        signal,
        reason: death.end.to_string(),
    };
    (status, exit)
}

fn dead_record(death: &ProcDeath, host: Option<String>) -> ProcRecord {
    let (status, exit) = ended(death);
    let mut record = ProcRecord::bare(death.proc_id.to_string(), status);
    record.host = host;
    record.pid = (death.pid != 0).then_some(death.pid);
    record.exit = Some(exit);
    record
}

/// The longest a host waits for one of its procs to answer a monitor request.
const PROC_ANSWER_DEADLINE: Duration = Duration::from_millis(300);

/// The longest a snapshot waits for a host (which waits for its procs first).
const HOST_ANSWER_DEADLINE: Duration = Duration::from_millis(1000);

/// The wait for a host that did not answer the previous snapshot.
const SILENT_HOST_WAIT: Duration = Duration::from_millis(100);

/// The hosts that did not answer their last monitor request.
fn silent_hosts() -> &'static Mutex<HashSet<ProcId>> {
    static SILENT: std::sync::OnceLock<Mutex<HashSet<ProcId>>> = std::sync::OnceLock::new();
    SILENT.get_or_init(Default::default)
}

impl Inner {
    /// This proc and its actors, as they are now.
    pub(super) fn proc_report(&self) -> ProcReport {
        let stats = system::proc_stats();
        let (sent, received) = hyperactor::channel::link_bytes();
        let mut proc = ProcRecord::bare(self.proc.proc_id().to_string(), ProcStatus::Running);
        proc.host = match (&self.host, &self.spawned_by) {
            (Some(_), _) => Some(self.proc.proc_id().to_string()),
            (None, host) => host.as_ref().map(ToString::to_string),
        };
        proc.pid = Some(std::process::id());
        proc.rss = stats.rss;
        proc.cpu_s = stats.cpu_s;
        proc.cpu_pct = stats.cpu_pct;
        proc.threads = stats.threads;
        proc.link_sent = sent;
        proc.link_received = received;
        proc.log_lines_dropped = crate::output::dropped_lines();
        // Both copied: no lock is held across the two.
        let actor_stats = self.proc.actor_stats();
        let local = self.local.snapshot();
        let actors = actor_stats
            .iter()
            .map(|s| {
                let mut record = ActorRecord::from_stats(s);
                match local.get(s.actor_id.name()) {
                    Some(a)
                        if a.handle
                            .as_ref()
                            .is_some_and(|h| h.actor_id() == &s.actor_id) =>
                    {
                        record.mesh = Some(a.mesh.id.to_string());
                        record.name = a.mesh.name.clone();
                        record.class = Some(a.mesh.class.clone());
                        record.rank = Some(a.rank as usize);
                        record.system = is_system_class(&a.mesh.class);
                    }
                    _ => record.system = true,
                }
                record
            })
            .collect();
        ProcReport { proc, actors }
    }

    /// This host (this agent must have one): its stats, its procs and their actors,
    /// asking each live proc with `timeout`.
    pub(super) async fn host_report(
        self: &Arc<Self>,
        host: &HostService,
        timeout: Duration,
    ) -> HostReport {
        let me = self.proc.proc_id().to_string();
        let (live, dead) = {
            let state = host.state.lock();
            let live: Vec<crate::host::ProcHandle> = state.handles.values().cloned().collect();
            let dead: Vec<ProcDeath> = state.dead.values().cloned().collect();
            (live, dead)
        };
        // A proc's agent answers from the runtime's threads in milliseconds; one that
        // does not answer soon (frozen, or overloaded) must not hold up the host's
        // answer: it is reported with what the host knows.
        let timeout = timeout.min(PROC_ANSWER_DEADLINE);
        let asks = live.iter().map(|handle| {
            let proc = handle.proc_id().clone();
            let (port, receiver) = self.client.open_once_port::<ProcReport>();
            self.send_control(
                &proc,
                &Control::MonitorProc {
                    reply: port.port_id().clone(),
                },
            );
            let me = me.clone();
            async move {
                // A proc that dies meanwhile is not waited for: it is reported dead.
                let answer = tokio::select! {
                    answer = tokio::time::timeout(timeout, receiver.recv()) => {
                        answer.ok().and_then(Result::ok)
                    }
                    status = handle.wait() => {
                        let expected = host.state.lock().expected.contains(&proc);
                        let death = ProcDeath {
                            proc_id: proc.clone(),
                            pid: handle.pid(),
                            end: ProcEnd::from_status(&status),
                            expected,
                        };
                        return ProcReport {
                            proc: dead_record(&death, Some(me)),
                            actors: Vec::new(),
                        };
                    }
                };
                match answer {
                    Some(mut report) => {
                        report.proc.host = Some(me);
                        report
                    }
                    None => {
                        let mut record = ProcRecord::bare(proc.to_string(), ProcStatus::Running);
                        record.host = Some(me);
                        record.pid = Some(handle.pid());
                        ProcReport {
                            proc: record,
                            actors: Vec::new(),
                        }
                    }
                }
            }
        });
        let answers = futures::future::join_all(asks).await;
        let own = self.proc_report();
        let mut procs = vec![own.proc];
        let mut actors = own.actors;
        for answer in answers {
            procs.push(answer.proc);
            actors.extend(answer.actors);
        }
        procs.extend(dead.iter().map(|d| dead_record(d, Some(me.clone()))));
        let stats = system::host_stats();
        let record = HostRecord {
            id: me.clone(),
            addr: self.proc.proc_id().addr().to_string(),
            hostname: stats.hostname,
            status: HostStatus::Alive,
            heartbeat_age_ms: None,
            load: stats.load,
            cpus: stats.cpus,
            mem_total: stats.mem_total,
            mem_available: stats.mem_available,
            gpus: system::gpus(),
            procs: procs.iter().map(|p| p.id.clone()).collect(),
        };
        HostReport {
            host: record,
            procs,
            actors,
        }
    }

    /// [`Control::MonitorProc`]: a report of this proc, sent to `reply`.
    pub(super) fn on_monitor_proc(&self, reply: PortId) {
        let report = self.proc_report();
        if let Err(e) = PortRef::<ProcReport>::attest(reply).send(&self.client, report) {
            tracing::warn!(agent = %self.id, "cannot answer a monitor request: {e}");
        }
    }

    /// [`Control::MonitorHost`]: a report of this host (each proc gets `timeout_ms`),
    /// or why there is none, sent to `reply`.
    pub(super) fn on_monitor_host(self: &Arc<Self>, timeout_ms: u64, reply: PortId) {
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            let result = match agent.host.clone() {
                Some(host) => Ok(agent
                    .host_report(&host, Duration::from_millis(timeout_ms))
                    .await),
                None => Err(MonitorError::NotAHost {
                    agent: agent.id.to_string(),
                }),
            };
            let port = PortRef::<Result<HostReport, MonitorError>>::attest(reply);
            if let Err(e) = port.send(&agent.client, result) {
                tracing::warn!(agent = %agent.id, "cannot answer a monitor request: {e}");
            }
        });
    }

    /// [`Control::StackDump`]: the stacks of this process's threads (within
    /// `timeout_ms`), sent to `reply`.
    pub(super) fn on_stack_dump(self: &Arc<Self>, timeout_ms: u64, reply: PortId) {
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            let result = agent
                .dump_own_stack(Duration::from_millis(timeout_ms))
                .await;
            let port = PortRef::<Result<StackDump, MonitorError>>::attest(reply);
            if let Err(e) = port.send(&agent.client, result) {
                tracing::warn!(agent = %agent.id, "cannot answer a stack request: {e}");
            }
        });
    }

    /// [`Control::KillProc`]: this host kills `proc` (an admin action), if it is one of
    /// its procs; an agent without a host ignores it.
    pub(super) fn on_kill_proc(&self, proc: &ProcId, reason: &str) {
        if let Some(host) = &self.host {
            let handle = host.state.lock().handles.get(proc).cloned();
            if let Some(handle) = handle {
                tracing::warn!(agent = %self.id, "killing proc {proc}: {reason}");
                handle.kill_lost(format!("killed on request: {reason}"));
            }
        }
    }

    async fn dump_own_stack(&self, timeout: Duration) -> Result<StackDump, MonitorError> {
        let proc = self.proc.proc_id().to_string();
        tokio::task::spawn_blocking(move || stack::dump_self(&proc, timeout))
            .await
            .map_err(|e| StackError::Task(e.to_string()))?
            .map_err(MonitorError::from)
    }

    /// Asks `port`'s agent (via `control`) and waits up to `timeout` for a `T`.
    async fn ask<T: hyperactor::message::Message>(
        &self,
        proc: &ProcId,
        timeout: Duration,
        control: impl FnOnce(PortId) -> Control,
    ) -> Result<T, MonitorError> {
        let (port, receiver) = self.client.open_once_port::<T>();
        self.send_control(proc, &control(port.port_id().clone()));
        match tokio::time::timeout(timeout, receiver.recv()).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(MonitorError::NoReply {
                target: proc.to_string(),
                reason: e.to_string(),
            }),
            Err(_) => Err(MonitorError::NoAnswer {
                target: proc.to_string(),
                timeout,
            }),
        }
    }

    /// The host agents this process knows: its own (if it has one), its own host, the
    /// hosts of the procs it talks to, and the hosts it watches.
    fn known_hosts(&self) -> Vec<ProcId> {
        let me = self.proc.proc_id();
        let mut hosts: HashSet<ProcId> = self.supervisor.known_hosts();
        hosts.extend(self.liveness.known_hosts());
        hosts.extend(self.spawned_by.iter().cloned());
        hosts.remove(me);
        let mut hosts: Vec<ProcId> = hosts.into_iter().collect();
        hosts.sort();
        hosts
    }

    /// The meshes this process spawned, and fills in what they say of `procs` and
    /// `actors` (proc mesh ranks and points; actors of dead procs, from the failures
    /// heard of).
    fn owned_meshes(
        &self,
        procs: &mut Vec<ProcRecord>,
        actors: &mut Vec<ActorRecord>,
    ) -> Vec<MeshRecord> {
        // Copied out: the monitor's records are built with no agent lock held.
        let (owned, dead) = self.supervisor.snapshot();
        let mut meshes = Vec::new();
        let proc_index: HashMap<String, usize> = procs
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.clone(), i))
            .collect();
        // Proc meshes by member proc, for the actor meshes on them.
        let mut proc_mesh_of: HashMap<ProcId, String> = HashMap::new();
        for m in owned.values() {
            if matches!(m.kind, OwnedKind::Procs) {
                for (t, _) in &m.ranks {
                    proc_mesh_of.insert(t.proc.clone(), m.mesh.name.clone());
                }
            }
        }
        let actor_index: HashMap<String, usize> = actors
            .iter()
            .enumerate()
            .map(|(i, a)| (a.id.clone(), i))
            .collect();
        let mut extra_procs = Vec::new();
        let mut extra_actors = Vec::new();
        for m in owned.values() {
            let (labels, sizes) = (&m.view.labels, &m.view.sizes);
            let mut failed = false;
            for (rank, (target, pid)) in m.ranks.iter().enumerate() {
                let death = dead.get(&target.proc).map(|d| &d.death);
                failed |= death.is_some_and(|d| !d.expected);
                let point = point_of(labels, sizes, rank);
                match &m.kind {
                    OwnedKind::Procs => {
                        let id = target.proc.to_string();
                        let record = match proc_index.get(&id) {
                            Some(&i) => procs.get_mut(i),
                            None => {
                                let mut record = match death {
                                    Some(d) => dead_record(
                                        d,
                                        target.host.as_ref().map(ToString::to_string),
                                    ),
                                    None => ProcRecord::bare(id.clone(), ProcStatus::Running),
                                };
                                record.pid = record.pid.or(*pid);
                                record.host = target.host.as_ref().map(ToString::to_string);
                                extra_procs.push(record);
                                extra_procs.last_mut()
                            }
                        };
                        if let Some(record) = record {
                            record.mesh = Some(m.mesh.name.clone());
                            record.rank = Some(rank);
                            record.point = point;
                        }
                    }
                    OwnedKind::Actors { actor } => {
                        let Ok(id) = target.proc.actor_id(actor, 0) else {
                            continue;
                        };
                        let id = id.to_string();
                        let heard = failures::mesh_failure(m.mesh.id, rank);
                        failed |= heard.is_some();
                        match actor_index.get(&id) {
                            Some(&i) => {
                                if let Some(a) = actors.get_mut(i) {
                                    a.point = point;
                                    if a.failure.is_none() {
                                        a.failure = heard;
                                    }
                                }
                            }
                            None => {
                                let (status, failure) = match (death, heard) {
                                    (_, Some(f)) => (ActorState::Failed, Some(f)),
                                    (Some(d), None) if d.expected => (ActorState::Stopped, None),
                                    (Some(d), None) => (
                                        ActorState::Failed,
                                        Some(FailureRecord {
                                            reason: d.to_string(),
                                            class: "infrastructure".to_string(),
                                            cause: vec![d.to_string()],
                                        }),
                                    ),
                                    (None, None) if m.stopped => (ActorState::Stopped, None),
                                    // Its proc did not answer (yet): nothing known.
                                    (None, None) => continue,
                                };
                                extra_actors.push(ActorRecord {
                                    mesh: Some(m.mesh.id.to_string()),
                                    name: m.mesh.name.clone(),
                                    class: Some(m.mesh.class.clone()),
                                    rank: Some(rank),
                                    point,
                                    system: is_system_class(&m.mesh.class),
                                    failure,
                                    ..ActorRecord::bare(id, target.proc.to_string(), status)
                                });
                            }
                        }
                    }
                }
            }
            let (kind, class, proc_mesh) = match &m.kind {
                OwnedKind::Procs => ("proc", None, None),
                OwnedKind::Actors { .. } => (
                    "actor",
                    Some(m.mesh.class.clone()),
                    m.ranks
                        .first()
                        .and_then(|(t, _)| proc_mesh_of.get(&t.proc).cloned()),
                ),
            };
            let status = match (m.stopped, failed) {
                (true, _) => MeshStatus::Stopped,
                (false, true) => MeshStatus::Failed,
                (false, false) => MeshStatus::Running,
            };
            meshes.push(MeshRecord {
                id: m.mesh.id.to_string(),
                name: m.mesh.name.clone(),
                kind: kind.to_string(),
                system: class.as_deref().is_some_and(is_system_class),
                class,
                extent: labels.iter().cloned().zip(sizes.iter().copied()).collect(),
                proc_mesh,
                status,
                created: m.created,
            });
        }
        procs.extend(extra_procs);
        actors.extend(extra_actors);
        meshes.sort_by(|a, b| a.created.total_cmp(&b.created));
        meshes
    }
}

impl ProcAgent {
    /// Gathers a snapshot of every host this process knows (its own host first, when it
    /// is a host agent), their procs and actors, and the meshes this process spawned.
    /// Each host gets `timeout` (each of its procs a little less); one that does not
    /// answer appears with what this process knows, and never holds up the answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the requests sent are answered to nobody.
    pub async fn monitor_snapshot(&self, timeout: Duration) -> Snapshot {
        let started = Instant::now();
        let inner = &self.inner;
        failures::init();
        let proc_timeout = timeout.saturating_sub(HOST_SLACK).max(timeout / 2);
        let mut snapshot = Snapshot::empty();
        let remote = inner.known_hosts();
        let asks = remote.iter().map(|host| {
            let host = host.clone();
            async move {
                if let Some(why) = inner.lost_reason(&host) {
                    return (
                        host,
                        Err(MonitorError::HostLost {
                            reason: why.to_string(),
                        }),
                    );
                }
                // A host that did not answer the last snapshot (its process is gone or
                // frozen, and no heartbeat judged it lost yet) gets a short wait, so it
                // does not slow every snapshot down; one that answers gets its time again.
                let wait = if silent_hosts().lock().contains(&host) {
                    SILENT_HOST_WAIT
                } else {
                    timeout.min(HOST_ANSWER_DEADLINE)
                };
                let answer = inner
                    .ask::<Result<HostReport, MonitorError>>(&host, wait, |reply| {
                        Control::MonitorHost {
                            timeout_ms: millis(proc_timeout),
                            reply,
                        }
                    })
                    .await
                    .and_then(|r| r);
                if answer.is_ok() {
                    silent_hosts().lock().remove(&host);
                } else {
                    silent_hosts().lock().insert(host.clone());
                }
                (host, answer)
            }
        });
        // This process's own host (when it holds one), or just its own proc.
        let own = async {
            match &inner.host {
                Some(host) => {
                    let report = inner.host_report(host, proc_timeout).await;
                    (Some(report.host), report.procs, report.actors)
                }
                None => {
                    let report = inner.proc_report();
                    (None, vec![report.proc], report.actors)
                }
            }
        };
        let (answers, (own_host, own_procs, own_actors)) =
            futures::future::join(futures::future::join_all(asks), own).await;
        snapshot.hosts.extend(own_host);
        snapshot.procs.extend(own_procs);
        snapshot.actors.extend(own_actors);
        let acks = inner.liveness.acks();
        for (host, answer) in answers {
            let age = acks.get(&host).map(|at| crate::monitor::ms(at.elapsed()));
            match answer {
                Ok(mut report) => {
                    report.host.heartbeat_age_ms = age;
                    snapshot.hosts.push(report.host);
                    snapshot.procs.extend(report.procs);
                    snapshot.actors.extend(report.actors);
                }
                Err(why) => {
                    let lost = inner.lost_reason(&host).is_some();
                    tracing::debug!(agent = %inner.id, "host {host} did not answer a snapshot: {why}");
                    let mut record = HostRecord::bare(
                        host.to_string(),
                        host.addr().to_string(),
                        if lost {
                            HostStatus::Lost
                        } else {
                            HostStatus::Alive
                        },
                    );
                    record.heartbeat_age_ms = age;
                    snapshot.hosts.push(record);
                }
            }
        }
        let mut seen = HashSet::new();
        snapshot.procs.retain(|p| seen.insert(p.id.clone()));
        let mut seen = HashSet::new();
        snapshot.actors.retain(|a| seen.insert(a.id.clone()));
        let (mut procs, mut actors) = (
            std::mem::take(&mut snapshot.procs),
            std::mem::take(&mut snapshot.actors),
        );
        snapshot.meshes = inner.owned_meshes(&mut procs, &mut actors);
        // Procs that a lost host could not report: what this process knows of them.
        for host in snapshot.hosts.iter_mut() {
            for p in procs.iter().filter(|p| p.host.as_deref() == Some(&host.id)) {
                if !host.procs.contains(&p.id) {
                    host.procs.push(p.id.clone());
                }
            }
        }
        snapshot.procs = procs;
        snapshot.actors = actors;
        snapshot.time = unix_now();
        snapshot.collected_ms = crate::monitor::ms(started.elapsed());
        snapshot
    }

    /// The stacks of every thread of `proc` (this process's own proc included), by
    /// `py-spy` when it is on `PATH`, else by Python's `faulthandler` (see
    /// [`crate::monitor::stack`]).
    ///
    /// # Errors
    ///
    /// If the proc does not answer within `timeout`, or cannot dump its stacks.
    pub async fn stack_dump(
        &self,
        proc: &ProcId,
        timeout: Duration,
    ) -> Result<StackDump, MonitorError> {
        if proc == self.inner.proc.proc_id() {
            return self.inner.dump_own_stack(timeout).await;
        }
        self.inner
            .ask::<Result<StackDump, MonitorError>>(proc, timeout + HOST_SLACK, |reply| {
                Control::StackDump {
                    timeout_ms: millis(timeout),
                    reply,
                }
            })
            .await
            .and_then(|r| r)
    }

    /// Kills `proc` (an admin action): its host kills its process group, and its death
    /// is reported as lost, "killed on request", to whoever watches it.
    ///
    /// # Errors
    ///
    /// If no host of `proc` is known.
    pub fn kill_proc(&self, proc: &ProcId, reason: &str) -> Result<(), MonitorError> {
        let host = self.inner.supervisor.any_host_of(proc);
        let Some(host) = host else {
            return Err(MonitorError::UnknownHost {
                proc: proc.to_string(),
            });
        };
        self.inner.send_control(
            &host,
            &Control::KillProc {
                proc: proc.clone(),
                reason: reason.to_string(),
            },
        );
        Ok(())
    }
}
