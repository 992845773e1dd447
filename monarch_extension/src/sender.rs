//! Who sends: the root client of a process (a `Client`) or a Python actor (a
//! `DrivenActor`). Bindings that send on behalf of Python code take either.

use std::sync::Arc;

use hyperactor::actor::DrivenActor;
use hyperactor::mailbox::Mailbox;
use hyperactor::{ActorId, Proc, SendContext};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::actor::PyDrivenActor;
use crate::proc::PyClient;

/// A sender: see the [module docs](self).
#[derive(Debug, Clone)]
pub enum Sender {
    /// A client mailbox.
    Client(Arc<hyperactor::Client>),
    /// A driven (Python) actor.
    Actor(DrivenActor),
}

impl Sender {
    /// The sender given to a binding: a `Client` or a `DrivenActor`.
    ///
    /// # Errors
    ///
    /// `TypeError` for anything else.
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(client) = obj.cast::<PyClient>() {
            return Ok(Sender::Client(Arc::clone(&client.get().client)));
        }
        if let Ok(actor) = obj.cast::<PyDrivenActor>() {
            return Ok(Sender::Actor(actor.get().actor().clone()));
        }
        Err(PyTypeError::new_err(format!(
            "expected the sending Client or DrivenActor, got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string())
        )))
    }
}

impl SendContext for Sender {
    fn proc(&self) -> &Proc {
        match self {
            Sender::Client(c) => c.proc(),
            Sender::Actor(a) => a.proc(),
        }
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        match self {
            Sender::Client(c) => c.mailbox(),
            Sender::Actor(a) => a.mailbox(),
        }
    }

    fn actor_id(&self) -> &ActorId {
        self.mailbox().actor_id()
    }
}
