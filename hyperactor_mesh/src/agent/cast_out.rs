//! Sending a cast from this process: number it per receiver (ORD-1), leave out
//! receivers on dead procs (reporting them), cut the rest into chunks and post one
//! frame per chunk head; remember what a call waits for, so a death fails it at once.

use rustc_hash::FxHashMap;
use std::sync::Arc;

use bytes::Bytes;
use hyperactor::{ActorId, ProcId};
use serde::{Deserialize, Serialize};

use super::lock::{Rank, Ranked};
use super::{cast_port, Inner, ProcAgent};
use crate::cast::codec::{CastHeader, CastKind, Entry, ReplyMode, ReplyTo, ViewExtent};
use crate::cast::order::Outgoing;
use crate::cast::reply::ReplyItem;
use crate::cast::tree::{chunks, subtree_ends};

/// One receiver of a cast: its index in the view, its proc, and the proc of the host
/// agent that watches it (`None` for a proc no host spawned, such as a client's).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CastTarget {
    /// The index in the view.
    pub index: u32,
    /// The receiver's proc.
    pub proc: ProcId,
    /// The proc of its host agent.
    pub host: Option<ProcId>,
}

/// What a cast did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CastOutcome {
    /// The receivers on dead procs, left out (and reported to the reply target).
    pub lost: Vec<u32>,
}

/// A call from this process still waiting for replies: the receivers it was cast to, in
/// order, and the end of the subtree each heads (see [`subtree_ends`]).
pub(super) struct CallWatch {
    pub(super) targets: Vec<(u32, ProcId)>,
    pub(super) ends: Vec<u32>,
}

impl CallWatch {
    /// The indices whose message went through `proc` (it heads their subtree, or is
    /// theirs), with `true` for the ones on `proc` itself.
    pub(super) fn through(&self, proc: &ProcId) -> Vec<(u32, bool)> {
        let mut out = Vec::new();
        for (pos, (index, p)) in self.targets.iter().enumerate() {
            if p != proc {
                continue;
            }
            out.push((*index, true));
            let end = self.ends.get(pos).map_or(pos + 1, |&e| e as usize);
            let relayed = self.targets[pos + 1..end.max(pos + 1)].iter();
            out.extend(
                relayed
                    .filter(|(_, rp)| rp != proc)
                    .map(|(i, _)| (*i, false)),
            );
        }
        out.sort_unstable_by_key(|&(index, on)| (index, !on));
        out.dedup_by_key(|(index, _)| *index);
        out
    }
}

/// The casts sent from this process: the numbering of each sender's messages per
/// receiver (ORD-1), and the calls still waiting, by reply key: the casts-out
/// component. It owns its state behind one lock, which only its methods take; none
/// calls anything else while holding it (see [`super::lock`]).
pub(super) struct CastsOut {
    state: Ranked<CastsOutState>,
}

#[derive(Default)]
struct CastsOutState {
    outgoing: Outgoing,
    /// Calls from this process still waiting: what they were cast to.
    calls: FxHashMap<u64, CallWatch>,
}

impl Default for CastsOut {
    fn default() -> Self {
        Self {
            state: Ranked::new(Rank::Component),
        }
    }
}

impl CastsOut {
    /// The next sequence numbers of messages to actor `actor` on each of `procs`.
    fn number<'a>(&self, actor: &str, procs: impl IntoIterator<Item = &'a ProcId>) -> Vec<u64> {
        let mut state = self.state.lock();
        let numbering = state.outgoing.actor(actor);
        procs
            .into_iter()
            .map(|p| crate::cast::order::next_in(numbering, p))
            .collect()
    }

    /// Remembers what the call with reply key `key` was cast to.
    fn watch_call(&self, key: u64, watch: CallWatch) {
        self.state.lock().calls.insert(key, watch);
    }

    /// The calls with a message that went through `proc`, with the indices it carried
    /// (see [`CallWatch::through`]).
    pub(super) fn calls_through(&self, proc: &ProcId) -> Vec<(u64, Vec<(u32, bool)>)> {
        self.state
            .lock()
            .calls
            .iter()
            .map(|(key, watch)| (*key, watch.through(proc)))
            .filter(|(_, hit)| !hit.is_empty())
            .collect()
    }

    /// The call with reply key `key` waits no more.
    pub(super) fn forget_call(&self, key: u64) {
        self.state.lock().calls.remove(&key);
    }
}

impl ProcAgent {
    /// Asks the hosts of `targets` (once per proc) to report their procs' deaths to this
    /// agent, so that calls waiting on a dead proc fail at once. A mesh's owner watches
    /// its procs from the spawn; others watch the procs of a view before casting to it
    /// ([`crate::actor_mesh::ActorMeshRef::cast_parts`] does).
    pub fn watch(&self, targets: &[CastTarget]) {
        self.inner.watch_targets(targets);
    }

    /// Casts `parts` from `origin` to actor `actor` on every target (in view order):
    /// see the `cast_out` module's docs and [`crate::cast`]. `view` is the extent the
    /// targets' indices refer to; replies (per `mode`) go to `reply`.
    #[allow(clippy::too_many_arguments)]
    pub fn cast(
        &self,
        origin: &ActorId,
        actor: &str,
        kind: CastKind,
        view: &ViewExtent,
        targets: &[CastTarget],
        mode: ReplyMode,
        reply: Option<ReplyTo>,
        parts: Vec<Bytes>,
    ) -> CastOutcome {
        self.inner
            .cast(origin, actor, kind, view, targets, mode, reply, parts)
    }
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cast(
        self: &Arc<Self>,
        origin: &ActorId,
        actor: &str,
        kind: CastKind,
        view: &ViewExtent,
        targets: &[CastTarget],
        mode: ReplyMode,
        reply: Option<ReplyTo>,
        parts: Vec<Bytes>,
    ) -> CastOutcome {
        let fanout = self.fanout.load(std::sync::atomic::Ordering::Relaxed);
        let mut lost: Vec<ReplyItem> = Vec::new();
        let mut live: Vec<&CastTarget> = Vec::with_capacity(targets.len());
        let mut deaths = self
            .supervisor
            .deaths_among(targets.iter().map(|t| &t.proc))
            .into_iter()
            .peekable();
        for (at, t) in targets.iter().enumerate() {
            match deaths.next_if(|(dead, _)| *dead == at) {
                Some((_, death)) => lost.push(ReplyItem::unanswered(
                    t.index,
                    &death.unanswered_reason(),
                    death.expected,
                )),
                None => live.push(t),
            }
        }
        let seqs = self.casts_out.number(actor, live.iter().map(|t| &t.proc));
        let entries: Vec<Entry> = live
            .iter()
            .zip(seqs)
            .map(|(t, seq)| Entry {
                index: t.index,
                seq,
                proc: t.proc.clone(),
            })
            .collect();
        let reply = if mode == ReplyMode::None { None } else { reply };
        let local_key = reply
            .as_ref()
            .filter(|to| to.port == self.reply_port())
            .map(|to| to.key);
        if let Some(key) = local_key {
            self.casts_out.watch_call(
                key,
                CallWatch {
                    targets: live.iter().map(|t| (t.index, t.proc.clone())).collect(),
                    ends: subtree_ends(live.len(), fanout),
                },
            );
        }
        let lost_indices: Vec<u32> = lost.iter().map(|i| i.index).collect();
        if let (Some(to), false) = (&reply, lost.is_empty()) {
            self.send_items(to, lost);
        }
        let header = CastHeader {
            sender: self.sender_id,
            origin: origin.clone(),
            actor: actor.to_string(),
            kind,
            mode,
            reply,
            view: view.clone(),
            hops: 1,
            fanout: u16::try_from(fanout).unwrap_or(u16::MAX),
            entries: Vec::new(),
            dead: self.supervisor.recent_dead(),
        };
        for range in chunks(entries.len(), fanout) {
            match header.encode_chunk(1, header.reply.as_ref(), &entries[range.clone()]) {
                Ok(head) => {
                    let mut out = Vec::with_capacity(1 + parts.len());
                    out.push(head);
                    out.extend(parts.iter().cloned());
                    self.post(origin, cast_port(&entries[range.start].proc), None, out);
                }
                Err(e) => tracing::error!(agent = %self.id, "cannot encode a cast: {e}"),
            }
        }
        CastOutcome { lost: lost_indices }
    }

    /// Asks the hosts of `targets` (once per proc) to report their procs' deaths here.
    pub(super) fn watch_targets(self: &Arc<Self>, targets: &[CastTarget]) {
        let mut new = self.supervisor.watch_new(targets);
        if new.is_empty() {
            return;
        }
        new.sort();
        let mut at = 0;
        while at < new.len() {
            let host = new[at].0.clone();
            let procs: Vec<ProcId> = new[at..]
                .iter()
                .take_while(|(h, _)| *h == host)
                .map(|(_, p)| p.clone())
                .collect();
            at += procs.len();
            self.monitor_host(&host);
            self.send_control(
                &host,
                &super::Control::WatchProcs {
                    procs,
                    subscriber: self.id.port_id(super::CONTROL_PORT),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_relay_takes_its_subtree_along() {
        let p = |i: u32| -> ProcId { format!("p{i}@local:{i}").parse().unwrap() };
        // 7 receivers, fan-out 2: [0 heads 0..4: 1 heads 1..3 (2), 3], [4 heads 4..7: 5, 6].
        let targets: Vec<(u32, ProcId)> = (0..7).map(|i| (i, p(i))).collect();
        let watch = CallWatch {
            targets,
            ends: subtree_ends(7, 2),
        };
        assert_eq!(watch.ends, vec![4, 3, 3, 4, 7, 6, 7]);
        assert_eq!(watch.through(&p(1)), vec![(1, true), (2, false)]);
        assert_eq!(
            watch.through(&p(4)),
            vec![(4, true), (5, false), (6, false)]
        );
        assert_eq!(watch.through(&p(6)), vec![(6, true)]);
    }
}
