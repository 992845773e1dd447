//! The state of a proc's OS process and the record of its exit: the values a host
//! publishes (HOST-2), below everything that watches a proc, whether a child process
//! ([`super::child`]) or an in-process proc ([`super::in_process`]).

use std::fmt;
use std::process::ExitStatus;

use hyperactor::ProcId;

/// The state of a proc's OS process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcStatus {
    /// The process runs (or is exiting but not yet reaped).
    Running,
    /// The process exited and was reaped; how it ended.
    Exited(ExitStatus),
    /// The host could not wait for the process; why.
    Lost {
        /// What went wrong, in words.
        reason: String,
    },
}

impl ProcStatus {
    /// True while the process runs.
    pub fn is_running(&self) -> bool {
        matches!(self, Self::Running)
    }

    /// The exit status, once the process exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        match self {
            Self::Exited(status) => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for ProcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Running => f.write_str("running"),
            Self::Exited(status) => write!(f, "exited with {status}"),
            Self::Lost { reason } => write!(f, "was lost: {reason}"),
        }
    }
}

/// The exit of a proc, as published on the host's event stream (HOST-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcExit {
    /// The proc name given to `spawn_procs`.
    pub name: String,
    /// The proc's rank.
    pub rank: usize,
    /// The proc.
    pub proc_id: ProcId,
    /// Its OS process id (no longer valid).
    pub pid: u32,
    /// How it ended (never [`ProcStatus::Running`]).
    pub status: ProcStatus,
}

impl fmt::Display for ProcExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "proc {} rank {} ({}, pid {}) {}",
            self.name, self.rank, self.proc_id, self.pid, self.status
        )
    }
}
