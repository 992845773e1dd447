//! Routing between procs over every transport: ORD-1, DEL-1, large messages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hyperactor::channel::ChannelAddr;
use hyperactor::error::CallError;
use hyperactor::id::ProcId;
use hyperactor::testing::{timed, Echo, EchoMsg, GetRecords, Record, Recorder, TRANSPORTS};
use hyperactor::{ActorRef, Proc, SendContext};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_between_procs_on_every_transport() {
    for transport in TRANSPORTS {
        let a = Proc::serve(transport, "a").await.unwrap();
        let b = Proc::serve(transport, "b").await.unwrap();
        let echo = b.spawn::<Echo>("echo", ()).unwrap();
        let client = a.client("client").unwrap();
        let reply = timed(client.call(&echo.bind().port::<EchoMsg>(), |r| EchoMsg(vec![7; 10], r)))
            .await
            .unwrap();
        assert_eq!(reply, vec![7; 10], "{transport:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_message_crosses_every_transport_intact() {
    let payload: Vec<u8> = (0..64 * 1024 * 1024)
        .map(|i: u32| (i % 251) as u8)
        .collect();
    for transport in TRANSPORTS {
        let a = Proc::serve(transport, "a").await.unwrap();
        let b = Proc::serve(transport, "b").await.unwrap();
        let echo = b.spawn::<Echo>("echo", ()).unwrap();
        let client = a.client("client").unwrap();
        let reply = timed(client.call(&echo.bind().port::<EchoMsg>(), |r| {
            EchoMsg(payload.clone(), r)
        }))
        .await
        .unwrap();
        assert!(reply == payload, "{transport:?}: the 64 MiB echo differs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ord1_per_sender_fifo_under_concurrent_senders() {
    const SENDERS: u64 = 4;
    const MESSAGES: u64 = 500;
    for transport in TRANSPORTS {
        let here = Proc::serve(transport, "here").await.unwrap();
        let there = Proc::serve(transport, "there").await.unwrap();
        let recorder = there.spawn::<Recorder>("recorder", ()).unwrap().bind();
        // Senders on two procs (one remote, one local to the recorder), all concurrent.
        let mut tasks = Vec::new();
        for sender in 0..SENDERS {
            let proc = if sender % 2 == 0 {
                here.clone()
            } else {
                there.clone()
            };
            let recorder = recorder.clone();
            tasks.push(tokio::spawn(async move {
                let client = proc.client("sender").unwrap();
                for seq in 0..MESSAGES {
                    recorder.send(&client, Record(sender, seq)).unwrap();
                    if seq % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                client
            }));
        }
        let mut clients = Vec::new();
        for task in tasks {
            clients.push(timed(task).await.unwrap());
        }
        // A call from each sender after its sends: ORD-1 makes it arrive after them.
        let mut records = Vec::new();
        for client in &clients {
            records = timed(client.call(&recorder.port::<GetRecords>(), GetRecords))
                .await
                .unwrap();
        }
        assert_eq!(
            records.len() as u64,
            SENDERS * MESSAGES,
            "{transport:?}: messages lost"
        );
        for sender in 0..SENDERS {
            let seqs: Vec<u64> = records
                .iter()
                .filter(|(s, _)| *s == sender)
                .map(|(_, q)| *q)
                .collect();
            assert_eq!(
                seqs,
                (0..MESSAGES).collect::<Vec<_>>(),
                "ORD-1 violated over {transport:?}"
            );
        }
    }
}

#[tokio::test]
async fn del1_a_message_to_a_missing_actor_returns_to_its_sender() {
    for transport in TRANSPORTS {
        let a = Proc::serve(transport, "a").await.unwrap();
        let b = Proc::serve(transport, "b").await.unwrap();
        let client = a.client("client").unwrap();
        let ghost = ActorRef::<Recorder>::attest(b.proc_id().actor_id("ghost", 0).unwrap());
        ghost.send(&client, Record(1, 2)).unwrap();
        let returned = timed(client.next_undeliverable()).await.unwrap();
        assert_eq!(
            returned.envelope.header.sender,
            *client.actor_id(),
            "DEL-1 ({transport:?})"
        );
        assert!(returned.reason.contains("no actor"), "{}", returned.reason);
        let record: Record = returned.envelope.payload.decode().unwrap();
        assert_eq!(
            (record.0, record.1),
            (1, 2),
            "DEL-1: the returned message is intact"
        );
    }
}

#[tokio::test]
async fn del1_a_call_to_a_missing_actor_fails_instead_of_hanging() {
    let proc = Proc::serve(hyperactor::ChannelTransport::Unix, "a")
        .await
        .unwrap();
    let client = proc.client("client").unwrap();
    let ghost = ActorRef::<Echo>::attest(proc.proc_id().actor_id("ghost", 3).unwrap());
    let err = timed(client.call(&ghost.port::<EchoMsg>(), |r| EchoMsg(vec![], r)))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Undeliverable { .. }), "{err}");
    assert!(
        err.to_string().contains("ghost[3]"),
        "errors name the actor: {err}"
    );
}

#[tokio::test]
async fn del1_messages_to_an_unreachable_proc_come_back() {
    let here = Proc::serve(hyperactor::ChannelTransport::Unix, "here")
        .await
        .unwrap();
    let client = here.client("client").unwrap();
    let nowhere: ChannelAddr = "unix:/nonexistent/hyperactor-test.sock".parse().unwrap();
    let proc = ProcId::new("gone", nowhere).unwrap();
    let ghost = ActorRef::<Echo>::attest(proc.actor_id("echo", 0).unwrap());
    let err = timed(client.call(&ghost.port::<EchoMsg>(), |r| EchoMsg(vec![], r)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CallError::Undeliverable { .. } | CallError::LinkFailed { .. }
        ),
        "{err}"
    );
    ghost
        .send(&client, EchoMsg(vec![], client.open_once_port().0))
        .unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(returned.reason.contains("link"), "{}", returned.reason);
}

#[tokio::test]
async fn del1_an_undeliverable_return_fails_an_actor_that_does_not_handle_it() {
    use hyperactor::actor::{Actor, Binder, Context, Handler};
    use hyperactor::BoxError;
    use serde::{Deserialize, Serialize};

    #[derive(Debug)]
    struct Forwarder;
    #[derive(Debug, Serialize, Deserialize)]
    struct Forward(ActorRef<Recorder>);
    impl Actor for Forwarder {
        type Params = ();
        async fn new(_: ()) -> Result<Self, BoxError> {
            Ok(Forwarder)
        }
        fn bind(binder: &mut Binder<Self>) {
            binder.handle::<Forward>();
        }
    }
    impl Handler<Forward> for Forwarder {
        async fn handle(
            &mut self,
            cx: &Context<Self>,
            Forward(to): Forward,
        ) -> Result<(), BoxError> {
            to.send(cx, Record(0, 0))?;
            Ok(())
        }
    }

    let proc = Proc::serve(hyperactor::ChannelTransport::Local, "p")
        .await
        .unwrap();
    let client = proc.client("client").unwrap();
    let forwarder = client.spawn::<Forwarder>("forwarder", ()).unwrap();
    let ghost = ActorRef::<Recorder>::attest(proc.proc_id().actor_id("ghost", 0).unwrap());
    forwarder.bind().send(&client, Forward(ghost)).unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(event.actor_id, *forwarder.actor_id());
    assert!(
        event.reason.contains("handle_undeliverable"),
        "{}",
        event.reason
    );
    assert!(event.reason.contains("ghost[0]"), "{}", event.reason);
}
