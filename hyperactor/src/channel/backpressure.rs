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
//!
//! The transport knows the queue only as a [`Congested`]: the actor layer implements it
//! for its work queue.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A queue over its high water mark, as the transport sees it.
pub(crate) trait Congested: Send + Sync {
    /// Resolves once the queue is back under its mark (or closed).
    fn wait_for_room(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

thread_local! {
    static PENDING: RefCell<Option<Arc<dyn Congested>>> = const { RefCell::new(None) };
}

/// Records that `queue` is over its high water mark after a push on this thread.
pub(crate) fn defer(queue: Arc<dyn Congested>) {
    PENDING.with(|p| *p.borrow_mut() = Some(queue));
}

/// A wait for room left by the deliveries just made on this thread, if any.
pub(crate) fn take() -> Option<impl Future<Output = ()>> {
    let queue = PENDING.with(|p| p.borrow_mut().take())?;
    Some(queue.wait_for_room())
}
