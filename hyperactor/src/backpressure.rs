//! Receive-side backpressure: a delivery that leaves an actor's queue over its high
//! water mark (WQ-4 of the work queue) holds up the connection that delivered it.
//!
//! Deliveries run synchronously on the task of the connection that read the frame
//! (through the proc's router, the agent's ports, down to the actor's queue). A push
//! that leaves a queue over its mark records the queue here, on the current thread
//! ([`defer`]); once the delivery returns, the connection takes it ([`take`]) and waits
//! for the queue to have room before it reads its next frame. Its sender's link then
//! stops being acknowledged, its byte budget runs out, and senders that wait for budget
//! wait: memory stays bounded end to end, at the price of holding up the other
//! messages of that link meanwhile.

use std::cell::RefCell;
use std::sync::Arc;

use crate::actor::WorkQueue;
use crate::mailbox::Work;

thread_local! {
    static PENDING: RefCell<Option<Arc<WorkQueue<Work>>>> = const { RefCell::new(None) };
}

/// Records that `queue` is over its high water mark after a push on this thread.
pub(crate) fn defer(queue: Arc<WorkQueue<Work>>) {
    PENDING.with(|p| *p.borrow_mut() = Some(queue));
}

/// A wait for room left by the deliveries just made on this thread, if any.
pub(crate) fn take() -> Option<impl std::future::Future<Output = ()>> {
    let queue = PENDING.with(|p| p.borrow_mut().take())?;
    Some(async move { queue.room().await })
}
