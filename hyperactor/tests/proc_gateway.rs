//! Procs attached to a gateway (`Proc::attach`, `Proc::serve_gateway`): every message
//! goes through the gateway, both ways, with ORD-1 and DEL-1 kept.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use hyperactor::channel::{
    self, AttachError, AttachHandler, ChannelAddr, ChannelTransport, Listen,
};
use hyperactor::error::ProcError;
use hyperactor::testing::{timed, Echo, EchoMsg, GetRecords, Record, Recorder};
use hyperactor::{ActorRef, Proc, SendContext};

/// A gateway on TCP (loopback), and a proc behind it on a Unix socket.
async fn gateway_and_target() -> (Proc, Proc) {
    let bind = Listen::Addr("tcp:127.0.0.1:0".parse().unwrap());
    let gateway = Proc::serve_gateway(&bind, None, "gateway").await.unwrap();
    let target = Proc::serve(ChannelTransport::Unix, "target").await.unwrap();
    (gateway, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_proc_calls_through_its_gateway_and_is_called_back() {
    let (gateway, target) = gateway_and_target().await;
    assert!(gateway.is_gateway() && !target.is_gateway());
    let attached = timed(Proc::attach(gateway.proc_id().addr(), "client"))
        .await
        .unwrap();
    // Its id carries the gateway's address: that is where its peers reach it.
    assert_eq!(attached.proc_id().addr(), gateway.proc_id().addr());
    assert_eq!(attached.gateway(), Some(gateway.proc_id().addr()));
    assert_eq!(gateway.attached_clients(), vec![attached.proc_id().clone()]);

    // The client calls an actor behind the gateway...
    let echo = target.spawn::<Echo>("echo", ()).unwrap();
    let client = attached.client("client").unwrap();
    let reply = timed(client.call(&echo.bind().port::<EchoMsg>(), |r| EchoMsg(vec![3; 100], r)))
        .await
        .unwrap();
    assert_eq!(reply, vec![3; 100]);
    // ... and an actor of the client is called from behind the gateway.
    let mine = attached.spawn::<Echo>("mine", ()).unwrap();
    let caller = target.client("caller").unwrap();
    let reply = timed(caller.call(&mine.bind().port::<EchoMsg>(), |r| {
        EchoMsg(vec![5; 70_000], r)
    }))
    .await
    .unwrap();
    assert_eq!(reply, vec![5; 70_000]);
    // The gateway's own actors answer the client too.
    let local = gateway.spawn::<Echo>("local", ()).unwrap();
    let reply = timed(client.call(&local.bind().port::<EchoMsg>(), |r| EchoMsg(vec![1], r)))
        .await
        .unwrap();
    assert_eq!(reply, vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ord1_holds_through_a_gateway_both_ways() {
    const MESSAGES: u64 = 500;
    let (gateway, target) = gateway_and_target().await;
    let attached = timed(Proc::attach(gateway.proc_id().addr(), "client"))
        .await
        .unwrap();
    // Client -> behind the gateway.
    let recorder = target.spawn::<Recorder>("recorder", ()).unwrap().bind();
    let client = attached.client("sender").unwrap();
    for seq in 0..MESSAGES {
        recorder.send(&client, Record(1, seq)).unwrap();
    }
    let records = timed(client.call(&recorder.port::<GetRecords>(), GetRecords))
        .await
        .unwrap();
    let seqs: Vec<u64> = records.iter().map(|(_, q)| *q).collect();
    assert_eq!(
        seqs,
        (0..MESSAGES).collect::<Vec<_>>(),
        "ORD-1, client to cluster"
    );
    // Behind the gateway -> client.
    let mine = attached.spawn::<Recorder>("mine", ()).unwrap().bind();
    let sender = target.client("sender").unwrap();
    for seq in 0..MESSAGES {
        mine.send(&sender, Record(2, seq)).unwrap();
    }
    let records = timed(sender.call(&mine.port::<GetRecords>(), GetRecords))
        .await
        .unwrap();
    let seqs: Vec<u64> = records.iter().map(|(_, q)| *q).collect();
    assert_eq!(
        seqs,
        (0..MESSAGES).collect::<Vec<_>>(),
        "ORD-1, cluster to client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del1_messages_the_gateway_cannot_relay_return_to_their_senders() {
    let (gateway, target) = gateway_and_target().await;
    let attached = timed(Proc::attach(gateway.proc_id().addr(), "client"))
        .await
        .unwrap();
    let client = attached.client("client").unwrap();
    // No such actor behind the gateway.
    let ghost = ActorRef::<Recorder>::attest(target.proc_id().actor_id("ghost", 0).unwrap());
    ghost.send(&client, Record(1, 2)).unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(returned.reason.contains("no actor"), "{}", returned.reason);
    assert_eq!(returned.envelope.header.sender, *client.actor_id());
    // A proc behind the gateway that is gone: the gateway's link to it fails.
    let gone = Proc::serve(ChannelTransport::Unix, "gone").await.unwrap();
    let gone_id = gone.proc_id().clone();
    gone.stop(std::time::Duration::from_secs(1)).await;
    drop(gone);
    let ghost = ActorRef::<Recorder>::attest(gone_id.actor_id("recorder", 0).unwrap());
    ghost.send(&client, Record(3, 4)).unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(returned.link_failed, "{}", returned.reason);
    assert!(
        returned.reason.contains(&gone_id.to_string()),
        "{}",
        returned.reason
    );
    let record: Record = returned.envelope.payload.decode().unwrap();
    assert_eq!((record.0, record.1), (3, 4), "DEL-1: returned intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_client_is_unreachable_and_messages_to_it_come_back() {
    let (gateway, target) = gateway_and_target().await;
    let attached = timed(Proc::attach(gateway.proc_id().addr(), "client"))
        .await
        .unwrap();
    let mine = attached.spawn::<Recorder>("mine", ()).unwrap().bind();
    attached.stop(std::time::Duration::from_secs(1)).await;
    drop(attached);
    let sender = target.client("sender").unwrap();
    mine.send(&sender, Record(1, 1)).unwrap();
    let returned = timed(sender.next_undeliverable()).await.unwrap();
    assert_eq!(returned.envelope.header.sender, *sender.actor_id(), "DEL-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_proc_learns_when_its_gateway_goes_away() {
    let (gateway, _target) = gateway_and_target().await;
    let attached = timed(Proc::attach(gateway.proc_id().addr(), "client"))
        .await
        .unwrap();
    gateway.stop(std::time::Duration::from_secs(1)).await;
    drop(gateway);
    let error = timed(attached.gateway_lost()).await;
    assert!(error.to_string().contains("tcp:127.0.0.1"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_to_a_proc_that_is_not_a_gateway_fails_naming_it() {
    let bind = Listen::Addr("tcp:127.0.0.1:0".parse().unwrap());
    let plain = Proc::serve_as(&bind, None, "plain").await.unwrap();
    let err = timed(Proc::attach(plain.proc_id().addr(), "client"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProcError::Attach(AttachError::Protocol { .. })),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(&plain.proc_id().addr().to_string()), "{text}");
    assert!(text.contains("not a gateway"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_refuses_says_why_and_nothing_is_connected() {
    let refuse: channel::AttachFn = Arc::new(|uid: &str, _link| {
        Err(channel::AttachRefusal::Refused {
            reason: format!("{uid} is not welcome here"),
        })
    });
    let handler = AttachHandler {
        accept: refuse,
        on_return: Arc::new(|_, _| {}),
    };
    let bind = Listen::Addr("tcp:127.0.0.1:0".parse().unwrap());
    let server = channel::serve_gateway(&bind, Arc::new(|_| {}), handler)
        .await
        .unwrap();
    let err = timed(channel::attach(server.addr(), "visitor", Arc::new(|_| {})))
        .await
        .unwrap_err();
    assert!(matches!(err, AttachError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("visitor is not welcome here"),
        "{err}"
    );
    // The in-process transport carries no attachment.
    let err = timed(channel::attach(
        &ChannelAddr::Local(1),
        "x",
        Arc::new(|_| {}),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AttachError::Transport { .. }), "{err}");
}
