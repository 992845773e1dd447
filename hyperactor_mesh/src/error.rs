//! The errors of the hyperactor_mesh crate.
//!
//! Two enums, one per side of a bootstrap:
//!
//! - [`BootstrapError`]: a child process could not start its proc or report in
//!   ([`crate::bootstrap::bootstrap_proc`]);
//! - [`HostError`]: the host agent could not start, watch or stop its procs
//!   ([`crate::host::Host`]).
//!
//! Then the errors of mesh operations ([`MeshError`], [`CodecError`]), of the requests
//! one agent makes of another ([`ProbeError`], [`EndHostError`]), and [`RemoteError`],
//! the error an agent sends back in its answer to a control request.
//!
//! Display strings are lowercase, have no trailing period, and name the host and the
//! proc (name and rank) involved, so that a message read in a log is enough to find the
//! process at fault. Both enums are `#[non_exhaustive]`.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use hyperactor::channel::ChannelError;
use hyperactor::error::{IdError, ProcError, RecvError, SpawnError};
use hyperactor::ProcId;
use serde::{Deserialize, Serialize};

/// A child process could not start its proc or report to its host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A variable the host sets is missing: the process was not started by a host.
    #[error(
        "environment variable {var} is not set: this process must be started by a \
         hyperactor_mesh host (Host::spawn_procs), which sets it"
    )]
    MissingEnv {
        /// The missing variable.
        var: &'static str,
    },
    /// A variable the host sets does not parse.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What was expected, in words.
        reason: String,
    },
    /// The child's proc could not be served.
    #[error("cannot serve proc {name} rank {rank}: {source}")]
    Serve {
        /// The proc name given by the host.
        name: String,
        /// The proc's rank.
        rank: usize,
        /// The proc error.
        #[source]
        source: ProcError,
    },
    /// The ready report could not be sent to the host.
    #[error("proc {proc_id} (rank {rank}) cannot report ready to its host: {reason}")]
    Report {
        /// The child's proc.
        proc_id: ProcId,
        /// The proc's rank.
        rank: usize,
        /// Why, in words.
        reason: String,
    },
}

/// The host agent could not start, watch or stop its procs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The host's own proc could not be served.
    #[error("cannot serve the host proc: {0}")]
    Serve(#[from] ProcError),
    /// The host's client could not be created on its proc.
    #[error("cannot create the client of host {host}: {source}")]
    Client {
        /// The host's proc.
        host: ProcId,
        /// The spawn error.
        #[source]
        source: SpawnError,
    },
    /// The host's proc uses the in-process transport, which children cannot reach.
    #[error(
        "host proc {host} listens on the local (in-process) transport, which child \
         processes cannot reach: serve it with ChannelTransport::Unix or Tcp"
    )]
    LocalTransport {
        /// The host's proc.
        host: ProcId,
    },
    /// The proc name is not a valid id name.
    #[error("host {host} cannot spawn procs named {name:?}: {source}")]
    InvalidName {
        /// The host's proc.
        host: ProcId,
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        #[source]
        source: IdError,
    },
    /// The host was shut down.
    #[error("host {host} is shut down and cannot spawn procs {name}")]
    ShutDown {
        /// The host's proc.
        host: ProcId,
        /// The procs that were to be spawned.
        name: String,
    },
    /// A per-rank list of commands does not have one command per proc.
    #[error(
        "host {host} cannot spawn {count} procs {name}: it was given {commands} per-rank \
         commands; give one per proc"
    )]
    CommandCount {
        /// The host's proc.
        host: ProcId,
        /// The procs that were to be spawned.
        name: String,
        /// How many procs.
        count: usize,
        /// How many commands.
        commands: usize,
    },
    /// The OS process could not be started.
    #[error("host {host} cannot start proc {name} rank {rank} ({program}): {source}")]
    Spawn {
        /// The host's proc.
        host: ProcId,
        /// The proc name.
        name: String,
        /// The proc's rank.
        rank: usize,
        /// The program that was to be run.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A child exited (or was lost) before it reported ready.
    #[error(
        "proc {name} rank {rank} (pid {pid}) {status} before reporting ready to host \
         {host}{}",
        stderr_section(stderr_tail)
    )]
    ExitedBeforeReady {
        /// The host's proc.
        host: ProcId,
        /// The proc name.
        name: String,
        /// The proc's rank.
        rank: usize,
        /// The child's pid.
        pid: u32,
        /// How it ended, in words (for example `exited with exit status: 3`).
        status: String,
        /// The exit status, when the host reaped the child.
        exit_status: Option<ExitStatus>,
        /// The last lines the child wrote to its standard error.
        stderr_tail: String,
    },
    /// Some children did not report ready in time.
    #[error(
        "procs {name} ranks {ranks:?} did not report ready to host {host} within \
         {timeout:?}: check that the bootstrap command calls bootstrap_proc, or raise the \
         limit with Host::with_ready_timeout"
    )]
    ReadyTimeout {
        /// The host's proc.
        host: ProcId,
        /// The proc name.
        name: String,
        /// The ranks that did not report.
        ranks: Vec<usize>,
        /// The limit that expired.
        timeout: Duration,
    },
    /// The host's report port closed while waiting (its client stopped).
    #[error("host {host} stopped receiving ready reports while spawning procs {name}")]
    ReportPortClosed {
        /// The host's proc.
        host: ProcId,
        /// The proc name.
        name: String,
    },
}

fn stderr_section(tail: &str) -> String {
    if tail.trim().is_empty() {
        "; it wrote nothing to stderr".to_string()
    } else {
        format!("; last lines of its stderr:\n{tail}")
    }
}

/// Bytes that do not decode as the mesh layer's wire formats (see [`crate::cast`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A value could not be encoded.
    #[error("cannot encode a mesh message: {0}")]
    Encode(String),
    /// A cast header does not decode.
    #[error("malformed cast header: {0}")]
    Header(String),
    /// A route does not decode.
    #[error("malformed cast route: {0}")]
    Route(String),
    /// A reply message does not decode.
    #[error("malformed reply message: {0}")]
    Reply(String),
    /// A control message does not decode.
    #[error("malformed control message: {0}")]
    Control(String),
}

/// A mesh operation failed: spawning procs or actors, casting, calling, stopping.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeshError {
    /// This process has no agent, or the agent of this proc is gone.
    #[error("no mesh agent serves proc {proc}: create one with ProcAgent::new (or serve) first")]
    NoAgent {
        /// The proc.
        proc: hyperactor::ProcId,
    },
    /// A proc already has an agent.
    #[error("proc {proc} already has a mesh agent; there is one per proc")]
    AgentExists {
        /// The proc.
        proc: hyperactor::ProcId,
    },
    /// The agent's mailbox could not be created.
    #[error("cannot create the mesh agent of proc {proc}: {source}")]
    Agent {
        /// The proc.
        proc: hyperactor::ProcId,
        /// Why.
        #[source]
        source: SpawnError,
    },
    /// A message is larger than the largest message a channel carries.
    #[error(
        "a message of {bytes} bytes to actor mesh '{mesh}' is over the largest message \
         size, {max} bytes: send less per message, or raise HYPERACTOR_CODEC_MAX_FRAME_LENGTH \
         (the codec_max_frame_length config key) in every process"
    )]
    TooLarge {
        /// The mesh's name.
        mesh: String,
        /// The message's payload size.
        bytes: u64,
        /// The largest payload a message may have ([`crate::cast::max_message_len`]).
        max: u64,
    },
    /// A value could not be serialized or deserialized.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A message could not be encoded.
    #[error(transparent)]
    Message(#[from] hyperactor::error::MessageError),
    /// Procs could not be spawned.
    #[error("cannot spawn procs {name:?}: {reason}")]
    SpawnProcs {
        /// The proc mesh's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A mesh name is invalid.
    #[error("invalid mesh name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What was expected.
        reason: String,
    },
    /// A worker or transport address is invalid.
    #[error("invalid address {input:?}: {reason}")]
    InvalidAddress {
        /// The address given.
        input: String,
        /// What is wrong, and what is expected.
        reason: String,
    },
    /// Only the owner of a mesh (the actor that spawned it) can do this.
    #[error(
        "{what} is a reference (received, or a view of another process's mesh); only its \
         owner, the actor that spawned it, can {action} it"
    )]
    NotOwner {
        /// The mesh, in words.
        what: String,
        /// What was attempted.
        action: &'static str,
    },
    /// The mesh was stopped.
    #[error("{what} was stopped ({reason}); create a new one")]
    Stopped {
        /// The mesh, in words.
        what: String,
        /// Why it was stopped.
        reason: String,
    },
    /// Some ranks of a call did not answer with a value.
    #[error("{what}: rank {rank} {}: {reason}", if *failed { "cannot answer" } else { "raised an error" })]
    Call {
        /// The mesh and the call, in words.
        what: String,
        /// The first rank at fault (index in the view).
        rank: u32,
        /// True if the rank cannot answer (its actor failed or stopped, its proc is
        /// gone); false if its handler returned an error.
        failed: bool,
        /// The reason, or the error's text.
        reason: String,
    },
    /// A reply could not be decoded as the expected type.
    #[error("{what}: the reply of rank {rank} does not decode: {reason}")]
    BadReply {
        /// The mesh and the call, in words.
        what: String,
        /// The rank.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// The host could not be reached or refused the request.
    #[error("host {host}: {reason}")]
    Host {
        /// The host's proc.
        host: hyperactor::ProcId,
        /// Why.
        reason: String,
    },
    /// The agent of `host` answered a request with an error.
    #[error("host {host}: {error}")]
    Remote {
        /// The proc whose agent answered.
        host: hyperactor::ProcId,
        /// Its answer.
        #[source]
        error: RemoteError,
    },
    /// The wait ended before the answer came.
    #[error("{what}: no answer within {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        timeout: std::time::Duration,
    },
}

/// What an agent failed to do for another, in the answer to a control request
/// ([`RemoteError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RemoteErrorKind {
    /// A host agent could not spawn the procs asked for
    /// ([`crate::agent::Control::SpawnProcs`]); the message is the [`HostError`].
    SpawnProcs,
    /// An agent could not make the singleton asked for
    /// ([`crate::agent::Control::Singleton`]); the message is the [`MeshError`].
    Singleton,
    /// A host agent refused to end ([`crate::agent::Control::EndHost`]): it is not a
    /// worker (it runs inside its client's process).
    NotAWorker,
}

/// The error an agent sends back in its answer to a control request: what failed and
/// the error's text as the answering agent wrote it (the error itself stays in that
/// process). Its `Display` is that text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct RemoteError {
    /// What failed.
    pub kind: RemoteErrorKind,
    /// The error, as the answering agent displayed it.
    pub message: String,
}

impl RemoteError {
    /// The answer for `error`, a failure of `kind`.
    pub fn new(kind: RemoteErrorKind, error: impl std::fmt::Display) -> Self {
        Self {
            kind,
            message: error.to_string(),
        }
    }
}

/// A heartbeat sent to the agent of `proc` got no answer
/// ([`crate::agent::ProcAgent::probe`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The port waiting for the answer closed (this process's client stopped).
    #[error("{source}")]
    NoReply {
        /// The proc probed.
        proc: ProcId,
        /// Why the port closed.
        source: RecvError,
    },
    /// The link to the proc failed: refused, authentication failed, ...
    #[error("{source}")]
    Unreachable {
        /// The proc probed.
        proc: ProcId,
        /// The link's error.
        source: ChannelError,
    },
    /// No answer came in time.
    #[error("no answer within {timeout:?}")]
    Timeout {
        /// The proc probed.
        proc: ProcId,
        /// The limit.
        timeout: std::time::Duration,
    },
}

/// A worker host did not confirm that it ends ([`crate::agent::ProcAgent::end_host`]).
/// The texts do not repeat the host; callers prefix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndHostError {
    /// The host was found lost before the request: it was not asked.
    #[error("it was lost already ({reason})")]
    AlreadyLost {
        /// The host's proc.
        host: ProcId,
        /// Why it was found lost.
        reason: String,
    },
    /// The port waiting for the answer closed (this process's client stopped).
    #[error("{source}")]
    NoReply {
        /// The host's proc.
        host: ProcId,
        /// Why the port closed.
        source: RecvError,
    },
    /// The host refused: it is not a worker ([`RemoteErrorKind::NotAWorker`]).
    #[error("{source}")]
    Refused {
        /// The host's proc.
        host: ProcId,
        /// Its answer.
        source: RemoteError,
    },
    /// The link to the host failed.
    #[error("it cannot be reached: {source}")]
    Unreachable {
        /// The host's proc.
        host: ProcId,
        /// The link's error.
        source: ChannelError,
    },
    /// The host was found lost (it stopped answering heartbeats) while it ended.
    #[error("it was lost ({reason})")]
    Lost {
        /// The host's proc.
        host: ProcId,
        /// Why it was found lost.
        reason: String,
    },
    /// No answer came in time.
    #[error("no answer within {timeout:?}")]
    Timeout {
        /// The host's proc.
        host: ProcId,
        /// The limit (the request's timeout plus a little slack).
        timeout: std::time::Duration,
    },
}
