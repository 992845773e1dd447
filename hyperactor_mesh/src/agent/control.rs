//! The control port: proc deaths reported by hosts, and — on an agent that has a
//! [`Host`] — requests to spawn, watch and stop procs.
//!
//! A host agent tells every agent that watches a proc ([`Control::WatchProcs`]) when
//! that proc dies ([`Control::ProcDied`]), whoever asked: the owners of meshes on it and
//! the processes with calls to it. It also kills the procs owned by an actor whose own
//! proc died, so nothing outlives its owner (no orphans). It forwards the output of the
//! procs it spawned to their owners ([`Control::Output`], see [`super::output`]), ahead
//! of their death reports.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hyperactor::message::{Envelope, Serialized};
use hyperactor::{ActorId, PortId, PortRef, ProcId, SendContext};
use serde::{Deserialize, Serialize};

use super::lock::{Rank, Ranked};
use super::{control_port, CastTarget, Inner};
use crate::bootstrap::ProcCommands;
use crate::cast::codec::MeshInfo;
use crate::error::{RemoteError, RemoteErrorKind};
use crate::host::{Host, ProcExit, ProcHandle};
use crate::output::{OutputBatch, OutputOptions};
use crate::supervision::{MeshFailure, ProcDeath, ProcEnd};
use hyperactor::channel::log_limit::LogLimit;

/// A control message (one bincode part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Control {
    /// A proc died (from its host to the agents that watch it).
    ProcDied(ProcDeath),
    /// Asks a host agent to report the deaths of `procs` to `subscriber` (an agent's
    /// control port); deaths that already happened are reported at once.
    WatchProcs {
        /// The procs to watch.
        procs: Vec<ProcId>,
        /// Where to report.
        subscriber: PortId,
    },
    /// Asks a host agent to spawn procs.
    SpawnProcs(Box<SpawnProcsRequest>),
    /// Asks a host agent to stop procs (each gets `timeout_ms`, then is killed); their
    /// deaths are then expected, not failures.
    StopProcs {
        /// The procs.
        procs: Vec<ProcId>,
        /// Why.
        reason: String,
        /// How long each gets.
        timeout_ms: u64,
        /// Where to send `()` once all are reaped.
        reply: Option<PortId>,
    },
    /// Asks an agent for its singleton `name` ([`super::ProcAgent::singleton`]), made
    /// from `parts` if it does not exist yet; the answer, a
    /// `Result<ActorMeshRef, RemoteError>` (of kind [`RemoteErrorKind::Singleton`]),
    /// goes to `reply`.
    Singleton {
        /// The singleton's name.
        name: String,
        /// Its actor type, as users know it.
        class: String,
        /// What the foreign spawner needs to create it.
        parts: Vec<bytes::Bytes>,
        /// Where the answer goes.
        reply: PortId,
    },
    /// Tells a host agent that `proc` cannot be reached: it kills it as lost.
    Unreachable {
        /// The proc.
        proc: ProcId,
        /// Why.
        reason: String,
    },
    /// A heartbeat from the agent whose control port is `from` (see
    /// [`super::liveness`]): any agent answers with [`Control::HeartbeatAck`]; a host
    /// agent also renews the lease of `from`'s proc on the procs it owns there.
    Heartbeat {
        /// The sender's control port.
        from: PortId,
    },
    /// The answer to a [`Control::Heartbeat`], from the agent of `proc`.
    HeartbeatAck {
        /// The answering agent's proc.
        proc: ProcId,
    },
    /// Tells a proc that its host was given up for lost: it exits at once, so that
    /// nothing of a lost host keeps running unseen.
    Abandon {
        /// Why.
        reason: String,
    },
    /// Asks a worker's host agent to stop every proc of its host (each gets
    /// `timeout_ms`, then is killed) and then end its worker (see
    /// [`super::AgentOptions::on_end`]). The answer, a `Result<(), RemoteError>`, goes
    /// to `reply` once the procs are reaped, before the worker ends; a host that is not
    /// a worker answers with an error ([`RemoteErrorKind::NotAWorker`]) and keeps
    /// running.
    EndHost {
        /// Why.
        reason: String,
        /// How long each proc gets to stop.
        timeout_ms: u64,
        /// Where the answer goes.
        reply: PortId,
    },
    /// Lines written by procs spawned for the receiving agent's process (from their
    /// host agent; see [`crate::output`]).
    Output(OutputBatch),
    /// Asks an agent for a [`crate::monitor::ProcReport`] of its proc, sent to `reply`.
    MonitorProc {
        /// Where the report goes.
        reply: PortId,
    },
    /// Asks a host agent for a
    /// `Result<`[`crate::monitor::HostReport`]`, `[`crate::monitor::MonitorError`]`>`,
    /// giving each of its procs `timeout_ms` to answer.
    MonitorHost {
        /// How long each proc gets.
        timeout_ms: u64,
        /// Where the report goes.
        reply: PortId,
    },
    /// Asks an agent for the stacks of its process's threads: a
    /// `Result<`[`crate::monitor::StackDump`]`, `[`crate::monitor::MonitorError`]`>`
    /// sent to `reply`.
    StackDump {
        /// How long the dump may take.
        timeout_ms: u64,
        /// Where the dump goes.
        reply: PortId,
    },
    /// Asks a host agent to kill `proc` (an admin action); its death is reported as
    /// lost, killed on request.
    KillProc {
        /// The proc.
        proc: ProcId,
        /// Why.
        reason: String,
    },
    /// From the agent of a stopping proc to the agent of `owner`'s process: the proc
    /// refused to spawn an actor of a mesh `owner` owns (see
    /// [`super::ProcAgent::close_spawns`]). The receiving agent reports `failure` to
    /// `owner` unless its process stopped that proc or that mesh (MSUP-3).
    SpawnRefused {
        /// The owner of the actor's mesh.
        owner: ActorId,
        /// The refusal, as the failure the owner gets if it is one.
        failure: MeshFailure,
    },
    /// A heartbeat to relay (see [`super::liveness`]): the receiver takes it as a
    /// heartbeat from `client`'s agent (a host agent renews `client`'s lease), answers
    /// `ack_to` with [`Control::HeartbeatAcks`], which says when the hosts below it
    /// (its members, and theirs) last answered it, and then passes the heartbeat on: a
    /// [`Control::RelayedHeartbeat`] to each member with no members of its own, a
    /// [`Control::HeartbeatRelay`] (answered to the receiver) to each other.
    HeartbeatRelay {
        /// The proc of the monitoring agent.
        client: ProcId,
        /// Where the answer goes: the monitoring agent's control port, or the control
        /// port of the relay one level up.
        ack_to: PortId,
        /// Hosts below that answered longer ago than this are named in the answer;
        /// the others are answered for together.
        quiet_ms: u64,
        /// The hosts to relay the heartbeat to.
        members: RelayMembers,
    },
    /// A heartbeat relayed on behalf of `client`'s agent: a host agent renews the lease
    /// of `client` on the procs it owns there, and every agent answers `ack_to` (the
    /// relay's control port) with [`Control::HeartbeatAck`].
    RelayedHeartbeat {
        /// The proc of the agent that sent the heartbeat to the relay.
        client: ProcId,
        /// Where the answer goes.
        ack_to: PortId,
    },
    /// The answer to a [`Control::HeartbeatRelay`], from the relay's agent (`proc`).
    HeartbeatAcks {
        /// The relay's proc.
        proc: ProcId,
        /// The proc of the monitoring agent the heartbeat came from.
        client: ProcId,
        /// The relay tree answered for ([`RelayMembers`]).
        tree: u64,
        /// When the hosts below the relay last answered, as far as it knows.
        answer: RelayAnswer,
    },
}

/// The hosts a relay passes a heartbeat on to ([`Control::HeartbeatRelay`]). A relay
/// keeps the members it was last given by each sender, so a sender names them only
/// when they change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelayMembers {
    /// The members given with tree `tree` before.
    Same {
        /// The tree's number (the monitoring agent's).
        tree: u64,
    },
    /// New members, for tree `tree`.
    New {
        /// The tree's number (the monitoring agent's).
        tree: u64,
        /// The hosts to relay the heartbeat to.
        members: Vec<RelayTarget>,
    },
}

impl RelayMembers {
    /// The tree's number.
    pub fn tree(&self) -> u64 {
        match self {
            Self::Same { tree } | Self::New { tree, .. } => *tree,
        }
    }
}

/// A relay's answer ([`Control::HeartbeatAcks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelayAnswer {
    /// The relay does not know the members of the tree it was asked to relay to (it
    /// was given them by another sender, or forgot them): it relayed nothing, and
    /// needs them named again.
    UnknownTree,
    /// When the hosts below the relay last answered it.
    Below {
        /// Every host below not in `quiet` answered within this many milliseconds
        /// (`None`: every host is in `quiet`).
        within_ms: Option<u64>,
        /// The hosts that answered longer ago than the heartbeat's `quiet_ms`, or
        /// never.
        quiet: Vec<MemberAnswer>,
    },
}

/// A host a relayed heartbeat goes to ([`Control::HeartbeatRelay`]), and the hosts it
/// relays the heartbeat on to (none: it only answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayTarget {
    /// The host's proc (its agent relays or answers).
    pub proc: ProcId,
    /// The hosts it relays the heartbeat to.
    pub members: Vec<RelayTarget>,
}

impl RelayTarget {
    /// A host that only answers.
    pub fn leaf(proc: ProcId) -> Self {
        Self {
            proc,
            members: Vec::new(),
        }
    }

    /// Every host below this one (not this one), depth first.
    pub fn below(&self) -> impl Iterator<Item = &ProcId> + '_ {
        let mut stack: Vec<&RelayTarget> = self.members.iter().rev().collect();
        std::iter::from_fn(move || {
            let next = stack.pop()?;
            stack.extend(next.members.iter().rev());
            Some(&next.proc)
        })
    }
}

/// When a member of a relayed heartbeat last answered its relay
/// ([`Control::HeartbeatAcks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAnswer {
    /// The member's proc.
    pub proc: ProcId,
    /// How long before the relay's answer the member last answered it, in milliseconds;
    /// `None` if it has not answered yet.
    pub age_ms: Option<u64>,
}

/// A request to spawn `count` procs named `name` running `commands`, owned by `owner`.
/// The host sends a `Result<Vec<ProcInfo>, RemoteError>` to `reply` (of kind
/// [`RemoteErrorKind::SpawnProcs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnProcsRequest {
    /// The procs' name.
    pub name: String,
    /// How many.
    pub count: usize,
    /// The bootstrap command each runs: one for all, or one per rank (`count` of them).
    pub commands: ProcCommands,
    /// The actor that owns them: when its proc dies, they are killed.
    pub owner: ActorId,
    /// The mesh they form (for logs).
    pub mesh: MeshInfo,
    /// Where the result goes.
    pub reply: PortId,
    /// How the host handles their output.
    pub output: OutputOptions,
}

/// A proc of a proc mesh: what casting to it and supervising it take.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcInfo {
    /// Its rank in its spawn.
    pub rank: usize,
    /// The proc.
    pub proc_id: ProcId,
    /// Its OS process id.
    pub pid: u32,
    /// The proc of the host agent that spawned it (`None`: no host spawned it).
    pub host: Option<ProcId>,
}

impl ProcInfo {
    /// This proc as the receiver at `index` of a cast.
    pub fn target(&self, index: u32) -> CastTarget {
        CastTarget {
            index,
            proc: self.proc_id.clone(),
            host: self.host.clone(),
        }
    }
}

static BAD_CONTROL: LogLimit = LogLimit::per_second();

#[derive(Default)]
pub(super) struct HostState {
    /// Procs that own procs here without being procs of this host (remote clients),
    /// and when their agent's last heartbeat arrived (see [`super::liveness`]).
    pub(super) leases: HashMap<ProcId, std::time::Instant>,
    pub(super) handles: HashMap<ProcId, ProcHandle>,
    subscribers: HashMap<ProcId, HashSet<PortId>>,
    pub(super) owners: HashMap<ProcId, ActorId>,
    pub(super) expected: HashSet<ProcId>,
    pub(super) dead: HashMap<ProcId, ProcDeath>,
}

/// The host side of an agent that has a [`Host`].
pub(super) struct HostService {
    host: Host,
    pub(super) state: Ranked<HostState>,
    /// Requests to flush the output of the host's procs (see [`super::output`]).
    pub(super) flush_requests: tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<()>>,
    flushes: Ranked<Option<super::output::FlushRequests>>,
}

impl HostService {
    pub(super) fn new(host: Host) -> Self {
        let (flush_requests, flushes) = tokio::sync::mpsc::unbounded_channel();
        Self {
            host,
            state: Ranked::new(Rank::Component),
            flush_requests,
            flushes: Ranked::holding(Rank::Component, Some(flushes)),
        }
    }

    pub(super) fn host(&self) -> &Host {
        &self.host
    }

    /// Stops every proc of the host (their deaths are expected, not failures).
    pub(super) async fn shutdown(&self, timeout: Duration) {
        {
            let mut state = self.state.lock();
            let procs: Vec<ProcId> = state.handles.keys().cloned().collect();
            state.expected.extend(procs);
        }
        self.host.shutdown(timeout).await;
        // The procs' last lines go out before this returns.
        self.flush_output().await;
    }

    /// Starts the task that forwards the host's output and turns each reaped proc into
    /// death reports (see [`super::output`]).
    pub(super) fn start(self: &Arc<Self>, agent: &Arc<Inner>) {
        let Some(flushes) = self.flushes.lock().take() else {
            return;
        };
        let service = Arc::clone(self);
        tokio::spawn(super::output::run_host_events(
            service,
            Arc::downgrade(agent),
            flushes,
        ));
    }

    /// Subscribes `subscriber` to the deaths of `procs`; returns the deaths already
    /// known (not subscribed to).
    fn subscribe(&self, procs: Vec<ProcId>, subscriber: &PortId) -> Vec<ProcDeath> {
        let mut known = Vec::new();
        let mut state = self.state.lock();
        for proc in procs {
            match state.dead.get(&proc) {
                Some(death) => known.push(death.clone()),
                None => {
                    state
                        .subscribers
                        .entry(proc)
                        .or_default()
                        .insert(subscriber.clone());
                }
            }
        }
        known
    }

    /// Kills `proc`, which cannot be reached (`reason`), as lost; false if it is not a
    /// proc of this host or was killed already.
    fn kill_unreachable(&self, proc: &ProcId, reason: &str) -> bool {
        let handle = self.state.lock().handles.get(proc).cloned();
        handle.is_some_and(|handle| {
            handle.kill_lost(format!("messages to it could not be delivered ({reason})"))
        })
    }

    /// A proc of the host exited (its output was sent before): report its death.
    pub(super) fn on_exit(&self, agent: &Inner, exit: ProcExit) {
        let (death, subscribers, orphans) = {
            let mut state = self.state.lock();
            let death = ProcDeath {
                proc_id: exit.proc_id.clone(),
                pid: exit.pid,
                end: ProcEnd::from_status(&exit.status),
                expected: state.expected.contains(&exit.proc_id),
            };
            state.dead.insert(exit.proc_id.clone(), death.clone());
            state.handles.remove(&exit.proc_id);
            let subscribers = state.subscribers.remove(&exit.proc_id).unwrap_or_default();
            // No orphans: procs owned by actors of the dead proc go too.
            let orphans: Vec<ProcHandle> = state
                .owners
                .iter()
                .filter(|(_, owner)| owner.proc_id() == &exit.proc_id)
                .filter_map(|(proc, _)| state.handles.get(proc).cloned())
                .collect();
            (death, subscribers, orphans)
        };
        for orphan in orphans {
            orphan.kill_lost(format!("its owner's proc {} {}", death.proc_id, death.end));
        }
        let notice = Control::ProcDied(death);
        for subscriber in subscribers {
            agent.send_control_to(subscriber, &notice);
        }
    }
}

impl Inner {
    /// Sends `control` to the agent of `proc`.
    pub(super) fn send_control(&self, proc: &ProcId, control: &Control) {
        self.send_control_to(control_port(proc), control);
    }

    pub(super) fn send_control_to(&self, port: PortId, control: &Control) {
        match Serialized::encode(control) {
            Ok(payload) => self.post(&self.id, port, None, payload.into_parts()),
            Err(e) => tracing::error!(agent = %self.id, "cannot encode {control:?}: {e}"),
        }
    }

    /// A message arrived on the control port (on the delivering task).
    pub(super) fn on_control(self: &Arc<Self>, envelope: Envelope) {
        let control: Control = match envelope.payload.decode() {
            Ok(control) => control,
            Err(e) => {
                if let Some(suppressed) = BAD_CONTROL.check() {
                    tracing::warn!(
                        suppressed,
                        "agent {}: dropping a malformed control message from {}: {e}",
                        self.id,
                        envelope.header.sender
                    );
                }
                return;
            }
        };
        let from = &envelope.header.sender;
        // One handler per message; host requests need this agent's host.
        match control {
            Control::ProcDied(death) => self.on_proc_died(death),
            Control::Output(batch) => self.on_output(batch),
            Control::MonitorProc { reply } => self.on_monitor_proc(reply),
            Control::MonitorHost { timeout_ms, reply } => self.on_monitor_host(timeout_ms, reply),
            Control::StackDump { timeout_ms, reply } => self.on_stack_dump(timeout_ms, reply),
            Control::KillProc { proc, reason } => self.on_kill_proc(&proc, &reason),
            Control::Heartbeat { from } => self.on_heartbeat(from),
            Control::HeartbeatAck { proc } => self.on_heartbeat_ack(&proc),
            Control::HeartbeatRelay {
                client,
                ack_to,
                quiet_ms,
                members,
            } => self.on_heartbeat_relay(client, ack_to, quiet_ms, members),
            Control::RelayedHeartbeat { client, ack_to } => self.on_heartbeat_from(&client, ack_to),
            Control::HeartbeatAcks {
                proc,
                client,
                tree,
                answer,
            } => self.on_heartbeat_acks(&proc, &client, tree, answer),
            Control::SpawnRefused { owner, failure } => self.on_spawn_refused(&owner, &failure),
            Control::Abandon { reason } => self.on_abandon(&reason, from),
            Control::Singleton {
                name,
                class,
                parts,
                reply,
            } => self.on_singleton(&name, &class, parts, reply),
            Control::WatchProcs { procs, subscriber } => {
                if let Some(host) = self.host_for(from) {
                    self.host_watch(&host, procs, subscriber);
                }
            }
            Control::SpawnProcs(request) => {
                if let Some(host) = self.host_for(from) {
                    self.host_spawn(host, *request);
                }
            }
            Control::StopProcs {
                procs,
                reason,
                timeout_ms,
                reply,
            } => {
                if let Some(host) = self.host_for(from) {
                    self.host_stop(host, procs, reason, timeout_ms, reply);
                }
            }
            Control::EndHost {
                reason,
                timeout_ms,
                reply,
            } => {
                if let Some(host) = self.host_for(from) {
                    self.host_end(host, reason, timeout_ms, reply, from);
                }
            }
            Control::Unreachable { proc, reason } => {
                if let Some(host) = self.host_for(from) {
                    self.host_unreachable(&host, &proc, &reason);
                }
            }
        }
    }

    /// This agent's host, for a host request from `from`; `None` (the request is
    /// dropped, with a warning) if it has none.
    fn host_for(&self, from: &ActorId) -> Option<Arc<HostService>> {
        let host = self.host.clone();
        if host.is_none() {
            if let Some(suppressed) = BAD_CONTROL.check() {
                tracing::warn!(
                    suppressed,
                    "agent {}: {from} sent a host request, but this agent has no host",
                    self.id,
                );
            }
        }
        host
    }

    /// [`Control::Singleton`]: the registry sits above the agent, reached through its
    /// hook.
    fn on_singleton(
        self: &Arc<Self>,
        name: &str,
        class: &str,
        parts: Vec<bytes::Bytes>,
        reply: PortId,
    ) {
        let agent = super::ProcAgent {
            inner: Arc::clone(self),
        };
        self.singletons
            .on_request(&agent, name, class, parts, reply);
    }

    /// [`Control::WatchProcs`]: deaths already known are reported at once, the others
    /// when they happen.
    fn host_watch(&self, host: &HostService, procs: Vec<ProcId>, subscriber: PortId) {
        for death in host.subscribe(procs, &subscriber) {
            self.send_control_to(subscriber.clone(), &Control::ProcDied(death));
        }
    }

    /// [`Control::Unreachable`]: the host kills the proc as lost.
    fn host_unreachable(&self, host: &HostService, proc: &ProcId, reason: &str) {
        if host.kill_unreachable(proc, reason) {
            tracing::warn!(agent = %self.id, "killed unreachable proc {proc}");
        }
    }

    fn host_spawn(self: &Arc<Self>, host: Arc<HostService>, request: SpawnProcsRequest) {
        host.renew_lease(request.owner.proc_id(), self.proc.proc_id());
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            let spawned = host
                .host
                .spawn_commands(
                    &request.name,
                    request.count,
                    &request.commands,
                    request.output.clone(),
                )
                .await;
            let result: Result<Vec<ProcInfo>, RemoteError> = match spawned {
                Ok(handles) => {
                    let host_proc = agent.proc.proc_id().clone();
                    let mut state = host.state.lock();
                    Ok(handles
                        .into_iter()
                        .map(|h| {
                            state
                                .owners
                                .insert(h.proc_id().clone(), request.owner.clone());
                            let info = ProcInfo {
                                rank: h.rank(),
                                proc_id: h.proc_id().clone(),
                                pid: h.pid(),
                                host: Some(host_proc.clone()),
                            };
                            state.handles.insert(h.proc_id().clone(), h);
                            info
                        })
                        .collect())
                }
                Err(e) => Err(RemoteError::new(RemoteErrorKind::SpawnProcs, e)),
            };
            let reply = PortRef::<Result<Vec<ProcInfo>, RemoteError>>::attest(request.reply);
            if let Err(e) = reply.send(&agent.client, result) {
                tracing::error!(agent = %agent.id, "cannot answer a spawn request: {e}");
            }
        });
    }

    fn host_end(
        self: &Arc<Self>,
        host: Arc<HostService>,
        reason: String,
        timeout_ms: u64,
        reply: PortId,
        from: &hyperactor::ActorId,
    ) {
        let answer = PortRef::<Result<(), RemoteError>>::attest(reply);
        let Some(on_end) = self.on_end.clone() else {
            tracing::warn!(agent = %self.id, "ignoring a request from {from} to end this host: it is not a worker");
            let refusal = RemoteError::new(
                RemoteErrorKind::NotAWorker,
                format!(
                    "host {} is not a worker (it runs inside its client's process) and cannot \
                     be ended; stop its procs instead",
                    self.proc.proc_id()
                ),
            );
            let _ = answer.send(&self.client, Err(refusal));
            return;
        };
        let handles: Vec<ProcHandle> = {
            let mut state = host.state.lock();
            let handles: Vec<ProcHandle> = state.handles.values().cloned().collect();
            for h in &handles {
                state.expected.insert(h.proc_id().clone());
            }
            handles
        };
        tracing::info!(agent = %self.id, "ending this worker, as {from} asked ({reason}): stopping {} procs", handles.len());
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            let timeout = Duration::from_millis(timeout_ms);
            futures::future::join_all(handles.iter().map(|h| h.stop(timeout))).await;
            // The procs' last lines go out before the answer.
            host.flush_output().await;
            let _ = answer.send(&agent.client, Ok(()));
            on_end(&reason);
        });
    }

    fn host_stop(
        self: &Arc<Self>,
        host: Arc<HostService>,
        procs: Vec<ProcId>,
        reason: String,
        timeout_ms: u64,
        reply: Option<PortId>,
    ) {
        let handles: Vec<ProcHandle> = {
            let mut state = host.state.lock();
            procs
                .iter()
                .filter_map(|p| {
                    state.expected.insert(p.clone());
                    state.handles.get(p).cloned()
                })
                .collect()
        };
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            tracing::debug!(agent = %agent.id, "stopping {} procs: {reason}", handles.len());
            let timeout = Duration::from_millis(timeout_ms);
            futures::future::join_all(handles.iter().map(|h| h.stop(timeout))).await;
            // The procs' last lines go out before the answer.
            host.flush_output().await;
            if let Some(reply) = reply {
                let _ = PortRef::<()>::attest(reply).send(&agent.client, ());
            }
        });
    }
}

impl Inner {
    /// Asks the hosts of `targets` to stop those procs, and waits for each host's answer
    /// (bounded by `timeout` and a little more), or until the host is found lost: a
    /// host already known lost is not asked nor waited on (LIVE-3).
    pub(super) async fn stop_procs(
        self: &Arc<Self>,
        mesh: &MeshInfo,
        targets: &[CastTarget],
        reason: &str,
        timeout: Duration,
    ) {
        let mut by_host: HashMap<ProcId, Vec<ProcId>> = HashMap::new();
        for t in targets {
            if let Some(host) = &t.host {
                by_host
                    .entry(host.clone())
                    .or_default()
                    .push(t.proc.clone());
            }
        }
        by_host.retain(|host, procs| match self.lost_reason(host) {
            Some(why) => {
                tracing::debug!(agent = %self.id, "not waiting for {} procs of lost host {host} to stop ({why})", procs.len());
                false
            }
            None => true,
        });
        let waits = by_host.into_iter().map(|(host, procs)| {
            let (port, receiver) = self.client.open_once_port::<()>();
            self.send_control(
                &host,
                &Control::StopProcs {
                    procs,
                    reason: format!("proc mesh {:?} stopped: {reason}", mesh.name),
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    reply: Some(port.port_id().clone()),
                },
            );
            let inner = Arc::clone(self);
            async move {
                let limit = timeout + Duration::from_secs(2);
                tokio::select! {
                    _ = receiver.recv() => {}
                    _ = inner.host_lost_wait(&host) => {}
                    () = tokio::time::sleep(limit) => {}
                }
            }
        });
        futures::future::join_all(waits).await;
    }
}
