//! Bad input to the mesh layer: the decoders of casts, routes, replies and control
//! messages (properties over generated input: never a panic, only errors), and
//! malformed messages sent over live sockets to the agents and actors of running procs,
//! which must go on serving.
//!
//! The procs are this test binary itself, re-run on the ignored `child_agent` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use hyperactor::message::{handler_port, Serialized, SUPERVISION_PORT, UNDELIVERABLE_PORT};
use hyperactor::testing::timed;
use hyperactor::{Actor, BoxError, Context, Handler, PortId, PortRef, SendContext};
use hyperactor_mesh::agent::{cast_port, control_port, reply_port, AgentOptions, Control};
use hyperactor_mesh::cast::codec::{CastHeader, CastKind, Entry, ReplyMode, Route};
use hyperactor_mesh::cast::reply::{decode_reply, encode_reply, ReplyItem};
use hyperactor_mesh::testing::{agent_child_main, child_command, host_agent, process_exists};
use hyperactor_mesh::{reply, ActorMesh, Extent, HostMesh, Request};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct Counter {
    total: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Add(u64);

#[derive(Debug, Serialize, Deserialize)]
struct Get;
impl Request for Get {
    type Reply = u64;
}

impl Actor for Counter {
    type Params = u64;
    async fn new(start: u64) -> Result<Self, BoxError> {
        Ok(Counter { total: start })
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Add>();
        binder.handle::<Get>();
    }
}

impl Handler<Add> for Counter {
    async fn handle(&mut self, _cx: &Context<Self>, Add(n): Add) -> Result<(), BoxError> {
        // Mutated messages may decode to any number.
        self.total = self.total.saturating_add(n);
        Ok(())
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, cx: &Context<Self>, _: Get) -> Result<(), BoxError> {
        reply(cx, &self.total)?;
        Ok(())
    }
}

#[test]
#[ignore = "entry point of the child processes started by the other tests"]
fn child_agent() {
    agent_child_main(|| AgentOptions::default().register::<Counter>());
}

/// Deterministic noise.
fn noise(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Malformed payloads: none, empty, noise, and a real encoding cut short, with bytes
/// flipped, or with a length field claiming the maximum.
fn malformed(valid: &Bytes) -> Vec<Vec<Bytes>> {
    let mut out = vec![
        vec![],
        vec![Bytes::new()],
        vec![noise(1, 7)],
        vec![noise(2, 300), noise(3, 5)],
    ];
    for cut in [1, valid.len() / 2, valid.len().saturating_sub(1)] {
        out.push(vec![valid.slice(..cut)]);
    }
    for at in [0, valid.len() / 3, valid.len() / 2] {
        let mut flipped = valid.to_vec();
        if let Some(b) = flipped.get_mut(at) {
            *b ^= 0xFF;
        }
        out.push(vec![flipped.into()]);
    }
    let mut huge = valid.to_vec();
    if huge.len() >= 16 {
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    }
    out.push(vec![huge.into()]);
    out
}

fn send_raw(client: &hyperactor::Client, port: &PortId, parts: Vec<Bytes>) {
    PortRef::<Vec<Bytes>>::attest(port.clone())
        .send_serialized(client, Serialized::from_parts(parts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_actors_survive_malformed_messages_over_live_sockets() {
    let (agent, client) = host_agent().await;
    let per_host = Extent::new(vec!["gpus".to_string()], vec![2]).unwrap();
    let hosts = HostMesh::local(&agent).unwrap();
    let procs =
        timed(hosts.spawn_procs(&client, "targets", &per_host, &child_command("child_agent")))
            .await
            .unwrap();
    let counters: ActorMesh<Counter> = procs.spawn(&client, "counters", &0).unwrap();
    counters.cast(&client, &Add(1)).unwrap();
    assert_eq!(
        timed(counters.call(&client, &Get)).await.unwrap().values(),
        [1, 1]
    );

    // Real encodings to mutate.
    let valid_reply = encode_reply(7, &[ReplyItem::ok(0, vec![Bytes::from_static(b"x")])]);
    let watch = Control::WatchProcs {
        procs: procs.procs().iter().map(|p| p.proc_id.clone()).collect(),
        subscriber: reply_port(client.proc().proc_id()),
    };
    let valid_control = Serialized::encode(&watch).unwrap().into_parts().remove(0);
    let valid_add = Serialized::encode(&Add(5)).unwrap().into_parts().remove(0);

    let mut sent = 0;
    for info in procs.procs() {
        let actor = counters.mesh_ref().actor_id(info.rank).unwrap();
        let valid_cast = CastHeader {
            sender: 12345,
            origin: client.actor_id().clone(),
            actor: counters.mesh_ref().actor_name().to_string(),
            kind: CastKind::Message {
                port: handler_port::<Add>(),
            },
            mode: ReplyMode::None,
            reply: None,
            view: counters.mesh_ref().view_extent(),
            hops: 1,
            fanout: 16,
            entries: vec![Entry {
                index: info.rank as u32,
                seq: 1,
                proc: info.proc_id.clone(),
            }],
            dead: Vec::new(),
        }
        .encode()
        .unwrap();
        let targets = [
            (cast_port(&info.proc_id), valid_cast),
            (control_port(&info.proc_id), valid_control.clone()),
            (reply_port(&info.proc_id), valid_reply.concat().into()),
            (actor.port_id(handler_port::<Add>()), valid_add.clone()),
            (actor.port_id(SUPERVISION_PORT), valid_control.clone()),
            (actor.port_id(UNDELIVERABLE_PORT), valid_control.clone()),
        ];
        for (port, valid) in &targets {
            for parts in malformed(valid) {
                send_raw(&client, port, parts);
                sent += 1;
            }
        }
    }
    assert!(sent > 100, "{sent}");

    // Everything above went first on the same links (ORD-1): once these are answered,
    // every malformed message was handled, and the agents and actors still serve. A
    // corrupt Add that happened to decode could only have added to the totals.
    counters.cast(&client, &Add(1)).unwrap();
    let totals = timed(counters.call(&client, &Get)).await.unwrap();
    assert!(totals.values().iter().all(|t| *t >= 2), "{totals:?}");
    for info in procs.procs() {
        assert!(process_exists(info.pid), "proc {} died", info.proc_id);
    }
    timed(procs.stop(&client, "test done")).await.unwrap();
}

fn any_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn cast_headers_and_routes_decode_any_bytes_without_panicking(bytes in any_bytes(512)) {
        let _ = CastHeader::decode(&bytes);
        let _ = Route::decode(&bytes);
    }

    #[test]
    fn replies_decode_any_parts_without_panicking(
        parts in proptest::collection::vec(any_bytes(64), 0..6)
    ) {
        let parts: Vec<Bytes> = parts.into_iter().map(Bytes::from).collect();
        let _ = decode_reply(&parts);
    }

    #[test]
    fn replies_round_trip_and_survive_mutation(
        key in any::<u64>(),
        values in proptest::collection::vec(any_bytes(32), 1..5),
        at in any::<usize>(),
        flip in 1u8..,
    ) {
        let items: Vec<ReplyItem> = values
            .iter()
            .enumerate()
            .map(|(i, v)| ReplyItem::ok(i as u32, vec![Bytes::from(v.clone())]))
            .collect();
        let parts = encode_reply(key, &items);
        let (got_key, got) = decode_reply(&parts).unwrap();
        prop_assert_eq!(got_key, key);
        prop_assert_eq!(got, items);
        // One byte of the head flipped: an error or some reply, never a panic.
        let mut head = parts[0].to_vec();
        let len = head.len();
        head[at % len] ^= flip;
        let mut mutated = parts.clone();
        mutated[0] = head.into();
        let _ = decode_reply(&mutated);
    }

    #[test]
    fn control_messages_decode_any_bytes_without_panicking(bytes in any_bytes(512)) {
        let _ = Serialized::from_parts(vec![Bytes::from(bytes)]).decode::<Control>();
    }
}
