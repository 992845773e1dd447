//! Tests of host liveness: heartbeats, relays and leases.

use std::future::Future;

use hyperactor::ChannelTransport;

use super::*;
use crate::agent::control::{RelayAnswer, RelayTarget};
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
