//! Supervision: failures reach owners (SUP-1), chains keep their causes (SUP-2).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hyperactor::actor::{Actor, Binder, Context, Handler};
use hyperactor::testing::{timed, EchoMsg, Fail, Failer};
use hyperactor::{
    ActorHandle, ActorStatus, BoxError, ChannelTransport, OncePortRef, PortRef, Proc, SendContext,
    SupervisionEvent,
};
use serde::{Deserialize, Serialize};

async fn local_proc() -> Proc {
    Proc::serve(ChannelTransport::Local, "test").await.unwrap()
}

#[tokio::test]
async fn sup1_a_handler_error_sends_one_event_to_the_owner() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let failer = client.spawn::<Failer>("failer", ()).unwrap();
    failer.bind().send(&client, Fail::Error).unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(
        event.actor_id,
        *failer.actor_id(),
        "SUP-1: the event names the failed actor"
    );
    assert!(
        event.reason.contains("failing as asked"),
        "{}",
        event.reason
    );
    assert!(
        event.reason.contains("Fail"),
        "the reason names the message type: {}",
        event.reason
    );
    assert!(matches!(timed(failer.wait()).await, ActorStatus::Failed(_)));
}

#[tokio::test]
async fn sup1_a_panicking_handler_sends_an_event_to_the_owner() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let failer = client.spawn::<Failer>("failer", ()).unwrap();
    failer.bind().send(&client, Fail::Panic).unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(event.actor_id, *failer.actor_id());
    assert!(
        event.reason.contains("panicked: panicking as asked"),
        "{}",
        event.reason
    );
    // The rest of the proc is unharmed.
    let other = client.spawn::<Failer>("other", ()).unwrap();
    let reply = timed(client.call(&other.bind().port::<EchoMsg>(), |r| EchoMsg(vec![1], r))).await;
    assert_eq!(reply.unwrap(), vec![1]);
}

#[derive(Debug)]
struct FailsToStart;

impl Actor for FailsToStart {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Err("cannot start".into())
    }
    fn bind(_: &mut Binder<Self>) {}
}

#[tokio::test]
async fn sup1_a_failing_constructor_sends_an_event() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let actor = client.spawn::<FailsToStart>("fails", ()).unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(event.actor_id, *actor.actor_id());
    assert!(
        event.reason.contains("new returned an error: cannot start"),
        "{}",
        event.reason
    );
}

#[tokio::test]
async fn a_failed_actor_returns_its_queued_messages() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let failer = client.spawn::<Failer>("failer", ()).unwrap();
    failer.bind().send(&client, Fail::Error).unwrap();
    let (reply, reply_rx) = client.open_once_port::<hyperactor::testing::EchoReply>();
    failer
        .bind()
        .send(&client, EchoMsg(vec![9], reply))
        .unwrap();
    let returned = timed(client.next_undeliverable()).await.unwrap();
    assert!(
        returned.reason.contains("failed"),
        "DEL-1: {}",
        returned.reason
    );
    drop(reply_rx);
    timed(client.next_supervision_event()).await.unwrap();
}

/// Owns a [`Failer`]; forwards what it sees of its failure to `report`, and handles it
/// or not as configured.
#[derive(Debug)]
struct Supervisor {
    handle: bool,
    report: PortRef<SupervisionEvent>,
    child: Option<ActorHandle<Failer>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct BreakChild(Fail);

#[derive(Debug, Serialize, Deserialize)]
struct Ping(OncePortRef<()>);

impl Actor for Supervisor {
    type Params = (bool, PortRef<SupervisionEvent>);
    async fn new((handle, report): Self::Params) -> Result<Self, BoxError> {
        Ok(Self {
            handle,
            report,
            child: None,
        })
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<BreakChild>().handle::<Ping>();
    }
    async fn init(&mut self, cx: &Context<Self>) -> Result<(), BoxError> {
        self.child = Some(cx.spawn::<Failer>("child", ())?);
        Ok(())
    }
    async fn handle_supervision_event(
        &mut self,
        cx: &Context<Self>,
        event: &SupervisionEvent,
    ) -> Result<bool, BoxError> {
        self.report.send(cx, event.clone())?;
        Ok(self.handle)
    }
}

impl Handler<BreakChild> for Supervisor {
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        BreakChild(how): BreakChild,
    ) -> Result<(), BoxError> {
        let child = self.child.as_ref().ok_or("no child")?;
        child.bind().send(cx, how)?;
        Ok(())
    }
}

impl Handler<Ping> for Supervisor {
    async fn handle(&mut self, cx: &Context<Self>, Ping(reply): Ping) -> Result<(), BoxError> {
        reply.send(cx, ())?;
        Ok(())
    }
}

#[tokio::test]
async fn an_owner_that_handles_a_failure_carries_on() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (report, mut seen) = client.open_port::<SupervisionEvent>();
    let sup = client.spawn::<Supervisor>("sup", (true, report)).unwrap();
    sup.bind().send(&client, BreakChild(Fail::Panic)).unwrap();
    let event = timed(seen.recv()).await.unwrap();
    assert_eq!(event.actor_id.name(), "child");
    timed(client.call(&sup.bind().port::<Ping>(), Ping))
        .await
        .unwrap();
    assert!(!sup.status().is_terminal(), "{:?}", sup.status());
}

#[tokio::test]
async fn sup2_an_unhandled_failure_passes_up_with_its_cause() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let (report, mut seen) = client.open_port::<SupervisionEvent>();
    let sup = client.spawn::<Supervisor>("sup", (false, report)).unwrap();
    sup.bind().send(&client, BreakChild(Fail::Error)).unwrap();
    timed(seen.recv()).await.unwrap();
    let event = timed(client.next_supervision_event()).await.unwrap();
    assert_eq!(
        event.actor_id,
        *sup.actor_id(),
        "SUP-2: the owner fails in turn"
    );
    let cause = event
        .caused_by
        .as_deref()
        .expect("SUP-2: the child's event is the cause");
    assert_eq!(cause.actor_id.name(), "child");
    assert_eq!(event.root_cause().reason, cause.reason);
    assert!(event.to_string().contains("caused by"), "{event}");
    assert!(matches!(timed(sup.wait()).await, ActorStatus::Failed(_)));
}

#[tokio::test]
async fn a_root_actor_failure_reaches_the_proc() {
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let failer = proc.spawn::<Failer>("root", ()).unwrap();
    failer.bind().send(&client, Fail::Error).unwrap();
    let event = timed(proc.next_supervision_event()).await.unwrap();
    assert_eq!(event.actor_id, *failer.actor_id());
}

#[tokio::test]
async fn a_stuck_actor_is_aborted_when_it_does_not_stop_in_time() {
    #[derive(Debug)]
    struct Stuck;
    #[derive(Debug, Serialize, Deserialize)]
    struct Hang;
    impl Actor for Stuck {
        type Params = ();
        async fn new(_: ()) -> Result<Self, BoxError> {
            Ok(Stuck)
        }
        fn bind(binder: &mut Binder<Self>) {
            binder.handle::<Hang>();
        }
    }
    impl Handler<Hang> for Stuck {
        async fn handle(&mut self, _cx: &Context<Self>, _: Hang) -> Result<(), BoxError> {
            std::future::pending::<()>().await;
            Ok(())
        }
    }
    tokio::time::pause();
    let proc = local_proc().await;
    let client = proc.client("client").unwrap();
    let stuck = client.spawn::<Stuck>("stuck", ()).unwrap();
    stuck.bind().send(&client, Hang).unwrap();
    let status = timed(stuck.stop_and_wait(Duration::from_secs(10))).await;
    assert!(
        matches!(&status, ActorStatus::Failed(r) if r.contains("aborted")),
        "{status:?}"
    );
}
