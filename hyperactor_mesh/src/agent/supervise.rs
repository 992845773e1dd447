//! The agent's supervision duties: reporting failures of the actors it spawned to their
//! meshes' owners, turning a proc's death into failures of the meshes owned here, and
//! handling messages that came back undelivered.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use hyperactor::message::{Envelope, EnvelopeHeader, Serialized, SUPERVISION_PORT};
use hyperactor::{ActorId, ProcId, SupervisionEvent};

use super::lock::{Rank, Ranked};
use super::{CallReplies, CastTarget, Control, Inner, ProcAgent, ProcInfo, AGENT_NAME, CAST_PORT};
use crate::cast::codec::{CastHeader, CastKind, MeshInfo, ReplyMode, Route, ViewExtent};
use crate::cast::reply::ReplyItem;
use crate::supervision::{FailureCause, MeshFailure, ProcDeath};
use hyperactor::channel::log_limit::LogLimit;

/// A proc known to be gone.
#[derive(Debug, Clone)]
pub(super) struct Dead {
    pub(super) death: ProcDeath,
    /// Reported by its host (not only named dead in a cast header).
    pub(super) confirmed: bool,
}

/// How many recently dead procs a cast header names.
const DEAD_IN_HEADERS: usize = 32;

/// A mesh owned by an actor of this process.
#[derive(Clone)]
pub(super) struct OwnedMesh {
    pub(super) mesh: MeshInfo,
    pub(super) owner: ActorId,
    pub(super) kind: OwnedKind,
    /// Its members, by rank.
    pub(super) ranks: Vec<(CastTarget, Option<u32>)>,
    pub(super) view: ViewExtent,
    pub(super) stopped: bool,
    /// When it was registered (Unix seconds).
    pub(super) created: f64,
}

/// Records a `mesh_spawned` or `mesh_stopped` event for `mesh`.
fn mesh_event(kind: &str, what: &str, mesh: &MeshInfo, extra: &str) {
    let mut event = crate::monitor::Event::new(
        kind,
        format!("{what} '{}' ({}){extra}", mesh.name, mesh.class),
    );
    event.mesh = Some(mesh.name.clone());
    crate::monitor::events::record(event);
}

/// What an owned mesh is made of.
#[derive(Clone)]
pub(super) enum OwnedKind {
    /// Actors named `actor` on each member proc.
    Actors { actor: String },
    /// The member procs themselves.
    Procs,
}

/// What the agent knows of procs' deaths and of the meshes owned here: the proc-death
/// and supervision component. It owns its state behind one lock, which only its
/// methods take; they copy out what their callers need and never call anything else
/// while holding it (see [`super::lock`]).
pub(super) struct Supervisor {
    state: Ranked<SupervisorState>,
    /// Bumped after each handled death, for those who wait on one.
    handled_events: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct SupervisorState {
    /// Procs known to be gone: from their host (confirmed), or from a cast header
    /// (hearsay: it unblocks what waits for them, but the host's report is still awaited
    /// for the owners of meshes on them).
    dead: HashMap<ProcId, Dead>,
    /// The most recent of them, which casts sent from here tell their receivers.
    dead_recent: VecDeque<ProcId>,
    /// Meshes owned by actors of this process, by mesh id.
    owned: HashMap<u64, OwnedMesh>,
    /// Procs this agent watches at their hosts, and each proc's host.
    watched: HashSet<ProcId>,
    hosts: HashMap<ProcId, ProcId>,
    /// Procs whose death this agent has handled (its reports to the owners sent).
    handled: HashSet<ProcId>,
    /// Where each proc is a member of the meshes owned here: the mesh's id and the
    /// position in its ranks. A death looks up its proc's meshes here instead of
    /// scanning every rank of every mesh (which made `n` deaths cost `n` times the
    /// size of the meshes).
    members: HashMap<ProcId, Vec<(u64, usize)>>,
}

impl SupervisorState {
    /// Whether `proc` belongs to a proc mesh owned here that was stopped.
    fn in_stopped_proc_mesh(&self, proc: &ProcId) -> bool {
        self.meshes_of(proc)
            .any(|(m, _)| m.stopped && matches!(m.kind, OwnedKind::Procs))
    }

    /// The meshes owned here that `proc` is a member of, each with its position there.
    fn meshes_of<'a>(&'a self, proc: &ProcId) -> impl Iterator<Item = (&'a OwnedMesh, usize)> + 'a {
        self.members
            .get(proc)
            .into_iter()
            .flatten()
            .filter_map(|&(id, at)| Some((self.owned.get(&id)?, at)))
    }

    /// Records `mesh`, replacing a mesh of the same id.
    fn own(&mut self, mesh: OwnedMesh) {
        let id = mesh.mesh.id;
        if let Some(old) = self.owned.remove(&id) {
            for (target, _) in &old.ranks {
                if let Some(places) = self.members.get_mut(&target.proc) {
                    places.retain(|&(mesh, _)| mesh != id);
                    if places.is_empty() {
                        self.members.remove(&target.proc);
                    }
                }
            }
        }
        for (at, (target, _)) in mesh.ranks.iter().enumerate() {
            self.members
                .entry(target.proc.clone())
                .or_default()
                .push((id, at));
        }
        self.owned.insert(id, mesh);
    }
}

/// Whether this process stopped a proc's mesh (see [`Supervisor::stop_check`]).
pub(super) enum StopCheck {
    /// It stopped the mesh, or a proc mesh the proc belongs to.
    Stopped,
    /// No mesh of that id is owned here.
    NotOwned,
    /// Not stopped here; the proc's host, if known (asked to end from here, it stops
    /// the proc on request too).
    Running(Option<ProcId>),
}

impl Default for Supervisor {
    fn default() -> Self {
        Self {
            state: Ranked::new(Rank::Component),
            handled_events: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Supervisor {
    /// How `proc` ended, if it is known to be gone.
    pub(super) fn death_of(&self, proc: &ProcId) -> Option<ProcDeath> {
        self.state.lock().dead.get(proc).map(|d| d.death.clone())
    }

    /// Whether `proc` is known to be gone (confirmed or not).
    pub(super) fn is_dead(&self, proc: &ProcId) -> bool {
        self.state.lock().dead.contains_key(proc)
    }

    /// Whether `proc`'s death was reported by its host.
    pub(super) fn is_confirmed_dead(&self, proc: &ProcId) -> bool {
        self.state
            .lock()
            .dead
            .get(proc)
            .is_some_and(|d| d.confirmed)
    }

    /// The positions of the dead procs among `procs`, with their deaths.
    pub(super) fn deaths_among<P: Borrow<ProcId>>(
        &self,
        procs: impl IntoIterator<Item = P>,
    ) -> Vec<(usize, ProcDeath)> {
        let state = self.state.lock();
        if state.dead.is_empty() {
            return Vec::new();
        }
        procs
            .into_iter()
            .enumerate()
            .filter_map(|(at, p)| state.dead.get(p.borrow()).map(|d| (at, d.death.clone())))
            .collect()
    }

    /// The most recently dead procs, oldest first (for cast headers).
    pub(super) fn recent_dead(&self) -> Vec<ProcId> {
        self.state.lock().dead_recent.iter().cloned().collect()
    }

    /// Records `death`; false if it was known already (as confirmed, when `confirmed`).
    pub(super) fn mark_dead(&self, death: &ProcDeath, confirmed: bool) -> bool {
        let mut state = self.state.lock();
        match state.dead.get(&death.proc_id) {
            Some(d) if d.confirmed || !confirmed => return false,
            _ => {}
        }
        let known = state
            .dead
            .insert(
                death.proc_id.clone(),
                Dead {
                    death: death.clone(),
                    confirmed,
                },
            )
            .is_some();
        if !known {
            if state.dead_recent.len() == DEAD_IN_HEADERS {
                state.dead_recent.pop_front();
            }
            state.dead_recent.push_back(death.proc_id.clone());
        }
        true
    }

    /// Starts watching the procs of `targets` that have a host and are not watched yet;
    /// returns them, with their hosts.
    pub(super) fn watch_new(&self, targets: &[CastTarget]) -> Vec<(ProcId, ProcId)> {
        let mut state = self.state.lock();
        let mut new = Vec::new();
        for t in targets {
            if let Some(host) = &t.host {
                // Looked up before inserting: a view is cast to again and again, and
                // cloning each id for an insert that finds it there costs two atomics.
                if !state.watched.contains(&t.proc) {
                    state.watched.insert(t.proc.clone());
                    new.push((host.clone(), t.proc.clone()));
                }
            }
        }
        for (host, proc) in &new {
            state.hosts.insert(proc.clone(), host.clone());
        }
        new
    }

    /// The host of `proc`, if this agent watches it.
    pub(super) fn host_of(&self, proc: &ProcId) -> Option<ProcId> {
        self.state.lock().hosts.get(proc).cloned()
    }

    /// The host of `proc`: the one this agent watches it at, else the one named by a
    /// mesh owned here.
    pub(super) fn any_host_of(&self, proc: &ProcId) -> Option<ProcId> {
        let state = self.state.lock();
        state.hosts.get(proc).cloned().or_else(|| {
            state.owned.values().find_map(|m| {
                m.ranks
                    .iter()
                    .find(|(t, _)| &t.proc == proc)
                    .and_then(|(t, _)| t.host.clone())
            })
        })
    }

    /// The hosts this agent knows of: those it watches procs at, and those of the meshes
    /// owned here.
    pub(super) fn known_hosts(&self) -> HashSet<ProcId> {
        let state = self.state.lock();
        let mut hosts: HashSet<ProcId> = state.hosts.values().cloned().collect();
        for owned in state.owned.values() {
            hosts.extend(owned.ranks.iter().filter_map(|(t, _)| t.host.clone()));
        }
        hosts
    }

    /// The procs of `host` this agent knows of, as (proc, pid, owned here): the members
    /// of meshes owned here first, then the procs it watches there.
    pub(super) fn procs_of_host(&self, host: &ProcId) -> Vec<(ProcId, u32, bool)> {
        let state = self.state.lock();
        let mut procs = Vec::new();
        for owned in state.owned.values() {
            for (target, pid) in &owned.ranks {
                if target.host.as_ref() == Some(host) {
                    procs.push((target.proc.clone(), pid.unwrap_or(0), true));
                }
            }
        }
        procs.extend(
            state
                .hosts
                .iter()
                .filter(|(_, h)| *h == host)
                .map(|(p, _)| (p.clone(), 0, false)),
        );
        procs
    }

    /// Records the mesh `mesh` owned here.
    pub(super) fn own(&self, mesh: OwnedMesh) {
        self.state.lock().own(mesh);
    }

    /// Marks mesh `id` stopped; its info if it was running.
    pub(super) fn mark_stopped(&self, id: u64) -> Option<MeshInfo> {
        let mut state = self.state.lock();
        let mesh = state.owned.get_mut(&id)?;
        let was_running = !mesh.stopped;
        mesh.stopped = true;
        was_running.then(|| mesh.mesh.clone())
    }

    /// The owner of mesh `id`, if it is owned here.
    pub(super) fn owner_of(&self, id: u64) -> Option<ActorId> {
        self.state.lock().owned.get(&id).map(|m| m.owner.clone())
    }

    /// Marks the running meshes that `which` selects stopped, and returns them.
    pub(super) fn take_to_stop(&self, which: impl Fn(&OwnedMesh) -> bool) -> Vec<OwnedMesh> {
        let mut state = self.state.lock();
        state
            .owned
            .values_mut()
            .filter(|m| which(m) && !m.stopped)
            .map(|m| {
                m.stopped = true;
                m.clone()
            })
            .collect()
    }

    /// Whether `proc` belongs to a proc mesh this process owns and stopped.
    pub(super) fn in_stopped_proc_mesh(&self, proc: &ProcId) -> bool {
        self.state.lock().in_stopped_proc_mesh(proc)
    }

    /// Whether this process stopped `proc`'s mesh `mesh` (or a proc mesh `proc` belongs
    /// to), and else `proc`'s host.
    pub(super) fn stop_check(&self, proc: &ProcId, mesh: u64) -> StopCheck {
        let state = self.state.lock();
        if state.in_stopped_proc_mesh(proc) {
            return StopCheck::Stopped;
        }
        let Some(m) = state.owned.get(&mesh) else {
            return StopCheck::NotOwned;
        };
        if m.stopped {
            return StopCheck::Stopped;
        }
        let host = m
            .ranks
            .iter()
            .find(|(t, _)| &t.proc == proc)
            .and_then(|(t, _)| t.host.clone())
            .or_else(|| state.hosts.get(proc).cloned());
        StopCheck::Running(host)
    }

    /// The failures that the death of `proc` (`death`) makes for the owners of the
    /// running actor meshes on it, with their owners.
    pub(super) fn failures_on(
        &self,
        proc: &ProcId,
        death: &ProcDeath,
    ) -> Vec<(ActorId, MeshFailure)> {
        let state = self.state.lock();
        let mut failures = Vec::new();
        for (owned, at) in state.meshes_of(proc) {
            if owned.stopped || !matches!(owned.kind, OwnedKind::Actors { .. }) {
                continue;
            }
            let Some((target, pid)) = owned.ranks.get(at) else {
                continue;
            };
            failures.push((
                owned.owner.clone(),
                MeshFailure {
                    mesh: owned.mesh.clone(),
                    rank: target.index as usize,
                    actor_id: None,
                    proc_id: proc.clone(),
                    pid: pid.or(Some(death.pid)),
                    cause: death.end.cause(),
                    caused_by: None,
                    path: None,
                },
            ));
        }
        failures
    }

    /// The procs (other than `me`) running actors of meshes owned here that are not
    /// stopped, whose death was not handled yet, by host (`None`: no host spawned them,
    /// or `me` is their host).
    pub(super) fn running_owned_procs(&self, me: &ProcId) -> HashMap<Option<ProcId>, Vec<ProcId>> {
        let state = self.state.lock();
        let mut procs: HashMap<ProcId, Option<ProcId>> = HashMap::new();
        for owned in state.owned.values() {
            if owned.stopped || !matches!(owned.kind, OwnedKind::Actors { .. }) {
                continue;
            }
            for (target, _) in &owned.ranks {
                if &target.proc != me {
                    let host = target.host.clone().filter(|h| h != me);
                    procs.insert(target.proc.clone(), host);
                }
            }
        }
        let mut by_host: HashMap<Option<ProcId>, Vec<ProcId>> = HashMap::new();
        for (proc, host) in procs {
            if !state.handled.contains(&proc) && !state.in_stopped_proc_mesh(&proc) {
                by_host.entry(host).or_default().push(proc);
            }
        }
        by_host
    }

    /// The procs of mesh `id` (owned here), by rank, as text.
    pub(super) fn mesh_procs(&self, id: u64) -> Vec<String> {
        match self.state.lock().owned.get(&id) {
            Some(owned) => owned
                .ranks
                .iter()
                .map(|(t, _)| t.proc.to_string())
                .collect(),
            None => Vec::new(),
        }
    }

    /// The meshes owned here and the procs known dead, as they are now.
    pub(super) fn snapshot(&self) -> (HashMap<u64, OwnedMesh>, HashMap<ProcId, Dead>) {
        let state = self.state.lock();
        (state.owned.clone(), state.dead.clone())
    }

    /// The death of `proc` was handled: its failures were sent to their owners.
    pub(super) fn death_handled(&self, proc: ProcId) {
        self.state.lock().handled.insert(proc);
        self.handled_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Completes once the death of `proc` was handled.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn death_handled_wait(&self, proc: &ProcId) {
        let mut events = self.handled_events.subscribe();
        loop {
            if self.state.lock().handled.contains(proc) {
                return;
            }
            if events.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

static RETURNED: LogLimit = LogLimit::per_second();

/// How long the ranks of a cast frame that could not reach its proc wait before they are
/// answered "cannot be reached": long enough for the host's report of the proc's death,
/// which names the true cause, to arrive first.
pub(super) const UNREACHABLE_GRACE: Duration = Duration::from_millis(250);

/// Starts the agent's tasks: its actors' failures and its returned messages.
pub(super) fn start_tasks(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            let Some(agent) = weak.upgrade() else { return };
            let Some(event) = agent.client.next_supervision_event().await else {
                return;
            };
            agent.on_actor_failed(event);
        }
    });
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            let Some(agent) = weak.upgrade() else { return };
            let returned = agent.client.next_undeliverable().await;
            let Some(returned) = returned else {
                return;
            };
            agent.on_returned(returned.envelope, &returned.reason, returned.link_failed);
        }
    });
}

impl ProcAgent {
    /// Records that `owner` (an actor of this process) owns the actor mesh `mesh`, whose
    /// actors are named `actor` on `ranks` (with their pids when known): their failures
    /// and their procs' deaths will be reported to `owner`, and stopping `owner` stops
    /// them.
    pub fn register_owned_actors(
        &self,
        mesh: MeshInfo,
        owner: ActorId,
        actor: String,
        view: ViewExtent,
        ranks: Vec<(CastTarget, Option<u32>)>,
    ) {
        self.inner
            .watch_targets(&ranks.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>());
        mesh_event(
            "mesh_spawned",
            "actor mesh",
            &mesh,
            &format!(" spawned on {} procs", ranks.len()),
        );
        self.inner.supervisor.own(OwnedMesh {
            mesh,
            owner,
            kind: OwnedKind::Actors { actor },
            ranks,
            view,
            stopped: false,
            created: crate::monitor::unix_now(),
        });
    }

    /// Records that `owner` owns the procs `procs` (a proc mesh it spawned): stopping
    /// `owner` stops them.
    pub fn register_owned_procs(&self, mesh: MeshInfo, owner: ActorId, procs: &[ProcInfo]) {
        self.register_owned_procs_in(mesh, owner, procs, ViewExtent::default());
    }

    /// As [`ProcAgent::register_owned_procs`], for procs laid out in `view` (their
    /// ranks' coordinates, shown by monitoring).
    pub fn register_owned_procs_in(
        &self,
        mesh: MeshInfo,
        owner: ActorId,
        procs: &[ProcInfo],
        view: ViewExtent,
    ) {
        let ranks = procs
            .iter()
            .map(|p| (p.target(p.rank as u32), Some(p.pid)))
            .collect();
        mesh_event(
            "mesh_spawned",
            "proc mesh",
            &mesh,
            &format!(" spawned with {} procs", procs.len()),
        );
        self.inner.supervisor.own(OwnedMesh {
            mesh,
            owner,
            kind: OwnedKind::Procs,
            ranks,
            view,
            stopped: false,
            created: crate::monitor::unix_now(),
        });
    }

    /// Records that mesh `id` was stopped: its procs' deaths are no longer failures.
    pub fn mark_stopped(&self, id: u64) {
        if let Some(mesh) = self.inner.supervisor.mark_stopped(id) {
            mesh_event("mesh_stopped", "mesh", &mesh, " stopped");
        }
    }

    /// Stops every mesh owned by `owner` (an actor of this process that is stopping),
    /// each bounded by the agent's stop timeout.
    pub async fn stop_owned_by(&self, owner: &ActorId, reason: &str) {
        self.inner.stop_owned_by(owner, reason).await;
    }

    /// Stops the mesh `id`, owned by an actor of this process (procs are stopped by
    /// their hosts, actors by their agents), bounded by the agent's stop timeout.
    /// Returns false if no actor of this process owns such a mesh.
    pub async fn stop_owned(&self, id: u64, reason: &str) -> bool {
        let Some(owner) = self.inner.supervisor.owner_of(id) else {
            return false;
        };
        self.inner
            .stop_meshes(|m| m.mesh.id == id && m.owner == owner, reason)
            .await;
        true
    }
}

impl Inner {
    /// Sends `failure` to `owner`'s supervision port.
    pub(super) fn report_to_owner(&self, owner: &ActorId, failure: &MeshFailure) {
        let event = failure.to_event();
        match Serialized::encode(&event) {
            Ok(payload) => self.proc.post(Envelope {
                header: EnvelopeHeader {
                    sender: self.id.clone(),
                    dest: owner.port_id(SUPERVISION_PORT),
                    return_to: None,
                    extra: None,
                },
                payload,
            }),
            Err(e) => tracing::error!(agent = %self.id, "cannot report {failure}: {e}"),
        }
    }

    /// An actor this agent spawned failed (the runtime's report).
    fn on_actor_failed(&self, event: SupervisionEvent) {
        let Some(actor) = self.local.entry(event.actor_id.name()) else {
            tracing::warn!(agent = %self.id, "a failure of an actor it does not know: {event}");
            return;
        };
        let caused_by = event
            .caused_by
            .as_deref()
            .and_then(MeshFailure::from_event)
            .map(Box::new);
        let cause = if event.caused_by.is_some() {
            FailureCause::Unhandled {
                reason: event.reason.clone(),
            }
        } else {
            FailureCause::Actor {
                reason: event.reason.clone(),
            }
        };
        let failure = MeshFailure {
            mesh: actor.mesh,
            rank: actor.rank as usize,
            actor_id: Some(event.actor_id.clone()),
            proc_id: self.proc.proc_id().clone(),
            pid: Some(std::process::id()),
            cause,
            caused_by,
            path: None,
        };
        // The actor's host reports it where it runs (Python prints it); the owner hears.
        tracing::debug!(agent = %self.id, "{}", failure.report());
        self.report_to_owner(&actor.owner, &failure);
    }

    /// A cast from `origin` says `proc` is dead: unblock what waits for it (held
    /// messages, reducers, calls); its host's report, if this agent watches it, is
    /// still what reaches the owners of meshes on it.
    pub(super) fn hearsay_death(self: &Arc<Self>, proc: &ProcId, origin: &ActorId) {
        if self.supervisor.is_dead(proc) {
            return;
        }
        let death = ProcDeath {
            proc_id: proc.clone(),
            pid: 0,
            end: crate::supervision::ProcEnd::Lost {
                reason: format!("it is gone (as {origin} reported)"),
            },
            expected: false,
        };
        if self.supervisor.mark_dead(&death, false) {
            self.release_held();
            self.replies_after_death(proc, &death.to_string(), false);
        }
    }

    /// Whether this process asked for the stop of `proc` or of mesh `mesh`: the mesh
    /// was stopped from here, `proc` belongs to a proc mesh stopped from here, or its
    /// host was asked from here to end.
    fn stop_asked_here(&self, proc: &ProcId, mesh: u64) -> bool {
        match self.supervisor.stop_check(proc, mesh) {
            StopCheck::Stopped => true,
            StopCheck::NotOwned => false,
            StopCheck::Running(host) => host.is_some_and(|h| self.liveness.is_ending(&h)),
        }
    }

    /// A stopping proc refused to spawn an actor of a mesh `owner` owns (MSUP-3):
    /// a stop this process asked for is not a failure of what it stops, whatever state
    /// the spawn was in (the actor never existed: calls to it find it stopped); a proc
    /// stopping for any other reason fails the rank.
    pub(super) fn on_spawn_refused(&self, owner: &ActorId, failure: &MeshFailure) {
        if self.stop_asked_here(&failure.proc_id, failure.mesh.id) {
            tracing::debug!(agent = %self.id, "not a failure, its stop was asked here: {failure}");
            return;
        }
        tracing::debug!(agent = %self.id, "{}", failure.report());
        self.report_to_owner(owner, failure);
    }

    /// A proc died (its host's report).
    pub(super) fn on_proc_died(self: &Arc<Self>, mut death: ProcDeath) {
        // A proc of a proc mesh stopped here: its death is no failure, whoever reports
        // it. (Its host's report says so too, but a host lost after the stop, before that
        // report arrived, is reported as lost.)
        death.expected = death.expected || self.supervisor.in_stopped_proc_mesh(&death.proc_id);
        let proc = death.proc_id.clone();
        if !self.supervisor.mark_dead(&death, true) {
            return;
        }
        let host = self.supervisor.host_of(&proc).map(|h| h.to_string());
        crate::monitor::failures::note_proc_death(&death, host);
        self.handle_death(&proc, &death);
        self.supervisor.death_handled(proc);
    }

    /// Completes once the death of `proc` was handled ([`Inner::on_proc_died`] sent its
    /// failures to their owners).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn death_handled_wait(&self, proc: &ProcId) {
        self.supervisor.death_handled_wait(proc).await;
    }

    /// The procs (other than this agent's own) running actors of meshes owned here that
    /// are not stopped, whose death was not handled yet, by host (`None`: no host
    /// spawned them, or this agent's own host).
    pub(super) fn running_owned_procs(&self) -> HashMap<Option<ProcId>, Vec<ProcId>> {
        self.supervisor.running_owned_procs(self.proc.proc_id())
    }

    /// What the death of `proc` changes here: what waited for it is released, calls to
    /// it are answered, and, unless it was expected, the owners of the actor meshes on
    /// it are sent their failures.
    fn handle_death(self: &Arc<Self>, proc: &ProcId, death: &ProcDeath) {
        let proc = proc.clone();
        let reason = death.unanswered_reason();
        self.release_held();
        self.replies_after_death(&proc, &reason, death.expected);
        if death.expected {
            return;
        }
        let failures = self.supervisor.failures_on(&proc, death);
        for (owner, failure) in failures {
            crate::monitor::failures::note_mesh_failure(&failure);
            self.report_to_owner(&owner, &failure);
        }
    }

    /// A message this agent (or an actor it delivered to) sent came back.
    fn on_returned(self: &Arc<Self>, envelope: Envelope, reason: &str, link_failed: bool) {
        let dest = envelope.header.dest.clone();
        if dest.index() == CAST_PORT && dest.actor().name() == AGENT_NAME && !link_failed {
            // Refused or never sent (too large): the proc is fine, the ranks of the
            // chunk are answered at once.
            let why = format!(
                "a cast to proc {} was not delivered: {reason}",
                dest.actor().proc_id()
            );
            if let Some(Ok(header)) = envelope
                .payload
                .into_parts()
                .first()
                .map(|p| CastHeader::decode(p))
            {
                if let (true, Some(to)) = (header.mode != ReplyMode::None, header.reply) {
                    let items = header
                        .entries
                        .iter()
                        .map(|e| ReplyItem::failed(e.index, &why))
                        .collect();
                    self.send_items(&to, items);
                }
            }
            return;
        }
        if dest.index() == CAST_PORT && dest.actor().name() == AGENT_NAME {
            // A cast frame: nobody in its chunk can be reached through that proc. It may
            // have died: its host's report, with the true cause, should reach the caller
            // within the grace period (the first answer per rank is kept, REP-1). If it
            // did not die, its host is told it cannot be reached.
            let proc = dest.actor().proc_id().clone();
            let why = format!("proc {proc} cannot be reached: {reason}");
            let parts = envelope.payload.into_parts();
            let answer = match parts.first().map(|p| CastHeader::decode(p)) {
                Some(Ok(header)) if header.mode != ReplyMode::None => header.reply.map(|to| {
                    let items: Vec<ReplyItem> = header
                        .entries
                        .iter()
                        .map(|e| ReplyItem::failed(e.index, &why))
                        .collect();
                    (to, items)
                }),
                _ => None,
            };
            let inner = Arc::clone(self);
            let reason = reason.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(UNREACHABLE_GRACE).await;
                if !inner.supervisor.is_dead(&proc) {
                    inner.suspect(&proc, &reason);
                }
                if let Some((to, items)) = answer {
                    inner.send_items(&to, items);
                }
            });
            return;
        }
        if let Some(Ok(route)) = envelope.header.extra.as_deref().map(Route::decode) {
            if let Some(to) = &route.reply {
                let (why, stopped) = self
                    .why_not_running(dest.actor().name())
                    .unwrap_or_else(|| (reason.to_string(), false));
                self.send_items(to, vec![ReplyItem::unanswered(route.index, &why, stopped)]);
            }
            return;
        }
        // The agent's own messages come back when their proc is gone: routine while
        // procs die, so only visible at debug level.
        if let Some(suppressed) = RETURNED.check() {
            tracing::debug!(
                suppressed,
                "agent {}: a message from {} to {dest} came back: {reason}",
                self.id,
                envelope.header.sender
            );
        }
    }

    /// `proc` could not be reached: its host (if known) kills it as lost, so that its
    /// death is reported to everyone who watches it.
    fn suspect(&self, proc: &ProcId, reason: &str) {
        let host = self.supervisor.host_of(proc);
        match host {
            Some(host) => self.send_control(
                &host,
                &Control::Unreachable {
                    proc: proc.clone(),
                    reason: reason.to_string(),
                },
            ),
            None => {
                if let Some(suppressed) = RETURNED.check() {
                    tracing::warn!(
                        suppressed,
                        "agent {}: proc {proc} cannot be reached ({reason}) and no host \
                         watches it",
                        self.id
                    );
                }
            }
        }
    }

    pub(super) async fn stop_owned_by(self: &Arc<Self>, owner: &ActorId, reason: &str) {
        self.stop_meshes(|m| &m.owner == owner, reason).await;
    }

    async fn stop_meshes(self: &Arc<Self>, which: impl Fn(&OwnedMesh) -> bool, reason: &str) {
        let meshes: Vec<(MeshInfo, OwnedKind, Vec<CastTarget>, ViewExtent)> = self
            .supervisor
            .take_to_stop(which)
            .into_iter()
            .map(|m| {
                mesh_event("mesh_stopped", "mesh", &m.mesh, &format!(": {reason}"));
                let targets = m.ranks.into_iter().map(|(t, _)| t).collect();
                (m.mesh, m.kind, targets, m.view)
            })
            .collect();
        let timeout = self.stop_timeout;
        let exit_timeout = self.exit_timeout();
        let stops = meshes.into_iter().map(|(mesh, kind, targets, view)| {
            let inner = Arc::clone(self);
            let reason = reason.to_string();
            async move {
                match kind {
                    OwnedKind::Actors { actor } => {
                        inner
                            .stop_actors(&actor, &view, &targets, &reason, timeout)
                            .await
                    }
                    OwnedKind::Procs => {
                        inner
                            .stop_procs(&mesh, &targets, &reason, exit_timeout)
                            .await
                    }
                }
            }
        });
        futures::future::join_all(stops).await;
    }

    /// Casts a stop to actor `actor` on `targets` and waits (at most `timeout`).
    pub(super) async fn stop_actors(
        self: &Arc<Self>,
        actor: &str,
        view: &ViewExtent,
        targets: &[CastTarget],
        reason: &str,
        timeout: Duration,
    ) {
        let agent = ProcAgent {
            inner: Arc::clone(self),
        };
        let replies = CallReplies::open_all(&agent, targets.iter().map(|t| t.index));
        self.cast(
            &self.id,
            actor,
            CastKind::Stop {
                reason: reason.to_string(),
            },
            view,
            targets,
            ReplyMode::Reduce,
            Some(replies.reply_to().clone()),
            Vec::new(),
        );
        let _ = tokio::time::timeout(timeout, replies.wait()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervision::ProcEnd;

    fn proc(i: u32) -> ProcId {
        format!("p{i}@unix:/tmp/p{i}.sock").parse().unwrap()
    }

    fn mesh(id: u64, kind: OwnedKind, procs: &[u32]) -> OwnedMesh {
        OwnedMesh {
            mesh: MeshInfo {
                id,
                name: format!("m{id}"),
                class: "Test".into(),
            },
            owner: proc(100).actor_id("owner", 0).unwrap(),
            kind,
            ranks: procs
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let target = CastTarget {
                        index: i as u32,
                        proc: proc(p),
                        host: None,
                    };
                    (target, Some(p))
                })
                .collect(),
            view: ViewExtent::default(),
            stopped: false,
            created: 0.0,
        }
    }

    fn actors() -> OwnedKind {
        OwnedKind::Actors { actor: "a".into() }
    }

    fn death(p: u32) -> ProcDeath {
        ProcDeath {
            proc_id: proc(p),
            pid: p,
            end: ProcEnd::Signaled { signal: 9 },
            expected: false,
        }
    }

    fn ranks_failed(s: &Supervisor, p: u32) -> Vec<(u64, usize)> {
        let mut got: Vec<(u64, usize)> = s
            .failures_on(&proc(p), &death(p))
            .into_iter()
            .map(|(_, f)| (f.mesh.id, f.rank))
            .collect();
        got.sort_unstable();
        got
    }

    #[test]
    fn a_death_fails_the_ranks_of_running_actor_meshes_on_its_proc_only() {
        let s = Supervisor::default();
        s.own(mesh(1, actors(), &[1, 2, 3]));
        s.own(mesh(2, actors(), &[3, 4]));
        s.own(mesh(3, OwnedKind::Procs, &[1, 2, 3, 4]));
        assert_eq!(ranks_failed(&s, 3), vec![(1, 2), (2, 0)]);
        assert_eq!(ranks_failed(&s, 4), vec![(2, 1)]);
        assert_eq!(ranks_failed(&s, 9), vec![]);
        s.mark_stopped(1);
        assert_eq!(
            ranks_failed(&s, 3),
            vec![(2, 0)],
            "a stopped mesh has no failures"
        );
        assert!(!s.in_stopped_proc_mesh(&proc(1)));
        s.mark_stopped(3);
        assert!(s.in_stopped_proc_mesh(&proc(1)));
        assert!(!s.in_stopped_proc_mesh(&proc(9)));
    }

    #[test]
    fn a_mesh_registered_again_under_its_id_replaces_its_members() {
        let s = Supervisor::default();
        s.own(mesh(1, actors(), &[1, 2]));
        s.own(mesh(1, actors(), &[2, 3]));
        assert_eq!(ranks_failed(&s, 1), vec![]);
        assert_eq!(ranks_failed(&s, 2), vec![(1, 0)]);
        assert_eq!(ranks_failed(&s, 3), vec![(1, 1)]);
    }
}
