//! Helpers for tests of this crate and of crates built on it.
//!
//! Compiled only for this crate's tests or with the `testing` feature. It holds a
//! timeout wrapper (every async test waits with a bound) and a few small actors that
//! tests use to observe the runtime: [`Echo`], [`Recorder`] and [`Failer`].

#![allow(clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::{Actor, Binder, Context, Handler};
use crate::channel::ChannelTransport;
use crate::error::BoxError;
use crate::port::OncePortRef;

/// The transports every routing test runs over.
pub const TRANSPORTS: [ChannelTransport; 3] = [
    ChannelTransport::Local,
    ChannelTransport::Unix,
    ChannelTransport::Tcp,
];

/// The bound on any single wait in a test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Awaits `future`, panicking (failing the test) if it takes longer than
/// [`TEST_TIMEOUT`].
///
/// # Panics
///
/// When the timeout expires.
#[track_caller]
pub fn timed<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(TEST_TIMEOUT, future).await {
            Ok(value) => value,
            Err(_) => panic!("test wait at {caller} timed out after {TEST_TIMEOUT:?}"),
        }
    }
}

/// An actor that answers each [`EchoMsg`] with its bytes.
#[derive(Debug)]
pub struct Echo;

/// A request to [`Echo`]: the bytes and where to send them back.
#[derive(Debug, Serialize, Deserialize)]
pub struct EchoMsg(
    #[serde(with = "serde_bytes")] pub Vec<u8>,
    pub OncePortRef<EchoReply>,
);

impl EchoMsg {
    /// Answers the request with its own bytes, from `cx`.
    ///
    /// # Errors
    ///
    /// If the reply cannot be serialized.
    pub fn answer(self, cx: &impl crate::context::SendContext) -> Result<(), BoxError> {
        let EchoMsg(bytes, reply) = self;
        reply.send(cx, serde_bytes::ByteBuf::from(bytes))?;
        Ok(())
    }
}

/// The bytes an [`Echo`] sends back (`serde_bytes`, so large payloads are copied in
/// one piece rather than decoded byte by byte).
pub type EchoReply = serde_bytes::ByteBuf;

impl Actor for Echo {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Echo)
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<EchoMsg>();
    }
}

impl Handler<EchoMsg> for Echo {
    async fn handle(&mut self, cx: &Context<Self>, msg: EchoMsg) -> Result<(), BoxError> {
        msg.answer(cx)
    }
}

/// An actor that records `(sender, sequence)` pairs in arrival order.
#[derive(Debug, Default)]
pub struct Recorder {
    records: Vec<(u64, u64)>,
}

/// Record one `(sender, sequence)` pair.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record(pub u64, pub u64);

/// Ask a [`Recorder`] for everything recorded so far.
#[derive(Debug, Serialize, Deserialize)]
pub struct GetRecords(pub OncePortRef<Vec<(u64, u64)>>);

impl Actor for Recorder {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Recorder::default())
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Record>().handle::<GetRecords>();
    }
}

impl Handler<Record> for Recorder {
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        Record(sender, seq): Record,
    ) -> Result<(), BoxError> {
        self.records.push((sender, seq));
        Ok(())
    }
}

impl Handler<GetRecords> for Recorder {
    async fn handle(
        &mut self,
        cx: &Context<Self>,
        GetRecords(reply): GetRecords,
    ) -> Result<(), BoxError> {
        reply.send(cx, self.records.clone())?;
        Ok(())
    }
}

/// An actor that fails on request, in the way asked.
#[derive(Debug)]
pub struct Failer;

/// How a [`Failer`] should fail.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum Fail {
    /// Return an error from the handler.
    Error,
    /// Panic in the handler.
    Panic,
}

impl Actor for Failer {
    type Params = ();
    async fn new(_: ()) -> Result<Self, BoxError> {
        Ok(Failer)
    }
    fn bind(binder: &mut Binder<Self>) {
        binder.handle::<Fail>().handle::<EchoMsg>();
    }
}

impl Handler<Fail> for Failer {
    async fn handle(&mut self, _cx: &Context<Self>, how: Fail) -> Result<(), BoxError> {
        match how {
            Fail::Error => Err("failing as asked".into()),
            Fail::Panic => panic!("panicking as asked"),
        }
    }
}

impl Handler<EchoMsg> for Failer {
    async fn handle(&mut self, cx: &Context<Self>, msg: EchoMsg) -> Result<(), BoxError> {
        msg.answer(cx)
    }
}
