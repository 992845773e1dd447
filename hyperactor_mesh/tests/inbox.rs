//! The keyed inbox: per-key queues filled on the delivering task.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use hyperactor::message::Serialized;
use hyperactor::testing::timed;
use hyperactor::{ChannelTransport, Proc};
use hyperactor_mesh::inbox::{key_part, Inbox, REPLY_KEY_BIT};

fn msg(key: u64, body: &str) -> Serialized {
    Serialized::from_parts(vec![key_part(key), Bytes::from(body.to_string())])
}

#[tokio::test]
async fn messages_reach_their_key_in_order_even_before_the_queue_is_asked_for() {
    for transport in [ChannelTransport::Local, ChannelTransport::Unix] {
        let proc = Proc::serve(transport, "inbox").await.unwrap();
        let other = Proc::serve(transport, "sender").await.unwrap();
        let owner = proc.client("agent").unwrap();
        let sender = other.client("sender").unwrap();
        let inbox = Inbox::open(&owner);
        for i in 0..50 {
            inbox
                .port()
                .send_serialized(&sender, msg(1, &format!("a{i}")));
            inbox
                .port()
                .send_serialized(&sender, msg(2, &format!("b{i}")));
        }
        // Asked for only now: the first messages created the queues and waited there.
        let (a, b) = (inbox.queue(1), inbox.queue(2));
        for i in 0..50 {
            assert_eq!(
                timed(a.pop()).await.unwrap()[0],
                format!("a{i}"),
                "{transport:?}"
            );
            assert_eq!(
                timed(b.pop()).await.unwrap()[0],
                format!("b{i}"),
                "{transport:?}"
            );
        }
        assert!(a.try_pop().unwrap().is_none());
    }
}

#[tokio::test]
async fn replies_to_a_removed_or_unknown_reply_key_are_dropped() {
    let proc = Proc::serve(ChannelTransport::Local, "inbox").await.unwrap();
    let owner = proc.client("agent").unwrap();
    let inbox = Inbox::open(&owner);
    let reply = inbox.reply_queue();
    assert_ne!(reply.key() & REPLY_KEY_BIT, 0);
    inbox
        .port()
        .send_serialized(&owner, msg(reply.key(), "first"));
    assert_eq!(timed(reply.pop()).await.unwrap()[0], "first");
    inbox.remove(reply.key());
    assert!(reply.is_closed());
    inbox
        .port()
        .send_serialized(&owner, msg(reply.key(), "late"));
    inbox
        .port()
        .send_serialized(&owner, msg(REPLY_KEY_BIT | 12345, "unknown"));
    // A marker on an actor key proves the two messages before it were processed.
    inbox.port().send_serialized(&owner, msg(3, "marker"));
    assert_eq!(timed(inbox.queue(3).pop()).await.unwrap()[0], "marker");
    assert!(reply.try_pop().is_err(), "closed and empty");
    let fresh = inbox.reply_queue();
    assert_ne!(fresh.key(), reply.key(), "reply keys are not reused");
}

#[tokio::test]
async fn a_message_without_a_key_part_is_dropped_without_harm() {
    let proc = Proc::serve(ChannelTransport::Local, "inbox").await.unwrap();
    let owner = proc.client("agent").unwrap();
    let inbox = Inbox::open(&owner);
    inbox.port().send_serialized(
        &owner,
        Serialized::from_parts(vec![Bytes::from_static(b"short")]),
    );
    inbox.port().send_serialized(&owner, msg(4, "after"));
    assert_eq!(timed(inbox.queue(4).pop()).await.unwrap()[0], "after");
}

#[tokio::test]
async fn blocking_pop_times_out_and_closing_wakes_every_waiter() {
    let proc = Proc::serve(ChannelTransport::Local, "inbox").await.unwrap();
    let owner = proc.client("agent").unwrap();
    let inbox = Inbox::open(&owner);
    let queue = inbox.queue(5);
    let start = Instant::now();
    let q = std::sync::Arc::clone(&queue);
    let timed_out = tokio::task::spawn_blocking(move || {
        q.pop_blocking(Some(Instant::now() + Duration::from_millis(50)))
    });
    assert_eq!(timed(timed_out).await.unwrap().unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(50));

    let q = std::sync::Arc::clone(&queue);
    let blocked = tokio::task::spawn_blocking(move || q.pop_blocking(None));
    let q = std::sync::Arc::clone(&queue);
    let awaiting = tokio::spawn(async move { q.pop().await });
    tokio::task::yield_now().await;
    inbox.remove(5);
    assert!(timed(blocked).await.unwrap().is_err());
    assert!(timed(awaiting).await.unwrap().is_err());
}

#[tokio::test]
async fn a_blocked_reader_wakes_on_a_message() {
    let proc = Proc::serve(ChannelTransport::Unix, "inbox").await.unwrap();
    let owner = proc.client("agent").unwrap();
    let inbox = Inbox::open(&owner);
    let queue = inbox.queue(6);
    let blocked = tokio::task::spawn_blocking(move || queue.pop_blocking(None));
    inbox.port().send_serialized(&owner, msg(6, "wake"));
    let got = timed(blocked).await.unwrap().unwrap().unwrap();
    assert_eq!(got, vec![Bytes::from("wake")]);
}

#[tokio::test]
async fn a_retired_key_forwards_queued_and_later_messages_with_their_key() {
    let proc = Proc::serve(ChannelTransport::Local, "inbox").await.unwrap();
    let owner = proc.client("agent").unwrap();
    let inbox = Inbox::open(&owner);
    let actor = inbox.queue(10);
    inbox.port().send_serialized(&owner, msg(10, "queued"));
    inbox.port().send_serialized(&owner, msg(11, "marker"));
    assert_eq!(timed(inbox.queue(11).pop()).await.unwrap()[0], "marker");
    inbox.retire(10, 2);
    assert!(
        actor.try_pop().is_err(),
        "the retired queue is closed and empty"
    );
    inbox.port().send_serialized(&owner, msg(10, "later"));
    let undertaker = inbox.queue(2);
    for body in ["queued", "later"] {
        let parts = timed(undertaker.pop()).await.unwrap();
        assert_eq!(parts, vec![key_part(10), Bytes::from(body)]);
    }
    // Asking for the key again gives it a queue of its own again.
    let again = inbox.queue(10);
    inbox.port().send_serialized(&owner, msg(10, "reborn"));
    assert_eq!(timed(again.pop()).await.unwrap()[0], "reborn");
}
