//! The actor every proc of the bench runs (`Bench`, answering `Ping`), and what every
//! module of the harness shares: its result type and how long a stopped proc's actors
//! get.

use std::time::Duration;

use hyperactor::{Actor, BoxError, Context, Handler};
use hyperactor_mesh::{reply, Request};
use serde::{Deserialize, Serialize};

/// The result of the harness's fallible steps.
pub(crate) type Res<T> = Result<T, BoxError>;

/// How long a stopped proc's actors get (as `serve_until_stopped` gives them).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// One actor per proc: answers a `Ping` with its number.
#[derive(Debug)]
pub(crate) struct Bench;

/// A call: every actor replies with the number.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Ping(pub(crate) u64);

impl Request for Ping {
    type Reply = u64;
}

impl Actor for Bench {
    type Params = ();
    async fn new((): ()) -> Result<Self, BoxError> {
        Ok(Bench)
    }
    fn bind(binder: &mut hyperactor::Binder<Self>) {
        binder.handle::<Ping>();
    }
}

impl Handler<Ping> for Bench {
    async fn handle(&mut self, cx: &Context<Self>, Ping(value): Ping) -> Result<(), BoxError> {
        reply(cx, &value)?;
        Ok(())
    }
}
