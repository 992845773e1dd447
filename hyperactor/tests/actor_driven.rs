//! Driven actors: an outside thread handles the messages, the runtime keeps ACT-1, the
//! status, supervision (SUP-1) and DEL-1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hyperactor::actor::{DrivenWork, Next};
use hyperactor::message::HANDLER_PORT_BIT;
use hyperactor::testing::timed;
use hyperactor::{ActorStatus, ChannelTransport, PortRef, Proc, SendContext, SupervisionEvent};

const PORT: u64 = HANDLER_PORT_BIT | 0x5150;

async fn local_proc() -> Proc {
    Proc::serve(ChannelTransport::Local, "test").await.unwrap()
}

fn message(next: Next) -> u32 {
    match next {
        Next::Work(DrivenWork::Message(envelope)) => envelope.payload.decode::<u32>().unwrap(),
        other => panic!("expected a message, got {other:?}"),
    }
}

#[tokio::test]
async fn act1_a_driver_thread_takes_messages_in_order_and_the_status_follows() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let actor = client.spawn_driven("driven").unwrap();
    assert_eq!(actor.status(), ActorStatus::Initializing);
    let port = PortRef::<u32>::attest(actor.actor_id().port_id(PORT));
    for i in 0..100 {
        port.send(&client, i).unwrap();
    }
    actor.started();
    let driver = {
        let actor = actor.clone();
        std::thread::spawn(move || {
            let deadline = Some(Instant::now() + Duration::from_secs(30));
            (0..100)
                .map(|_| message(actor.next_blocking(deadline)))
                .collect::<Vec<_>>()
        })
    };
    let got = tokio::task::spawn_blocking(move || driver.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        got,
        (0..100).collect::<Vec<_>>(),
        "ACT-1: one at a time, in order"
    );
    assert_eq!(
        actor.status(),
        ActorStatus::Processing,
        "a message was taken"
    );
    actor.idle();
    assert_eq!(actor.status(), ActorStatus::Idle);
    assert!(matches!(actor.try_next(), Next::Timeout));
    let soon = Instant::now() + Duration::from_millis(5);
    assert!(matches!(actor.next_blocking(Some(soon)), Next::Timeout));
}

#[tokio::test]
async fn sup1_a_failed_driven_actor_reports_to_its_owner_and_returns_its_queue() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let actor = client.spawn_driven("driven").unwrap();
    actor.started();
    let port = PortRef::<u32>::attest(actor.actor_id().port_id(PORT));
    port.send(&client, 1).unwrap();
    port.send(&client, 2).unwrap();
    assert_eq!(message(actor.next().await), 1);
    let cause = SupervisionEvent::new(client.actor_id().clone(), "the cause");
    assert!(actor.fail("it gave up", Some(cause.clone())));
    assert!(!actor.fail("again", None), "only the first end counts");
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(event.actor_id, *actor.actor_id(), "SUP-1");
    assert_eq!(event.reason, "it gave up");
    assert_eq!(
        event.caused_by.as_deref(),
        Some(&cause),
        "SUP-2: the cause is kept"
    );
    // DEL-1: message 2, still queued, and a later one come back to the sender.
    port.send(&client, 3).unwrap();
    for _ in 0..2 {
        let returned = timed(client.next_undeliverable()).await.unwrap();
        assert!(
            returned.reason.contains("failed: it gave up"),
            "{}",
            returned.reason
        );
    }
    assert!(matches!(actor.next().await, Next::Ended));
    assert_eq!(
        timed(actor.wait()).await,
        ActorStatus::Failed("it gave up".into())
    );
}

#[tokio::test]
async fn a_stop_request_comes_after_the_queued_messages() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let actor = client.spawn_driven("driven").unwrap();
    actor.started();
    let port = PortRef::<u32>::attest(actor.actor_id().port_id(PORT));
    port.send(&client, 7).unwrap();
    assert!(actor.request_stop());
    assert_eq!(message(actor.next().await), 7);
    assert!(matches!(actor.next().await, Next::Work(DrivenWork::Stop)));
    assert!(actor.stop());
    assert_eq!(timed(actor.wait()).await, ActorStatus::Stopped);
    port.send(&client, 8).unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(returned.reason.contains("stopped"), "{}", returned.reason);
}

#[tokio::test]
async fn stopping_the_proc_reaches_the_driver_and_waits_for_it() {
    let proc = local_proc().await;
    let actor = proc.spawn_driven("driven").unwrap();
    actor.started();
    let driver = {
        let actor = actor.clone();
        std::thread::spawn(move || {
            let deadline = Some(Instant::now() + Duration::from_secs(30));
            match actor.next_blocking(deadline) {
                Next::Work(DrivenWork::Stop) => actor.stop(),
                other => panic!("expected a stop request, got {other:?}"),
            }
        })
    };
    timed(proc.stop(Duration::from_secs(10))).await;
    assert_eq!(actor.status(), ActorStatus::Stopped);
    assert!(driver.join().unwrap());
}
