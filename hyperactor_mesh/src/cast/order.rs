//! ORD-1 across the paths of a cast tree: messages of one sender to one actor are
//! delivered in the order they were sent, even when some were relayed through other
//! procs and others went directly.
//!
//! Every cast entry carries a sequence number per (sending agent, target actor,
//! receiving proc), counted from 1 by the sender ([`Outgoing::next_seq`]). The receiving
//! agent keeps, per (sender, actor), the next number it expects, and holds back any
//! message that arrives early until the gap before it is filled
//! ([`Sequencer::arrive`]).
//!
//! A relay that dies loses what it had not forwarded yet, so a gap may never fill.
//! Once a proc has died, a gap is waited for only [`GAP_GRACE`] (the agent arms a timer
//! and calls [`Sequencer::release`]); a message given up on that still arrives is
//! delivered late, never dropped. A repeated number is dropped.
//!
//! ```
//! use hyperactor_mesh::cast::order::{Arrival, Sequencer};
//!
//! let mut seq = Sequencer::<&str, &str>::default();
//! assert!(matches!(seq.arrive(7, "a", 2, "second"), Arrival::Held { .. }));
//! let Arrival::Ready(ready) = seq.arrive(7, "a", 1, "first") else { panic!() };
//! assert_eq!(ready, vec!["first", "second"]);
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

use rustc_hash::FxHashMap;
use std::hash::Hash;
use std::time::Duration;

/// How long a message waits for an earlier one once a proc has died: the earlier one
/// may have been lost with a relay. One still in flight after this is delivered late.
pub const GAP_GRACE: Duration = Duration::from_millis(100);

/// Messages of one sender to one actor, put back in sequence order.
#[derive(Debug)]
struct InOrder<T> {
    next: u64,
    held: BTreeMap<u64, T>,
    /// Numbers given up on: delivered late if they still come.
    skipped: HashSet<u64>,
    /// A release timer is armed.
    timer: bool,
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        Self {
            next: 1,
            held: BTreeMap::new(),
            skipped: HashSet::new(),
            timer: false,
        }
    }
}

/// What became of an arriving message.
#[derive(Debug)]
pub enum Arrival<T> {
    /// These messages can be delivered now, in this order (the arriving one and any it
    /// unblocked).
    Ready(Vec<T>),
    /// The message waits for earlier ones. `arm_timer`: the caller should call
    /// [`Sequencer::release`] for this (sender, actor) after [`GAP_GRACE`] (procs have
    /// died, so the gap may never fill).
    Held {
        /// Whether to arm the release timer.
        arm_timer: bool,
    },
    /// A repeat of a message delivered already: drop it.
    Repeat,
}

/// The sequencing state of one agent: see the [module docs](self).
#[derive(Debug)]
pub struct Sequencer<T, A = String> {
    incoming: HashMap<(u64, A), InOrder<T>>,
    /// Whether any proc has died (gaps then get a grace period only).
    deaths: bool,
}

impl<T, A> Default for Sequencer<T, A> {
    fn default() -> Self {
        Self {
            incoming: HashMap::new(),
            deaths: false,
        }
    }
}

impl<T, A: Eq + Hash + Clone> Sequencer<T, A> {
    /// Message `seq` of `sender` to `actor` arrived.
    pub fn arrive(&mut self, sender: u64, actor: A, seq: u64, item: T) -> Arrival<T> {
        let deaths = self.deaths;
        let order = self.incoming.entry((sender, actor)).or_default();
        if seq < order.next {
            return if order.skipped.remove(&seq) {
                // Given up on after a death, yet it came: late beats lost.
                Arrival::Ready(vec![item])
            } else {
                Arrival::Repeat
            };
        }
        if seq > order.next {
            order.held.insert(seq, item);
            let arm_timer = deaths && !order.timer;
            order.timer |= arm_timer;
            return Arrival::Held { arm_timer };
        }
        let mut ready = vec![item];
        order.next += 1;
        while let Some(item) = order.held.remove(&order.next) {
            ready.push(item);
            order.next += 1;
        }
        Arrival::Ready(ready)
    }

    /// Gives up on the gaps before the messages held for (`sender`, `actor`) and returns
    /// those messages, in order.
    pub fn release(&mut self, sender: u64, actor: &A) -> Vec<T> {
        match self.incoming.get_mut(&(sender, actor.clone())) {
            Some(order) => {
                order.timer = false;
                release(order)
            }
            None => Vec::new(),
        }
    }

    /// A proc died: every gap may be lost for good. Returns the held messages of every
    /// (sender, actor), released in order; later gaps get [`GAP_GRACE`].
    pub fn peer_died(&mut self) -> Vec<((u64, A), Vec<T>)> {
        self.deaths = true;
        self.incoming
            .iter_mut()
            .filter(|(_, order)| !order.held.is_empty())
            .map(|(key, order)| (key.clone(), release(order)))
            .collect()
    }

    /// Forgets the state of messages to `actor` (it has ended).
    pub fn forget_actor(&mut self, actor: &A) {
        self.incoming.retain(|(_, a), _| a != actor);
    }
}

fn release<T>(order: &mut InOrder<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(order.held.len());
    for (seq, item) in std::mem::take(&mut order.held) {
        order.skipped.extend(order.next..seq);
        out.push(item);
        order.next = seq + 1;
    }
    out
}

/// The sending side: per (actor, receiving proc), the last sequence number used.
#[derive(Debug)]
pub struct Outgoing<A = String, P = hyperactor::ProcId> {
    last: FxHashMap<A, FxHashMap<P, u64>>,
}

impl<A, P> Default for Outgoing<A, P> {
    fn default() -> Self {
        Self {
            last: FxHashMap::default(),
        }
    }
}

impl<A: Eq + Hash, P: Eq + Hash + Clone> Outgoing<A, P> {
    /// The numbering of messages to `actor` (see [`Outgoing::next_seq`]), created on
    /// first use. Looked up once per cast, then used for each receiver.
    // invariant: the entry is inserted just before it is looked up.
    #[allow(clippy::expect_used)]
    pub fn actor<Q>(&mut self, actor: &Q) -> &mut FxHashMap<P, u64>
    where
        A: std::borrow::Borrow<Q> + for<'a> From<&'a Q>,
        Q: Eq + Hash + ?Sized,
    {
        if !self.last.contains_key(actor) {
            self.last.insert(A::from(actor), FxHashMap::default());
        }
        self.last
            .get_mut(actor)
            .expect("invariant: inserted just above")
    }

    /// The number of the next message to `actor` on `proc`.
    pub fn next_seq<Q>(&mut self, actor: &Q, proc: &P) -> u64
    where
        A: std::borrow::Borrow<Q> + for<'a> From<&'a Q>,
        Q: Eq + Hash + ?Sized,
    {
        next_in(self.actor(actor), proc)
    }
}

/// The next number in `numbering` for `proc`.
pub fn next_in<P: Eq + Hash + Clone>(numbering: &mut FxHashMap<P, u64>, proc: &P) -> u64 {
    if let Some(n) = numbering.get_mut(proc) {
        *n += 1;
        return *n;
    }
    numbering.insert(proc.clone(), 1);
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(a: Arrival<&'static str>) -> Vec<&'static str> {
        match a {
            Arrival::Ready(v) => v,
            other => panic!("ORD-1: expected ready, got {other:?}"),
        }
    }

    #[test]
    fn ord1_messages_of_one_sender_come_out_in_sequence_order() {
        let mut s = Sequencer::<&str, u8>::default();
        assert!(matches!(
            s.arrive(1, 4, 3, "three"),
            Arrival::Held { arm_timer: false }
        ));
        assert!(matches!(s.arrive(1, 4, 2, "two"), Arrival::Held { .. }));
        assert_eq!(
            ready(s.arrive(2, 4, 1, "other sender")),
            vec!["other sender"]
        );
        assert_eq!(ready(s.arrive(1, 4, 1, "one")), vec!["one", "two", "three"]);
        assert!(matches!(s.arrive(1, 4, 2, "again"), Arrival::Repeat));
    }

    #[test]
    fn a_death_releases_held_messages_and_late_ones_still_come() {
        let mut s = Sequencer::<&str, u8>::default();
        s.arrive(5, 4, 2, "two");
        s.arrive(5, 4, 4, "four");
        let released = s.peer_died();
        assert_eq!(released, vec![((5, 4), vec!["two", "four"])]);
        assert_eq!(ready(s.arrive(5, 4, 5, "five")), vec!["five"]);
        assert_eq!(
            ready(s.arrive(5, 4, 3, "three")),
            vec!["three"],
            "late, not lost"
        );
        assert!(matches!(s.arrive(5, 4, 3, "three"), Arrival::Repeat));
        // After a death, a new gap arms the timer once.
        assert!(matches!(
            s.arrive(5, 4, 7, "seven"),
            Arrival::Held { arm_timer: true }
        ));
        assert!(matches!(
            s.arrive(5, 4, 8, "eight"),
            Arrival::Held { arm_timer: false }
        ));
        assert_eq!(s.release(5, &4), vec!["seven", "eight"]);
    }

    #[test]
    fn outgoing_numbers_count_per_actor_and_proc() {
        let mut o = Outgoing::<String, u8>::default();
        assert_eq!(o.next_seq("a", &1), 1);
        assert_eq!(o.next_seq("a", &1), 2);
        assert_eq!(o.next_seq("a", &2), 1);
        assert_eq!(o.next_seq("b", &1), 1);
    }
}
