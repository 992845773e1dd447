//! Relayed heartbeats (see the [parent module](super)): the relay tree a monitoring
//! agent builds, what it and each relay remember of what they sent and were given,
//! and a relay's side of the protocol.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor::{PortId, ProcId};

use super::super::control::{MemberAnswer, RelayAnswer, RelayMembers, RelayTarget};
use super::super::{Control, Inner};
use super::{HostLiveness, HostsState, MEMBER_MEMORY};

/// The heartbeat's way to the hosts of `hosts` (in order) that are `fresh`, through
/// `levels` levels of relays in groups of `group`: each block of `group^levels` hosts
/// is reached through its first fresh host, which relays to the rest of its block the
/// same way, one level fewer. The blocks are cut from `hosts`, not from the fresh
/// hosts, so that a host that stops being fresh changes only the groups it is in:
/// the others keep their relays, and their relays' knowledge of when they answered.
pub(super) fn relay_tree(
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

/// A member of relayed heartbeats, at its relay.
pub(super) struct Member {
    /// When the relay last forwarded it a heartbeat.
    pub(super) forwarded: Instant,
    /// When it last answered one (`None`: not yet).
    pub(super) answered: Option<Instant>,
}

/// A monitoring agent's relay tree (see [`relay_tree`]).
pub(super) struct Tree {
    /// Its number, which relays are given it by.
    pub(super) number: u64,
    /// Its levels of relays.
    pub(super) levels: usize,
    /// The fresh hosts it was built for.
    pub(super) hosts: HashSet<ProcId>,
    /// Its top level: the hosts the monitoring agent sends to.
    pub(super) targets: Vec<RelayTarget>,
    /// How many hosts are below the relays of the top level.
    pub(super) below: u64,
}

/// What a relay was last given by this agent (see [`RelayMembers`]).
pub(super) struct Sent {
    /// The tree's number.
    pub(super) tree: u64,
    /// Its members in that tree.
    pub(super) members: Vec<RelayTarget>,
    /// False once the relay answered that it does not know the tree: it is given the
    /// members again.
    pub(super) known: bool,
    /// When it was last sent a heartbeat.
    pub(super) used: Instant,
}

/// The members a relay was last given by one sender.
pub(super) struct Given {
    /// The tree's number.
    pub(super) tree: u64,
    /// The members.
    pub(super) members: Arc<Vec<RelayTarget>>,
    /// When it was last used.
    pub(super) used: Instant,
}

/// What `relay` is sent for `client`'s tree `tree`, in which its members are
/// `members`: only the number of the tree it was given them with, if it was.
pub(super) fn members_for(
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
            sent.insert(
                key,
                Sent {
                    tree,
                    members: members.to_vec(),
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

/// Every host of `members` and below them, depth first.
fn every_host(members: &[RelayTarget]) -> impl Iterator<Item = &ProcId> + '_ {
    members
        .iter()
        .flat_map(|member| std::iter::once(&member.proc).chain(member.below()))
}

impl HostLiveness {
    /// A relay (`relay`, which answered now) says when the hosts below it in
    /// `client`'s tree `tree` last answered: taken as their answers by a monitoring
    /// agent, and by a relay one level up as its members' answers.
    pub(super) fn relay_acked(
        &self,
        relay: &ProcId,
        client: &ProcId,
        tree: u64,
        answer: RelayAnswer,
    ) {
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
                    for host in every_host(&last.members) {
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
    pub(super) fn take_members(
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
    pub(super) fn members_for(
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
    pub(super) fn relay<'a>(
        &self,
        below: impl Iterator<Item = &'a ProcId>,
        quiet: Duration,
    ) -> RelayAnswer {
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
}

impl Inner {
    /// A heartbeat from `client`'s agent to relay to `members`: answered first (with
    /// when the hosts below this one last answered), then passed on, as a heartbeat
    /// to members with no members of their own and as a relayed heartbeat to the
    /// others.
    pub(in crate::agent) fn on_heartbeat_relay(
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
        let answer = self
            .liveness
            .relay(every_host(&members), Duration::from_millis(quiet_ms));
        self.send_control_to(
            ack_to,
            &Control::HeartbeatAcks {
                proc: me.clone(),
                client: client.clone(),
                tree,
                answer,
            },
        );
        let own = self.id.port_id(super::super::CONTROL_PORT);
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

    pub(in crate::agent) fn on_heartbeat_acks(
        &self,
        relay: &ProcId,
        client: &ProcId,
        tree: u64,
        answer: RelayAnswer,
    ) {
        self.liveness.relay_acked(relay, client, tree, answer);
    }
}
