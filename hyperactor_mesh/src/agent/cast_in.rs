//! Receiving a cast: relay it to the heads of this node's sub-chunks, open a reducer for
//! `call` replies, and execute it here once the sender's earlier messages have been
//! (ORD-1).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use hyperactor::message::{Envelope, UNDELIVERABLE_PORT};
use hyperactor::ActorId;

use super::lock::{Rank, Ranked};
use super::replies::{ReduceState, Reducer, Slot};
use super::{cast_port, Inner};
use crate::cast::codec::{CastHeader, CastKind, Entry, ReplyMode, ReplyTo, Route};
use crate::cast::order::{Arrival, Sequencer, GAP_GRACE};
use crate::cast::reply::ReplyItem;
use crate::cast::tree::chunks;
use hyperactor::channel::log_limit::LogLimit;

/// A cast waiting to be executed on this proc, in its sender's order.
pub(crate) struct Delivery {
    actor: String,
    origin: ActorId,
    kind: CastKind,
    route: Route,
    parts: Vec<Bytes>,
}

static MALFORMED: LogLimit = LogLimit::per_second();

/// A receiver on a dead proc: its index, why, and whether its proc was stopped.
type Lost = (u32, String, bool);

/// The casts that arrived, put back in each sender's order (ORD-1): the casts-in
/// component. Its sequencer's lock is the one component lock held while other code
/// runs: the casts it releases execute under it, so that nothing overtakes them, and
/// executing takes other component locks (its rank is below theirs: see
/// [`super::lock`]). Executing only posts, takes component locks and starts tasks.
///
/// Generic over the cast (a [`Delivery`] in the agent) only so that the loom models at
/// the bottom of this file can sequence plain numbers.
pub(super) struct CastsIn<T = Delivery> {
    sequencer: Ranked<Sequencer<T>>,
}

impl<T> Default for CastsIn<T> {
    fn default() -> Self {
        Self {
            sequencer: Ranked::new(Rank::Sequencer),
        }
    }
}

/// What became of an arriving cast.
enum Arrived {
    /// It was executed, with any it unblocked.
    Executed,
    /// It waits for an earlier one; if `arm_timer`, the caller arms the gap timer.
    Held { arm_timer: bool },
    /// It was executed before.
    Repeat,
}

impl<T> CastsIn<T> {
    /// Sequences `delivery` (message `seq` of `sender` to `actor`) and runs `execute` on
    /// what is ready, in order, under the sequencer's lock.
    fn arrive(
        &self,
        sender: u64,
        actor: String,
        seq: u64,
        delivery: T,
        mut execute: impl FnMut(T),
    ) -> Arrived {
        let mut sequencer = self.sequencer.lock();
        match sequencer.arrive(sender, actor, seq, delivery) {
            Arrival::Ready(ready) => {
                ready.into_iter().for_each(&mut execute);
                Arrived::Executed
            }
            Arrival::Held { arm_timer } => Arrived::Held { arm_timer },
            Arrival::Repeat => Arrived::Repeat,
        }
    }

    /// Runs `execute` on the casts of `sender` to `actor` held past their gap's grace
    /// period, in order, under the sequencer's lock.
    fn release(&self, sender: u64, actor: &String, execute: impl FnMut(T)) {
        let mut sequencer = self.sequencer.lock();
        sequencer
            .release(sender, actor)
            .into_iter()
            .for_each(execute);
    }

    /// A proc died: runs `execute` on the casts that no longer wait for a gap, in
    /// order, under the sequencer's lock.
    fn peer_died(&self, mut execute: impl FnMut(T)) {
        let mut sequencer = self.sequencer.lock();
        for (_, ready) in sequencer.peer_died() {
            ready.into_iter().for_each(&mut execute);
        }
    }
}

impl Inner {
    /// A frame arrived on the cast port (on the delivering task).
    pub(super) fn on_cast(self: &Arc<Self>, envelope: Envelope) {
        let mut parts = envelope.payload.into_parts();
        let header = match parts.first().map(|p| CastHeader::decode(p)) {
            Some(Ok(header)) => header,
            Some(Err(e)) => {
                if let Some(suppressed) = MALFORMED.check() {
                    tracing::warn!(
                        suppressed,
                        "agent {}: dropping a malformed cast from {}: {e}",
                        self.id,
                        envelope.header.sender
                    );
                }
                return;
            }
            None => {
                if let Some(suppressed) = MALFORMED.check() {
                    tracing::warn!(
                        suppressed,
                        "agent {}: dropping an empty cast from {}",
                        self.id,
                        envelope.header.sender
                    );
                }
                return;
            }
        };
        let user = parts.split_off(1);
        for proc in &header.dead {
            self.hearsay_death(proc, &header.origin);
        }
        let Some((me, rest)) = header.entries.split_first() else {
            return;
        };
        let (rest, lost) = self.split_dead(rest);
        let children: Vec<&[Entry]> = chunks(rest.len(), usize::from(header.fanout))
            .into_iter()
            .map(|range| &rest[range])
            .collect();
        let lost_items: Vec<ReplyItem> = lost
            .iter()
            .map(|(index, why, stopped)| ReplyItem::unanswered(*index, why, *stopped))
            .collect();
        // Where this node's and its children's replies go.
        let reply = match (&header.mode, &header.reply) {
            (ReplyMode::Reduce, Some(parent)) if !children.is_empty() => {
                Some(self.open_reducer(parent, me.index, &children, lost_items))
            }
            (ReplyMode::None, _) | (_, None) => None,
            (_, Some(parent)) => {
                if !lost_items.is_empty() {
                    self.send_items(parent, lost_items);
                }
                Some(parent.clone())
            }
        };
        let forward_reply = if header.mode == ReplyMode::Reduce {
            reply.as_ref()
        } else {
            header.reply.as_ref()
        };
        for chunk in &children {
            match header.encode_chunk(header.hops.saturating_add(1), forward_reply, chunk) {
                Ok(head) => {
                    let mut out = Vec::with_capacity(1 + user.len());
                    out.push(head);
                    out.extend(user.iter().cloned());
                    self.post(&self.id, cast_port(&chunk[0].proc), None, out);
                }
                Err(e) => tracing::error!(agent = %self.id, "cannot forward a cast: {e}"),
            }
        }
        let delivery = Delivery {
            actor: header.actor,
            origin: header.origin,
            kind: header.kind,
            route: Route {
                index: me.index,
                hops: header.hops,
                view: header.view,
                reply,
            },
            parts: user,
        };
        self.arrive(header.sender, me.seq, delivery);
    }

    /// `entries` without those on dead procs, and the (index, reason) of those.
    fn split_dead<'a>(&self, entries: &'a [Entry]) -> (std::borrow::Cow<'a, [Entry]>, Vec<Lost>) {
        let deaths = self
            .supervisor
            .deaths_among(entries.iter().map(|e| &e.proc));
        if deaths.is_empty() {
            return (std::borrow::Cow::Borrowed(entries), Vec::new());
        }
        let mut deaths = deaths.into_iter().peekable();
        let (mut live, mut lost) = (Vec::with_capacity(entries.len()), Vec::new());
        for (at, e) in entries.iter().enumerate() {
            match deaths.next_if(|(dead, _)| *dead == at) {
                Some((_, death)) => lost.push((e.index, death.unanswered_reason(), death.expected)),
                None => live.push(e.clone()),
            }
        }
        (std::borrow::Cow::Owned(live), lost)
    }

    fn open_reducer(
        &self,
        parent: &ReplyTo,
        mine: u32,
        children: &[&[Entry]],
        lost: Vec<ReplyItem>,
    ) -> ReplyTo {
        let key = self.replies.next_key();
        let mut pending: HashSet<u32> = HashSet::new();
        pending.insert(mine);
        let mut kids = Vec::with_capacity(children.len());
        for chunk in children {
            let indices: Vec<u32> = chunk.iter().map(|e| e.index).collect();
            pending.extend(&indices);
            kids.push((chunk[0].proc.clone(), indices));
        }
        let reducer = Arc::new(Reducer {
            parent: parent.clone(),
            state: hyperactor::sync::Mutex::new(ReduceState {
                pending,
                got: lost,
                children: kids,
            }),
        });
        self.replies.insert(key, Slot::Reducer(reducer));
        ReplyTo {
            port: self.reply_port(),
            key,
        }
    }

    /// Sequences `delivery` (message `seq` of `sender`) and executes what is ready. The
    /// sequencer's lock is held while executing, so nothing overtakes (ORD-1): executing
    /// only posts, or starts tasks.
    fn arrive(self: &Arc<Self>, sender: u64, seq: u64, delivery: Delivery) {
        let actor = delivery.actor.clone();
        match self
            .incoming
            .arrive(sender, actor.clone(), seq, delivery, |d| self.execute(d))
        {
            Arrived::Executed => {}
            Arrived::Held { arm_timer } => {
                if arm_timer {
                    let inner = Arc::downgrade(self);
                    tokio::spawn(async move {
                        tokio::time::sleep(GAP_GRACE).await;
                        if let Some(inner) = inner.upgrade() {
                            inner.incoming.release(sender, &actor, |d| inner.execute(d));
                        }
                    });
                }
            }
            Arrived::Repeat => {
                tracing::warn!(agent = %self.id, actor, seq, "dropping a repeated cast")
            }
        }
    }

    /// Executes deliveries released by a proc's death (the sequencer lock is taken).
    pub(super) fn release_held(self: &Arc<Self>) {
        self.incoming.peer_died(|d| self.execute(d));
    }

    /// Executes one delivery on this proc.
    fn execute(self: &Arc<Self>, d: Delivery) {
        let reply = d.route.reply.clone().map(|to| (to, d.route.index));
        match d.kind {
            CastKind::Message { port } => {
                let dest = match self.proc.proc_id().actor_id(&d.actor, 0) {
                    Ok(actor) => actor.port_id(port),
                    Err(e) => {
                        if let Some((to, index)) = reply {
                            self.send_items(&to, vec![ReplyItem::failed(index, &e.to_string())]);
                        }
                        return;
                    }
                };
                let extra = match d.route.encode() {
                    Ok(extra) => extra,
                    Err(e) => {
                        tracing::error!(agent = %self.id, "cannot encode a route: {e}");
                        return;
                    }
                };
                self.proc.post(Envelope {
                    header: hyperactor::message::EnvelopeHeader {
                        sender: d.origin,
                        dest,
                        return_to: Some(self.id.port_id(UNDELIVERABLE_PORT)),
                        extra: Some(extra),
                    },
                    payload: hyperactor::message::Serialized::from_parts(d.parts),
                });
            }
            CastKind::Spawn(spec) => {
                let (rank, view) = (d.route.index, d.route.view);
                self.spawn_local(&d.actor, &spec, &d.origin, rank, &view, d.parts);
            }
            CastKind::Stop { reason } => self.stop_local(&d.actor, reason, reply),
            CastKind::Probe => self.probe_local(&d.actor, reply),
        }
    }
}

/// Models of the sequencer of incoming casts under loom (`make loom`): casts of one
/// sender arriving out of order on two connection tasks, and a gap timer firing while
/// the missing cast arrives. A cast is its sequence number; executing one logs it.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use hyperactor::sync::Mutex;
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    const SENDER: u64 = 7;

    fn actor() -> String {
        "worker".to_string()
    }

    /// Message `seq` of the sender arrives (on the calling thread, a connection task);
    /// what it releases is executed into `log`.
    fn deliver(casts: &CastsIn<u64>, log: &Mutex<Vec<u64>>, seq: u64) -> Arrived {
        casts.arrive(SENDER, actor(), seq, seq, |seq| log.lock().push(seq))
    }

    /// ORD-1 under concurrency: one connection task delivers message 2 then a copy of
    /// message 1, another delivers message 1. Whatever the interleaving, each message
    /// executes exactly once, 1 before 2, and one copy of message 1 is dropped as a
    /// repeat.
    #[test]
    fn loom_casts_of_one_sender_execute_once_in_seq_order() {
        loom::model(|| {
            let casts = Arc::new(CastsIn::<u64>::default());
            let log = Arc::new(Mutex::new(Vec::new()));
            let task = {
                let (casts, log) = (Arc::clone(&casts), Arc::clone(&log));
                thread::spawn(move || [deliver(&casts, &log, 2), deliver(&casts, &log, 1)])
            };
            let mine = deliver(&casts, &log, 1);
            let theirs = task.join().expect("a connection task");
            assert_eq!(*log.lock(), [1, 2], "ORD-1: each cast once, in seq order");
            let repeats = theirs
                .iter()
                .chain([&mine])
                .filter(|a| matches!(a, Arrived::Repeat))
                .count();
            assert_eq!(repeats, 1, "one copy of message 1 is dropped");
        });
    }

    /// The gap timer against the missing cast: after a death, message 2 waits for 1
    /// with the timer armed; the timer's release and message 1 race. Each executes
    /// once: 1 then 2 when 1 came first, else 2 (released past the gap) then 1 (late,
    /// not lost), never 1 overtaking the release that gave up on it.
    #[test]
    fn loom_a_gap_released_while_the_missing_cast_arrives_executes_each_once() {
        loom::model(|| {
            let casts = Arc::new(CastsIn::<u64>::default());
            let log = Arc::new(Mutex::new(Vec::new()));
            casts.peer_died(|seq| panic!("nothing was held, yet {seq} was released"));
            assert!(
                matches!(deliver(&casts, &log, 2), Arrived::Held { arm_timer: true }),
                "after a death, a gap arms the timer"
            );
            let timer = {
                let (casts, log) = (Arc::clone(&casts), Arc::clone(&log));
                thread::spawn(move || {
                    let mut released = Vec::new();
                    casts.release(SENDER, &actor(), |seq| {
                        released.push(seq);
                        log.lock().push(seq);
                    });
                    released
                })
            };
            assert!(matches!(deliver(&casts, &log, 1), Arrived::Executed));
            let released = timer.join().expect("the gap timer");
            let log = log.lock().clone();
            if released.is_empty() {
                assert_eq!(log, [1, 2], "1 filled the gap: both in order");
            } else {
                assert_eq!(released, [2]);
                assert_eq!(log, [2, 1], "1 came late: after what was released past it");
            }
        });
    }
}
