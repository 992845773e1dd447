//! Two procs in two OS processes: messages flow both ways, and a killed peer fails the
//! calls waiting on it instead of hanging them.
//!
//! The child process is this test binary itself, re-run with `--ignored --exact
//! child_proc_main`: that ignored test is the child's entry point.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;

use hyperactor::actor::{Actor, Binder, Context, Handler};
use hyperactor::error::CallError;
use hyperactor::testing::{timed, EchoMsg};
use hyperactor::{
    ActorRef, BoxError, ChannelTransport, OncePortRef, PortId, PortRef, Proc, SendContext,
};
use serde::{Deserialize, Serialize};

/// Echoes, or never answers.
#[derive(Debug)]
struct Peer;

#[derive(Debug, Serialize, Deserialize)]
struct NeverAnswer(OncePortRef<()>);

impl Actor for Peer {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Peer)
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<EchoMsg>().handle::<NeverAnswer>();
    }
}

impl Handler<EchoMsg> for Peer {
    async fn handle(&mut self, cx: &Context<Self>, msg: EchoMsg) -> Result<(), BoxError> {
        msg.answer(cx)
    }
}

impl Handler<NeverAnswer> for Peer {
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        NeverAnswer(reply): NeverAnswer,
    ) -> Result<(), BoxError> {
        std::mem::forget(reply);
        Ok(())
    }
}

const REPORT_ENV: &str = "HYPERACTOR_TEST_REPORT_PORT";
const TRANSPORT_ENV: &str = "HYPERACTOR_TEST_TRANSPORT";

#[test]
#[ignore = "entry point of the child process started by the other tests"]
fn child_proc_main() {
    let (Ok(report), Ok(transport)) = (std::env::var(REPORT_ENV), std::env::var(TRANSPORT_ENV))
    else {
        panic!("child_proc_main is started by the other tests of this file");
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let transport: ChannelTransport = transport.parse().unwrap();
        let proc = Proc::serve(transport, "child").await.unwrap();
        let peer = proc.spawn::<Peer>("peer", ()).unwrap();
        let client = proc.client("boot").unwrap();
        let report = PortRef::<ActorRef<Peer>>::attest(report.parse::<PortId>().unwrap());
        report.send(&client, peer.bind()).unwrap();
        // Serve until the parent kills this process.
        std::future::pending::<()>().await;
    });
}

/// Starts the child process and returns it with a reference to its `Peer`.
async fn start_child(
    client: &hyperactor::Client,
    transport: ChannelTransport,
) -> (tokio::process::Child, ActorRef<Peer>) {
    let (report, mut rx) = client.open_port::<ActorRef<Peer>>();
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .envs(hyperactor::channel::auth::child_env())
        .args(["--ignored", "--exact", "child_proc_main", "--nocapture"])
        .env(REPORT_ENV, report.port_id().to_string())
        .env(TRANSPORT_ENV, transport.to_string())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let peer = timed(rx.recv()).await.unwrap();
    (child, peer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_os_processes_exchange_messages() {
    for transport in [ChannelTransport::Unix, ChannelTransport::Tcp] {
        let proc = Proc::serve(transport, "parent").await.unwrap();
        let client = proc.client("client").unwrap();
        let (mut child, peer) = start_child(&client, transport).await;
        assert_ne!(peer.actor_id().proc_id(), proc.proc_id());
        for i in 0..100u8 {
            let reply =
                timed(client.call(&peer.port::<EchoMsg>(), |r| EchoMsg(vec![i; 3], r))).await;
            assert_eq!(reply.unwrap(), vec![i; 3], "{transport:?}");
        }
        child.kill().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_peer_fails_the_calls_waiting_on_it() {
    for transport in [ChannelTransport::Unix, ChannelTransport::Tcp] {
        let proc = Proc::serve(transport, "parent").await.unwrap();
        let client = proc.client("client").unwrap();
        let (mut child, peer) = start_child(&client, transport).await;
        // Make sure the link is up and the request delivered before the kill.
        timed(client.call(&peer.port::<EchoMsg>(), |r| EchoMsg(vec![], r)))
            .await
            .unwrap();
        let pending = client.call(&peer.port::<NeverAnswer>(), NeverAnswer);
        child.start_kill().unwrap();
        let err = timed(pending).await.unwrap_err();
        assert!(
            matches!(
                err,
                CallError::LinkFailed { .. } | CallError::Undeliverable { .. }
            ),
            "{transport:?}: {err}"
        );
        child.wait().await.unwrap();
        // Later calls fail at once too.
        let err = timed(client.call(&peer.port::<EchoMsg>(), |r| EchoMsg(vec![], r)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Undeliverable { .. } | CallError::LinkFailed { .. }
            ),
            "{err}"
        );
    }
}
