//! Host meshes: the machines whose host agents spawn procs, laid out along named
//! dimensions (`{"hosts": n}` for a cluster; no dimension for this machine alone).
//!
//! [`HostMesh::spawn_procs`] asks every host agent for `per_host` procs running a
//! bootstrap command and returns a [`ProcMesh`] whose extent is the hosts' extent
//! followed by `per_host`. The procs are owned by the calling actor: they stop when it
//! stops (with the other meshes it owns), and their host kills them if its proc dies.
//! Their output is forwarded to the calling actor's process (see [`crate::output`]).
//!
//! ```no_run
//! use hyperactor::ChannelTransport;
//! use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
//! use hyperactor_mesh::bootstrap::BootstrapCommand;
//! use hyperactor_mesh::host::Host;
//! use hyperactor_mesh::host_mesh::HostMesh;
//! use hyperactor_mesh::shape::Extent;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let host = Host::serve(ChannelTransport::Unix).await?;
//! let agent = ProcAgent::new(host.proc().clone(), AgentOptions::default().host(host))?;
//! let client = agent.proc().client("main")?;
//! let hosts = HostMesh::local(&agent)?;
//! let cmd = BootstrapCommand::new("/path/to/worker");
//! let procs = hosts.spawn_procs(&client, "workers", &Extent::new(["gpus"], [4])?, &cmd).await?;
//! assert_eq!(procs.len(), 4);
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use hyperactor::{ProcId, SendContext};
use serde::{Deserialize, Serialize};

use crate::actor_mesh::agent_of;
use crate::agent::{Control, ProcAgent, ProcInfo, SpawnProcsRequest};
use crate::bootstrap::{BootstrapCommand, ProcCommands};
use crate::cast::codec::MeshInfo;
use crate::error::{EndHostError, MeshError, RemoteError};
use crate::output::{OutputConfig, OutputOptions};
use crate::proc_mesh::ProcMesh;
use crate::shape::Extent;

/// How long [`HostMesh::spawn_procs`] waits for a host's answer beyond the host's own
/// ready timeout.
const SPAWN_ANSWER_SLACK: Duration = Duration::from_secs(5);

/// A mesh of hosts: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMesh {
    /// The proc of each host's agent, by rank.
    hosts: Vec<ProcId>,
    extent: Extent,
}

impl HostMesh {
    /// The host of this process (its agent must be a host agent), as a mesh with no
    /// dimension.
    ///
    /// # Errors
    ///
    /// [`MeshError::Host`] if `agent` has no host.
    pub fn local(agent: &ProcAgent) -> Result<Self, MeshError> {
        if !agent.is_host() {
            return Err(MeshError::Host {
                host: agent.proc().proc_id().clone(),
                reason: "this agent is not a host agent (create it with AgentOptions::host)".into(),
            });
        }
        Ok(Self {
            hosts: vec![agent.proc().proc_id().clone()],
            extent: Extent::unity(),
        })
    }

    /// The hosts whose agents serve on `hosts` (by rank), laid out along `extent`.
    ///
    /// # Errors
    ///
    /// [`MeshError::InvalidName`] unless there is one host per rank of `extent`.
    pub fn new(hosts: Vec<ProcId>, extent: Extent) -> Result<Self, MeshError> {
        if hosts.len() != extent.num_ranks() {
            return Err(MeshError::InvalidName {
                name: "hosts".into(),
                reason: format!(
                    "{} hosts for an extent of {} ranks ({extent}); give one host per rank",
                    hosts.len(),
                    extent.num_ranks()
                ),
            });
        }
        Ok(Self { hosts, extent })
    }

    /// The hosts' agents' procs, by rank.
    pub fn hosts(&self) -> &[ProcId] {
        &self.hosts
    }

    /// The hosts' extent.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// Ends every host of this mesh that is a worker ([`ProcAgent::end_host`]): each
    /// stops all its procs (each gets `timeout`) and exits. Waits for all hosts at once,
    /// never longer than `timeout` plus a little slack, not at all for a host known
    /// lost, and for a silent one only until it is found lost; returns, per host in
    /// order, whether it confirmed (or why not: [`EndHostError`]).
    ///
    /// # Errors
    ///
    /// [`MeshError`] if `cx` has no agent; per-host failures are in the result.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the requests stay sent.
    pub async fn end_hosts(
        &self,
        cx: &impl SendContext,
        reason: &str,
        timeout: Duration,
    ) -> Result<Vec<(ProcId, Result<(), EndHostError>)>, MeshError> {
        let agent = agent_of(cx)?;
        let ends = self.hosts.iter().map(|host| {
            let agent = agent.clone();
            async move { (host.clone(), agent.end_host(host, reason, timeout).await) }
        });
        Ok(futures::future::join_all(ends).await)
    }

    /// Spawns `per_host.num_ranks()` procs named `name` on every host, each running
    /// `command`, owned by `cx`'s actor; returns them as a proc mesh of extent
    /// `hosts + per_host` once all reported ready. Their output is forwarded to this
    /// process and kept in log files ([`OutputConfig::default`]).
    ///
    /// # Errors
    ///
    /// As [`HostMesh::spawn_procs_with`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: procs spawned before cancellation keep running until their owner
    /// stops.
    pub async fn spawn_procs(
        &self,
        cx: &impl SendContext,
        name: &str,
        per_host: &Extent,
        command: &BootstrapCommand,
    ) -> Result<ProcMesh, MeshError> {
        self.spawn_procs_with(cx, name, per_host, command, OutputConfig::default())
            .await
    }

    /// Like [`HostMesh::spawn_procs`], with the procs' output handled as `output` says.
    ///
    /// # Errors
    ///
    /// [`MeshError::InvalidName`] if a `per_host` dimension is also a host dimension;
    /// [`MeshError::SpawnProcs`] naming the host and why (a proc exited before it was
    /// ready, the host is unreachable, ...): procs spawned on other hosts are stopped.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: procs spawned before cancellation keep running until their owner
    /// stops.
    pub async fn spawn_procs_with(
        &self,
        cx: &impl SendContext,
        name: &str,
        per_host: &Extent,
        command: &BootstrapCommand,
        output: OutputConfig,
    ) -> Result<ProcMesh, MeshError> {
        let commands = ProcCommands::Same(command.clone());
        self.spawn_commands(cx, name, per_host, &commands, output)
            .await
    }

    /// Like [`HostMesh::spawn_procs_with`], each proc running its command of
    /// `commands`: with [`ProcCommands::PerRank`], the proc of rank `r` of the proc
    /// mesh (extent `hosts + per_host`, row-major) runs the `r`th command.
    ///
    /// # Errors
    ///
    /// As [`HostMesh::spawn_procs_with`], and [`MeshError::SpawnProcs`] if a per-rank
    /// list does not have one command per proc.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: procs spawned before cancellation keep running until their owner
    /// stops.
    pub async fn spawn_commands(
        &self,
        cx: &impl SendContext,
        name: &str,
        per_host: &Extent,
        commands: &ProcCommands,
        output: OutputConfig,
    ) -> Result<ProcMesh, MeshError> {
        if let Some(clash) = per_host.labels().iter().find(|l| self.extent.contains(l)) {
            return Err(MeshError::InvalidName {
                name: clash.clone(),
                reason: format!(
                    "per-host dimension {clash:?} is also a host dimension ({})",
                    self.extent
                ),
            });
        }
        let mut labels = self.extent.labels().to_vec();
        labels.extend(per_host.labels().iter().cloned());
        let mut sizes = self.extent.sizes().to_vec();
        sizes.extend(per_host.sizes().iter().copied());
        let extent = Extent::new(labels, sizes).map_err(|e| MeshError::InvalidName {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let agent = agent_of(cx)?;
        let info = MeshInfo {
            id: crate::agent::random_id(),
            name: name.to_string(),
            class: "proc".to_string(),
        };
        let count = per_host.num_ranks();
        let total = count * self.hosts.len();
        if let Some(given) = commands.ranks().filter(|&n| n != total) {
            return Err(MeshError::SpawnProcs {
                name: name.to_string(),
                reason: format!(
                    "{given} per-proc commands for {total} procs ({} hosts x {count}); \
                     give one per proc",
                    self.hosts.len()
                ),
            });
        }
        let forward_to = output
            .forward
            .then(|| crate::agent::control_port(agent.proc().proc_id()));
        let asks = self.hosts.iter().enumerate().map(|(index, host)| {
            // Checked above: a per-rank list has `count` commands for every host.
            let commands = commands
                .slice(index * count, count)
                .unwrap_or_else(|| commands.clone());
            let (port, receiver) = cx
                .mailbox()
                .open_once_port::<Result<Vec<ProcInfo>, RemoteError>>();
            let request = SpawnProcsRequest {
                name: name.to_string(),
                count,
                commands,
                owner: cx.actor_id().clone(),
                mesh: info.clone(),
                reply: port.port_id().clone(),
                output: OutputOptions {
                    forward_to: forward_to.clone(),
                    mesh_id: info.id,
                    rank_base: index * count,
                    files: output.files,
                    tail_lines: output.tail_lines,
                },
            };
            agent.monitor_host(host);
            send_control(&agent, host, &Control::SpawnProcs(Box::new(request)));
            // A host that cannot be reached (refused, failed authentication, lost)
            // fails the spawn at once, with the reason.
            let link = agent.remote_link_failed(host);
            async move {
                let limit = crate::host::DEFAULT_READY_TIMEOUT + SPAWN_ANSWER_SLACK;
                tokio::select! {
                    answer = tokio::time::timeout(limit, receiver.recv()) => match answer {
                        Ok(Ok(Ok(procs))) => Ok(procs),
                        Ok(Ok(Err(refused))) => Err(HostSpawnError::Refused(refused)),
                        Ok(Err(e)) => Err(HostSpawnError::AnswerLost(e)),
                        Err(_) => Err(HostSpawnError::Timeout { limit }),
                    },
                    error = link => Err(HostSpawnError::Unreachable(error)),
                }
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut procs = Vec::with_capacity(count * self.hosts.len());
        let mut failure = None;
        for (host, answer) in self.hosts.iter().zip(answers) {
            match answer {
                Ok(mut got) => {
                    got.sort_by_key(|p| p.rank);
                    procs.extend(got);
                }
                Err(reason) => {
                    failure.get_or_insert((host.clone(), reason));
                }
            }
        }
        for (rank, proc) in procs.iter_mut().enumerate() {
            proc.rank = rank;
        }
        let view = crate::cast::codec::ViewExtent {
            labels: extent.labels().to_vec(),
            sizes: extent.sizes().to_vec(),
        };
        agent.register_owned_procs_in(info.clone(), cx.actor_id().clone(), &procs, view);
        if let Some((host, reason)) = failure {
            agent.stop_owned(info.id, "its spawn failed").await;
            return Err(MeshError::SpawnProcs {
                name: name.to_string(),
                reason: format!("host {host}: {reason}"),
            });
        }
        ProcMesh::new(info, &extent, procs).map_err(|e| MeshError::SpawnProcs {
            name: name.to_string(),
            reason: e.to_string(),
        })
    }
}

/// Why one host did not spawn its procs of a [`HostMesh::spawn_commands`]; its text
/// becomes the reason of the [`MeshError::SpawnProcs`], after the host.
#[derive(Debug, thiserror::Error)]
enum HostSpawnError {
    /// The host's agent answered with an error.
    #[error(transparent)]
    Refused(RemoteError),
    /// The port waiting for the answer closed.
    #[error("the host's answer was lost: {0}")]
    AnswerLost(hyperactor::error::RecvError),
    /// No answer came in time.
    #[error("no answer within {limit:?}")]
    Timeout {
        /// The limit.
        limit: Duration,
    },
    /// The link to the host failed.
    #[error("it cannot be reached: {0}")]
    Unreachable(hyperactor::channel::ChannelError),
}

fn send_control(agent: &ProcAgent, host: &ProcId, control: &Control) {
    match hyperactor::message::Serialized::encode(control) {
        Ok(payload) => agent.post_parts(
            agent.id(),
            crate::agent::control_port(host),
            payload.into_parts(),
        ),
        Err(e) => tracing::error!("cannot encode a host request: {e}"),
    }
}
