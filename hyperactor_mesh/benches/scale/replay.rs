//! The tree of a call, replayed: the depth of each receiver, and the frames and bytes
//! each level of the tree sends down (the cast) and up (the reduced replies), built as
//! the agents build them.

use std::ops::Range;

use bytes::Bytes;
use hyperactor::message::{handler_port, Envelope, EnvelopeHeader, Serialized, UNDELIVERABLE_PORT};
use hyperactor::{ActorId, ProcId};
use hyperactor_mesh::agent::{agent_id, cast_port, reply_port};
use hyperactor_mesh::cast::codec::{CastHeader, CastKind, Entry, ReplyMode, ReplyTo, ViewExtent};
use hyperactor_mesh::cast::reply::{encode_reply, ReplyItem};
use hyperactor_mesh::cast::tree::chunks;
use serde::Serialize;

use crate::actor::{Ping, Res};

/// The depth (1: the root's direct receivers) of each position of a cast to `n`
/// receivers with fan-out `fanout`, as `cast_out` and `cast_in` cut it.
pub(crate) fn tree_levels(n: usize, fanout: usize) -> Vec<u8> {
    fn walk(range: Range<usize>, depth: u8, fanout: usize, out: &mut [u8]) {
        for chunk in chunks(range.len(), fanout) {
            let (start, end) = (range.start + chunk.start, range.start + chunk.end);
            out[start] = depth;
            walk(start + 1..end, depth.saturating_add(1), fanout, out);
        }
    }
    let mut out = vec![0; n];
    walk(0..n, 1, fanout, &mut out);
    out
}

/// The traffic of one level of a call's tree (level `k`: the receivers at depth `k`).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LevelTraffic {
    /// Receivers at this depth.
    pub(crate) nodes: u64,
    /// Entries (receivers named) in the headers they receive.
    pub(crate) entries: u64,
    /// Frames and bytes they receive from their parents (the cast).
    pub(crate) frames_down: u64,
    pub(crate) bytes_down: u64,
    /// Frames and bytes they send to their parents (replies, reduced).
    pub(crate) frames_up: u64,
    pub(crate) bytes_up: u64,
}

/// What every frame of a call shares, for the replay.
struct Replay<'a> {
    header: CastHeader,
    parts: Vec<Bytes>,
    actor: &'a str,
    fanout: usize,
}

impl Replay<'_> {
    /// Replays the frames of a call whose receivers are `entries`, as the agents build
    /// them (`cast_out`, `cast_in`, the reducers), into `out` by depth.
    fn walk(
        &self,
        entries: &[Entry],
        depth: usize,
        sender: &ActorId,
        agent: &ActorId,
        reply: &ReplyTo,
        out: &mut Vec<LevelTraffic>,
    ) -> Res<()> {
        for range in chunks(entries.len(), self.fanout) {
            let chunk = &entries[range];
            let head = &chunk[0];
            if out.len() <= depth {
                out.resize(depth + 1, LevelTraffic::default());
            }
            let hops = u8::try_from(depth).unwrap_or(u8::MAX);
            let mut parts = vec![self.header.encode_chunk(hops, Some(reply), chunk)?];
            parts.extend(self.parts.iter().cloned());
            let down = frame_len(sender, cast_port(&head.proc), Some(agent), parts)?;
            let level = &mut out[depth];
            level.nodes += 1;
            level.entries += chunk.len() as u64;
            level.frames_down += 1;
            level.bytes_down += down;
            let rest = &chunk[1..];
            let head_agent = agent_id(&head.proc);
            let items: Vec<ReplyItem> = chunk
                .iter()
                .map(|e| ReplyItem::ok(e.index, vec![Bytes::from(e.index.to_le_bytes().repeat(2))]))
                .collect();
            let up = if rest.is_empty() {
                // The actor replies to its parent's reducer.
                let actor = head.proc.actor_id(self.actor, 0)?;
                let parts = encode_reply(reply.key, &items);
                frame_len(&actor, reply.port.clone(), Some(&actor), parts)?
            } else {
                let mine = ReplyTo {
                    port: reply_port(&head.proc),
                    key: 1,
                };
                self.walk(rest, depth + 1, &head_agent, &head_agent, &mine, out)?;
                // Its reducer sends the whole subtree's items up.
                let parts = encode_reply(reply.key, &items);
                frame_len(&head_agent, reply.port.clone(), Some(&head_agent), parts)?
            };
            let level = &mut out[depth];
            level.frames_up += 1;
            level.bytes_up += up;
        }
        Ok(())
    }
}

fn frame_len(
    sender: &ActorId,
    dest: hyperactor::PortId,
    return_to: Option<&ActorId>,
    parts: Vec<Bytes>,
) -> Res<u64> {
    let envelope = Envelope {
        header: EnvelopeHeader {
            sender: sender.clone(),
            dest,
            return_to: return_to.map(|a| a.port_id(UNDELIVERABLE_PORT)),
            extra: None,
        },
        payload: Serialized::from_parts(parts),
    };
    Ok(envelope.into_frame()?.len() as u64)
}

/// The traffic of a `Ping` call from `client` to `procs` (in view order), by depth
/// (index 0 unused).
pub(crate) fn replay_call(
    client: &ActorId,
    procs: &[ProcId],
    view: ViewExtent,
    actor: &str,
    fanout: usize,
) -> Res<Vec<LevelTraffic>> {
    let client_proc = client.proc_id();
    let reply = ReplyTo {
        port: reply_port(client_proc),
        key: 1,
    };
    let header = CastHeader {
        sender: 1,
        origin: client.clone(),
        actor: actor.to_string(),
        kind: CastKind::Message {
            port: handler_port::<Ping>(),
        },
        mode: ReplyMode::Reduce,
        reply: Some(reply.clone()),
        view,
        hops: 1,
        fanout: u16::try_from(fanout).unwrap_or(u16::MAX),
        entries: Vec::new(),
        dead: Vec::new(),
    };
    let entries: Vec<Entry> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| Entry {
            index: i as u32,
            seq: 1,
            proc: p.clone(),
        })
        .collect();
    let replay = Replay {
        header,
        parts: Serialized::encode(&Ping(1))?.into_parts(),
        actor,
        fanout,
    };
    let mut out = Vec::new();
    replay.walk(
        &entries,
        1,
        client,
        &agent_id(client_proc),
        &reply,
        &mut out,
    )?;
    Ok(out)
}
