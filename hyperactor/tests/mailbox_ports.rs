//! Ports: once ports (MB-2), streaming ports, port references inside messages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hyperactor::actor::{Actor, Binder, Context, Handler};
use hyperactor::error::RecvError;
use hyperactor::sync::Mutex;
use hyperactor::testing::timed;
use hyperactor::{BoxError, ChannelTransport, PortRef, Proc, SendContext};
use serde::{Deserialize, Serialize};

async fn local_proc() -> Proc {
    Proc::serve(ChannelTransport::Local, "test").await.unwrap()
}

#[tokio::test]
async fn mb2_once_port_delivers_exactly_once() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let sender = proc.client("sender").unwrap();
    let (port, rx) = client.open_once_port::<u64>();
    // Send twice through copies of the reference (it is serializable, so copies exist).
    let copy: hyperactor::OncePortRef<u64> =
        bincode::deserialize(&bincode::serialize(&port).unwrap()).unwrap();
    port.send(&sender, 1).unwrap();
    copy.send(&sender, 2).unwrap();
    assert_eq!(
        timed(rx.recv()).await.unwrap(),
        1,
        "MB-2: first message delivered"
    );
    let returned = timed(sender.next_undeliverable()).await.unwrap();
    assert!(
        returned.reason.contains("not open"),
        "MB-2: {}",
        returned.reason
    );
    let second: u64 = returned.envelope.payload.decode().unwrap();
    assert_eq!(second, 2, "MB-2: the second message is the one returned");
}

#[tokio::test]
async fn streaming_port_delivers_every_message_in_order() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (port, mut rx) = client.open_port::<u64>();
    for i in 0..1000 {
        port.send(&client, i).unwrap();
    }
    for i in 0..1000 {
        assert_eq!(timed(rx.recv()).await.unwrap(), i);
    }
    assert!(rx.try_recv().unwrap().is_none());
}

/// Sends `count` numbers to the port it receives.
#[derive(Debug)]
struct Streamer;

#[derive(Debug, Serialize, Deserialize)]
struct StreamTo {
    count: u64,
    port: PortRef<u64>,
}

impl Actor for Streamer {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Streamer)
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<StreamTo>();
    }
}

impl Handler<StreamTo> for Streamer {
    async fn handle(&mut self, cx: &Context<Self>, msg: StreamTo) -> Result<(), BoxError> {
        for i in 0..msg.count {
            msg.port.send(cx, i)?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn port_refs_travel_inside_messages_across_procs() {
    for transport in hyperactor::testing::TRANSPORTS {
        let here = Proc::serve(transport, "here").await.unwrap();
        let there = Proc::serve(transport, "there").await.unwrap();
        let client = here.client("client").unwrap();
        let streamer = there.spawn::<Streamer>("streamer", ()).unwrap();
        let (port, mut rx) = client.open_port::<u64>();
        streamer
            .bind()
            .send(&client, StreamTo { count: 100, port })
            .unwrap();
        for i in 0..100 {
            assert_eq!(timed(rx.recv()).await.unwrap(), i, "{transport:?}");
        }
    }
}

#[tokio::test]
async fn a_dropped_receiver_closes_its_port() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (port, rx) = client.open_port::<u64>();
    drop(rx);
    port.send(&client, 5).unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert_eq!(returned.envelope.header.dest, *port.port_id());
}

#[tokio::test]
async fn receivers_fail_when_their_mailbox_closes() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (_port, mut rx) = client.open_port::<u64>();
    let (_once, once_rx) = client.open_once_port::<u64>();
    drop(client);
    assert!(matches!(
        timed(rx.recv()).await,
        Err(RecvError::Closed { .. })
    ));
    assert!(matches!(
        timed(once_rx.recv()).await,
        Err(RecvError::Closed { .. })
    ));
}

#[tokio::test]
async fn a_message_of_the_wrong_type_is_a_decode_error() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (port, mut rx) = client.open_port::<String>();
    let wrong = PortRef::<u8>::attest(port.port_id().clone());
    wrong.send(&client, 200).unwrap();
    let err = timed(rx.recv()).await.unwrap_err();
    assert!(matches!(err, RecvError::Decode { .. }), "{err}");
}

#[tokio::test]
async fn a_call_stays_pending_until_answered_and_cancelling_closes_its_reply_port() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let responder = proc.client("responder").unwrap();
    let (service, mut requests) = responder.open_port::<hyperactor::OncePortRef<u64>>();
    let mut call = Box::pin(client.call(&service, |reply| reply));
    // The request arrives (it is sent when `call` is called)...
    let reply = timed(requests.recv()).await.unwrap();
    // ...and, unanswered, the call is still pending.
    let pending = tokio::select! {
        biased;
        _ = &mut call => false,
        () = std::future::ready(()) => true,
    };
    assert!(pending, "a call with no reply must stay pending");
    // Cancelling the call closes its reply port: a late reply goes back to the replier.
    drop(call);
    reply.send(&responder, 7).unwrap();
    let returned = timed(responder.next_undeliverable()).await.unwrap();
    assert!(returned.reason.contains("not open"), "{}", returned.reason);
}

#[tokio::test]
async fn serialized_messages_keep_their_parts_across_procs() {
    use bytes::Bytes;
    use hyperactor::message::Serialized;
    for transport in hyperactor::testing::TRANSPORTS {
        let here = Proc::serve(transport, "here").await.unwrap();
        let there = Proc::serve(transport, "there").await.unwrap();
        let sender = here.client("sender").unwrap();
        let receiver = there.client("receiver").unwrap();
        let (port, mut rx) = receiver.open_port::<Vec<u8>>();
        let big = Bytes::from(vec![7u8; 1 << 20]);
        let parts = vec![Bytes::from_static(b"stream"), big.clone(), Bytes::new()];
        port.send_serialized(&sender, Serialized::from_parts(parts.clone()));
        let received = timed(rx.recv_serialized()).await.unwrap();
        assert_eq!(
            received.parts(),
            &parts[..],
            "{transport:?}: parts changed on the way"
        );
    }
}

#[tokio::test]
async fn a_direct_port_hands_over_messages_in_order_and_bounces_after_close() {
    use std::sync::Arc;

    for transport in [ChannelTransport::Local, ChannelTransport::Unix] {
        let receiver_proc = Proc::serve(transport, "receiver").await.unwrap();
        let sender_proc = Proc::serve(transport, "sender").await.unwrap();
        let owner = receiver_proc.client("owner").unwrap();
        let sender = sender_proc.client("sender").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let sink_seen = Arc::clone(&seen);
        let (port, handle) = owner.mailbox().open_direct_port::<u64>(Arc::new(
            move |envelope: hyperactor::message::Envelope| {
                let n: u64 = envelope.payload.decode().unwrap();
                sink_seen.lock().push(n);
                if n == 99 {
                    done_tx.send(()).unwrap();
                }
            },
        ));
        assert_eq!(handle.port_id(), port.port_id());
        for i in 0..100 {
            port.send(&sender, i).unwrap();
        }
        timed(done_rx.recv()).await.unwrap();
        assert_eq!(
            *seen.lock(),
            (0..100).collect::<Vec<u64>>(),
            "{transport:?}"
        );
        drop(handle);
        port.send(&sender, 100).unwrap();
        let returned = timed(sender.next_undeliverable()).await.unwrap();
        assert!(returned.reason.contains("not open"), "{}", returned.reason);
        assert_eq!(seen.lock().len(), 100, "nothing delivered after close");
    }
}
