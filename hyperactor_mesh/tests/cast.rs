//! Casting over a tree of inboxes: exactly-once delivery, tree depth, reply reduction,
//! and what a dead node does to a cast.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use bytes::Bytes;
use hyperactor::message::Serialized;
use hyperactor::testing::timed;
use hyperactor::{ChannelTransport, Client, PortRef, Proc};
use hyperactor_mesh::inbox::{
    key_part, reply_items, reply_parts, CastReply, CastTarget, Inbox, Queue, Route,
};

/// One receiver: a proc with a client and an inbox.
struct Node {
    proc: Proc,
    client: Client,
    inbox: Inbox,
}

/// A proc named `name` with a client and an inbox: a receiver, or the casting side.
async fn node(transport: ChannelTransport, name: &str) -> Node {
    let proc = Proc::serve(transport, name).await.unwrap();
    let client = proc.client("agent").unwrap();
    let inbox = Inbox::open(&client);
    Node {
        proc,
        client,
        inbox,
    }
}

async fn nodes(n: usize, transport: ChannelTransport) -> Vec<Node> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(node(transport, &format!("node{i}")).await);
    }
    out
}

fn targets(nodes: &[Node]) -> Vec<CastTarget> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| CastTarget::new(i as u32, n.inbox.port().port_id().clone()))
        .collect()
}

/// The depth a balanced tree of `n` receivers with fan-out `f` should have, computed
/// independently of the implementation: a chunk of `m` receivers has its head at depth
/// 1 and its other `m - 1` split into at most `f` chunks of near-equal size.
fn expected_depth(n: usize, f: usize) -> u8 {
    fn chunk(m: usize, f: usize) -> u8 {
        if m <= 1 {
            return m as u8;
        }
        // The largest sub-chunk of the other m - 1 has ceil((m - 1) / k) receivers.
        let rest = m - 1;
        let k = rest.min(f);
        1 + chunk(rest.div_ceil(k), f)
    }
    let k = n.min(f).max(1);
    chunk(n.div_ceil(k), f)
}

async fn next_route(queue: &Queue) -> (Route, Vec<Bytes>) {
    let mut parts = timed(queue.pop()).await.unwrap();
    let route = Route::decode(&parts.remove(0)).expect("a route part");
    (route, parts)
}

/// Replies to a delivered message as an actor would: `(index, value)` to its route.
fn reply(from: &Client, route: &Route, value: &str) {
    let port: hyperactor::PortId = route.reply_port.as_deref().unwrap().parse().unwrap();
    let mut parts = vec![key_part(route.reply_key)];
    parts.extend(reply_parts(route.index, Bytes::from(value.to_string())));
    PortRef::<Vec<Bytes>>::attest(port).send_serialized(from, Serialized::from_parts(parts));
}

#[tokio::test]
async fn every_receiver_gets_a_cast_exactly_once_at_the_expected_depth() {
    let all = nodes(64, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let sender = &caller.inbox;
    let key = 7;
    for fanout in [2usize, 16] {
        for n in 1..=64usize {
            let group = &all[..n];
            let body = Bytes::from(format!("cast n={n} f={fanout}"));
            let ends = sender.cast(
                key,
                &targets(group),
                fanout,
                &CastReply::None,
                vec![Bytes::from_static(b"header"), body.clone()],
            );
            assert_eq!(ends.len(), n);
            let mut depth = 0;
            for (i, node) in group.iter().enumerate() {
                let (route, parts) = next_route(&node.inbox.queue(key)).await;
                assert_eq!(route.index, i as u32);
                assert_eq!(route.reply_port, None, "a broadcast has no reply port");
                assert_eq!(parts, vec![Bytes::from_static(b"header"), body.clone()]);
                depth = depth.max(route.hops);
            }
            assert_eq!(depth, expected_depth(n, fanout), "n={n} fanout={fanout}");
            let bound = (n as f64).log(fanout as f64).ceil() as u8 + 1;
            assert!(depth <= bound, "n={n} f={fanout}: depth {depth} > {bound}");
            if n <= fanout {
                assert_eq!(depth, 1, "up to `fanout` receivers are sent to directly");
            }
        }
    }
    // A marker cast to all: had any receiver got a cast twice, the copy would be
    // queued before the marker.
    sender.cast(
        key,
        &targets(&all),
        16,
        &CastReply::None,
        vec![Bytes::from_static(b"marker")],
    );
    for node in &all {
        let (_, parts) = next_route(&node.inbox.queue(key)).await;
        assert_eq!(parts, vec![Bytes::from_static(b"marker")]);
        assert!(node.inbox.queue(key).try_pop().unwrap().is_none());
    }
}

#[tokio::test]
async fn reduced_replies_reach_the_caller_as_one_message_per_subtree() {
    for transport in [ChannelTransport::Local, ChannelTransport::Unix] {
        let all = nodes(40, transport).await;
        let caller = node(transport, "caller").await;
        let sender = &caller.inbox;
        for fanout in [2usize, 4, 16] {
            let replies = sender.reply_queue();
            sender.cast(
                9,
                &targets(&all),
                fanout,
                &CastReply::Reduce {
                    port: sender.port().port_id().clone(),
                    key: replies.key(),
                },
                vec![Bytes::from_static(b"call")],
            );
            for node in &all {
                let (route, _) = next_route(&node.inbox.queue(9)).await;
                reply(&node.client, &route, &format!("v{}", route.index));
            }
            let mut values = HashMap::new();
            let mut messages = 0;
            while values.len() < all.len() {
                let parts = timed(replies.pop()).await.unwrap();
                messages += 1;
                assert_eq!(parts.len() % 2, 0);
                for pair in parts.chunks(2) {
                    let index = u32::from_le_bytes(pair[0][..].try_into().unwrap());
                    assert!(values.insert(index, pair[1].clone()).is_none());
                }
            }
            assert_eq!(
                messages,
                fanout.min(all.len()),
                "{transport:?} fanout={fanout}: one message per top-level subtree"
            );
            for (index, value) in values {
                assert_eq!(value, format!("v{index}"));
            }
            sender.remove(replies.key());
        }
    }
}

#[tokio::test]
async fn reduced_replies_keep_the_parts_attached_to_a_value() {
    let all = nodes(12, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let sender = &caller.inbox;
    let replies = sender.reply_queue();
    sender.cast(
        3,
        &targets(&all),
        4,
        &CastReply::Reduce {
            port: sender.port().port_id().clone(),
            key: replies.key(),
        },
        vec![Bytes::from_static(b"call")],
    );
    // Odd indices answer with two attached parts: [index, 2], value, a, b.
    for node in &all {
        let (route, _) = next_route(&node.inbox.queue(3)).await;
        let port: hyperactor::PortId = route.reply_port.as_deref().unwrap().parse().unwrap();
        let mut parts = vec![key_part(route.reply_key)];
        let i = route.index;
        if i % 2 == 1 {
            let mut head = i.to_le_bytes().to_vec();
            head.extend(2u32.to_le_bytes());
            parts.push(Bytes::from(head));
            parts.push(Bytes::from(format!("v{i}")));
            parts.push(Bytes::from(format!("a{i}")));
            parts.push(Bytes::from(format!("b{i}")));
        } else {
            parts.extend(reply_parts(i, Bytes::from(format!("v{i}"))));
        }
        PortRef::<Vec<Bytes>>::attest(port)
            .send_serialized(&node.client, Serialized::from_parts(parts));
    }
    let mut got = HashMap::new();
    while got.len() < all.len() {
        let parts = timed(replies.pop()).await.unwrap();
        for (index, item) in reply_items(&parts) {
            assert!(got.insert(index, parts[item].to_vec()).is_none());
        }
    }
    for (index, item) in got {
        let mut want = vec![Bytes::from(format!("v{index}"))];
        if index % 2 == 1 {
            want.push(Bytes::from(format!("a{index}")));
            want.push(Bytes::from(format!("b{index}")));
        }
        assert_eq!(item[1..], want[..], "index {index}");
    }
}

#[tokio::test]
async fn direct_replies_come_one_per_receiver() {
    let all = nodes(10, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let sender = &caller.inbox;
    let replies = sender.reply_queue();
    sender.cast(
        3,
        &targets(&all),
        2,
        &CastReply::Direct {
            port: sender.port().port_id().clone(),
            key: replies.key(),
        },
        vec![Bytes::from_static(b"stream")],
    );
    for node in &all {
        let (route, _) = next_route(&node.inbox.queue(3)).await;
        assert_eq!(
            route.reply_key,
            replies.key(),
            "direct: the caller's own key"
        );
        reply(&node.client, &route, "x");
    }
    for _ in 0..all.len() {
        assert_eq!(timed(replies.pop()).await.unwrap().len(), 2);
    }
}

#[tokio::test]
async fn a_dead_child_is_not_waited_for_and_is_skipped_by_later_casts() {
    // Fan-out 1 makes a chain: caller -> a -> b -> c.
    let all = nodes(3, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let sender = &caller.inbox;
    let replies = sender.reply_queue();
    let reduce = CastReply::Reduce {
        port: sender.port().port_id().clone(),
        key: replies.key(),
    };
    sender.cast(
        5,
        &targets(&all),
        1,
        &reduce,
        vec![Bytes::from_static(b"m")],
    );
    for node in &all[..2] {
        let (route, _) = next_route(&node.inbox.queue(5)).await;
        reply(&node.client, &route, "ok");
    }
    // c never answers: b learns that its proc died, and stops waiting for it.
    all[1].inbox.peer_died(all[2].proc.proc_id());
    let parts = timed(replies.pop()).await.unwrap();
    let got: HashMap<u32, Bytes> = parts
        .chunks(2)
        .map(|p| {
            (
                u32::from_le_bytes(p[0][..].try_into().unwrap()),
                p[1].clone(),
            )
        })
        .collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[&0], "ok");
    assert_eq!(got[&1], "ok");
    assert!(
        got[&2].is_empty(),
        "c's reply is reported lost (an empty value)"
    );

    // A later cast through b skips c altogether.
    let c = all[2].inbox.queue(5);
    assert!(c.try_pop().unwrap().is_some(), "c got the first cast");
    let replies = sender.reply_queue();
    let reduce = CastReply::Reduce {
        port: sender.port().port_id().clone(),
        key: replies.key(),
    };
    sender.cast(
        5,
        &targets(&all),
        1,
        &reduce,
        vec![Bytes::from_static(b"m2")],
    );
    for node in &all[..2] {
        let (route, parts) = next_route(&node.inbox.queue(5)).await;
        assert_eq!(parts, vec![Bytes::from_static(b"m2")]);
        reply(&node.client, &route, "ok");
    }
    let parts = timed(replies.pop()).await.unwrap();
    assert_eq!(parts.len(), 6, "a, b, and c reported lost");
    let lost: Vec<&[Bytes]> = parts.chunks(2).filter(|p| p[1].is_empty()).collect();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0][0], Bytes::copy_from_slice(&2u32.to_le_bytes()));
    assert!(c.try_pop().unwrap().is_none(), "c was skipped");

    // The caller knowing of the death leaves c out at the first hop, and says so.
    sender.peer_died(all[2].proc.proc_id());
    let direct = sender.reply_queue();
    let ends = sender.cast(
        5,
        &targets(&all),
        1,
        &CastReply::Direct {
            port: sender.port().port_id().clone(),
            key: direct.key(),
        },
        vec![Bytes::from_static(b"m3")],
    );
    assert_eq!(ends, vec![2, 2, 3], "c is outside a's subtree now");
    let lost = timed(direct.pop()).await.unwrap();
    assert_eq!(
        lost,
        vec![Bytes::copy_from_slice(&2u32.to_le_bytes()), Bytes::new()]
    );
    for node in &all[..2] {
        let (_, parts) = next_route(&node.inbox.queue(5)).await;
        assert_eq!(parts, vec![Bytes::from_static(b"m3")]);
    }
    assert!(c.try_pop().unwrap().is_none());
}

#[test]
fn subtree_ends_cover_exactly_the_receivers_behind_each_node() {
    for fanout in [1usize, 2, 3, 16] {
        for n in 0..80usize {
            let ends = hyperactor_mesh::inbox::subtree_ends(n, fanout);
            assert_eq!(ends.len(), n);
            for (pos, &end) in ends.iter().enumerate() {
                assert!(end as usize > pos && end as usize <= n);
            }
            if n > 0 {
                // The top-level chunks tile 0..n.
                let mut pos = 0;
                let mut top = 0;
                while pos < n {
                    pos = ends[pos] as usize;
                    top += 1;
                }
                assert_eq!(top, n.min(fanout));
            }
        }
    }
}
