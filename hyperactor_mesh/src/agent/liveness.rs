//! Host liveness: heartbeats between an agent and the hosts of the procs it uses, and
//! leases on the procs a host spawned for a client on another machine.
//!
//! An agent that casts to procs of a host, or spawned procs there, **monitors** that
//! host (never its own proc): every [`Liveness::interval`] it sends the host agent a
//! [`Control::Heartbeat`], which the host answers with [`Control::HeartbeatAck`]. The
//! host is given up for lost when
//!
//! - no answer came for [`Liveness::timeout`] (a host whose network was cut, or whose
//!   agent is frozen: TCP connections go silent, they are not reset), or
//! - the connection to it failed and a new one failed too before any answer (a host
//!   agent that was killed: its socket refuses connections at once).
//!
//! Then every proc of that host this agent knows of is recorded dead ("its host ... was
//! lost: ..."), as if its host had reported it: calls waiting on it fail at once and the
//! owners of meshes on it get a failure (LIVE-1). The procs this agent owns there are
//! also told to exit ([`Control::Abandon`]), so that a proc of a frozen host does not
//! keep running unseen; a host that comes back is monitored afresh when used again.
//!
//! **Relayed heartbeats.** An agent that monitors many hosts does not send each a
//! heartbeat of its own: its cost would grow with the hosts (at 1,024 hosts, four
//! heartbeats a second each took about a quarter of the client's core). When more than
//! [`Liveness::relay_group`] of its hosts answered within half of [`Liveness::timeout`]
//! (*fresh* hosts), it splits the hosts it monitors, in order, into groups of that size
//! and sends the first fresh host of each group one [`Control::HeartbeatRelay`] naming
//! the group's other fresh hosts (the groups are cut from all the monitored hosts, so a
//! host that stops being fresh changes only its own group). That
//! relay forwards the heartbeat to each of them ([`Control::RelayedHeartbeat`], which
//! renews the monitoring agent's leases there as a heartbeat would), and answers at
//! once with [`Control::HeartbeatAcks`]: how long ago each member answered the heartbeat
//! it last relayed. The monitoring agent takes those times as the members' answers.
//! With more hosts than a group of groups (1,024 with groups of 32), the relays are
//! themselves reached through relays: the first fresh host of each block of
//! `relay_group²` hosts gets the heartbeat and relays it to the relay of each group of
//! the block, which relays it to its group, and so on for as many levels as
//! keep the monitoring agent's relays at most [`Liveness::relay_group`] (and as the
//! timeout allows, below). A relay's answer covers every host below it, from what the
//! relays below it last told it.
//!
//! So that the monitoring agent's work per round grows with its relays, not its hosts,
//! a relay keeps the members it was given ([`RelayMembers`]): they are named only when
//! they change (the fresh hosts changed: a new tree, numbered) or the relay says it does
//! not know them
//! ([`RelayAnswer::UnknownTree`](super::control::RelayAnswer::UnknownTree): it restarted, or forgot them after a minute unused);
//! otherwise the heartbeat names only the tree. And a relay's answer
//! ([`RelayAnswer::Below`](super::control::RelayAnswer::Below)) names only the hosts below it that answered longer ago
//! than the heartbeat's `quiet_ms` (or never), with when; for all the others it says
//! one time they all answered within. `quiet_ms` is half an interval more than an
//! answer's usual lag through the levels, so the hosts answered for together stay fresh.
//!
//! Every host that is not fresh — one whose relay stopped answering, or one that
//! stopped answering its relay — gets direct heartbeats again, so a host is
//! given up for lost only after it left direct heartbeats unanswered for at least half
//! of the timeout: a relay's loss makes the hosts below it go direct, not lost. Each
//! level makes a member's answer reach the monitoring agent up to one interval later,
//! so relaying needs a timeout of at least six intervals for one level (a member's
//! answer arrives up to two intervals late), eight for two (the default: 250 ms and
//! 2 s), and two more for each further level; with a shorter one every heartbeat is
//! direct.
//!
//! A lost host is remembered as lost until then: stopping procs there and ending it
//! ([`super::ProcAgent::end_host`]) do not wait for an answer from it, and a wait for
//! one ends as soon as the host is found lost (LIVE-3), so a host that stops answering
//! holds them up for at most [`Liveness::timeout`].
//!
//! On the host side, a heartbeat renews the **lease** of the sender's proc. When a proc
//! that owns procs of this host, but is not one of them (a client on another machine),
//! sends no heartbeat for [`Liveness::lease`], the host kills the procs it owns there
//! (LIVE-2): a client that dies or is cut off leaves no orphans behind, and the host
//! serves the next client.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hyperactor::{PortId, ProcId};

use tokio::task::AbortHandle;

use super::control::{HostService, RelayMembers};
use super::lock::{Rank, Ranked};
use super::{Control, Inner};
use crate::supervision::{ProcDeath, ProcEnd};

mod relay;

use relay::{members_for, relay_tree, Given, Member, Sent, Tree};

/// Default [`Liveness::interval`].
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);
/// Default [`Liveness::timeout`].
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default [`Liveness::lease`].
pub const DEFAULT_CLIENT_LEASE: Duration = Duration::from_secs(10);
/// Default [`Liveness::relay_group`].
pub const DEFAULT_RELAY_GROUP: usize = 32;
/// How long a relay remembers a member it has not been asked to relay to.
const MEMBER_MEMORY: Duration = Duration::from_secs(60);
/// The most levels of relays between a monitoring agent and a host (four levels of 32
/// reach a million hosts).
const MAX_RELAY_LEVELS: usize = 4;

/// The timing of heartbeats and leases (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How often an agent sends a heartbeat to each host it monitors.
    pub interval: Duration,
    /// How long a host may leave heartbeats unanswered before it is lost.
    pub timeout: Duration,
    /// How long a host keeps the procs of a client that sends no heartbeat.
    pub lease: Duration,
    /// How many hosts share one relayed heartbeat (the relay and the members it
    /// forwards to); heartbeats are relayed only to an agent monitoring more fresh hosts
    /// than this (see the [module docs](self)). 0 or 1: never relayed.
    pub relay_group: usize,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEARTBEAT_INTERVAL,
            timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            lease: DEFAULT_CLIENT_LEASE,
            relay_group: DEFAULT_RELAY_GROUP,
        }
    }
}

impl Liveness {
    /// How long since a host's last answer before it gets direct heartbeats again.
    fn fresh_for(&self) -> Duration {
        self.timeout / 2
    }

    /// How many levels of relays the timing allows (0: none): groups of two or more,
    /// and a timeout that leaves a member's late answers (up to one interval per level,
    /// and one more) and then direct heartbeats time to arrive.
    fn max_relay_levels(&self) -> usize {
        if self.relay_group < 2 || self.interval.is_zero() {
            return 0;
        }
        let intervals = (self.fresh_for().as_nanos() / self.interval.as_nanos()) as usize;
        intervals.saturating_sub(2).min(MAX_RELAY_LEVELS)
    }

    /// How many levels of relays heartbeats to `hosts` fresh hosts go through: the
    /// fewest that leave the monitoring agent at most [`Liveness::relay_group`] relays,
    /// as far as the timing allows; 0 for a group's worth or fewer.
    fn relay_levels(&self, hosts: usize) -> usize {
        let most = self.max_relay_levels();
        if most == 0 || hosts <= self.relay_group {
            return 0;
        }
        let mut levels = 1;
        let mut block = self.relay_group;
        while levels < most && hosts.div_ceil(block) > self.relay_group {
            levels += 1;
            block = block.saturating_mul(self.relay_group);
        }
        levels
    }
}

/// How many heartbeats an agent sent, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeartbeatCounts {
    /// Rounds of the heartbeat task (one every [`Liveness::interval`] while hosts are
    /// monitored).
    pub rounds: u64,
    /// Heartbeats sent to a host directly.
    pub direct: u64,
    /// Heartbeats sent to relays ([`Control::HeartbeatRelay`]) by this agent as a
    /// monitoring agent (not those it passed on as a relay).
    pub relayed: u64,
    /// Hosts reached through those relays (every host below them).
    pub members: u64,
    /// Hosts named in those relayed heartbeats: a relay is told the hosts below it
    /// only when they change (or it forgot them), else the number of the tree it was
    /// given.
    pub named: u64,
}

/// The hosts an agent monitors, and those it gave up for lost or asked to end: the host
/// liveness component. It owns its state behind one lock, which only its methods take;
/// none calls anything else while holding it (see [`super::lock`]).
pub(super) struct HostLiveness {
    config: Liveness,
    state: Ranked<HostsState>,
    /// Bumped after each host loss, for those who wait on one.
    lost_events: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct HostsState {
    /// Hosts this agent monitors, and when each last answered a heartbeat (directly or
    /// through a relay).
    monitored: HashMap<ProcId, Instant>,
    /// The tasks watching the connections to monitored hosts, aborted when a host is no
    /// longer monitored.
    watchers: HashMap<ProcId, AbortHandle>,
    /// Whether the heartbeat task runs (it ends when no host is monitored).
    ticking: bool,
    /// As a relay: the members this agent relayed heartbeats to.
    members: HashMap<ProcId, Member>,
    /// As a monitoring agent: the monitored hosts in order (empty when they changed).
    order: Vec<ProcId>,
    /// As a monitoring agent: the relay tree of the last rounds, rebuilt when the
    /// fresh hosts change.
    tree: Option<Tree>,
    /// The number of the next tree built.
    next_tree: u64,
    /// As a sender of relayed heartbeats (a monitoring agent, or a relay passing one
    /// on): what each relay was last given, by (monitoring agent, relay).
    sent: HashMap<(ProcId, ProcId), Sent>,
    /// As a relay: the members each sender last gave, by (monitoring agent, the port
    /// the answers go to).
    given: HashMap<(ProcId, PortId), Given>,
    counts: HeartbeatCounts,
    /// Hosts given up for lost, and why, until they are monitored afresh (see the
    /// [module docs](self)): stopping and ending never wait on them.
    lost: HashMap<ProcId, String>,
    /// Hosts asked to end ([`super::ProcAgent::end_host`]), until monitored afresh:
    /// their loss fails none of their procs.
    ending: HashSet<ProcId>,
}

/// What one round of the heartbeat task does.
#[derive(Default)]
struct Round {
    /// Hosts that answered nothing for the timeout.
    lost: Vec<ProcId>,
    /// Hosts that get a heartbeat of their own.
    direct: Vec<ProcId>,
    /// The heartbeats sent to relays: each relay, and its members.
    relayed: Vec<(ProcId, RelayMembers)>,
    /// The levels of relays.
    levels: usize,
}

impl HostLiveness {
    pub(super) fn new(config: Liveness) -> Self {
        Self {
            config,
            state: Ranked::new(Rank::Component),
            lost_events: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The timing of heartbeats and leases.
    pub(super) fn config(&self) -> Liveness {
        self.config
    }

    /// Starts monitoring `host`: `None` if it is monitored already, else whether the
    /// heartbeat task must be started. Monitored afresh, a host lost before (or ended)
    /// is in use again.
    fn start_monitoring(&self, host: &ProcId) -> Option<bool> {
        let mut state = self.state.lock();
        if state.monitored.contains_key(host) {
            return None;
        }
        state.lost.remove(host);
        state.ending.remove(host);
        state.monitored.insert(host.clone(), Instant::now());
        state.order.clear();
        let start = !state.ticking;
        state.ticking = true;
        Some(start)
    }

    /// Keeps `watcher` (the task watching `host`'s connection) to abort it when `host`
    /// is no longer monitored (at once if it is not any more).
    fn keep_watcher(&self, host: &ProcId, watcher: AbortHandle) {
        let mut state = self.state.lock();
        if state.monitored.contains_key(host) {
            if let Some(old) = state.watchers.insert(host.clone(), watcher) {
                old.abort();
            }
        } else {
            watcher.abort();
        }
    }

    /// Stops monitoring `host`.
    fn stop_monitoring(&self, host: &ProcId) {
        let mut state = self.state.lock();
        state.monitored.remove(host);
        state.order.clear();
        if let Some(watcher) = state.watchers.remove(host) {
            watcher.abort();
        }
    }

    /// `host` answered a heartbeat (if it is monitored, or a member relayed to).
    fn acked(&self, host: &ProcId) {
        let now = Instant::now();
        let mut state = self.state.lock();
        if let Some(at) = state.monitored.get_mut(host) {
            *at = now;
        }
        if let Some(member) = state.members.get_mut(host) {
            member.answered = Some(now);
        }
    }

    /// The next round of the heartbeat task of `me`'s agent: the hosts found lost,
    /// and where the heartbeats go (see the [module docs](self)); `None` when no host
    /// is monitored (the task ends).
    fn round(&self, me: &ProcId) -> Option<Round> {
        let config = self.config;
        let now = Instant::now();
        let mut state = self.state.lock();
        if state.monitored.is_empty() {
            state.ticking = false;
            return None;
        }
        let mut round = Round::default();
        let mut fresh = Vec::new();
        for (host, at) in &state.monitored {
            let silent = now.saturating_duration_since(*at);
            if silent > config.timeout {
                round.lost.push(host.clone());
            } else if silent <= config.fresh_for() {
                fresh.push(host.clone());
            } else {
                round.direct.push(host.clone());
            }
        }
        // The levels follow the monitored hosts, not the fresh ones, so that the
        // groups stay when some hosts stop being fresh.
        let levels = if fresh.len() > config.relay_group {
            config.relay_levels(state.monitored.len())
        } else {
            0
        };
        round.levels = levels;
        let state = &mut *state;
        let mut below = 0;
        let mut named = 0;
        if levels > 0 {
            let same = state.tree.as_ref().is_some_and(|tree| {
                tree.levels == levels
                    && tree.hosts.len() == fresh.len()
                    && fresh.iter().all(|host| tree.hosts.contains(host))
            });
            if !same {
                if state.order.len() != state.monitored.len() {
                    state.order = state.monitored.keys().cloned().collect();
                    state.order.sort_unstable();
                }
                let fresh_set: HashSet<ProcId> = fresh.into_iter().collect();
                let targets = relay_tree(
                    &state.order,
                    &|host| fresh_set.contains(host),
                    config.relay_group,
                    levels,
                );
                let number = state.next_tree;
                state.next_tree += 1;
                state.tree = Some(Tree {
                    number,
                    levels,
                    below: targets
                        .iter()
                        .map(|target| target.below().count() as u64)
                        .sum(),
                    hosts: fresh_set,
                    targets,
                });
            }
            state
                .sent
                .retain(|_, last| now.duration_since(last.used) < MEMBER_MEMORY);
            if let Some(tree) = &state.tree {
                below = tree.below;
                for target in &tree.targets {
                    if target.members.is_empty() {
                        round.direct.push(target.proc.clone());
                        continue;
                    }
                    let members = members_for(
                        &mut state.sent,
                        me,
                        &target.proc,
                        tree.number,
                        &target.members,
                        now,
                    );
                    if matches!(members, RelayMembers::New { .. }) {
                        named += target.below().count() as u64;
                    }
                    round.relayed.push((target.proc.clone(), members));
                }
            }
        } else {
            state.tree = None;
            round.direct.append(&mut fresh);
        }
        let counts = &mut state.counts;
        counts.rounds += 1;
        counts.direct += round.direct.len() as u64;
        counts.relayed += round.relayed.len() as u64;
        counts.members += below;
        counts.named += named;
        Some(round)
    }

    /// How many heartbeats were sent.
    pub(super) fn counts(&self) -> HeartbeatCounts {
        self.state.lock().counts
    }

    /// When `host` last answered, if it is monitored.
    fn last_ack(&self, host: &ProcId) -> Option<Instant> {
        self.state.lock().monitored.get(host).copied()
    }

    /// When each monitored host last answered.
    pub(super) fn acks(&self) -> HashMap<ProcId, Instant> {
        self.state.lock().monitored.clone()
    }

    /// The hosts monitored or given up for lost.
    pub(super) fn known_hosts(&self) -> Vec<ProcId> {
        let state = self.state.lock();
        state
            .monitored
            .keys()
            .chain(state.lost.keys())
            .cloned()
            .collect()
    }

    /// Why `host` was given up for lost, if it was (and is not monitored afresh since).
    pub(super) fn lost_reason(&self, host: &ProcId) -> Option<String> {
        self.state.lock().lost.get(host).cloned()
    }

    /// `host` is asked to end: its loss fails none of its procs.
    pub(super) fn mark_ending(&self, host: &ProcId) {
        self.state.lock().ending.insert(host.clone());
    }

    /// Whether `host` was asked to end.
    pub(super) fn is_ending(&self, host: &ProcId) -> bool {
        self.state.lock().ending.contains(host)
    }

    /// Records `host` as lost (`reason`) and wakes those who wait for it.
    fn record_lost(&self, host: &ProcId, reason: &str) {
        self.state
            .lock()
            .lost
            .insert(host.clone(), reason.to_string());
        self.lost_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Completes, with the reason, once `host` is given up for lost (at once if it is).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn lost_wait(&self, host: &ProcId) -> String {
        let mut events = self.lost_events.subscribe();
        loop {
            if let Some(why) = self.lost_reason(host) {
                return why;
            }
            if events.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

impl Drop for HostLiveness {
    fn drop(&mut self) {
        for watcher in self.state.lock().watchers.values() {
            watcher.abort();
        }
    }
}

impl Inner {
    /// Starts monitoring `host` (once; never this agent's own proc): a first heartbeat
    /// now, then the heartbeat task's.
    pub(super) fn monitor_host(self: &Arc<Self>, host: &ProcId) {
        if host == self.proc.proc_id() {
            return;
        }
        let Some(start_ticking) = self.liveness.start_monitoring(host) else {
            return;
        };
        let watcher = tokio::spawn(watch_link(Arc::downgrade(self), host.clone()));
        self.liveness.keep_watcher(host, watcher.abort_handle());
        if start_ticking {
            tokio::spawn(heartbeats(Arc::downgrade(self)));
        }
        self.send_heartbeat(host);
    }

    fn send_heartbeat(&self, host: &ProcId) {
        self.send_control(
            host,
            &Control::Heartbeat {
                from: self.id.port_id(super::CONTROL_PORT),
            },
        );
    }

    pub(super) fn on_heartbeat(&self, from: PortId) {
        let client = from.actor().proc_id().clone();
        self.on_heartbeat_from(&client, from);
    }

    /// A heartbeat from `client`'s agent (directly, or through a relay): renews its
    /// lease here and answers `ack_to`.
    pub(super) fn on_heartbeat_from(&self, client: &ProcId, ack_to: PortId) {
        self.renew_lease(client);
        self.send_control_to(
            ack_to,
            &Control::HeartbeatAck {
                proc: self.proc.proc_id().clone(),
            },
        );
    }

    /// On a host agent: `client` showed it is alive (see [`HostService::renew_lease`]).
    fn renew_lease(&self, client: &ProcId) {
        if let Some(host) = &self.host {
            host.renew_lease(client, self.proc.proc_id());
        }
    }

    pub(super) fn on_heartbeat_ack(&self, proc: &ProcId) {
        self.liveness.acked(proc);
    }

    pub(super) fn on_abandon(&self, reason: &str, from: &hyperactor::ActorId) {
        if self.spawned_by.is_none() {
            tracing::warn!(agent = %self.id, "ignoring a request from {from} to exit: this proc has no host");
            return;
        }
        tracing::error!(agent = %self.id, "exiting: {reason} (as {from} said)");
        // SAFETY: _exit ends the process at once, which is the point: its host is gone
        // and nothing of it may keep running.
        unsafe { libc::_exit(75) };
    }

    /// Stops monitoring `host` (its monitor task ends at its next tick).
    pub(super) fn unmonitor_host(&self, host: &ProcId) {
        self.liveness.stop_monitoring(host);
    }

    /// Why `host` was given up for lost, if it was (and is not monitored afresh since).
    pub(super) fn lost_reason(&self, host: &ProcId) -> Option<String> {
        self.liveness.lost_reason(host)
    }

    /// Completes, with the reason, once `host` is given up for lost (at once if it is).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn host_lost_wait(&self, host: &ProcId) -> String {
        self.liveness.lost_wait(host).await
    }

    /// `host` is lost: every proc of it that this agent knows of is dead (LIVE-1),
    /// unless the host is being ended (then its procs are being stopped, not failed).
    fn host_lost(self: &Arc<Self>, host: &ProcId, reason: &str) {
        self.unmonitor_host(host);
        if self.liveness.is_ending(host) {
            tracing::info!(agent = %self.id, "host {host}, which was asked to end, is lost ({reason})");
            self.liveness.record_lost(host, reason);
            return;
        }
        // (proc, pid, owned here): only an owner tells its procs to exit.
        let mut procs = self.supervisor.procs_of_host(host);
        procs.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
        procs.dedup_by(|a, b| a.0 == b.0);
        tracing::warn!(agent = %self.id, "host {host} is lost ({reason}); {} of its procs are failed", procs.len());
        let mut event = crate::monitor::Event::new(
            "host_lost",
            format!(
                "host {host} is lost ({reason}); {} of its procs are failed",
                procs.len()
            ),
        );
        event.host = Some(host.to_string());
        event.class = Some("infrastructure".to_string());
        event.cause = vec![reason.to_string()];
        crate::monitor::events::record(event);
        let why = format!("its host {host} was lost: {reason}");
        for (proc, pid, owned) in procs {
            if self.supervisor.is_confirmed_dead(&proc) {
                continue;
            }
            if owned {
                let abandon = Control::Abandon {
                    reason: why.clone(),
                };
                self.send_control(&proc, &abandon);
            }
            self.on_proc_died(ProcDeath {
                proc_id: proc,
                pid,
                end: ProcEnd::Lost {
                    reason: why.clone(),
                },
                expected: false,
            });
        }
        // Recorded last: whoever sees the host lost sees its procs' deaths handled.
        self.liveness.record_lost(host, reason);
    }
}

/// The heartbeat task of an agent: every [`Liveness::interval`], gives up the hosts
/// that answered nothing for [`Liveness::timeout`] and sends the others heartbeats,
/// directly or through relays (see the [module docs](self)). It ends when no host is
/// monitored (the next [`Inner::monitor_host`] starts it again) or the agent is gone.
async fn heartbeats(weak: Weak<Inner>) {
    let Some(interval) = weak.upgrade().map(|inner| inner.liveness.config().interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; monitor_host sent the first heartbeat.
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(inner) = weak.upgrade() else { return };
        if !inner.heartbeat_round() {
            return;
        }
    }
}

impl Inner {
    /// One round of the heartbeat task; false when no host is monitored.
    fn heartbeat_round(self: &Arc<Self>) -> bool {
        let me = self.proc.proc_id().clone();
        let Some(round) = self.liveness.round(&me) else {
            return false;
        };
        let config = self.liveness.config();
        let timeout = config.timeout;
        // Hosts below a relay that answered it longer ago than this are named in its
        // answer, the others answered for together: an answer normally reaches a relay
        // up to one interval per level below it late, so this is half an interval more
        // than that, and leaves the others an interval before they would stop being
        // fresh here.
        let quiet = (config.interval * round.levels as u32 + config.interval / 2)
            .min(config.fresh_for().saturating_sub(config.interval));
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        for host in &round.lost {
            self.host_lost(
                host,
                &format!(
                    "it answered no heartbeat for {timeout:?} (its network may be cut, or \
                     its agent frozen)"
                ),
            );
        }
        let ack_to = self.id.port_id(super::CONTROL_PORT);
        // One batch of writes per round: each link writes what gathered together.
        let _batched = hyperactor::channel::QueueWrites::new(true);
        for host in &round.direct {
            self.send_heartbeat(host);
        }
        for (relay, members) in round.relayed {
            self.send_control(
                &relay,
                &Control::HeartbeatRelay {
                    client: me.clone(),
                    ack_to: ack_to.clone(),
                    quiet_ms,
                    members,
                },
            );
        }
        true
    }
}

/// Watches the connection to a monitored host: when it fails, a direct heartbeat goes
/// out at once (which connects again); a second failure with no answer since the
/// first gives the host up for lost. Aborted when the host is no longer monitored.
async fn watch_link(weak: Weak<Inner>, host: ProcId) {
    let proc = match weak.upgrade() {
        Some(inner) => inner.proc.clone(),
        None => return,
    };
    // When the connection failed, and the last answer seen then.
    let mut broken: Option<Instant> = None;
    loop {
        let error = proc.link_failed(&host).await;
        let Some(inner) = weak.upgrade() else { return };
        // Not monitored any more: this watcher ends.
        let Some(last_ack) = inner.liveness.last_ack(&host) else {
            return;
        };
        match broken {
            // A second failure with no answer since the first: it is gone.
            Some(at) if last_ack <= at => {
                return inner.host_lost(&host, &format!("its connection failed: {error}"));
            }
            _ => {
                broken = Some(Instant::now());
                inner.send_heartbeat(&host);
            }
        }
    }
}

impl HostService {
    /// `client` (a proc) showed it is alive; if it is not one of this host's procs and
    /// owns procs here, its lease starts or is renewed.
    pub(super) fn renew_lease(&self, client: &ProcId, host: &ProcId) {
        if client == host {
            return;
        }
        let mut state = self.state.lock();
        if state.handles.contains_key(client) {
            return;
        }
        state.leases.insert(client.clone(), Instant::now());
    }

    /// Starts the task that kills the procs of clients whose lease ran out (LIVE-2).
    pub(super) fn start_leases(self: &Arc<Self>, lease: Duration) {
        let service = Arc::downgrade(self);
        let period = (lease / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            loop {
                ticker.tick().await;
                let Some(service) = service.upgrade() else {
                    return;
                };
                let doomed = {
                    let mut state = service.state.lock();
                    let expired: Vec<ProcId> = state
                        .leases
                        .iter()
                        .filter(|(_, at)| at.elapsed() > lease)
                        .map(|(p, _)| p.clone())
                        .collect();
                    let mut doomed = Vec::new();
                    for client in expired {
                        state.leases.remove(&client);
                        for (proc, owner) in &state.owners {
                            if owner.proc_id() == &client {
                                if let Some(handle) = state.handles.get(proc) {
                                    doomed.push((client.clone(), handle.clone()));
                                }
                            }
                        }
                    }
                    doomed
                };
                for (client, handle) in doomed {
                    let reason = format!(
                        "its owner's proc {client} sent no heartbeat for {lease:?} (the \
                         client went away)"
                    );
                    if handle.kill_lost(reason) {
                        tracing::warn!(
                            "killed proc {} of client {client}: its lease ran out",
                            handle.proc_id()
                        );
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
