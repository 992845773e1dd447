//! Why a monitoring request failed: [`MonitorError`], and [`StackError`] for stack dumps.
//! Both travel between agents (a host's answer to a snapshot or a stack request), so
//! they serialize; their `Display` is the message a user reads.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a monitoring request (a snapshot's host report, a stack dump, a kill) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MonitorError {
    /// A host report was asked of an agent that spawns no procs.
    #[error(
        "{agent} is not a host agent: only the agent of a host (the process that spawns \
         procs) reports on a host"
    )]
    NotAHost {
        /// The agent asked.
        agent: String,
    },
    /// The agent asked did not answer in time.
    #[error("no answer from {target} within {timeout:?}")]
    NoAnswer {
        /// The proc whose agent was asked.
        target: String,
        /// How long the request waited.
        timeout: Duration,
    },
    /// The reply port closed before an answer came.
    #[error("the request to {target} got no answer: {reason}")]
    NoReply {
        /// The proc whose agent was asked.
        target: String,
        /// What closed the port.
        reason: String,
    },
    /// The host was already judged lost.
    #[error("lost: {reason}")]
    HostLost {
        /// Why it was judged lost.
        reason: String,
    },
    /// A kill named a proc whose host this process does not know.
    #[error(
        "no host of proc {proc} is known here: only procs of meshes this process spawned or \
         talks to can be killed"
    )]
    UnknownHost {
        /// The proc named.
        proc: String,
    },
    /// A stack dump failed.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// A record did not serialize to JSON.
    #[error("cannot write the record as JSON: {0}")]
    Json(String),
}

impl From<serde_json::Error> for MonitorError {
    fn from(error: serde_json::Error) -> Self {
        Self::Json(error.to_string())
    }
}

/// Why a proc could not dump the stacks of its threads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum StackError {
    /// The pipe `faulthandler` writes to could not be made.
    #[error("cannot create the stack dump pipe: {0}")]
    Pipe(String),
    /// The process never registered Python's `faulthandler` (it is not a Python proc,
    /// or its bootstrap did not run), and `py-spy` is not on `PATH`.
    #[error(
        "this process has no Python stack handler (faulthandler was not registered); \
         install py-spy on the host to dump native processes"
    )]
    NoHandler,
    /// The signal that asks `faulthandler` for a dump could not be raised.
    #[error("cannot raise signal {signal}: {reason}")]
    Signal {
        /// The signal number.
        signal: i32,
        /// The OS error.
        reason: String,
    },
    /// Nothing came through the pipe in time.
    #[error("no stack dump came within {timeout:?}")]
    NoDump {
        /// How long it waited.
        timeout: Duration,
    },
    /// The blocking task that dumps the stacks panicked or was cancelled.
    #[error("the stack dump task failed: {0}")]
    Task(String),
}
