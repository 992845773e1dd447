//! Casting over a tree of agents: exactly-once delivery at the expected depth (CAST-1),
//! reply reduction (CAST-2), what a dead node does to a cast (CAST-3), and ORD-1 across
//! paths. Each node is a proc with an agent and a driven actor named `rec` that the
//! test reads directly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use bytes::Bytes;
use hyperactor::actor::{DrivenActor, DrivenWork, Next};
use hyperactor::message::{Envelope, Serialized, HANDLER_PORT_BIT};
use hyperactor::testing::timed;
use hyperactor::{ChannelTransport, Client, PortRef, SendContext};
use hyperactor_mesh::agent::{
    control_port, AgentOptions, CallReplies, CastTarget, Control, ProcAgent,
};
use hyperactor_mesh::cast::codec::{CastKind, ReplyMode, Route, ViewExtent};
use hyperactor_mesh::cast::reply::{encode_reply, ReplyItem, ReplyStatus};
use hyperactor_mesh::supervision::{ProcDeath, ProcEnd};

const PORT: u64 = HANDLER_PORT_BIT | 0x77;

/// One node: a proc with an agent and a driven receiver named `rec`.
struct Node {
    agent: ProcAgent,
    rec: DrivenActor,
}

async fn node(transport: ChannelTransport, name: &str) -> Node {
    let agent = ProcAgent::serve(transport, name, AgentOptions::default())
        .await
        .unwrap();
    let rec = agent.client().spawn_driven("rec").unwrap();
    rec.started();
    Node { agent, rec }
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
        .map(|(i, n)| CastTarget {
            index: i as u32,
            proc: n.agent.proc().proc_id().clone(),
            host: None,
        })
        .collect()
}

fn view(n: usize) -> ViewExtent {
    ViewExtent::new(vec!["nodes".into()], vec![n])
}

/// The depth a balanced tree of `n` receivers with fan-out `f` should have, computed
/// independently of the implementation: a chunk of `m` receivers has its head at depth
/// 1 and its other `m - 1` split into at most `f` chunks of near-equal size.
fn expected_depth(n: usize, f: usize) -> u8 {
    fn chunk(m: usize, f: usize) -> u8 {
        if m <= 1 {
            return m as u8;
        }
        let rest = m - 1;
        let k = rest.min(f);
        1 + chunk(rest.div_ceil(k), f)
    }
    let k = n.min(f).max(1);
    chunk(n.div_ceil(k), f)
}

async fn next(rec: &DrivenActor) -> (Route, Envelope) {
    match timed(rec.next()).await {
        Next::Work(DrivenWork::Message(envelope)) => {
            let route = Route::decode(envelope.header.extra.as_deref().unwrap()).unwrap();
            (route, envelope)
        }
        other => panic!("expected a message, got {other:?}"),
    }
}

/// Replies to a delivered message as an actor would: `value` (with `extra` parts) to its
/// route.
fn reply(from: &DrivenActor, route: &Route, value: &str, extra: Vec<Bytes>) {
    let to = route.reply.as_ref().unwrap();
    let mut parts = vec![Bytes::from(value.to_string())];
    parts.extend(extra);
    let item = ReplyItem::ok(route.index, parts);
    PortRef::<Vec<Bytes>>::attest(to.port.clone())
        .send_serialized(from, Serialized::from_parts(encode_reply(to.key, &[item])));
}

fn cast(
    caller: &Node,
    client: &Client,
    to: &[CastTarget],
    mode: ReplyMode,
    reply: Option<&CallReplies>,
    body: &str,
) {
    caller.agent.cast(
        client.actor_id(),
        "rec",
        CastKind::Message { port: PORT },
        &view(to.len()),
        to,
        mode,
        reply.map(|r| r.reply_to().clone()),
        vec![Bytes::from(body.to_string())],
    );
}

#[tokio::test]
async fn cast1_every_receiver_gets_a_cast_exactly_once_at_the_expected_depth() {
    let all = nodes(64, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let client = caller.agent.proc().client("client").unwrap();
    for fanout in [2usize, 16] {
        caller.agent.set_fanout(fanout);
        for n in 1..=64usize {
            let group = &all[..n];
            let body = format!("cast n={n} f={fanout}");
            cast(
                &caller,
                &client,
                &targets(group),
                ReplyMode::None,
                None,
                &body,
            );
            let mut depth = 0;
            for (i, node) in group.iter().enumerate() {
                let (route, envelope) = next(&node.rec).await;
                assert_eq!(route.index, i as u32, "CAST-1: the receiver's own index");
                assert_eq!(route.reply, None, "a broadcast has no reply target");
                assert_eq!(envelope.payload.parts(), &[Bytes::from(body.clone())]);
                assert_eq!(
                    envelope.header.sender,
                    *client.actor_id(),
                    "from the caller"
                );
                depth = depth.max(route.hops);
            }
            assert_eq!(
                depth,
                expected_depth(n, fanout),
                "CAST-1: n={n} fanout={fanout}"
            );
            if n <= fanout {
                assert_eq!(depth, 1, "up to `fanout` receivers are sent to directly");
            }
        }
    }
    // A marker cast to all: had any receiver got a cast twice, the copy would come first.
    cast(
        &caller,
        &client,
        &targets(&all),
        ReplyMode::None,
        None,
        "marker",
    );
    for node in &all {
        let (_, envelope) = next(&node.rec).await;
        assert_eq!(
            envelope.payload.parts(),
            &[Bytes::from_static(b"marker")],
            "CAST-1"
        );
        assert!(
            matches!(node.rec.try_next(), Next::Timeout),
            "CAST-1: exactly once"
        );
    }
}

#[tokio::test]
async fn cast2_reduced_replies_reach_the_caller_as_one_message_per_subtree() {
    for transport in [ChannelTransport::Local, ChannelTransport::Unix] {
        let all = nodes(40, transport).await;
        let caller = node(transport, "caller").await;
        let client = caller.agent.proc().client("client").unwrap();
        for fanout in [2usize, 4, 16] {
            caller.agent.set_fanout(fanout);
            let replies = CallReplies::open(&caller.agent, 0..all.len() as u32);
            cast(
                &caller,
                &client,
                &targets(&all),
                ReplyMode::Reduce,
                Some(&replies),
                "call",
            );
            for node in &all {
                let (route, _) = next(&node.rec).await;
                // Odd ranks answer with two attached parts: they travel with the value.
                let extra = if route.index % 2 == 1 {
                    vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]
                } else {
                    Vec::new()
                };
                reply(&node.rec, &route, &format!("v{}", route.index), extra);
            }
            let items = timed(replies.wait()).await;
            let values: HashMap<u32, Vec<Bytes>> =
                items.into_iter().map(|i| (i.index, i.parts)).collect();
            assert_eq!(values.len(), all.len());
            for (index, parts) in values {
                assert_eq!(parts[0], format!("v{index}"));
                assert_eq!(
                    parts.len(),
                    if index % 2 == 1 { 3 } else { 1 },
                    "parts kept"
                );
            }
            assert_eq!(
                replies.messages(),
                fanout.min(all.len()),
                "CAST-2: {transport:?} fanout={fanout}: one message per top-level subtree"
            );
        }
    }
}

#[tokio::test]
async fn direct_replies_come_one_per_receiver() {
    let all = nodes(9, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let client = caller.agent.proc().client("client").unwrap();
    caller.agent.set_fanout(2);
    let replies = CallReplies::open(&caller.agent, 0..9);
    cast(
        &caller,
        &client,
        &targets(&all),
        ReplyMode::Direct,
        Some(&replies),
        "call",
    );
    for node in &all {
        let (route, _) = next(&node.rec).await;
        reply(&node.rec, &route, "x", Vec::new());
    }
    assert_eq!(timed(replies.wait()).await.len(), 9);
    assert_eq!(replies.messages(), 9);
}

/// Tells `agent` that `node`'s proc died, as its host would.
fn report_death(agent: &ProcAgent, node: &Node) {
    let death = ProcDeath {
        proc_id: node.agent.proc().proc_id().clone(),
        pid: 4242,
        end: ProcEnd::Signaled { signal: 9 },
        expected: false,
    };
    let payload = Serialized::encode(&Control::ProcDied(death)).unwrap();
    agent.post_parts(
        agent.id(),
        control_port(agent.proc().proc_id()),
        payload.into_parts(),
    );
}

#[tokio::test]
async fn cast3_a_dead_node_is_skipped_and_its_ranks_answered() {
    let all = nodes(8, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let client = caller.agent.proc().client("client").unwrap();
    caller.agent.set_fanout(2);
    // Node 4 heads the second chunk of 8 (4..8) at fan-out 2.
    report_death(&caller.agent, &all[4]);
    let replies = CallReplies::open_all(&caller.agent, 0..8);
    cast(
        &caller,
        &client,
        &targets(&all),
        ReplyMode::Reduce,
        Some(&replies),
        "after",
    );
    for (i, node) in all.iter().enumerate() {
        if i == 4 {
            continue;
        }
        let (route, _) = next(&node.rec).await;
        reply(&node.rec, &route, "ok", Vec::new());
    }
    let items = timed(replies.wait()).await;
    assert_eq!(items.len(), 8);
    let failed: Vec<u32> = items
        .iter()
        .filter(|i| i.status == ReplyStatus::Failed)
        .map(|i| i.index)
        .collect();
    assert_eq!(
        failed,
        vec![4],
        "CAST-3: only the dead rank is lost; the others are routed around it"
    );
    assert!(
        items[4]
            .reason()
            .contains("died (killed by signal 9, SIGKILL)"),
        "{}",
        items[4].reason()
    );
    assert!(
        matches!(all[4].rec.try_next(), Next::Timeout),
        "the dead node got nothing"
    );
}

#[tokio::test]
async fn cast3_a_relay_that_dies_with_a_call_fails_its_subtree_at_the_caller() {
    let all = nodes(7, ChannelTransport::Local).await;
    let caller = node(ChannelTransport::Local, "caller").await;
    let client = caller.agent.proc().client("client").unwrap();
    caller.agent.set_fanout(2);
    // [0 heads 0..4: 1 heads 1..3 (2), 3], [4 heads 4..7: 5, 6].
    let replies = CallReplies::open_all(&caller.agent, 0..7);
    cast(
        &caller,
        &client,
        &targets(&all),
        ReplyMode::Reduce,
        Some(&replies),
        "call",
    );
    for (i, node) in all.iter().enumerate() {
        let (route, _) = next(&node.rec).await;
        if i >= 4 {
            reply(&node.rec, &route, "ok", Vec::new());
        }
    }
    // Node 0 dies before it or its subtree answered: the caller answers 0..4 at once.
    report_death(&caller.agent, &all[0]);
    let items = timed(replies.wait()).await;
    let failed: Vec<u32> = items
        .iter()
        .filter(|i| i.status == ReplyStatus::Failed)
        .map(|i| i.index)
        .collect();
    assert_eq!(
        failed,
        vec![0, 1, 2, 3],
        "CAST-3: the relay's whole subtree"
    );
    assert!(
        items[1].reason().contains("relayed through it"),
        "{}",
        items[1].reason()
    );
}

#[tokio::test]
async fn ord1_a_cast_followed_by_a_direct_send_keeps_its_order() {
    let all = nodes(16, ChannelTransport::Unix).await;
    let caller = node(ChannelTransport::Unix, "caller").await;
    let client = caller.agent.proc().client("client").unwrap();
    caller.agent.set_fanout(2);
    let deepest = targets(&all)[15].clone();
    for round in 0..20 {
        // A cast relayed down the tree, then a message sent straight to its deepest
        // receiver: the direct one must not overtake it.
        cast(
            &caller,
            &client,
            &targets(&all),
            ReplyMode::None,
            None,
            &format!("tree {round}"),
        );
        cast(
            &caller,
            &client,
            &[CastTarget {
                index: 0,
                ..deepest.clone()
            }],
            ReplyMode::None,
            None,
            &format!("direct {round}"),
        );
        let (_, first) = next(&all[15].rec).await;
        let (_, second) = next(&all[15].rec).await;
        assert_eq!(first.payload.parts()[0], format!("tree {round}"), "ORD-1");
        assert_eq!(
            second.payload.parts()[0],
            format!("direct {round}"),
            "ORD-1"
        );
        for node in &all[..15] {
            next(&node.rec).await;
        }
    }
}

#[tokio::test]
async fn a_call_opened_while_the_previous_one_is_unanswered_follows_it() {
    let caller = node(ChannelTransport::Local, "pipeliner").await;
    let first = CallReplies::open(&caller.agent, 0..1);
    assert!(
        !first.follows_pending(),
        "the agent's first call follows nothing"
    );
    let second = CallReplies::open(&caller.agent, 0..2);
    assert!(second.follows_pending(), "the first call is unanswered");
    second.answer(vec![ReplyItem::ok(0, vec![Bytes::from_static(b"v")])]);
    let third = CallReplies::open(&caller.agent, 0..1);
    assert!(
        third.follows_pending(),
        "the second call still owes index 1"
    );
    third.answer(vec![ReplyItem::ok(0, vec![Bytes::from_static(b"v")])]);
    assert!(third.is_done());
    let fourth = CallReplies::open(&caller.agent, 0..1);
    assert!(!fourth.follows_pending(), "the third call was complete");
    drop(fourth);
    let fifth = CallReplies::open(&caller.agent, 0..1);
    assert!(!fifth.follows_pending(), "a dropped call waits for nothing");
    drop((first, second));
}
