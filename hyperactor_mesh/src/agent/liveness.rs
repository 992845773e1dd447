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
//! ([`RelayAnswer::UnknownTree`]: it restarted, or forgot them after a minute unused);
//! otherwise the heartbeat names only the tree. And a relay's answer
//! ([`RelayAnswer::Below`]) names only the hosts below it that answered longer ago
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

use super::control::{HostService, MemberAnswer, RelayAnswer, RelayMembers, RelayTarget};
use super::lock::{Rank, Ranked};
use super::{Control, Inner};
use crate::supervision::{ProcDeath, ProcEnd};

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

/// The heartbeat's way to the hosts of `hosts` (in order) that are `fresh`, through
/// `levels` levels of relays in groups of `group`: each block of `group^levels` hosts
/// is reached through its first fresh host, which relays to the rest of its block the
/// same way, one level fewer. The blocks are cut from `hosts`, not from the fresh
/// hosts, so that a host that stops being fresh changes only the groups it is in:
/// the others keep their relays, and their relays' knowledge of when they answered.
fn relay_tree(
    hosts: &[ProcId],
    fresh: &dyn Fn(&ProcId) -> bool,
    group: usize,
    levels: usize,
) -> Vec<RelayTarget> {
    if levels == 0 {
        return hosts
            .iter()
            .filter(|host| fresh(host))
            .cloned()
            .map(RelayTarget::leaf)
            .collect();
    }
    let block = group.saturating_pow(levels as u32);
    hosts
        .chunks(block)
        .filter_map(|block| {
            let relay = block.iter().find(|host| fresh(host))?;
            let rest = |host: &ProcId| host != relay && fresh(host);
            Some(RelayTarget {
                proc: relay.clone(),
                members: relay_tree(&block[1..], &rest, group, levels - 1),
            })
        })
        .collect()
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

/// A member of relayed heartbeats, at its relay.
struct Member {
    /// When the relay last forwarded it a heartbeat.
    forwarded: Instant,
    /// When it last answered one (`None`: not yet).
    answered: Option<Instant>,
}

/// A monitoring agent's relay tree (see [`relay_tree`]).
struct Tree {
    /// Its number, which relays are given it by.
    number: u64,
    /// Its levels of relays.
    levels: usize,
    /// The fresh hosts it was built for.
    hosts: HashSet<ProcId>,
    /// Its top level: the hosts the monitoring agent sends to.
    targets: Vec<RelayTarget>,
    /// How many hosts are below the relays of the top level.
    below: u64,
}

/// What a relay was last given by this agent (see [`RelayMembers`]).
struct Sent {
    /// The tree's number.
    tree: u64,
    /// Its members in that tree.
    members: Vec<RelayTarget>,
    /// Every host below the relay in that tree.
    below: Vec<ProcId>,
    /// False once the relay answered that it does not know the tree: it is given the
    /// members again.
    known: bool,
    /// When it was last sent a heartbeat.
    used: Instant,
}

/// The members a relay was last given by one sender.
struct Given {
    /// The tree's number.
    tree: u64,
    /// The members.
    members: Arc<Vec<RelayTarget>>,
    /// When it was last used.
    used: Instant,
}

/// What `relay` is sent for `client`'s tree `tree`, in which its members are
/// `members`: only the number of the tree it was given them with, if it was.
fn members_for(
    sent: &mut HashMap<(ProcId, ProcId), Sent>,
    client: &ProcId,
    relay: &ProcId,
    tree: u64,
    members: &[RelayTarget],
    now: Instant,
) -> RelayMembers {
    let key = (client.clone(), relay.clone());
    match sent.get_mut(&key) {
        Some(last) if last.known && (last.tree == tree || last.members == members) => {
            last.used = now;
            RelayMembers::Same { tree: last.tree }
        }
        _ => {
            let below = members
                .iter()
                .flat_map(|m| std::iter::once(&m.proc).chain(m.below()))
                .cloned()
                .collect();
            sent.insert(
                key,
                Sent {
                    tree,
                    members: members.to_vec(),
                    below,
                    known: true,
                    used: now,
                },
            );
            RelayMembers::New {
                tree,
                members: members.to_vec(),
            }
        }
    }
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

    /// A relay (`relay`, which answered now) says when the hosts below it in
    /// `client`'s tree `tree` last answered: taken as their answers by a monitoring
    /// agent, and by a relay one level up as its members' answers.
    fn relay_acked(&self, relay: &ProcId, client: &ProcId, tree: u64, answer: RelayAnswer) {
        let now = Instant::now();
        let mut state = self.state.lock();
        let HostsState {
            monitored,
            members,
            sent,
            ..
        } = &mut *state;
        // Moves what is known of `host`'s last answer up to `answered`.
        let mut answered_at = |host: &ProcId, answered: Instant| {
            if let Some(at) = monitored.get_mut(host) {
                *at = (*at).max(answered);
            }
            if let Some(known) = members.get_mut(host) {
                known.answered = Some(known.answered.map_or(answered, |at| at.max(answered)));
            }
        };
        answered_at(relay, now);
        let last = sent
            .get_mut(&(client.clone(), relay.clone()))
            .filter(|last| last.tree == tree);
        match answer {
            RelayAnswer::UnknownTree => {
                if let Some(last) = last {
                    last.known = false;
                }
            }
            RelayAnswer::Below { within_ms, quiet } => {
                let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms));
                for member in &quiet {
                    if let Some(answered) = member.age_ms.and_then(ago) {
                        answered_at(&member.proc, answered);
                    }
                }
                if let (Some(last), Some(answered)) = (last, within_ms.and_then(ago)) {
                    let named: HashSet<&ProcId> = quiet.iter().map(|m| &m.proc).collect();
                    for host in &last.below {
                        if !named.contains(host) {
                            answered_at(host, answered);
                        }
                    }
                }
            }
        }
    }

    /// As a relay: the members that `client`'s heartbeat, answered to `ack_to`, goes on
    /// to, with their tree's number; `None` if they are given as a tree this relay does
    /// not know. Members not used for a long time are forgotten.
    fn take_members(
        &self,
        client: &ProcId,
        ack_to: &PortId,
        members: RelayMembers,
    ) -> Option<(u64, Arc<Vec<RelayTarget>>)> {
        let now = Instant::now();
        let mut state = self.state.lock();
        state
            .given
            .retain(|_, given| now.duration_since(given.used) < MEMBER_MEMORY);
        let key = (client.clone(), ack_to.clone());
        match members {
            RelayMembers::New { tree, members } => {
                let members = Arc::new(members);
                state.given.insert(
                    key,
                    Given {
                        tree,
                        members: members.clone(),
                        used: now,
                    },
                );
                Some((tree, members))
            }
            RelayMembers::Same { tree } => {
                let given = state.given.get_mut(&key).filter(|g| g.tree == tree)?;
                given.used = now;
                Some((tree, given.members.clone()))
            }
        }
    }

    /// As a relay passing `client`'s heartbeat on: what `relay` is sent for tree `tree`
    /// (see [`members_for`]).
    fn members_for(
        &self,
        client: &ProcId,
        relay: &ProcId,
        tree: u64,
        members: &[RelayTarget],
    ) -> RelayMembers {
        let now = Instant::now();
        let mut state = self.state.lock();
        state
            .sent
            .retain(|_, last| now.duration_since(last.used) < MEMBER_MEMORY);
        members_for(&mut state.sent, client, relay, tree, members, now)
    }

    /// As a relay: when the hosts below it (`below`) last answered (see
    /// [`RelayAnswer`]; those silent for longer than `quiet` are named), noting that
    /// they are now sent a heartbeat. Members not relayed to for a long time are
    /// forgotten.
    fn relay<'a>(&self, below: impl Iterator<Item = &'a ProcId>, quiet: Duration) -> RelayAnswer {
        let now = Instant::now();
        let mut state = self.state.lock();
        state
            .members
            .retain(|_, m| now.duration_since(m.forwarded) < MEMBER_MEMORY);
        let mut within: Option<Duration> = None;
        let mut named = Vec::new();
        for proc in below {
            let member = state.members.entry(proc.clone()).or_insert(Member {
                forwarded: now,
                answered: None,
            });
            member.forwarded = now;
            let age = member.answered.map(|at| now.saturating_duration_since(at));
            match age {
                Some(age) if age <= quiet => within = Some(within.map_or(age, |w| w.max(age))),
                _ => named.push(MemberAnswer {
                    proc: proc.clone(),
                    age_ms: age.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
                }),
            }
        }
        RelayAnswer::Below {
            // Rounded up: the hosts answered no longer ago than this.
            within_ms: within.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX) + 1),
            quiet: named,
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

    /// A heartbeat from `client`'s agent to relay to `members`: answered first (with
    /// when the hosts below this one last answered), then passed on, as a heartbeat
    /// to members with no members of their own and as a relayed heartbeat to the
    /// others.
    pub(super) fn on_heartbeat_relay(
        &self,
        client: ProcId,
        ack_to: PortId,
        quiet_ms: u64,
        members: RelayMembers,
    ) {
        self.renew_lease(&client);
        let me = self.proc.proc_id().clone();
        let asked = members.tree();
        let Some((tree, members)) = self.liveness.take_members(&client, &ack_to, members) else {
            self.send_control_to(
                ack_to,
                &Control::HeartbeatAcks {
                    proc: me,
                    client,
                    tree: asked,
                    answer: RelayAnswer::UnknownTree,
                },
            );
            return;
        };
        let below = members
            .iter()
            .flat_map(|member| std::iter::once(&member.proc).chain(member.below()));
        let answer = self.liveness.relay(below, Duration::from_millis(quiet_ms));
        self.send_control_to(
            ack_to,
            &Control::HeartbeatAcks {
                proc: me.clone(),
                client: client.clone(),
                tree,
                answer,
            },
        );
        let own = self.id.port_id(super::CONTROL_PORT);
        let relayed = Control::RelayedHeartbeat {
            client: client.clone(),
            ack_to: own.clone(),
        };
        // One batch of writes: each link writes what gathered together.
        let _batched = hyperactor::channel::QueueWrites::new(true);
        for member in members.iter().filter(|member| member.proc != me) {
            if member.members.is_empty() {
                self.send_control(&member.proc, &relayed);
                continue;
            }
            let members = self
                .liveness
                .members_for(&client, &member.proc, tree, &member.members);
            self.send_control(
                &member.proc,
                &Control::HeartbeatRelay {
                    client: client.clone(),
                    ack_to: own.clone(),
                    quiet_ms,
                    members,
                },
            );
        }
    }

    pub(super) fn on_heartbeat_ack(&self, proc: &ProcId) {
        self.liveness.acked(proc);
    }

    pub(super) fn on_heartbeat_acks(
        &self,
        relay: &ProcId,
        client: &ProcId,
        tree: u64,
        answer: RelayAnswer,
    ) {
        self.liveness.relay_acked(relay, client, tree, answer);
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
mod tests {
    use std::future::Future;

    use hyperactor::ChannelTransport;

    use super::*;
    use crate::agent::{AgentOptions, ProcAgent};
    use crate::host::Host;

    /// Heartbeats every 20 ms in groups of 3; a host silent for 1.2 s is lost.
    fn relaying() -> Liveness {
        Liveness {
            interval: Duration::from_millis(20),
            timeout: Duration::from_millis(1200),
            lease: Duration::from_secs(10),
            relay_group: 3,
        }
    }

    /// A client agent monitoring `n` host agents (each with a host, so that
    /// heartbeats renew the client's lease there), in the order of their ids.
    async fn monitoring(n: usize, liveness: Liveness) -> (ProcAgent, Vec<ProcAgent>) {
        let mut hosts = Vec::new();
        for _ in 0..n {
            let host = Host::serve(ChannelTransport::Unix).await.unwrap();
            let proc = host.proc().clone();
            hosts.push(ProcAgent::new(proc, AgentOptions::default().host(host)).unwrap());
        }
        hosts.sort_by(|a, b| a.proc().proc_id().cmp(b.proc().proc_id()));
        let client = ProcAgent::serve(
            ChannelTransport::Unix,
            "client",
            AgentOptions::default().liveness(liveness),
        )
        .await
        .unwrap();
        for host in &hosts {
            client.monitor_host(host.proc().proc_id());
        }
        (client, hosts)
    }

    /// Waits, at most 30 s, until `done` holds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("waited 30 s for {what}"));
    }

    /// Waits until the client's heartbeat task ran `rounds` more rounds.
    fn rounds_later(client: &ProcAgent, rounds: u64) -> impl Future<Output = ()> + '_ {
        let target = client.heartbeat_counts().rounds + rounds;
        async move {
            until("heartbeat rounds", || {
                client.heartbeat_counts().rounds >= target
            })
            .await;
        }
    }

    /// How long ago each host answered, as the client knows it.
    fn ages(client: &ProcAgent, hosts: &[ProcAgent]) -> Vec<Option<Duration>> {
        let acks = client.inner.liveness.acks();
        hosts
            .iter()
            .map(|h| acks.get(h.proc().proc_id()).map(Instant::elapsed))
            .collect()
    }

    /// How long ago `host` renewed `client`'s lease.
    fn lease_age(host: &ProcAgent, client: &ProcAgent) -> Option<Duration> {
        let service = host.inner.host.as_ref().expect("a host agent");
        let state = service.state.lock();
        state
            .leases
            .get(client.proc().proc_id())
            .map(Instant::elapsed)
    }

    /// A client monitoring `n` hosts: over 20 rounds (after 5 to settle) it sent about
    /// `direct` direct and `relayed` relayed heartbeats a round (one round's slack
    /// each), its relays reached at least `members` - 1 hosts a round, and every host
    /// answered within the time that keeps it fresh and renewed the client's lease as
    /// recently.
    async fn relays_reach_every_host(
        n: usize,
        direct: u64,
        relayed: u64,
        members: u64,
    ) -> (ProcAgent, Vec<ProcAgent>) {
        let (client, hosts) = monitoring(n, relaying()).await;
        rounds_later(&client, 5).await;
        let before = client.heartbeat_counts();
        rounds_later(&client, 20).await;
        let after = client.heartbeat_counts();
        let rounds = after.rounds - before.rounds;
        let sent = (
            after.direct - before.direct,
            after.relayed - before.relayed,
            after.members - before.members,
        );
        let named = after.named - before.named;
        assert!(
            sent.0 <= (rounds + 1) * direct
                && sent.1 <= (rounds + 1) * relayed
                && sent.1 >= rounds
                && sent.2 >= rounds * (members - 1),
            "in {rounds} rounds, (direct, relayed, hosts reached through relays): {sent:?}"
        );
        // The relays keep their members: naming them all every round would be sent.2.
        assert!(
            named * 4 <= sent.2,
            "{named} hosts named to relays in {rounds} rounds, for {} reached",
            sent.2
        );
        let fresh = relaying().fresh_for();
        for (host, age) in hosts.iter().zip(ages(&client, &hosts)) {
            let age = age.expect("monitored");
            assert!(age <= fresh, "{} last answered {age:?} ago", host.id());
            let lease = lease_age(host, &client).expect("a lease");
            assert!(
                lease <= fresh,
                "{} renewed the lease {lease:?} ago",
                host.id()
            );
        }
        (client, hosts)
    }

    /// Stops the hosts at `gone` (indices into `hosts`, which loses them) and waits
    /// until the client finds them lost; then, after the timeout's worth of rounds
    /// twice over (long enough for the others to have been lost too, had they been),
    /// checks that every other host is still monitored and fresh.
    async fn lose_only(client: &ProcAgent, hosts: &mut Vec<ProcAgent>, gone: &[usize]) {
        let mut gone = gone.to_vec();
        gone.sort_unstable_by(|a, b| b.cmp(a));
        let mut ids = Vec::new();
        for index in gone {
            let host = hosts.remove(index);
            ids.push(host.proc().proc_id().clone());
            host.proc().stop(Duration::from_secs(1)).await;
        }
        until("the stopped hosts found lost", || {
            ids.iter().all(|h| client.inner.lost_reason(h).is_some())
        })
        .await;
        let rounds = 2 * (relaying().timeout.as_millis() / relaying().interval.as_millis());
        rounds_later(client, rounds as u64).await;
        for host in hosts.iter() {
            let id = host.proc().proc_id();
            assert_eq!(client.inner.lost_reason(id), None, "{id} was found lost");
        }
        let fresh = relaying().fresh_for();
        for (host, age) in hosts.iter().zip(ages(client, hosts)) {
            let age = age.expect("still monitored");
            assert!(age <= fresh, "{} last answered {age:?} ago", host.id());
        }
    }

    /// Seven hosts in groups of three: two relays each forward to two members, and the
    /// seventh gets its own heartbeat. Every host's answer reaches the client, and the
    /// relayed heartbeats renew the client's leases on the members.
    #[tokio::test]
    async fn heartbeats_to_many_hosts_go_through_relays() {
        // Direct to all seven, it would be 7 per round.
        let (client, hosts) = relays_reach_every_host(7, 2, 2, 4).await;
        assert!(hosts
            .iter()
            .all(|h| client.inner.lost_reason(h.proc().proc_id()).is_none()));
    }

    /// A relay and a member of the other group go away: those two are found lost, and
    /// the relay's members, whose answers stopped coming through it, get direct
    /// heartbeats and stay monitored.
    #[tokio::test]
    async fn a_lost_relay_loses_only_itself() {
        let (client, mut hosts) = monitoring(7, relaying()).await;
        rounds_later(&client, 5).await;
        assert!(client.heartbeat_counts().relayed > 0);
        // Groups [0, 1, 2], [3, 4, 5], [6]: 0 relays to 1 and 2, 4 is a member of 3.
        lose_only(&client, &mut hosts, &[0, 4]).await;
    }

    /// Fewer fresh hosts than a group, or a timeout too short to leave a member's late
    /// answers time: every heartbeat is direct.
    #[test]
    fn relaying_needs_enough_hosts_and_time() {
        assert!(relaying().max_relay_levels() > 0);
        assert_eq!(
            Liveness {
                timeout: Duration::from_millis(100),
                ..relaying()
            }
            .max_relay_levels(),
            0
        );
        assert_eq!(
            Liveness {
                relay_group: 1,
                ..relaying()
            }
            .max_relay_levels(),
            0
        );
        let liveness = HostLiveness::new(relaying());
        for port in 0..3 {
            let host = ProcId::new(
                format!("h{port}"),
                hyperactor::ChannelAddr::any(ChannelTransport::Local),
            )
            .unwrap();
            liveness.start_monitoring(&host);
        }
        let me = ProcId::new(
            "me".to_string(),
            hyperactor::ChannelAddr::any(ChannelTransport::Local),
        )
        .unwrap();
        let round = liveness.round(&me).expect("hosts are monitored");
        assert_eq!(round.direct.len(), 3);
        assert!(round.relayed.is_empty());
    }

    /// The default timing (250 ms, 2 s) allows two levels of relays; six intervals of
    /// timeout one; each level needs two intervals more.
    #[test]
    fn levels_of_relays_follow_the_hosts_and_the_timing() {
        let default = Liveness::default();
        assert_eq!(default.max_relay_levels(), 2);
        let levels: Vec<usize> = [1, 32, 33, 1024, 1025, 32 * 1024, 100_000]
            .iter()
            .map(|&n| default.relay_levels(n))
            .collect();
        assert_eq!(levels, [0, 0, 1, 1, 2, 2, 2]);
        let six = Liveness {
            timeout: default.interval * 6,
            ..default
        };
        assert_eq!(six.max_relay_levels(), 1);
        assert_eq!(six.relay_levels(100_000), 1);
        let twelve = Liveness {
            timeout: default.interval * 12,
            ..default
        };
        assert_eq!(twelve.max_relay_levels(), 4);
        assert_eq!(twelve.relay_levels(32 * 1024 + 1), 3);
    }

    /// Every host is in the tree once; the monitoring agent has at most a group of
    /// relays, and each relay at most a group of members.
    #[test]
    fn a_relay_tree_reaches_each_host_once() {
        let hosts: Vec<ProcId> = (0..1100)
            .map(|i| {
                ProcId::new(
                    format!("h{i:04}"),
                    hyperactor::ChannelAddr::any(ChannelTransport::Local),
                )
                .unwrap()
            })
            .collect();
        let tree = relay_tree(&hosts, &|_| true, 32, 2);
        assert_eq!(tree.len(), 2);
        let mut seen: Vec<&ProcId> = Vec::new();
        let mut stack: Vec<&RelayTarget> = tree.iter().collect();
        while let Some(target) = stack.pop() {
            assert!(
                target.members.len() <= 32,
                "{} members",
                target.members.len()
            );
            seen.push(&target.proc);
            stack.extend(&target.members);
        }
        seen.sort();
        assert_eq!(seen, hosts.iter().collect::<Vec<_>>());
        // The first block: its relay, 32 relays below it, and their members.
        assert_eq!(tree[0].proc, hosts[0]);
        assert_eq!(tree[0].members.len(), 32);
        assert_eq!(tree[0].below().count(), 1023);
        assert_eq!(tree[1].below().count(), 1100 - 1024 - 1);
        assert!(tree[0].members.iter().all(|m| !m.members.is_empty()));

        // A relay of the second level (host 33) and a member (host 100) stop being
        // fresh: their groups change, and no other.
        let gone = [&hosts[33], &hosts[100]];
        let fewer = relay_tree(&hosts, &|host| !gone.contains(&host), 32, 2);
        assert_eq!(fewer[1], tree[1]);
        let (before, after) = (&tree[0].members, &fewer[0].members);
        assert_eq!(before.len(), after.len());
        let changed: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != after[i])
            .collect();
        // Groups of 32 from host 1: host 33 starts the second, host 100 is in the fourth.
        assert_eq!(changed, [1, 3]);
        assert_eq!(after[1].proc, hosts[34]);
        assert_eq!(after[1].members.len(), before[1].members.len() - 1);
        assert_eq!(after[3].members.len(), before[3].members.len() - 1);
    }

    /// Thirteen hosts in groups of three: two levels. The client sends two relayed
    /// heartbeats a round and nothing direct; every host answers, and each renews the
    /// client's lease, through one or two relays.
    #[tokio::test]
    async fn heartbeats_to_more_hosts_go_through_two_levels_of_relays() {
        // Blocks of nine: [0 | 1: 2 3 | 4: 5 6 | 7: 8] and [9 | 10: 11 12].
        relays_reach_every_host(13, 1, 2, 11).await;
    }

    /// A relay of the second level (1) and one of the first (9) go away: only they are
    /// found lost; the hosts below them get direct heartbeats, then relayed ones again,
    /// and stay monitored.
    #[tokio::test]
    async fn a_lost_relay_at_either_level_loses_only_itself() {
        let (client, mut hosts) = monitoring(13, relaying()).await;
        rounds_later(&client, 5).await;
        assert!(client.heartbeat_counts().relayed > 0);
        lose_only(&client, &mut hosts, &[1, 9]).await;
        // Eleven fresh hosts are relayed to again: two levels, no host direct.
        let before = client.heartbeat_counts();
        rounds_later(&client, 10).await;
        let after = client.heartbeat_counts();
        assert!(
            after.members - before.members >= (after.rounds - before.rounds) * 8,
            "relaying did not resume: {before:?} then {after:?}"
        );
    }

    /// `n` proc ids, in order.
    fn ids(n: usize) -> Vec<ProcId> {
        (0..n)
            .map(|i| {
                ProcId::new(
                    format!("h{i:04}"),
                    hyperactor::ChannelAddr::any(ChannelTransport::Local),
                )
                .unwrap()
            })
            .collect()
    }

    /// A sender names a relay's members when they change, and again when the relay
    /// says it does not know them; a relay relays only for a tree it was given.
    #[test]
    fn a_relay_is_named_its_members_only_when_they_change() {
        let liveness = HostLiveness::new(relaying());
        let ids = ids(4);
        let (client, relay) = (&ids[0], &ids[1]);
        let members = vec![
            RelayTarget::leaf(ids[2].clone()),
            RelayTarget::leaf(ids[3].clone()),
        ];
        let named = |m: &RelayMembers| matches!(m, RelayMembers::New { .. });
        assert!(named(&liveness.members_for(client, relay, 1, &members)));
        assert_eq!(
            liveness.members_for(client, relay, 1, &members),
            RelayMembers::Same { tree: 1 }
        );
        // Another client's tree 1 is another tree.
        assert!(named(&liveness.members_for(relay, relay, 1, &members)));
        // A new tree in which this relay's members are the same: the tree it knows.
        assert_eq!(
            liveness.members_for(client, relay, 2, &members),
            RelayMembers::Same { tree: 1 }
        );
        let fewer = &members[..1];
        assert!(named(&liveness.members_for(client, relay, 3, fewer)));
        liveness.relay_acked(relay, client, 3, RelayAnswer::UnknownTree);
        assert!(named(&liveness.members_for(client, relay, 3, fewer)));
        assert_eq!(
            liveness.members_for(client, relay, 3, fewer),
            RelayMembers::Same { tree: 3 }
        );

        let ack_to = crate::agent::agent_id(client).port_id(crate::agent::CONTROL_PORT);
        assert!(liveness
            .take_members(client, &ack_to, RelayMembers::Same { tree: 1 })
            .is_none());
        let given = RelayMembers::New {
            tree: 1,
            members: members.clone(),
        };
        let (tree, kept) = liveness.take_members(client, &ack_to, given).unwrap();
        assert_eq!((tree, kept.as_slice()), (1, members.as_slice()));
        let (_, again) = liveness
            .take_members(client, &ack_to, RelayMembers::Same { tree: 1 })
            .unwrap();
        assert_eq!(again.as_slice(), members.as_slice());
        assert!(liveness
            .take_members(client, &ack_to, RelayMembers::Same { tree: 2 })
            .is_none());
        assert!(liveness
            .take_members(relay, &ack_to, RelayMembers::Same { tree: 1 })
            .is_none());
    }

    /// A relay names the hosts below it that answered longer ago than `quiet`, or
    /// never, and answers for the others together; the monitoring agent takes that
    /// time for each host below that relay that is not named.
    #[test]
    fn a_relay_answers_together_for_the_hosts_that_answered() {
        let ids = ids(5);
        let (me, relay) = (&ids[0], &ids[1]);
        let below = &ids[2..];
        let quiet = Duration::from_millis(300);

        let at_relay = HostLiveness::new(relaying());
        let RelayAnswer::Below {
            within_ms,
            quiet: named,
        } = at_relay.relay(below.iter(), quiet)
        else {
            panic!("not an answer for the hosts below");
        };
        assert_eq!(within_ms, None);
        assert_eq!(named.len(), 3);
        assert!(named.iter().all(|m| m.age_ms.is_none()));
        at_relay.acked(&below[0]);
        at_relay.acked(&below[1]);
        at_relay
            .state
            .lock()
            .members
            .get_mut(&below[1])
            .unwrap()
            .answered = Instant::now().checked_sub(Duration::from_secs(1));
        let answer = at_relay.relay(below.iter(), quiet);
        let RelayAnswer::Below {
            within_ms,
            quiet: named,
        } = &answer
        else {
            panic!("not an answer for the hosts below");
        };
        assert!(within_ms.is_some_and(|ms| ms <= 300), "{within_ms:?}");
        let named: Vec<(&ProcId, bool)> = named
            .iter()
            .map(|m| (&m.proc, m.age_ms.is_some()))
            .collect();
        assert_eq!(named, [(&below[1], true), (&below[2], false)]);

        // At the monitoring agent: each host below silent for 10 s.
        let monitor = HostLiveness::new(relaying());
        let tree: Vec<RelayTarget> = below.iter().cloned().map(RelayTarget::leaf).collect();
        let long_ago = Instant::now().checked_sub(Duration::from_secs(10)).unwrap();
        {
            let mut state = monitor.state.lock();
            for host in below {
                state.monitored.insert(host.clone(), long_ago);
            }
        }
        monitor.members_for(me, relay, 7, &tree);
        // An answer for another tree says nothing of the hosts not named.
        monitor.relay_acked(relay, me, 6, answer.clone());
        assert_eq!(monitor.last_ack(&below[0]), Some(long_ago));
        monitor.relay_acked(relay, me, 7, answer);
        let age = |host| monitor.last_ack(host).unwrap().elapsed();
        assert!(age(&below[0]) < Duration::from_millis(400));
        let named_age = age(&below[1]);
        assert!(named_age >= Duration::from_millis(900) && named_age < Duration::from_secs(5));
        assert!(age(&below[2]) >= Duration::from_secs(10));
    }
}
