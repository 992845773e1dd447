//! Bootstrap: how a child proc starts and reports to the host that spawned it.
//!
//! A host ([`crate::host::Host`]) starts each proc as an OS process running a
//! [`BootstrapCommand`]. It tells the child who it is through environment variables:
//!
//! | variable | value |
//! |---|---|
//! | [`BOOTSTRAP_ADDR_ENV`] | the [`PortId`] of the host's report port |
//! | [`PROC_NAME_ENV`] | the proc name shared by the procs of one spawn |
//! | [`PROC_RANK_ENV`] | this proc's rank, `0..count` |
//! | [`PROC_COUNT_ENV`] | how many procs the spawn started |
//!
//! The child calls [`bootstrap_proc`] (or the three steps it is made of:
//! [`BootInfo::from_env`], [`BootInfo::serve`], [`BootInfo::report_ready`]). It serves a
//! [`Proc`] and sends a [`ProcReady`] to the report port; the host's
//! [`crate::host::Host::spawn_procs`] returns once every rank has reported. Ids carry
//! their address, so the report port id is all the child needs to reach its host.
//!
//! Then the child serves until told to stop: [`serve_until_stopped`] waits for its
//! **standard input to close**. The host holds the write end of a pipe to each child's
//! stdin and closes it to ask for a graceful stop; the kernel closes it too when the
//! host process dies, however it dies, so a child never outlives its host by more than
//! its grace period. (On Linux the host also arranges for a parent-death `SIGKILL`, see
//! [`crate::host`].)
//!
//! Invariants:
//!
//! - BOOT-1 (report after setup): a child reports ready only after its proc serves, so
//!   the [`ProcId`] in the report can be sent to at once. A child that spawns actors
//!   between [`BootInfo::serve`] and [`BootInfo::report_ready`] makes them reachable
//!   as soon as the host sees it ready.
//! - BOOT-2 (stop on stdin close): [`serve_until_stopped`] returns when stdin reaches end
//!   of file or fails, which happens when the host stops the proc or dies.
//!
//! ```no_run
//! use hyperactor::ChannelTransport;
//! use hyperactor_mesh::bootstrap::{serve_until_stopped, BootInfo};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The entry point of a child process started by a host.
//! let info = BootInfo::from_env()?;
//! let proc = info.serve(ChannelTransport::Unix).await?;
//! // ... spawn this proc's actors here (BOOT-1) ...
//! info.report_ready(&proc)?;
//! serve_until_stopped(&proc, std::time::Duration::from_secs(5)).await;
//! # Ok(())
//! # }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use hyperactor::id::validate_name;
use hyperactor::{ChannelTransport, PortId, PortRef, Proc, ProcId};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::error::BootstrapError;

/// The variable holding the [`PortId`] of the host's report port.
pub const BOOTSTRAP_ADDR_ENV: &str = "HYPERACTOR_MESH_BOOTSTRAP_ADDR";
/// The variable holding the proc name.
pub const PROC_NAME_ENV: &str = "HYPERACTOR_MESH_PROC_NAME";
/// The variable holding the proc's rank.
pub const PROC_RANK_ENV: &str = "HYPERACTOR_MESH_PROC_RANK";
/// The variable holding the number of procs started together.
pub const PROC_COUNT_ENV: &str = "HYPERACTOR_MESH_PROC_COUNT";

/// The program a host runs for each proc: a binary whose entry point calls
/// [`bootstrap_proc`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapCommand {
    /// The program to run.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables set for it, on top of the host's own environment. The
    /// host's bootstrap variables (see the [module docs](self)) are set last and win.
    pub env: Vec<(String, String)>,
    /// Arguments that make `program` a fork server for these procs, if it can be one:
    /// the host then starts `program` with these arguments once and forks every proc
    /// from it instead of starting `program args...` per proc (see
    /// [`crate::host`]). `None` starts every proc with `exec`.
    #[serde(default)]
    pub fork_server: Option<Vec<String>>,
}

impl BootstrapCommand {
    /// A command running `program` with no arguments and no extra environment.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            fork_server: None,
        }
    }

    /// The same command, forking its procs from `program` started with `args` (a fork
    /// server, see [`BootstrapCommand::fork_server`]).
    #[must_use]
    pub fn with_fork_server<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.fork_server = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// The same command with `args` appended to its arguments.
    #[must_use]
    pub fn with_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The same command with the variable `key` set to `value`, replacing an earlier
    /// value of `key`.
    #[must_use]
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let (key, value) = (key.into(), value.into());
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value));
        self
    }
}

/// The commands of the procs of one spawn: one for every rank, or one per rank (for
/// example a different environment per proc).
///
/// ```
/// use hyperactor_mesh::bootstrap::{BootstrapCommand, ProcCommands};
///
/// let each = ProcCommands::PerRank(vec![
///     BootstrapCommand::new("/bin/worker").with_env("ROLE", "a"),
///     BootstrapCommand::new("/bin/worker").with_env("ROLE", "b"),
/// ]);
/// assert_eq!(each.for_rank(1).unwrap().env, [("ROLE".to_string(), "b".to_string())]);
/// assert_eq!(each.ranks(), Some(2));
/// let same = ProcCommands::from(BootstrapCommand::new("/bin/worker"));
/// assert_eq!(same.for_rank(7).unwrap().program.to_str(), Some("/bin/worker"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProcCommands {
    /// Every rank runs this command (forked from its fork server, if it names one).
    Same(BootstrapCommand),
    /// Rank `r` runs the `r`th command (each forked from its own fork server, if it
    /// names one).
    PerRank(Vec<BootstrapCommand>),
}

impl ProcCommands {
    /// The command of `rank`; `None` past the end of a per-rank list.
    pub fn for_rank(&self, rank: usize) -> Option<&BootstrapCommand> {
        match self {
            Self::Same(command) => Some(command),
            Self::PerRank(commands) => commands.get(rank),
        }
    }

    /// How many ranks the commands are for: `None` for any number ([`Self::Same`]).
    pub fn ranks(&self) -> Option<usize> {
        match self {
            Self::Same(_) => None,
            Self::PerRank(commands) => Some(commands.len()),
        }
    }

    /// The commands of ranks `start..start + count`, renumbered from 0; `None` if a
    /// per-rank list does not reach that far.
    pub fn slice(&self, start: usize, count: usize) -> Option<Self> {
        match self {
            Self::Same(command) => Some(Self::Same(command.clone())),
            Self::PerRank(commands) => commands
                .get(start..start.checked_add(count)?)
                .map(|part| Self::PerRank(part.to_vec())),
        }
    }
}

impl From<BootstrapCommand> for ProcCommands {
    fn from(command: BootstrapCommand) -> Self {
        Self::Same(command)
    }
}

/// What a child learns from its host at start: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    /// The proc name shared by the procs of one spawn.
    pub name: String,
    /// This proc's rank, `0..count`.
    pub rank: usize,
    /// How many procs were started together.
    pub count: usize,
    /// The host's report port.
    pub report: PortId,
}

/// The message a child sends to its host's report port once its proc serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcReady {
    /// The child's rank.
    pub rank: usize,
    /// The child's proc, reachable from now on (BOOT-1).
    pub proc_id: ProcId,
    /// The child's OS process id.
    pub pid: u32,
}

impl BootInfo {
    /// Reads the bootstrap variables of this process's environment.
    ///
    /// # Errors
    ///
    /// [`BootstrapError::MissingEnv`] when a variable is not set (the process was not
    /// started by a host); [`BootstrapError::InvalidEnv`] when one does not parse.
    pub fn from_env() -> Result<Self, BootstrapError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads the bootstrap variables through `lookup` (a variable name to its value).
    ///
    /// # Errors
    ///
    /// As [`BootInfo::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, BootstrapError> {
        let get = |var: &'static str| lookup(var).ok_or(BootstrapError::MissingEnv { var });
        let invalid = |var: &'static str, value: &str, reason: String| BootstrapError::InvalidEnv {
            var,
            value: value.to_string(),
            reason,
        };
        let name = get(PROC_NAME_ENV)?;
        validate_name(&name).map_err(|e| invalid(PROC_NAME_ENV, &name, e.to_string()))?;
        let parse_usize = |var: &'static str| -> Result<usize, BootstrapError> {
            let value = get(var)?;
            value
                .parse()
                .map_err(|e| invalid(var, &value, format!("expected a number: {e}")))
        };
        let rank = parse_usize(PROC_RANK_ENV)?;
        let count = parse_usize(PROC_COUNT_ENV)?;
        if rank >= count {
            return Err(invalid(
                PROC_RANK_ENV,
                &rank.to_string(),
                format!("the rank must be below {PROC_COUNT_ENV}={count}"),
            ));
        }
        let report = get(BOOTSTRAP_ADDR_ENV)?;
        let report = report
            .parse::<PortId>()
            .map_err(|e| invalid(BOOTSTRAP_ADDR_ENV, &report, e.to_string()))?;
        Ok(Self {
            name,
            rank,
            count,
            report,
        })
    }

    /// The environment variables that make a child see `self` (what the host sets).
    pub fn to_env(&self) -> Vec<(String, String)> {
        vec![
            (BOOTSTRAP_ADDR_ENV.to_string(), self.report.to_string()),
            (PROC_NAME_ENV.to_string(), self.name.clone()),
            (PROC_RANK_ENV.to_string(), self.rank.to_string()),
            (PROC_COUNT_ENV.to_string(), self.count.to_string()),
        ]
    }

    /// Serves this child's proc on `transport`. Its uid starts with `{name}-{rank}`.
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Serve`] if the proc cannot be served.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing stays served.
    pub async fn serve(&self, transport: ChannelTransport) -> Result<Proc, BootstrapError> {
        Proc::serve(transport, &format!("{}-{}", self.name, self.rank))
            .await
            .map_err(|source| BootstrapError::Serve {
                name: self.name.clone(),
                rank: self.rank,
                source,
            })
    }

    /// Serves this child's proc where its host's peers can reach it: over Unix when the
    /// host serves over Unix; over TCP at the host's advertised IP (port chosen by the
    /// system) when the host serves over TCP, so the procs of a remote host are reached
    /// directly, never through the host agent.
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Serve`] if the proc cannot be served.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing stays served.
    pub async fn serve_near_host(&self) -> Result<Proc, BootstrapError> {
        let addr = match self.report.actor().proc_id().addr() {
            hyperactor::ChannelAddr::Tcp(host) => {
                hyperactor::ChannelAddr::Tcp(std::net::SocketAddr::new(host.ip(), 0))
            }
            other => hyperactor::ChannelAddr::any(other.transport()),
        };
        Proc::serve_at(&addr, &format!("{}-{}", self.name, self.rank))
            .await
            .map_err(|source| BootstrapError::Serve {
                name: self.name.clone(),
                rank: self.rank,
                source,
            })
    }

    /// Sends [`ProcReady`] for `proc` to the host's report port. Call it once the proc's
    /// actors are spawned (BOOT-1).
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Report`] if the report cannot be sent (the proc is stopped).
    pub fn report_ready(&self, proc: &Proc) -> Result<(), BootstrapError> {
        let report_error = |reason: String| BootstrapError::Report {
            proc_id: proc.proc_id().clone(),
            rank: self.rank,
            reason,
        };
        let client = proc
            .client("bootstrap")
            .map_err(|e| report_error(e.to_string()))?;
        let ready = ProcReady {
            rank: self.rank,
            proc_id: proc.proc_id().clone(),
            pid: std::process::id(),
        };
        PortRef::<ProcReady>::attest(self.report.clone())
            .send(&client, ready)
            .map_err(|e| report_error(e.to_string()))
    }
}

/// The child side of a bootstrap, in one call: reads the host's variables, serves a
/// proc on `transport`, and reports it ready. Use the [`BootInfo`] steps instead to
/// spawn actors before reporting (BOOT-1).
///
/// # Errors
///
/// As [`BootInfo::from_env`], [`BootInfo::serve`] and [`BootInfo::report_ready`].
///
/// # Cancel safety
///
/// Cancel safe: a cancelled call has served nothing, or has served a proc that is
/// dropped with the future.
pub async fn bootstrap_proc(
    transport: ChannelTransport,
) -> Result<(Proc, BootInfo), BootstrapError> {
    let info = BootInfo::from_env()?;
    let proc = info.serve(transport).await?;
    info.report_ready(&proc)?;
    Ok((proc, info))
}

/// Waits until the host asks this child to stop or goes away — that is, until standard
/// input reaches end of file or fails (BOOT-2) — then stops `proc`, giving its actors
/// `grace` to stop.
///
/// The child must leave its stdin to this function: bytes read from it are discarded.
///
/// # Cancel safety
///
/// Cancel safe before stdin closes; cancelling while `proc` stops leaves the actors
/// already asked to stop stopping.
pub async fn serve_until_stopped(proc: &Proc, grace: Duration) {
    wait_for_stop().await;
    proc.stop(grace).await;
}

/// Waits until standard input reaches end of file or fails (BOOT-2).
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn wait_for_stop() {
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 256];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sample() -> BootInfo {
        let report = "host-1@tcp:127.0.0.1:4000/host[0]:7"
            .parse::<PortId>()
            .unwrap();
        BootInfo {
            name: "trainers".into(),
            rank: 3,
            count: 8,
            report,
        }
    }

    fn lookup(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
        let map: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        move |k| map.get(k).map(|v| v.to_string())
    }

    #[test]
    fn boot_info_round_trips_through_the_environment() {
        let info = sample();
        let env = info.to_env();
        assert_eq!(BootInfo::from_lookup(lookup(&env)).unwrap(), info);
    }

    #[test]
    fn a_missing_or_invalid_variable_is_named() {
        let info = sample();
        let without_rank: Vec<_> = info
            .to_env()
            .into_iter()
            .filter(|(k, _)| k != PROC_RANK_ENV)
            .collect();
        let err = BootInfo::from_lookup(lookup(&without_rank)).unwrap_err();
        assert!(matches!(err, BootstrapError::MissingEnv { var } if var == PROC_RANK_ENV));
        assert!(err.to_string().contains(PROC_RANK_ENV), "{err}");

        let mut bad_rank = info.to_env();
        bad_rank.retain(|(k, _)| k != PROC_RANK_ENV);
        bad_rank.push((PROC_RANK_ENV.into(), "8".into()));
        let err = BootInfo::from_lookup(lookup(&bad_rank)).unwrap_err();
        assert!(err.to_string().contains("below"), "{err}");

        let mut bad_port = info.to_env();
        bad_port.retain(|(k, _)| k != BOOTSTRAP_ADDR_ENV);
        bad_port.push((BOOTSTRAP_ADDR_ENV.into(), "not a port".into()));
        let err = BootInfo::from_lookup(lookup(&bad_port)).unwrap_err();
        assert!(matches!(err, BootstrapError::InvalidEnv { var, .. } if var == BOOTSTRAP_ADDR_ENV));
    }

    #[test]
    fn with_env_replaces_earlier_values_and_keeps_order() {
        let cmd = BootstrapCommand::new("/bin/true")
            .with_args(["a", "b"])
            .with_env("A", "1")
            .with_env("B", "2")
            .with_env("A", "3");
        assert_eq!(cmd.args, ["a", "b"]);
        assert_eq!(
            cmd.env,
            [
                ("B".to_string(), "2".to_string()),
                ("A".to_string(), "3".to_string())
            ]
        );
    }
}
