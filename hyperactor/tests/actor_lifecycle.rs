//! Actor lifecycle: construction, ACT-1/ACT-2, status, stop, children.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyperactor::actor::{Actor, Binder, Context, Handler};
use hyperactor::testing::{timed, Echo, EchoMsg, Recorder};
use hyperactor::{ActorStatus, BoxError, ChannelTransport, OncePortRef, Proc, SendContext};
use serde::{Deserialize, Serialize};

async fn local_proc() -> Proc {
    Proc::serve(ChannelTransport::Local, "test").await.unwrap()
}

#[tokio::test]
async fn spawn_then_call_round_trip() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let echo = client.spawn::<Echo>("echo", ()).unwrap();
    let port = echo.bind().port::<EchoMsg>();
    let reply = timed(client.call(&port, |r| EchoMsg(b"hi".to_vec(), r)))
        .await
        .unwrap();
    assert_eq!(reply, b"hi");
    assert_eq!(echo.actor_id().name(), "echo");
}

/// An actor whose state is set by `init`, and whose handler tracks concurrency.
#[derive(Debug)]
struct Tracked {
    initialized: bool,
    active: Arc<AtomicUsize>,
    max_active: Arc<AtomicUsize>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Work(OncePortRef<bool>);

impl Actor for Tracked {
    type Params = (Arc<AtomicUsize>, Arc<AtomicUsize>);
    async fn new((active, max_active): Self::Params) -> Result<Self, BoxError> {
        Ok(Self {
            initialized: false,
            active,
            max_active,
        })
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Work>();
    }
    async fn init(&mut self, _cx: &Context<Self>) -> Result<(), BoxError> {
        // Give messages sent right after spawn every chance to overtake init.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        self.initialized = true;
        Ok(())
    }
}

impl Handler<Work> for Tracked {
    async fn handle(&mut self, cx: &Context<Self>, Work(reply): Work) -> Result<(), BoxError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active.fetch_max(now, Ordering::SeqCst);
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        reply.send(cx, self.initialized)?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn act1_act2_one_message_at_a_time_after_init() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let max_active = Arc::new(AtomicUsize::new(0));
    let actor = client
        .spawn::<Tracked>(
            "tracked",
            (Arc::new(AtomicUsize::new(0)), Arc::clone(&max_active)),
        )
        .unwrap();
    let port = actor.bind().port::<Work>();
    let calls: Vec<_> = (0..50).map(|_| client.call(&port, Work)).collect();
    for initialized in timed(futures::future::join_all(calls)).await {
        assert!(
            initialized.unwrap(),
            "ACT-2: a message was handled before init finished"
        );
    }
    assert_eq!(
        max_active.load(Ordering::SeqCst),
        1,
        "ACT-1: handlers overlapped"
    );
}

#[tokio::test]
async fn stop_handles_queued_messages_first_then_returns_later_ones() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let recorder = client.spawn::<Recorder>("recorder", ()).unwrap();
    let port = recorder.bind().port::<hyperactor::testing::Record>();
    for i in 0..10 {
        port.send(&client, hyperactor::testing::Record(0, i))
            .unwrap();
    }
    assert!(recorder.stop());
    assert_eq!(timed(recorder.wait()).await, ActorStatus::Stopped);
    // A message sent after the stop comes back to the sender (DEL-1).
    port.send(&client, hyperactor::testing::Record(0, 99))
        .unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert_eq!(returned.envelope.header.dest, *port.port_id());
    assert!(returned.reason.contains("stopped"), "{}", returned.reason);
}

#[tokio::test]
async fn status_reports_lifecycle() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let echo = client.spawn::<Echo>("echo", ()).unwrap();
    let port = echo.bind().port::<EchoMsg>();
    timed(client.call(&port, |r| EchoMsg(vec![], r)))
        .await
        .unwrap();
    assert!(
        matches!(echo.status(), ActorStatus::Idle | ActorStatus::Processing),
        "{:?}",
        echo.status()
    );
    let status = timed(echo.stop_and_wait(Duration::from_secs(5))).await;
    assert_eq!(status, ActorStatus::Stopped);
    assert!(echo.status().is_terminal());
}

/// A parent that spawns an [`Echo`] child in `init` and reports the child's ref.
#[derive(Debug)]
struct Parent {
    child: Option<hyperactor::ActorHandle<Echo>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct GetChild(OncePortRef<hyperactor::ActorRef<Echo>>);

impl Actor for Parent {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Self { child: None })
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<GetChild>();
    }
    async fn init(&mut self, cx: &Context<Self>) -> Result<(), BoxError> {
        self.child = Some(cx.spawn::<Echo>("child", ())?);
        Ok(())
    }
}

impl Handler<GetChild> for Parent {
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        GetChild(reply): GetChild,
    ) -> Result<(), BoxError> {
        let child = self.child.as_ref().ok_or("no child")?;
        reply.send(cx, child.bind())?;
        Ok(())
    }
}

#[tokio::test]
async fn stopping_an_owner_stops_its_children() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let parent = client.spawn::<Parent>("parent", ()).unwrap();
    let child = timed(client.call(&parent.bind().port::<GetChild>(), GetChild))
        .await
        .unwrap();
    assert_eq!(child.actor_id().proc_id(), proc.proc_id());
    // The child answers while its owner runs...
    let echo = child.port::<EchoMsg>();
    timed(client.call(&echo, |r| EchoMsg(vec![1], r)))
        .await
        .unwrap();
    // ...and is stopped with it.
    assert_eq!(
        timed(parent.stop_and_wait(Duration::from_secs(5))).await,
        ActorStatus::Stopped
    );
    let err = timed(client.call(&echo, |r| EchoMsg(vec![2], r)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not running"), "{err}");
}

#[tokio::test]
async fn proc_stop_stops_every_actor_and_refuses_spawns() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let a = client.spawn::<Echo>("a", ()).unwrap();
    let b = proc.spawn::<Recorder>("b", ()).unwrap();
    timed(proc.stop(Duration::from_secs(5))).await;
    assert_eq!(a.status(), ActorStatus::Stopped);
    assert_eq!(b.status(), ActorStatus::Stopped);
    let err = client.spawn::<Echo>("c", ()).unwrap_err();
    assert!(err.to_string().contains("stopped"), "{err}");
}

#[tokio::test]
async fn actor_names_repeat_with_distinct_indices_and_bad_names_are_rejected() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let a = client.spawn::<Echo>("same", ()).unwrap();
    let b = client.spawn::<Echo>("same", ()).unwrap();
    assert_ne!(a.actor_id(), b.actor_id());
    assert_eq!((a.actor_id().index(), b.actor_id().index()), (0, 1));
    let err = client.spawn::<Echo>("bad/name", ()).unwrap_err();
    assert!(err.to_string().contains("invalid name"), "{err}");
}

#[tokio::test]
async fn a_message_type_without_handler_is_returned() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let echo = client.spawn::<Echo>("echo", ()).unwrap();
    // Address a handler port Echo does not bind.
    let port = hyperactor::PortRef::<u32>::attest(
        echo.actor_id()
            .port_id(hyperactor::message::handler_port::<u32>()),
    );
    port.send(&client, 7).unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(
        returned.reason.contains("no handler"),
        "{}",
        returned.reason
    );
    // The actor itself is unharmed.
    let reply = timed(client.call(&echo.bind().port::<EchoMsg>(), |r| EchoMsg(vec![3], r))).await;
    assert_eq!(reply.unwrap(), vec![3]);
}
