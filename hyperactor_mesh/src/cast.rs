//! Casting: one message to every actor of a mesh view, fanned out over a tree of procs,
//! with the replies of a call reduced on the way back.
//!
//! The sender serializes a message once and gives it, with the receivers of the view in
//! order, to its process's agent ([`crate::agent::ProcAgent::cast`]). The list is cut
//! into at most `fanout` chunks ([`tree`]); the agent of each chunk's head receives the
//! message with the chunk, executes it on its own actor and relays the rest of the
//! chunk the same way. The user's parts are the same bytes on every hop; only the small
//! header ([`codec::CastHeader`]) is rebuilt.
//!
//! - [`codec`]: the cast header and the route each delivered message carries.
//! - [`tree`]: how receivers are cut into chunks, and which ones a node relays to.
//! - [`reply`]: the reply codec; a node that relays a `call` reduces its subtree's
//!   replies into one message for its parent.
//! - [`order`]: ORD-1 across the paths of the tree (sequence numbers per sender).
//!
//! Invariants (checked by `tests/cast.rs` and the unit tests of each module):
//!
//! - CAST-1 (exactly once): every receiver of a cast gets it once, at depth about
//!   `log_fanout(n)`.
//! - CAST-2 (reduction): with reduced replies the caller receives one message per
//!   top-level chunk, holding every receiver's item.
//! - ORD-1: see [`order`].
//! - CAST-3 (nothing hangs on the dead): a receiver on a dead proc, and every receiver
//!   relayed through it, is answered [`reply::ReplyStatus::Failed`] with the reason.

pub mod codec;
pub mod order;
pub mod reply;
pub mod tree;

/// Room kept in a frame for what a message carries besides its payload (envelope,
/// route, cast header).
pub const HEADER_ROOM: u64 = 64 << 10;

/// The largest payload (the sum of its parts) a message to a mesh may have: the
/// channel's [largest frame](hyperactor::channel::max_frame_len) less [`HEADER_ROOM`].
pub fn max_message_len() -> u64 {
    hyperactor::channel::max_frame_len().saturating_sub(HEADER_ROOM)
}
