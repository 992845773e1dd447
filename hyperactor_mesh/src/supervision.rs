//! Mesh supervision: what failed, in mesh terms, and how failures reach owners.
//!
//! Every actor mesh has an owner: the actor that spawned it (a Rust actor, a Python
//! actor, or a client such as a script's main thread). The agent of each proc is the
//! runtime-level owner of the actors it spawned there; when one fails it turns the
//! runtime's [`SupervisionEvent`] into a [`MeshFailure`] — which mesh, which rank, which
//! process, and the true cause — and sends it to the mesh's owner, attached to a
//! supervision event ([`MeshFailure::to_event`]). A proc that dies is reported by the
//! host agent that reaped it to the agents that watch it (the owners of meshes on it
//! among them), which report one failure per rank of each mesh they own there.
//!
//! At the owner the event is handled like any child failure: a Rust owner's
//! `handle_supervision_event` (or a Python owner's `__supervise__`) may handle it;
//! unhandled, the owner fails in turn, with the event as its cause, and its own owner
//! hears of it, hop by hop up the tree (SUP-2). [`MeshFailure::from_event`] reads the
//! failure back; `caused_by` chains keep every level.
//!
//! Invariants:
//!
//! - MSUP-1 (one report per failed rank): an owner receives one failure per failed rank
//!   of a mesh it owns, from the agent that saw the failure.
//! - MSUP-2 (true cause): the cause names what really happened: the error that escaped
//!   the actor, the proc's exit status or signal, or why it was lost.
//! - MSUP-3 (a stop asked for is no failure): a proc that gets a spawn while it stops
//!   refuses it and tells the agent of the mesh owner's process
//!   ([`crate::agent::Control::SpawnRefused`]), which reports the refusal as a failure
//!   only if that process stopped neither the proc, nor the mesh, nor the proc's host.
//!   The refused actor counts as stopped.
//!
//! ```
//! use hyperactor_mesh::cast::codec::MeshInfo;
//! use hyperactor_mesh::supervision::{FailureCause, MeshFailure};
//!
//! let proc = "p-1@unix:/tmp/p.sock".parse().unwrap();
//! let failure = MeshFailure {
//!     mesh: MeshInfo { id: 1, name: "trainers".into(), class: "Trainer".into() },
//!     rank: 3,
//!     actor_id: None,
//!     proc_id: proc,
//!     pid: Some(4242),
//!     cause: FailureCause::ProcExited { code: 3 },
//!     caused_by: None,
//!     path: None,
//! };
//! assert_eq!(
//!     failure.to_string(),
//!     "actor mesh 'trainers' (Trainer) rank 3 on proc p-1@unix:/tmp/p.sock (pid 4242) \
//!      failed: its process died (exited with status 3)"
//! );
//! let event = failure.to_event();
//! assert_eq!(MeshFailure::from_event(&event), Some(failure.clone()));
//!
//! // The report: the headline, then which actor failed and what kind of failure it
//! // was (by its path, once the owner named it), then the cause.
//! assert_eq!(
//!     failure.attribution(),
//!     "The actor trainers[3] failed. This occurred because its process failed \
//!      (process failure: Exited(code=3))."
//! );
//! let failure = MeshFailure {
//!     path: Some("<root>.<m.Trainer trainers{'gpus': 3/4}>".into()),
//!     ..failure
//! };
//! assert_eq!(
//!     failure.report().lines().nth(1),
//!     Some(
//!         "    The actor <root>.<m.Trainer trainers{'gpus': 3/4}> failed. This occurred \
//!          because its process failed (process failure: Exited(code=3))."
//!     )
//! );
//! ```

use std::fmt;

use bytes::Bytes;
use hyperactor::{ActorId, ProcId, SupervisionEvent};
use serde::{Deserialize, Serialize};

use crate::cast::codec::MeshInfo;

/// What really happened to a failed rank (MSUP-2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FailureCause {
    /// The actor failed: an error escaped it (in its constructor, a handler that does not
    /// return errors to callers, or a hook), or it was killed.
    Actor {
        /// What escaped, with its traceback when there is one.
        reason: String,
    },
    /// The actor failed because it did not handle the failure of a mesh it owns (the
    /// failure is its `caused_by`).
    Unhandled {
        /// In words.
        reason: String,
    },
    /// The actor could not be created on its proc.
    SpawnFailed {
        /// Why.
        reason: String,
    },
    /// The actor's process exited by itself.
    ProcExited {
        /// The exit status.
        code: i32,
    },
    /// The actor's process was killed by a signal.
    ProcSignaled {
        /// The signal number.
        signal: i32,
    },
    /// The actor's process was lost: unreachable, or its host could not watch it.
    ProcLost {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Actor { reason } | Self::Unhandled { reason } => f.write_str(reason),
            Self::SpawnFailed { reason } => write!(f, "it could not be spawned: {reason}"),
            Self::ProcExited { code } => write!(f, "its process died (exited with status {code})"),
            Self::ProcSignaled { signal } => {
                write!(f, "its process died (killed by signal {signal}")?;
                if let Some(name) = signal_name(*signal) {
                    write!(f, ", {name}")?;
                }
                f.write_str(")")
            }
            Self::ProcLost { reason } => write!(f, "its process was lost: {reason}"),
        }
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// A failure of one rank of an actor mesh, for its owner: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshFailure {
    /// The mesh.
    pub mesh: MeshInfo,
    /// The failed rank: the actor's position in the proc mesh it was spawned on.
    pub rank: usize,
    /// The failed actor, when it was created.
    pub actor_id: Option<ActorId>,
    /// The proc the actor lived on.
    pub proc_id: ProcId,
    /// That proc's OS process id, when known.
    pub pid: Option<u32>,
    /// What happened.
    pub cause: FailureCause,
    /// The failure that caused this one (an owned mesh's failure that the actor did not
    /// handle).
    pub caused_by: Option<Box<MeshFailure>>,
    /// The failed actor's path in the actor tree, from the root through its creators
    /// (`<root>.<mod.Outer outer>.<mod.Inner inner{'gpus': 0/2}>`), when the owner that
    /// received the failure named it; the report falls back to `name[rank]`.
    #[serde(default)]
    pub path: Option<String>,
}

impl MeshFailure {
    /// The first line of the report: which mesh, rank and process.
    pub fn headline(&self) -> String {
        let pid = self.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        format!(
            "actor mesh '{}' ({}) rank {} on proc {}{pid} failed",
            self.mesh.name, self.mesh.class, self.rank, self.proc_id
        )
    }

    /// Which actor failed and what kind of failure it was, in one sentence: `The actor
    /// <path> failed. This occurred because the actor itself failed.` (or its process
    /// failed, or it did not handle a failure of a mesh it owns).
    pub fn attribution(&self) -> String {
        let who = match &self.path {
            Some(path) => path.clone(),
            None => format!("{}[{}]", self.mesh.name, self.rank),
        };
        let because = match &self.cause {
            FailureCause::Actor { .. } => "the actor itself failed".to_string(),
            FailureCause::Unhandled { .. } => {
                "it did not handle the failure of an actor mesh it owns (below)".to_string()
            }
            FailureCause::SpawnFailed { .. } => "it could not be spawned".to_string(),
            FailureCause::ProcExited { code } => {
                format!("its process failed (process failure: Exited(code={code}))")
            }
            FailureCause::ProcSignaled { signal } => {
                format!("its process failed (process failure: Killed(sig={signal}))")
            }
            FailureCause::ProcLost { .. } => "its process was lost".to_string(),
        };
        format!("The actor {who} failed. This occurred because {because}.")
    }

    /// The failure and its causes, for people: one paragraph per level, each the
    /// headline, then the [attribution](Self::attribution) and the cause, indented.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let mut level = Some(self);
        while let Some(failure) = level {
            if !out.is_empty() {
                out.push_str("\ncaused by: ");
            }
            out.push_str(&format!(
                "{}:\n{}\n{}",
                failure.headline(),
                indent(&failure.attribution()),
                indent(&failure.cause.to_string())
            ));
            level = failure.caused_by.as_deref();
        }
        out
    }

    /// The runtime event carrying this failure (for the owner's supervision port).
    pub fn to_event(&self) -> SupervisionEvent {
        let actor_id = self.actor_id.clone().unwrap_or_else(|| {
            // No actor was created (its proc failed first): name the agent of its proc.
            crate::agent::address::agent_id(&self.proc_id)
        });
        SupervisionEvent {
            actor_id,
            reason: self.to_string(),
            caused_by: self.caused_by.as_ref().map(|c| Box::new(c.to_event())),
            detail: bincode::serialize(self).ok().map(Bytes::from),
        }
    }

    /// The failure attached to `event`, if it carries one.
    pub fn from_event(event: &SupervisionEvent) -> Option<MeshFailure> {
        bincode::deserialize(event.detail.as_deref()?).ok()
    }
}

fn indent(text: &str) -> String {
    text.trim_end()
        .lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl fmt::Display for MeshFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = self.cause.to_string();
        // The last line of a multi-line cause (a traceback ends with the error itself).
        let line = cause.trim_end().lines().last().unwrap_or_default();
        write!(f, "{}: {line}", self.headline())
    }
}

impl std::error::Error for MeshFailure {}

/// How a proc ended, as its host saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProcEnd {
    /// It exited by itself with this status.
    Exited {
        /// The exit status.
        code: i32,
    },
    /// It was killed by this signal.
    Signaled {
        /// The signal.
        signal: i32,
    },
    /// It was lost (unreachable, or its host cannot watch it).
    Lost {
        /// Why.
        reason: String,
    },
}

impl ProcEnd {
    /// The end of a process that finished with `status`.
    pub fn from_status(status: &crate::host::ProcStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match status {
            crate::host::ProcStatus::Exited(status) => match (status.code(), status.signal()) {
                (Some(code), _) => Self::Exited { code },
                (None, Some(signal)) => Self::Signaled { signal },
                (None, None) => Self::Lost {
                    reason: format!("it ended with {status}"),
                },
            },
            crate::host::ProcStatus::Lost { reason } => Self::Lost {
                reason: reason.clone(),
            },
            crate::host::ProcStatus::Running => Self::Lost {
                reason: "its host reported it ended while running".into(),
            },
            // ProcStatus is non-exhaustive: a future kind of end reads as lost.
            #[allow(unreachable_patterns)]
            other => Self::Lost {
                reason: other.to_string(),
            },
        }
    }

    /// The failure cause of the actors on such a proc.
    pub fn cause(&self) -> FailureCause {
        match self {
            Self::Exited { code } => FailureCause::ProcExited { code: *code },
            Self::Signaled { signal } => FailureCause::ProcSignaled { signal: *signal },
            Self::Lost { reason } => FailureCause::ProcLost {
                reason: reason.clone(),
            },
        }
    }
}

impl fmt::Display for ProcEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exited { code } => write!(f, "exited with status {code}"),
            Self::Signaled { signal } => {
                write!(f, "killed by signal {signal}")?;
                if let Some(name) = signal_name(*signal) {
                    write!(f, ", {name}")?;
                }
                Ok(())
            }
            Self::Lost { reason } => write!(f, "lost: {reason}"),
        }
    }
}

/// A proc's death, as its host reports it to the agents that watch it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcDeath {
    /// The proc.
    pub proc_id: ProcId,
    /// Its OS process id (0 when not known).
    pub pid: u32,
    /// How it ended.
    pub end: ProcEnd,
    /// True when it was asked to stop (a stopped proc mesh): not a failure.
    pub expected: bool,
}

impl ProcDeath {
    /// Why calls to actors on the dead proc cannot be answered, as their callers read
    /// it: a stopped proc mesh says so, a death names itself a process failure.
    pub fn unanswered_reason(&self) -> String {
        if self.expected {
            format!("{self}: the actor mesh is stopped due to proc mesh shutdown")
        } else {
            format!("process failure: {self}")
        }
    }
}

impl fmt::Display for ProcDeath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "proc {}", self.proc_id)?;
        if self.pid != 0 {
            write!(f, " (pid {})", self.pid)?;
        }
        match (&self.end, self.expected) {
            (ProcEnd::Lost { reason }, false) => write!(f, " was lost: {reason}"),
            (end, false) => write!(f, " died ({end})"),
            (end, true) => write!(f, " was stopped ({end})"),
        }
    }
}
