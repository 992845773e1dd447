//! `HostMeshHandle`: a mesh of hosts whose agents spawn procs
//! ([`hyperactor_mesh::HostMesh`]), bound for Python. `spawn_procs` returns at once; the
//! procs start in the background and the operations issued meanwhile wait, in order
//! (see [`hyperactor_mesh::deferred`]).

use std::sync::Arc;

use hyperactor_mesh::agent::ProcAgent;
use hyperactor_mesh::bootstrap::{BootstrapCommand, ProcCommands};
use hyperactor_mesh::error::ProbeError;
use hyperactor_mesh::shape::Extent;
use hyperactor_mesh::HostMesh;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::proc_mesh::{ProcMeshInner, ProcsStartError, PyProcMesh};
use crate::runtime::runtime;
use crate::sender::Sender;
use crate::shape::PyExtent;

/// A mesh of hosts; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "HostMeshHandle", frozen)]
#[derive(Debug, Clone)]
pub struct PyHostMesh {
    mesh: HostMesh,
    /// For hosts attached by address: the first contact, shared by `probe` and
    /// `spawn_procs` (which waits for it).
    attach: Option<Arc<Attach>>,
}

/// The first contact with attached workers (see `PyHostMesh::attached`).
#[derive(Debug)]
struct Attach {
    /// How users named each host (its worker address), by rank.
    names: Vec<String>,
    /// How long to keep trying each host.
    timeout: std::time::Duration,
    done: tokio::sync::OnceCell<Result<(), AttachError>>,
}

/// Why the first contact with attached workers failed. Every later wait (and every
/// operation on procs spawned on them) gets it again, so it is `Clone`.
#[derive(Debug, Clone)]
pub enum AttachError {
    /// This process has no mesh agent.
    NoAgent {
        /// The error's text (as raised to Python).
        message: String,
    },
    /// A worker did not answer a heartbeat in time.
    Unreachable {
        /// The worker's address, as the user gave it.
        name: String,
        /// The host's rank in the mesh.
        rank: usize,
        /// The host's proc.
        host: hyperactor::ProcId,
        /// How long it was tried.
        timeout: std::time::Duration,
        /// The last probe's failure.
        reason: Arc<ProbeError>,
    },
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoAgent { message } => f.write_str(message),
            Self::Unreachable {
                name,
                rank,
                host,
                timeout,
                reason,
            } => write!(
                f,
                "cannot reach worker {name} (host rank {rank}, {host}) within {timeout:?}: \
                 {reason}; check that the worker runs, that its address is reachable from \
                 this machine (and this machine's from it), and that both use the same \
                 credentials (certificates of the same CA, the same cluster secret, or \
                 ca=\"trust_all_connections\" on both)"
            ),
        }
    }
}

impl std::error::Error for AttachError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::NoAgent { .. } => None,
            Self::Unreachable { reason, .. } => Some(reason.as_ref()),
        }
    }
}

impl Attach {
    /// Waits until every host answered a heartbeat (retrying hosts that refuse
    /// connections, which may still be starting, until the timeout); each is then
    /// monitored. Runs once; later calls get the same outcome.
    async fn wait(&self, hosts: &[hyperactor::ProcId]) -> Result<(), AttachError> {
        self.done
            .get_or_init(|| async {
                let agent = crate::agent::process_agent()
                    .map_err(|e| AttachError::NoAgent {
                        message: e.to_string(),
                    })?
                    .clone();
                let deadline = tokio::time::Instant::now() + self.timeout;
                let reach = |host: hyperactor::ProcId| {
                    let agent = agent.clone();
                    async move {
                        loop {
                            let left =
                                deadline.saturating_duration_since(tokio::time::Instant::now());
                            match agent.probe(&host, left).await {
                                Ok(()) => return Ok(()),
                                // Refused or not there yet: the worker may be starting.
                                // The link's errors are not typed finely enough to tell
                                // a failed authentication apart: its text says so.
                                Err(reason)
                                    if !reason.to_string().contains("authentication")
                                        && tokio::time::Instant::now() + ATTACH_RETRY
                                            < deadline =>
                                {
                                    tracing::debug!("worker {host} not reachable yet: {reason}");
                                    tokio::time::sleep(ATTACH_RETRY).await;
                                }
                                Err(reason) => return Err(reason),
                            }
                        }
                    }
                };
                let answers = futures::future::join_all(hosts.iter().cloned().map(reach)).await;
                for (rank, (host, answer)) in hosts.iter().zip(answers).enumerate() {
                    let name = self
                        .names
                        .get(rank)
                        .cloned()
                        .unwrap_or_else(|| host.to_string());
                    if let Err(reason) = answer {
                        return Err(AttachError::Unreachable {
                            name,
                            rank,
                            host: host.clone(),
                            timeout: self.timeout,
                            reason: Arc::new(reason),
                        });
                    }
                    agent.monitor_host(host);
                }
                Ok(())
            })
            .await
            .clone()
    }
}

/// A proc's command as Python gives it: `(program, args, env)`.
type Command = (String, Vec<String>, Vec<(String, String)>);

/// The bootstrap command of `(program, args, env)`.
fn command((program, args, env): Command) -> BootstrapCommand {
    let mut command = BootstrapCommand::new(program).with_args(args);
    for (k, v) in env {
        command = command.with_env(k, v);
    }
    command
}

/// The pause between attempts to reach a worker that refused.
const ATTACH_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

impl PyHostMesh {
    /// This machine's host as `agent` sees it: its own host, or the host that spawned it.
    ///
    /// # Errors
    ///
    /// `RuntimeError` if the agent has neither.
    pub fn of_agent(agent: &ProcAgent) -> PyResult<Self> {
        let mesh = if agent.is_host() {
            HostMesh::local(agent)
        } else if let Some(host) = agent.spawned_by() {
            HostMesh::new(vec![host.clone()], Extent::unity())
        } else if let Some(gateway) = agent.proc().gateway() {
            return Err(PyRuntimeError::new_err(format!(
                "this client is attached through the gateway {gateway} \
                 (monarch.actor.attach): it has no host of its own, so this_host() has \
                 nothing to spawn on; spawn procs on the cluster's hosts instead \
                 (attach_to_workers(...), or a job's state())"
            )));
        } else {
            return Err(PyRuntimeError::new_err(
                "this process has no host agent and was not spawned by one",
            ));
        };
        Ok(Self {
            mesh: mesh.map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
            attach: None,
        })
    }
}

#[pymethods]
impl PyHostMesh {
    /// The hosts' extent.
    fn extent(&self, py: Python<'_>) -> PyResult<PyExtent> {
        PyExtent::from_extent(py, self.mesh.extent().clone())
    }

    /// Starts `prod(per_host)` procs named `name` on every host, each running a command
    /// of `commands`, `(program, args, env)`: one for every proc (forked from `program
    /// fork_server...` when that is given), or one per proc of the proc mesh (extent
    /// hosts + per_host, by rank; `fork_server` is then not used), owned by `sender`.
    /// Returns at once. Their output is forwarded to this process unless
    /// `forward_output` is false (each host prints it), and written to a log file per
    /// proc on its host when `log_files` is set; each host keeps the last `tail_lines`
    /// lines of each proc's stderr, for the error of a proc that exits before it is
    /// ready (20 by default: `hyperactor_mesh::output::DEFAULT_TAIL_LINES`).
    #[pyo3(signature = (
        sender, name, per_host, commands, fork_server=None, forward_output=true,
        log_files=true, tail_lines=20,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn spawn_procs(
        &self,
        sender: &Bound<'_, PyAny>,
        name: String,
        per_host: PyRef<'_, PyExtent>,
        commands: Vec<Command>,
        fork_server: Option<Vec<String>>,
        forward_output: bool,
        log_files: bool,
        tail_lines: usize,
    ) -> PyResult<PyProcMesh> {
        let sender = Sender::extract(sender)?;
        let mut commands: Vec<BootstrapCommand> = commands.into_iter().map(command).collect();
        let commands = match commands.len() {
            0 => {
                return Err(PyValueError::new_err(
                    "spawn_procs: no command; give one (program, args, env) for every proc \
                     or one per proc",
                ))
            }
            1 => {
                let mut only = commands.remove(0);
                only.fork_server = fork_server;
                ProcCommands::Same(only)
            }
            _ => ProcCommands::PerRank(commands),
        };
        let inner = Arc::new(ProcMeshInner::pending(name.clone()));
        let hosts = self.mesh.clone();
        let per_host = per_host.extent().clone();
        let pending = Arc::clone(&inner);
        let attach = self.attach.clone();
        runtime()?.spawn(async move {
            if let Some(attach) = attach {
                if let Err(e) = attach.wait(hosts.hosts()).await {
                    pending.deferred().resolve(Err(ProcsStartError::Attach(e)));
                    return;
                }
            }
            let output = hyperactor_mesh::output::OutputConfig {
                forward: forward_output,
                files: log_files,
                tail_lines,
            };
            let result = hosts
                .spawn_commands(&sender, &name, &per_host, &commands, output)
                .await
                .map_err(|e| ProcsStartError::Spawn(Arc::new(e)));
            pending.deferred().resolve(result);
        });
        Ok(PyProcMesh::new(inner, None))
    }

    /// Records that these hosts are about to end by this process's doing (their job
    /// is being killed): their loss is expected, not warned about.
    fn abandon(&self) -> PyResult<()> {
        let agent = crate::agent::process_agent()?;
        for host in self.mesh.hosts() {
            agent.expect_host_end(host);
        }
        Ok(())
    }

    /// Ends the workers of this mesh (each stops its procs, `timeout` seconds each, and
    /// exits); resolves to the failures, as `"host: reason"` strings (empty when every
    /// worker confirmed). Never waits on a host known lost, nor on a silent one longer
    /// than it takes heartbeats to find it lost.
    fn end_workers(
        &self,
        sender: &Bound<'_, PyAny>,
        reason: String,
        timeout: f64,
    ) -> PyResult<crate::future::PyFuture> {
        let sender = Sender::extract(sender)?;
        let timeout = crate::agent::duration("timeout", timeout)?;
        let mesh = self.mesh.clone();
        Ok(crate::future::PyFuture::from_work(
            "HostMesh.shutdown",
            async move {
                let results = mesh
                    .end_hosts(&sender, &reason, timeout)
                    .await
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                let failures: Vec<String> = results
                    .into_iter()
                    .filter_map(|(host, r)| r.err().map(|e| format!("{host}: {e}")))
                    .collect();
                let convert: crate::future::Convert =
                    Box::new(move |py| Ok(failures.into_pyobject(py)?.into_any().unbind()));
                Ok(convert)
            },
        ))
    }

    /// The workers at `addresses` (`tcp://HOST:PORT`, `ipc://PATH`), as a mesh laid out
    /// along `extent`. Returns at once; the first contact happens in the background
    /// (see `probe`), each worker given `timeout` seconds.
    #[staticmethod]
    fn attached(
        addresses: Vec<String>,
        extent: PyRef<'_, PyExtent>,
        timeout: f64,
    ) -> PyResult<Self> {
        let timeout = std::time::Duration::try_from_secs_f64(timeout)
            .map_err(|_| PyValueError::new_err(format!("timeout must be >= 0, got {timeout}")))?;
        let hosts = addresses
            .iter()
            .map(|a| {
                hyperactor_mesh::worker::WorkerAddress::dial(a)
                    .map(|addr| hyperactor_mesh::worker::worker_proc_id(&addr))
                    .map_err(|e| PyValueError::new_err(e.to_string()))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mesh = HostMesh::new(hosts, extent.extent().clone())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            mesh,
            attach: Some(Arc::new(Attach {
                names: addresses,
                timeout,
                done: tokio::sync::OnceCell::new(),
            })),
        })
    }

    /// The hosts' agents' proc ids (printed), by rank.
    fn hosts(&self) -> Vec<String> {
        self.mesh.hosts().iter().map(ToString::to_string).collect()
    }

    /// The hosts at the ranks of `shape` (global ranks of this mesh), along its extent.
    fn view(&self, shape: PyRef<'_, crate::shape::PyShape>) -> PyResult<Self> {
        let shape = shape.shape();
        let all = self.mesh.hosts();
        let hosts = shape
            .iter()
            .map(|r| {
                all.get(r).cloned().ok_or_else(|| {
                    PyValueError::new_err(format!("host rank {r} is not in {}", self.mesh.extent()))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mesh = HostMesh::new(hosts, shape.extent())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            mesh,
            attach: self.attach.clone(),
        })
    }

    /// A future that completes (with True) once every host answered (for attached
    /// workers: see `attached`), or fails naming the first host that could not be
    /// reached and why.
    fn probe(&self) -> crate::future::PyFuture {
        let attach = self.attach.clone();
        let hosts = self.mesh.hosts().to_vec();
        crate::future::PyFuture::from_work("HostMesh.initialized", async move {
            if let Some(attach) = attach {
                attach
                    .wait(&hosts)
                    .await
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            }
            let convert: crate::future::Convert =
                Box::new(|py| Ok(true.into_pyobject(py)?.to_owned().into_any().unbind()));
            Ok(convert)
        })
    }

    #[staticmethod]
    fn _from_bytes(data: &[u8]) -> PyResult<Self> {
        let mesh: HostMesh = bincode::deserialize(data)
            .map_err(|e| PyValueError::new_err(format!("not a pickled host mesh: {e}")))?;
        Ok(Self { mesh, attach: None })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let data = bincode::serialize(&slf.get().mesh)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            slf.get_type().getattr("_from_bytes")?,
            (PyBytes::new(slf.py(), &data),),
        ))
    }

    fn __repr__(&self) -> String {
        format!("HostMeshHandle({})", self.mesh.extent())
    }
}
