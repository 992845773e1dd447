//! Casting: one message to many inboxes, fanned out over a tree of the receivers.
//!
//! The sender serializes a message once and calls [`Inbox::cast`] with the list of
//! receivers (their inbox ports, in view order). The list is cut into at most `fanout`
//! contiguous chunks; the first receiver of each chunk (its *head*) gets the message
//! with the chunk attached. A head delivers the message to its own actor and does the
//! same with the rest of its chunk, so the tree has depth about `log_fanout(n)` and no
//! proc sends more than `fanout` copies. The user parts (method header and payload)
//! are the same `Bytes` on every hop; only the small cast header is rebuilt.
//!
//! Each delivered message starts with a [`Route`] part: the receiver's index in the
//! view, its depth in the tree, and where its reply goes. A reply message is a list of
//! *reply items*, each the receiver's `index` as a little-endian `u32`, then the value
//! (or, when the value comes with `n` attached parts, such as a pickle's out-of-band
//! buffers: the index and `n` as two little-endian `u32`s, the value, then the `n`
//! parts; see [`reply_items`]) so that a tree node can reduce them without decoding
//! the values:
//!
//! - [`CastReply::Direct`]: every receiver replies straight to the caller (streams,
//!   `call_one`).
//! - [`CastReply::Reduce`]: a head that forwarded to children opens a *reducer* under a
//!   fresh reply key of its own inbox, routes its own and its children's replies there,
//!   and sends one message up (all the pairs of its subtree) once every index of its
//!   subtree answered. The caller receives one message per top-level chunk.
//!
//! ORD-1 across paths: a cast relayed through other procs could be overtaken by a later
//! direct message from the same sender. Every message carries a per-(sender, actor,
//! receiver) sequence number, and the receiving inbox delivers each sender's messages
//! to an actor in sequence order, holding back any that arrive early. A relay that dies
//! loses what it had not forwarded yet, so after a death a gap is waited for only
//! [`GAP_GRACE`]; a message given up on that still arrives is delivered late, never
//! dropped.
//!
//! Failures: [`Inbox::peer_died`] tells the inbox that a proc is gone. Children on it
//! are no longer waited for: each index of their chunk still owed goes up as a *lost*
//! reply, a pair whose value is empty (no pickle is empty), so every ancestor stops
//! waiting too and the caller learns which ranks have no answer. Later casts skip the
//! proc, and messages held back for a sequence gap are released (the missing ones died
//! with it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{BufMut, Bytes, BytesMut};
use hyperactor::{PortId, ProcId};

use super::{key_part, Inbox, Shared, Slot, CAST_KEY, REPLY_KEY_BIT};

/// Where the replies of a cast go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CastReply {
    /// Nobody replies (a broadcast).
    None,
    /// Every receiver replies to `port` under `key`.
    Direct {
        /// The caller's inbox port.
        port: PortId,
        /// The caller's reply key.
        key: u64,
    },
    /// Replies are reduced on the way up; `port` receives one message per top-level
    /// subtree, under `key`.
    Reduce {
        /// The caller's inbox port.
        port: PortId,
        /// The caller's reply key.
        key: u64,
    },
}

impl CastReply {
    fn mode(&self) -> u8 {
        match self {
            CastReply::None => 0,
            CastReply::Direct { .. } => 1,
            CastReply::Reduce { .. } => 2,
        }
    }

    fn target(&self) -> Option<(&PortId, u64)> {
        match self {
            CastReply::None => None,
            CastReply::Direct { port, key } | CastReply::Reduce { port, key } => Some((port, *key)),
        }
    }
}

/// One receiver of a cast: its index in the view and its inbox port (with the port id's
/// printed form, which travels in cast headers: keep targets around to print it once).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CastTarget {
    index: u32,
    port: PortId,
    text: Bytes,
}

impl CastTarget {
    /// The receiver at `index` in the view, whose inbox port is `port`.
    pub fn new(index: u32, port: PortId) -> Self {
        let text = Bytes::from(port.to_string());
        Self { index, port, text }
    }

    /// The same receiver at another index (no printing).
    pub fn at(&self, index: u32) -> Self {
        Self {
            index,
            ..self.clone()
        }
    }

    /// The receiver's index in the view (reported back with its reply).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The receiver's inbox port.
    pub fn port(&self) -> &PortId {
        &self.port
    }
}

/// The first part of every message a cast delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The receiver's index in the view.
    pub index: u32,
    /// How many hops the message took from the sender (1: sent to it directly).
    pub hops: u8,
    /// The reply key, meaningful when `reply_port` is set.
    pub reply_key: u64,
    /// Where the reply goes (a port id), `None` for a broadcast.
    pub reply_port: Option<String>,
}

impl Route {
    const FIXED: usize = 4 + 1 + 8;

    /// Encodes the route: `index: u32, hops: u8, reply_key: u64` (little-endian), then
    /// the reply port id in UTF-8 (empty: no reply).
    pub fn encode(&self) -> Bytes {
        let port = self.reply_port.as_deref().unwrap_or("");
        Self::encode_parts(self.index, self.hops, self.reply_key, port.as_bytes())
    }

    fn encode_parts(index: u32, hops: u8, reply_key: u64, port: &[u8]) -> Bytes {
        let mut buf = BytesMut::with_capacity(Self::FIXED + port.len());
        buf.put_u32_le(index);
        buf.put_u8(hops);
        buf.put_u64_le(reply_key);
        buf.put_slice(port);
        buf.freeze()
    }

    /// Decodes [`Route::encode`]'s form; `None` if malformed.
    pub fn decode(part: &[u8]) -> Option<Self> {
        if part.len() < Self::FIXED {
            return None;
        }
        let port = std::str::from_utf8(&part[Self::FIXED..]).ok()?;
        Some(Self {
            index: u32::from_le_bytes(part[0..4].try_into().ok()?),
            hops: part[4],
            reply_key: u64::from_le_bytes(part[5..13].try_into().ok()?),
            reply_port: (!port.is_empty()).then(|| port.to_string()),
        })
    }
}

/// The two parts of one reply: the index, then the value.
pub fn reply_parts(index: u32, value: Bytes) -> [Bytes; 2] {
    [Bytes::copy_from_slice(&index.to_le_bytes()), value]
}

/// The reply items of a reply message's parts (after its key), as `(index, range of
/// the item's parts)`: see the [module docs](self) for the layout. A malformed item
/// ends the list (what follows it cannot be framed).
pub fn reply_items(parts: &[Bytes]) -> Vec<(u32, std::ops::Range<usize>)> {
    let mut items = Vec::new();
    let mut at = 0;
    while at + 1 < parts.len() {
        let head = &parts[at][..];
        let (index, attached) = match head.len() {
            4 => (u32::from_le_bytes([head[0], head[1], head[2], head[3]]), 0),
            8 => (
                u32::from_le_bytes([head[0], head[1], head[2], head[3]]),
                u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize,
            ),
            _ => break,
        };
        let end = at + 2 + attached;
        if end > parts.len() {
            break;
        }
        items.push((index, at..end));
        at = end;
    }
    items
}

fn parse_port(port: &[u8]) -> Option<PortId> {
    std::str::from_utf8(port).ok()?.parse().ok()
}

/// Reply pairs saying that the receivers `lost` cannot answer (empty values).
fn lost_pairs(lost: &[u32]) -> Vec<Bytes> {
    lost.iter()
        .flat_map(|&index| reply_parts(index, Bytes::new()))
        .collect()
}

/// The chunks a list of `n` receivers is cut into: at most `fanout`, contiguous, sizes
/// differing by at most one (larger first).
pub fn chunks(n: usize, fanout: usize) -> Vec<Range<usize>> {
    let k = n.min(fanout.max(1));
    if k == 0 {
        return Vec::new();
    }
    let (base, extra) = (n / k, n % k);
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// For each position of a cast's target list, the end (exclusive) of the subtree it
/// heads: the receivers whose message travels through it are `pos..ends[pos]`.
pub fn subtree_ends(n: usize, fanout: usize) -> Vec<u32> {
    fn layout(range: Range<usize>, fanout: usize, ends: &mut [u32]) {
        for chunk in chunks(range.len(), fanout) {
            let (start, end) = (range.start + chunk.start, range.start + chunk.end);
            ends[start] = end as u32;
            layout(start + 1..end, fanout, ends);
        }
    }
    let mut ends = vec![0; n];
    layout(0..n, fanout, &mut ends);
    ends
}

/// A receiver as listed in a cast header: its port id is parsed only if it heads a
/// chunk (or to check it against dead procs).
#[derive(Clone)]
struct Entry {
    index: u32,
    seq: u64,
    port: Bytes,
}

struct Header {
    mode: u8,
    hops: u8,
    fanout: u16,
    actor_key: u64,
    sender: u64,
    reply_key: u64,
    reply_port: Bytes,
    entries: Vec<Entry>,
}

const VERSION: u8 = 1;

impl Header {
    fn encode(&self, entries: &[Entry]) -> Bytes {
        let size = 1 + 1 + 1 + 2 + 8 + 8 + 8 + 2 + self.reply_port.len() + 4;
        let size = size
            + entries
                .iter()
                .map(|e| 4 + 8 + 2 + e.port.len())
                .sum::<usize>();
        let mut buf = BytesMut::with_capacity(size);
        buf.put_u8(VERSION);
        buf.put_u8(self.mode);
        buf.put_u8(self.hops);
        buf.put_u16_le(self.fanout);
        buf.put_u64_le(self.actor_key);
        buf.put_u64_le(self.sender);
        buf.put_u64_le(self.reply_key);
        buf.put_u16_le(self.reply_port.len() as u16);
        buf.put_slice(&self.reply_port);
        buf.put_u32_le(entries.len() as u32);
        for e in entries {
            buf.put_u32_le(e.index);
            buf.put_u64_le(e.seq);
            buf.put_u16_le(e.port.len() as u16);
            buf.put_slice(&e.port);
        }
        buf.freeze()
    }

    fn decode(part: &Bytes) -> Option<Self> {
        let mut r = Reader { part, at: 0 };
        if r.u8()? != VERSION {
            return None;
        }
        let mode = r.u8()?;
        let hops = r.u8()?;
        let fanout = r.u16()?;
        let actor_key = r.u64()?;
        let sender = r.u64()?;
        let reply_key = r.u64()?;
        let len = r.u16()? as usize;
        let reply_port = r.bytes(len)?;
        let n = r.u32()? as usize;
        let mut entries = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let index = r.u32()?;
            let seq = r.u64()?;
            let len = r.u16()? as usize;
            entries.push(Entry {
                index,
                seq,
                port: r.bytes(len)?,
            });
        }
        Some(Self {
            mode,
            hops,
            fanout,
            actor_key,
            sender,
            reply_key,
            reply_port,
            entries,
        })
    }
}

struct Reader<'a> {
    part: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> Option<Bytes> {
        let end = self.at.checked_add(n)?;
        if end > self.part.len() {
            return None;
        }
        let out = self.part.slice(self.at..end);
        self.at = end;
        Some(out)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?[..].try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
}

/// A tree node's collection of its subtree's replies, under a reply key of its inbox.
pub(super) struct Reducer {
    parent: PortId,
    parent_key: u64,
    state: Mutex<ReduceState>,
}

struct ReduceState {
    /// Indices still owed.
    pending: HashSet<u32>,
    /// Reply pairs received so far.
    got: Vec<Bytes>,
    /// The children: the proc of each head, and the indices of its chunk.
    children: Vec<(ProcId, Vec<u32>)>,
}

impl Reducer {
    fn lock(&self) -> MutexGuard<'_, ReduceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Messages of one sender to one actor, put back in sequence order.
struct InOrder {
    next: u64,
    held: BTreeMap<u64, Vec<Bytes>>,
    /// Numbers given up on (see [`GAP_GRACE`]): delivered late if they still come.
    skipped: HashSet<u64>,
    /// A release is scheduled.
    timer: bool,
}

impl InOrder {
    /// Gives up on the gaps before the held messages and delivers those.
    fn release(&mut self, shared: &Shared, actor_key: u64) {
        for (seq, parts) in std::mem::take(&mut self.held) {
            self.skipped.extend(self.next..seq);
            shared.push(actor_key, parts);
            self.next = seq + 1;
        }
    }
}

/// How long a message waits for an earlier one once a proc has died: the earlier one
/// may have been lost with a relay. One still in flight after this is delivered late
/// rather than dropped.
pub const GAP_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// The cast state of an inbox.
#[derive(Default)]
pub(super) struct CastState {
    /// Receiving: (sender, actor key) -> sequencing.
    incoming: HashMap<(u64, u64), InOrder>,
    /// Sending: (actor key, receiver's port id) -> last sequence number used.
    outgoing: HashMap<(u64, Bytes), u64>,
    /// Procs known to be gone.
    dead: HashSet<ProcId>,
}

impl Shared {
    fn cast_state(&self) -> MutexGuard<'_, CastState> {
        self.cast.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post(&self, dest: PortId, parts: Vec<Bytes>) {
        use hyperactor::message::{Envelope, EnvelopeHeader, Serialized, UNDELIVERABLE_PORT};
        self.proc.post(Envelope {
            header: EnvelopeHeader {
                sender: self.owner.clone(),
                dest,
                return_to: Some(self.owner.port_id(UNDELIVERABLE_PORT)),
                extra: None,
            },
            payload: Serialized::from_parts(parts),
        });
    }

    fn next_reply_key(&self) -> u64 {
        self.next_reply
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            | REPLY_KEY_BIT
    }

    /// A cast message arrived (key part already checked): forward, then deliver.
    pub(super) fn deliver_cast(self: &Arc<Self>, mut parts: Vec<Bytes>) {
        let header = match parts.get(1).and_then(Header::decode) {
            Some(header) => header,
            None => {
                tracing::warn!(inbox = %self.port, "dropping a malformed cast message");
                return;
            }
        };
        let user = parts.split_off(2);
        let Some((me, rest)) = header.entries.split_first() else {
            return;
        };
        // Receivers on procs known to be dead are left out, and reported lost.
        let (rest, lost) = self.without_dead(rest);
        let mut children: Vec<(PortId, &[Entry])> = Vec::new();
        for range in chunks(rest.len(), usize::from(header.fanout)) {
            let chunk = &rest[range];
            match parse_port(&chunk[0].port) {
                Some(port) => children.push((port, chunk)),
                None => tracing::warn!(inbox = %self.port, "cast: bad port id in a chunk"),
            }
        }
        // Where this node's and its children's replies go (the port id, printed).
        let (port, key): (Bytes, u64) = if header.mode == 2 && !children.is_empty() {
            let key = self.next_reply_key();
            let mut pending: HashSet<u32> = HashSet::with_capacity(rest.len() + 1);
            pending.insert(me.index);
            let mut kids = Vec::with_capacity(children.len());
            for (port, chunk) in &children {
                let indices: Vec<u32> = chunk.iter().map(|e| e.index).collect();
                pending.extend(&indices);
                kids.push((port.actor().proc_id().clone(), indices));
            }
            let Some(parent) = parse_port(&header.reply_port) else {
                tracing::warn!(inbox = %self.port, "cast: bad reply port {:?}", header.reply_port);
                return;
            };
            let reducer = Arc::new(Reducer {
                parent,
                parent_key: header.reply_key,
                state: Mutex::new(ReduceState {
                    pending,
                    got: lost_pairs(&lost),
                    children: kids,
                }),
            });
            self.lock().insert(key, Slot::Reduce(reducer));
            (self.port_text.clone(), key)
        } else {
            if header.mode != 0 && !lost.is_empty() {
                if let Some(port) = parse_port(&header.reply_port) {
                    self.report_lost(port, header.reply_key, &lost);
                }
            }
            (header.reply_port.clone(), header.reply_key)
        };
        for (child, chunk) in children {
            let forward = Header {
                hops: header.hops.saturating_add(1),
                reply_key: key,
                reply_port: port.clone(),
                entries: Vec::new(),
                ..header
            };
            let mut out = Vec::with_capacity(2 + user.len());
            out.push(key_part(CAST_KEY));
            out.push(forward.encode(chunk));
            out.extend(user.iter().cloned());
            self.post(child, out);
        }
        let port: &[u8] = if header.mode != 0 { &port } else { &[] };
        let mut local = Vec::with_capacity(1 + user.len());
        local.push(Route::encode_parts(me.index, header.hops, key, port));
        local.extend(user);
        self.deliver_in_order(header.sender, header.actor_key, me.seq, local);
    }

    /// `entries` without those on dead procs, and the indices of those.
    fn without_dead<'a>(&self, entries: &'a [Entry]) -> (std::borrow::Cow<'a, [Entry]>, Vec<u32>) {
        let state = self.cast_state();
        if state.dead.is_empty() {
            return (std::borrow::Cow::Borrowed(entries), Vec::new());
        }
        let (mut live, mut lost) = (Vec::with_capacity(entries.len()), Vec::new());
        for e in entries {
            match parse_port(&e.port) {
                Some(port) if state.dead.contains(port.actor().proc_id()) => lost.push(e.index),
                _ => live.push(e.clone()),
            }
        }
        (std::borrow::Cow::Owned(live), lost)
    }

    /// Tells `port` (under `key`) that the receivers `lost` cannot answer.
    fn report_lost(&self, port: PortId, key: u64, lost: &[u32]) {
        let mut out = vec![key_part(key)];
        out.extend(lost_pairs(lost));
        self.post(port, out);
    }

    /// Delivers message `seq` of `sender` to `actor_key`, after the ones before it.
    fn deliver_in_order(
        self: &Arc<Self>,
        sender: u64,
        actor_key: u64,
        seq: u64,
        parts: Vec<Bytes>,
    ) {
        let mut guard = self.cast_state();
        let state = &mut *guard;
        let order = state
            .incoming
            .entry((sender, actor_key))
            .or_insert(InOrder {
                next: 1,
                held: BTreeMap::new(),
                skipped: HashSet::new(),
                timer: false,
            });
        if seq < order.next {
            if order.skipped.remove(&seq) {
                // Given up on after a death, yet it came: late beats lost.
                self.push(actor_key, parts);
            } else {
                tracing::warn!(inbox = %self.port, seq, "dropping a repeated cast message");
            }
            return;
        }
        if seq > order.next {
            order.held.insert(seq, parts);
            // Once procs have died, a gap may never fill: give it a grace period.
            if !state.dead.is_empty() && !order.timer {
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    order.timer = true;
                    let shared = Arc::downgrade(self);
                    handle.spawn(async move {
                        tokio::time::sleep(GAP_GRACE).await;
                        if let Some(shared) = shared.upgrade() {
                            let mut state = shared.cast_state();
                            if let Some(order) = state.incoming.get_mut(&(sender, actor_key)) {
                                order.timer = false;
                                order.release(&shared, actor_key);
                            }
                        }
                    });
                } else {
                    order.release(self, actor_key);
                }
            }
            return;
        }
        // The state lock is held while pushing, so that nothing overtakes these.
        self.push(actor_key, parts);
        order.next += 1;
        while let Some(parts) = order.held.remove(&order.next) {
            self.push(actor_key, parts);
            order.next += 1;
        }
    }

    /// A reply for a reducer's key.
    pub(super) fn reduce(&self, key: u64, reducer: &Reducer, parts: Vec<Bytes>) {
        let mut state = reducer.lock();
        if state.pending.is_empty() {
            return; // complete already
        }
        for (index, item) in reply_items(&parts) {
            if state.pending.remove(&index) {
                state.got.extend(parts[item].iter().cloned());
            }
        }
        self.finish_if_done(key, reducer, state);
    }

    fn finish_if_done(&self, key: u64, reducer: &Reducer, mut state: MutexGuard<'_, ReduceState>) {
        if !state.pending.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(1 + state.got.len());
        out.push(key_part(reducer.parent_key));
        out.append(&mut state.got);
        drop(state);
        self.lock().remove(&key);
        self.post(reducer.parent.clone(), out);
    }
}

impl Inbox {
    /// Casts `parts` to `targets` (in view order) for actor key `actor_key`, over a
    /// tree with at most `fanout` children per node. Returns, per position in
    /// `targets`, the end of the subtree that position heads ([`subtree_ends`]): if the
    /// proc at `pos` dies, the message may be lost for `pos..ends[pos]`.
    ///
    /// # Panics
    ///
    /// If `actor_key` has [`REPLY_KEY_BIT`] set.
    pub fn cast(
        &self,
        actor_key: u64,
        targets: &[CastTarget],
        fanout: usize,
        reply: &CastReply,
        parts: Vec<Bytes>,
    ) -> Vec<u32> {
        assert!(
            actor_key & REPLY_KEY_BIT == 0,
            "cast to {actor_key:#x}: actor keys leave the reply bit clear"
        );
        let fanout = fanout.clamp(1, usize::from(u16::MAX));
        let shared = &self.shared;
        // Receivers on procs known to be dead are left out (and reported lost below).
        let mut live: Vec<usize> = Vec::with_capacity(targets.len());
        let mut lost: Vec<u32> = Vec::new();
        let entries: Vec<Entry> = {
            let mut state = shared.cast_state();
            let state = &mut *state;
            for (pos, t) in targets.iter().enumerate() {
                if !state.dead.is_empty() && state.dead.contains(t.port.actor().proc_id()) {
                    lost.push(t.index);
                } else {
                    live.push(pos);
                }
            }
            live.iter()
                .map(|&pos| {
                    let t = &targets[pos];
                    let seq = state
                        .outgoing
                        .entry((actor_key, t.text.clone()))
                        .or_insert(0);
                    *seq += 1;
                    Entry {
                        index: t.index,
                        seq: *seq,
                        port: t.text.clone(),
                    }
                })
                .collect()
        };
        let (reply_port, reply_key) = match reply.target() {
            // Usually the caller's own inbox, whose id is printed already.
            Some((port, key)) if *port == shared.port => (shared.port_text.clone(), key),
            Some((port, key)) => (Bytes::from(port.to_string()), key),
            None => (Bytes::new(), 0),
        };
        let header = Header {
            mode: reply.mode(),
            hops: 1,
            fanout: fanout as u16,
            actor_key,
            sender: shared.sender_id,
            reply_key,
            reply_port,
            entries: Vec::new(),
        };
        if let (Some((port, key)), false) = (reply.target(), lost.is_empty()) {
            shared.report_lost(port.clone(), key, &lost);
        }
        for range in chunks(entries.len(), fanout) {
            let head = targets[live[range.start]].port.clone();
            let mut out = Vec::with_capacity(2 + parts.len());
            out.push(key_part(CAST_KEY));
            out.push(header.encode(&entries[range]));
            out.extend(parts.iter().cloned());
            shared.post(head, out);
        }
        if lost.is_empty() {
            return subtree_ends(targets.len(), fanout);
        }
        // The live list's subtrees, as positions in `targets`.
        let mut ends: Vec<u32> = (1..=targets.len() as u32).collect();
        for (j, end) in subtree_ends(live.len(), fanout).into_iter().enumerate() {
            ends[live[j]] = live[end as usize - 1] as u32 + 1;
        }
        ends
    }

    /// The proc `proc` is gone: stop waiting for replies through it, skip it in later
    /// casts, and release messages held back for sequence gaps (see the module docs).
    pub fn peer_died(&self, proc: &ProcId) {
        let shared = &self.shared;
        {
            let mut state = shared.cast_state();
            state.dead.insert(proc.clone());
            for ((_, actor_key), order) in state.incoming.iter_mut() {
                order.release(shared, *actor_key);
            }
        }
        let reducers: Vec<(u64, Arc<Reducer>)> = shared
            .lock()
            .iter()
            .filter_map(|(key, slot)| match slot {
                Slot::Reduce(r) => Some((*key, Arc::clone(r))),
                _ => None,
            })
            .collect();
        for (key, reducer) in reducers {
            let mut state = reducer.lock();
            if state.pending.is_empty() {
                continue;
            }
            let lost: Vec<u32> = state
                .children
                .iter()
                .filter(|(p, _)| p == proc)
                .flat_map(|(_, indices)| indices.iter().copied())
                .collect();
            if lost.is_empty() {
                continue;
            }
            for index in lost {
                if state.pending.remove(&index) {
                    state.got.extend(reply_parts(index, Bytes::new()));
                }
            }
            shared.finish_if_done(key, &reducer, state);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hyperactor::{ChannelTransport, Proc};

    use super::*;

    fn msg(body: &'static str) -> Vec<Bytes> {
        vec![Bytes::from_static(body.as_bytes())]
    }

    #[test]
    fn reply_items_frame_plain_and_attached_values() {
        let b = |s: &'static [u8]| Bytes::from_static(s);
        let mut with_two = 7u32.to_le_bytes().to_vec();
        with_two.extend(2u32.to_le_bytes());
        let parts = vec![
            b(&[1, 0, 0, 0]),
            b(b"one"),
            Bytes::from(with_two),
            b(b"seven"),
            b(b"x"),
            b(b"y"),
            b(&[2, 0, 0, 0]),
            b(b""),
        ];
        assert_eq!(reply_items(&parts), vec![(1, 0..2), (7, 2..6), (2, 6..8)]);
        // Attached parts missing, or a bad head: the list ends there.
        assert_eq!(reply_items(&parts[..5]), vec![(1, 0..2)]);
        assert_eq!(reply_items(&[b(b"bad"), b(b"v")]), vec![]);
    }

    #[tokio::test]
    async fn messages_of_one_sender_are_delivered_in_sequence_order() {
        let proc = Proc::serve(ChannelTransport::Local, "order").await.unwrap();
        let client = proc.client("agent").unwrap();
        let inbox = Inbox::open(&client);
        let queue = inbox.queue(4);
        let shared = &inbox.shared;
        // 2 and 3 overtake 1 (e.g. 1 was relayed through other procs): they wait.
        shared.deliver_in_order(77, 4, 3, msg("three"));
        shared.deliver_in_order(77, 4, 2, msg("two"));
        assert!(queue.try_pop().unwrap().is_none());
        // Another sender is not held up.
        shared.deliver_in_order(78, 4, 1, msg("other"));
        assert_eq!(queue.try_pop().unwrap(), Some(msg("other")));
        shared.deliver_in_order(77, 4, 1, msg("one"));
        for body in ["one", "two", "three"] {
            assert_eq!(queue.try_pop().unwrap(), Some(msg(body)));
        }
        // A repeat of a delivered number is dropped.
        shared.deliver_in_order(77, 4, 2, msg("again"));
        assert!(queue.try_pop().unwrap().is_none());
    }

    #[tokio::test]
    async fn a_peer_death_releases_messages_held_for_a_gap() {
        let proc = Proc::serve(ChannelTransport::Local, "order").await.unwrap();
        let client = proc.client("agent").unwrap();
        let inbox = Inbox::open(&client);
        let queue = inbox.queue(4);
        inbox.shared.deliver_in_order(5, 4, 2, msg("two"));
        inbox.shared.deliver_in_order(5, 4, 4, msg("four"));
        assert!(queue.try_pop().unwrap().is_none());
        // Message 1 (and 3) died with the proc that relayed them.
        inbox.peer_died(proc.proc_id());
        assert_eq!(queue.try_pop().unwrap(), Some(msg("two")));
        assert_eq!(queue.try_pop().unwrap(), Some(msg("four")));
        inbox.shared.deliver_in_order(5, 4, 5, msg("five"));
        assert_eq!(queue.try_pop().unwrap(), Some(msg("five")));
        // Given up on, 3 still comes (it was slow, not lost): late, but delivered; a
        // second copy of it is a repeat.
        inbox.shared.deliver_in_order(5, 4, 3, msg("three"));
        assert_eq!(queue.try_pop().unwrap(), Some(msg("three")));
        inbox.shared.deliver_in_order(5, 4, 3, msg("three"));
        assert!(queue.try_pop().unwrap().is_none());
    }

    #[tokio::test]
    async fn after_a_death_a_new_gap_is_waited_for_only_a_grace_period() {
        let proc = Proc::serve(ChannelTransport::Local, "order").await.unwrap();
        let client = proc.client("agent").unwrap();
        let inbox = Inbox::open(&client);
        let queue = inbox.queue(4);
        inbox.peer_died(proc.proc_id());
        let start = std::time::Instant::now();
        inbox.shared.deliver_in_order(6, 4, 2, msg("two"));
        assert!(queue.try_pop().unwrap().is_none(), "held at first");
        let got = hyperactor::testing::timed(queue.pop()).await.unwrap();
        assert_eq!(got, msg("two"));
        assert!(start.elapsed() >= GAP_GRACE);
    }

    #[test]
    fn routes_round_trip() {
        for route in [
            Route {
                index: 3,
                hops: 2,
                reply_key: REPLY_KEY_BIT | 9,
                reply_port: Some("unix:@x,p/agent[0]:1".into()),
            },
            Route {
                index: 0,
                hops: 1,
                reply_key: 0,
                reply_port: None,
            },
        ] {
            assert_eq!(Route::decode(&route.encode()), Some(route));
        }
        assert_eq!(Route::decode(b"short"), None);
    }

    #[test]
    fn chunks_are_balanced_and_contiguous() {
        assert_eq!(chunks(0, 4), Vec::<Range<usize>>::new());
        assert_eq!(chunks(3, 16), vec![0..1, 1..2, 2..3]);
        assert_eq!(chunks(10, 4), vec![0..3, 3..6, 6..8, 8..10]);
        assert_eq!(chunks(5, 0), vec![0..5], "fan-out 0 is treated as 1");
    }
}
