//! Where the agent of a proc is: its id and its ports, derived from the proc's id alone,
//! so any process can address the agent of any proc it knows.
//!
//! This module names nothing else of the crate: the layers that only need an agent's
//! address (a failure that names the agent of a proc, for one) take it from here
//! without depending on the agent.

use hyperactor::{ActorId, PortId, ProcId};

/// The name of every agent's mailbox (index 0).
pub const AGENT_NAME: &str = "mesh";

/// The port numbers of an agent's three ports (opened in this order).
pub(crate) const CAST_PORT: u64 = 1;
pub(crate) const CONTROL_PORT: u64 = 2;
pub(crate) const REPLY_PORT: u64 = 3;

/// The id of the agent of `proc`.
// invariant: AGENT_NAME is a valid actor name, so `actor_id` cannot fail.
#[allow(clippy::expect_used)]
pub fn agent_id(proc: &ProcId) -> ActorId {
    proc.actor_id(AGENT_NAME, 0)
        .expect("invariant: AGENT_NAME is a valid actor name")
}

/// The cast port of the agent of `proc`.
pub fn cast_port(proc: &ProcId) -> PortId {
    agent_id(proc).port_id(CAST_PORT)
}

/// The control port of the agent of `proc`.
pub fn control_port(proc: &ProcId) -> PortId {
    agent_id(proc).port_id(CONTROL_PORT)
}

/// The reply port of the agent of `proc`.
pub fn reply_port(proc: &ProcId) -> PortId {
    agent_id(proc).port_id(REPLY_PORT)
}
