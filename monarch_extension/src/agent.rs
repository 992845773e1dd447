//! `ProcAgent`: this process's mesh agent ([`hyperactor_mesh::agent::ProcAgent`]),
//! bound for Python.
//!
//! The root client serves one with a host (`ProcAgent.serve_root`): it spawns and reaps
//! this machine's procs. A proc spawned by a host serves one with `ProcAgent.bootstrap`,
//! then reports ready. Python actors the agent is asked to spawn are handed to Python
//! through `next_spawn`: each comes as a `DrivenActor` whose messages already queue in
//! order; a Python thread runs its constructor and its messages.

use hyperactor::sync::Mutex;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use hyperactor::actor::DrivenActor;
use hyperactor::{ChannelTransport, SendContext};
use hyperactor_mesh::agent::{
    AgentOptions, EndHook, ForeignSpawn, ForeignSpawner, Liveness, ProcAgent,
};
use hyperactor_mesh::bootstrap::BootInfo;
use hyperactor_mesh::host::Host;
use hyperactor_mesh::worker::WorkerAddress;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::actor::PyDrivenActor;
use crate::host_mesh::PyHostMesh;
use crate::proc::PyClient;
use crate::proc_mesh::PyProcMesh;
use crate::runtime::{block, deadline};
use crate::runtime::{block_on, runtime};

type Spawned = (DrivenActor, ForeignSpawn);

/// Hands foreign spawns to Python's spawner thread.
struct PythonSpawner {
    tx: Mutex<Option<mpsc::Sender<Spawned>>>,
}

impl ForeignSpawner for PythonSpawner {
    fn spawn(&self, actor: DrivenActor, spawn: ForeignSpawn) -> Result<(), DrivenActor> {
        // Closed: the process is stopping; the agent ends the actor as stopped and
        // tells the mesh's owner.
        match &*self.tx.lock() {
            Some(tx) => tx.send((actor, spawn)).map_err(|e| e.0 .0),
            None => Err(actor),
        }
    }
}

/// The transport a proc serves over: a name [`crate::proc::parse_transport`] accepts,
/// other than `"local"` (which other processes cannot reach).
fn transport(name: &str) -> PyResult<ChannelTransport> {
    match crate::proc::parse_transport(name)? {
        ChannelTransport::Local => Err(PyValueError::new_err(format!(
            "a proc serves over \"unix\" or \"tcp\", not {name:?}: other processes cannot \
             reach the in-process transport"
        ))),
        other => Ok(other),
    }
}

/// Where the root proc serves: `"unix"`, `"tcp"` (every interface, advertising this
/// machine's primary IP), `"tcp-localhost"` (127.0.0.1) or an address
/// (`tcp://IP:PORT`, `ADVERTISE@BIND`).
fn root_address(
    spec: &str,
) -> PyResult<(hyperactor::channel::Listen, Option<hyperactor::ChannelAddr>)> {
    use hyperactor::channel::Listen;
    use hyperactor::ChannelAddr;
    use std::net::{Ipv4Addr, SocketAddr};
    Ok(match spec {
        "tcp-localhost" => (Listen::Addr(ChannelAddr::any(ChannelTransport::Tcp)), None),
        name if !name.contains(':') => {
            let transport = transport(name).map_err(|e| {
                PyValueError::new_err(format!(
                    "{e}; or \"tcp-localhost\", or an address (tcp://HOST:PORT, ipc://PATH, \
                     ADVERTISE@BIND)"
                ))
            })?;
            let bind = match transport {
                ChannelTransport::Tcp => {
                    ChannelAddr::Tcp(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))
                }
                other => ChannelAddr::any(other),
            };
            (Listen::Addr(bind), None)
        }
        address => {
            let address =
                WorkerAddress::parse(address).map_err(|e| PyValueError::new_err(e.to_string()))?;
            (address.bind, address.advertise)
        }
    })
}

/// Heartbeat timing from seconds.
fn liveness(interval: f64, timeout: f64, lease: f64) -> PyResult<Liveness> {
    Ok(Liveness {
        interval: duration("heartbeat_interval", interval)?.max(Duration::from_millis(1)),
        timeout: duration("heartbeat_timeout", timeout)?,
        lease: duration("client_lease", lease)?,
        ..Liveness::default()
    })
}

/// `host` writing its procs' log files to `dir`, when given (else to its default).
fn with_log_dir(host: Host, dir: Option<std::path::PathBuf>) -> Host {
    match dir {
        Some(dir) => host.with_log_dir(Some(dir)),
        None => host,
    }
}

pub(crate) fn duration(what: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a finite number of seconds >= 0, got {seconds}"
        ))
    })
}

/// This process's mesh agent; see the [module docs](self).
#[pyclass(module = "monarch._rust_bindings", name = "ProcAgent", frozen)]
pub struct PyProcAgent {
    agent: ProcAgent,
    boot: Option<BootInfo>,
    spawner: Arc<PythonSpawner>,
    spawns: Mutex<mpsc::Receiver<Spawned>>,
}

impl std::fmt::Debug for PyProcAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcAgent({})", self.agent.id())
    }
}

/// This process's agent, once one is created (one per process).
static AGENT: std::sync::OnceLock<ProcAgent> = std::sync::OnceLock::new();

/// This process's agent.
///
/// # Errors
///
/// `RuntimeError` before one is created.
pub fn process_agent() -> PyResult<&'static ProcAgent> {
    AGENT.get().ok_or_else(|| {
        PyRuntimeError::new_err("this process has no mesh agent yet (monarch is not initialized)")
    })
}

impl PyProcAgent {
    fn build(
        py: Python<'_>,
        proc: hyperactor::Proc,
        options: AgentOptions,
        boot: Option<BootInfo>,
    ) -> PyResult<Self> {
        let (tx, rx) = mpsc::channel();
        let spawner = Arc::new(PythonSpawner {
            tx: Mutex::new(Some(tx)),
        });
        let options = options.foreign(Arc::clone(&spawner) as Arc<dyn ForeignSpawner>);
        let agent = py.detach(|| -> PyResult<ProcAgent> {
            let _guard = runtime()?.enter();
            ProcAgent::new(proc, options).map_err(|e| PyRuntimeError::new_err(e.to_string()))
        })?;
        if AGENT.set(agent.clone()).is_err() {
            return Err(PyRuntimeError::new_err(
                "this process already has a mesh agent; there is one per process",
            ));
        }
        Ok(Self {
            agent,
            boot,
            spawner,
            spawns: Mutex::new(rx),
        })
    }

    /// The host agent of `host`'s proc.
    fn host_agent(
        py: Python<'_>,
        host: Host,
        stop: Duration,
        liveness: Liveness,
        on_end: Option<EndHook>,
    ) -> PyResult<Self> {
        let proc = host.proc().clone();
        let mut options = AgentOptions::default()
            .host(host)
            .stop_timeout(stop)
            .liveness(liveness);
        if let Some(on_end) = on_end {
            options = options.on_end(on_end);
        }
        Self::build(py, proc, options, None)
    }

    /// The agent.
    pub fn agent(&self) -> &ProcAgent {
        &self.agent
    }
}

#[pymethods]
impl PyProcAgent {
    /// Serves the root client's proc on `transport`, with a host agent that spawns and
    /// reaps this machine's procs (waiting `ready_timeout` seconds for each spawn).
    /// `transport` is `"unix"`, `"tcp"` (every interface, advertising this machine's
    /// primary IP), `"tcp-localhost"`, or an address (`tcp://IP:PORT`,
    /// `ADVERTISE@BIND`). The procs' log files go to `log_dir` (default: a per-user
    /// folder under the temporary directory).
    #[staticmethod]
    #[pyo3(signature = (
        transport = "unix",
        ready_timeout = 30.0,
        stop_timeout = 10.0,
        heartbeat_interval = 0.25,
        heartbeat_timeout = 2.0,
        client_lease = 10.0,
        log_dir = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn serve_root(
        py: Python<'_>,
        transport: &str,
        ready_timeout: f64,
        stop_timeout: f64,
        heartbeat_interval: f64,
        heartbeat_timeout: f64,
        client_lease: f64,
        log_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let (bind, advertise) = root_address(transport)?;
        let ready = duration("ready_timeout", ready_timeout)?;
        let stop = duration("stop_timeout", stop_timeout)?;
        let liveness = liveness(heartbeat_interval, heartbeat_timeout, client_lease)?;
        let host = block_on(py, "ProcAgent.serve_root()", async move {
            Host::serve_at(&bind, advertise.as_ref()).await
        })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .with_ready_timeout(ready);
        let host = with_log_dir(host, log_dir);
        Self::host_agent(py, host, stop, liveness, None)
    }

    /// Serves a worker (a host agent for clients on other machines) at `address`
    /// (`tcp://HOST:PORT`, `ipc://PATH`, `ADVERTISE@BIND`). The procs' log files go to
    /// `log_dir` (default: a per-user folder under the temporary directory).
    #[staticmethod]
    #[pyo3(signature = (
        address,
        ready_timeout = 30.0,
        stop_timeout = 10.0,
        heartbeat_interval = 0.25,
        heartbeat_timeout = 2.0,
        client_lease = 10.0,
        log_dir = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn serve_worker(
        py: Python<'_>,
        address: &str,
        ready_timeout: f64,
        stop_timeout: f64,
        heartbeat_interval: f64,
        heartbeat_timeout: f64,
        client_lease: f64,
        log_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let address =
            WorkerAddress::parse(address).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let ready = duration("ready_timeout", ready_timeout)?;
        let stop = duration("stop_timeout", stop_timeout)?;
        let liveness = liveness(heartbeat_interval, heartbeat_timeout, client_lease)?;
        let host = block_on(py, "ProcAgent.serve_worker()", async move {
            hyperactor_mesh::worker::worker_host(&address, ready).await
        })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let host = with_log_dir(host, log_dir);
        // A client ended this worker (its procs are reaped): stop the process the way
        // an operator would, so its worker loop exits cleanly.
        let on_end: EndHook = Arc::new(|reason: &str| {
            tracing::info!("worker ended by its client: {reason}");
            // SAFETY: raise(2) has no memory-safety preconditions.
            unsafe {
                libc::raise(libc::SIGTERM);
            }
        });
        Self::host_agent(py, host, stop, liveness, Some(on_end))
    }

    /// Starts the root client's proc attached to the gateway at `address` (a worker's
    /// address, `tcp://HOST:PORT`, as this machine reaches it: for example a
    /// `kubectl port-forward` of the worker's port): every message to and from it goes
    /// through that worker, and it serves no address of its own. It has no host agent:
    /// it spawns procs on the cluster's hosts only.
    ///
    /// Raises `ValueError` for an address that does not parse, `RuntimeError` naming
    /// the gateway when it cannot be reached or authenticated (wrong credentials), or
    /// refuses.
    #[staticmethod]
    #[pyo3(signature = (
        address,
        stop_timeout = 10.0,
        heartbeat_interval = 0.25,
        heartbeat_timeout = 2.0,
        client_lease = 10.0,
    ))]
    fn attach_root(
        py: Python<'_>,
        address: &str,
        stop_timeout: f64,
        heartbeat_interval: f64,
        heartbeat_timeout: f64,
        client_lease: f64,
    ) -> PyResult<Self> {
        let gateway =
            WorkerAddress::dial(address).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let stop = duration("stop_timeout", stop_timeout)?;
        let liveness = liveness(heartbeat_interval, heartbeat_timeout, client_lease)?;
        let proc = block_on(py, "ProcAgent.attach_root()", async move {
            hyperactor::Proc::attach(&gateway, "client").await
        })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let options = AgentOptions::default()
            .stop_timeout(stop)
            .liveness(liveness);
        Self::build(py, proc, options, None)
    }

    /// The gateway this process's proc is attached to (`attach_root`): the address it
    /// dialed, printed; `None` for a proc that serves an address of its own.
    #[getter]
    fn gateway(&self) -> Option<String> {
        self.agent.proc().gateway().map(ToString::to_string)
    }

    /// Serves this proc, started by a host agent (whose variables are in the
    /// environment); call `report_ready` once the process is ready to serve.
    /// `transport` `"auto"` serves like the host (Unix for a Unix host, TCP at the
    /// host's IP for a TCP host).
    #[staticmethod]
    #[pyo3(signature = (
        transport = "auto",
        stop_timeout = 10.0,
        heartbeat_interval = 0.25,
        heartbeat_timeout = 2.0,
        client_lease = 10.0,
    ))]
    fn bootstrap(
        py: Python<'_>,
        transport: &str,
        stop_timeout: f64,
        heartbeat_interval: f64,
        heartbeat_timeout: f64,
        client_lease: f64,
    ) -> PyResult<Self> {
        let transport = match transport {
            "auto" => None,
            other => Some(self::transport(other)?),
        };
        let stop = duration("stop_timeout", stop_timeout)?;
        let liveness = liveness(heartbeat_interval, heartbeat_timeout, client_lease)?;
        let info = BootInfo::from_env().map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let serving = info.clone();
        let proc = block_on(py, "ProcAgent.bootstrap()", async move {
            match transport {
                Some(transport) => serving.serve(transport).await,
                None => serving.serve_near_host().await,
            }
        })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let host = info.report.actor().proc_id().clone();
        let options = AgentOptions::default()
            .spawned_by(host)
            .stop_timeout(stop)
            .liveness(liveness);
        Self::build(py, proc, options, Some(info))
    }

    /// Tells the host that spawned this proc that it is ready.
    fn report_ready(&self) -> PyResult<()> {
        let Some(info) = &self.boot else {
            return Err(PyRuntimeError::new_err(
                "report_ready() is for procs started by a host (ProcAgent.bootstrap)",
            ));
        };
        let _guard = runtime()?.enter();
        info.report_ready(self.agent.proc())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Blocks, without the GIL, until the host asks this proc to stop (stdin closes).
    fn wait_for_stop(&self, py: Python<'_>) -> PyResult<()> {
        block_on(
            py,
            "ProcAgent.wait_for_stop()",
            hyperactor_mesh::bootstrap::wait_for_stop(),
        )
    }

    /// Where this host agent's host writes its procs' log files (`None`: no host, or
    /// no log files).
    #[getter]
    fn log_dir(&self) -> Option<String> {
        let host = self.agent.host()?;
        host.log_dir().map(|d| d.display().to_string())
    }

    /// The agent's proc id, printed.
    #[getter]
    fn proc_id(&self) -> String {
        self.agent.proc().proc_id().to_string()
    }

    /// This proc's rank in its spawn, and how many were spawned (`(0, 1)` for a root).
    #[getter]
    fn boot_rank(&self) -> (usize, usize) {
        self.boot.as_ref().map_or((0, 1), |b| (b.rank, b.count))
    }

    /// A new client mailbox on this proc named `name`.
    fn client(&self, name: &str) -> PyResult<PyClient> {
        let _guard = runtime()?.enter();
        let client = self
            .agent
            .proc()
            .client(name)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyClient::new(Arc::new(client)))
    }

    /// Makes `client` the owner of singletons other processes ask this agent for.
    fn set_singleton_owner(&self, client: &PyClient) {
        self.agent
            .set_singleton_owner(client.client.actor_id().clone());
    }

    /// The next Python actor to host: a `DrivenActor`, or `None` if `timeout` seconds
    /// pass first, or once `close_spawns` was called.
    #[pyo3(signature = (timeout = None))]
    fn next_spawn(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyDrivenActor>> {
        let deadline = deadline(timeout)?;
        let spawns = &self.spawns;
        let got = block(py, deadline, |until| {
            let rx = spawns.lock();
            let wait = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
            match wait {
                Some(wait) => match rx.recv_timeout(wait) {
                    Ok(spawned) => Some(Some(spawned)),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Some(None),
                },
                None => Some(rx.recv().ok()),
            }
        })?;
        Ok(got
            .flatten()
            .map(|(actor, spawn)| PyDrivenActor::new(actor, self.agent.clone(), spawn)))
    }

    /// The singleton actor `name` of the root process's proc (`root`, a printed proc
    /// id; `None`: this process is the root), spawned from `parts` the first time it is
    /// asked for. A future of its `ActorMeshHandle`.
    #[pyo3(signature = (sender, root, name, class_name, parts))]
    fn singleton(
        &self,
        sender: &Bound<'_, PyAny>,
        root: Option<&str>,
        name: String,
        class_name: String,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<crate::future::PyFuture> {
        let sender = crate::sender::Sender::extract(sender)?;
        let parts = crate::port::extract_parts(parts)?;
        let root: hyperactor::ProcId = match root {
            None => self.agent.proc().proc_id().clone(),
            Some(text) => text.parse().map_err(|e: hyperactor::error::IdError| {
                PyValueError::new_err(format!("root proc {text:?}: {e}"))
            })?,
        };
        let agent = self.agent.clone();
        Ok(crate::future::PyFuture::from_work(
            format!("get_or_spawn_controller({name:?})"),
            async move {
                let mesh = agent
                    .remote_singleton(&sender, &root, &name, &class_name, parts)
                    .await
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                let convert: crate::future::Convert = Box::new(move |py| {
                    Ok(Py::new(py, crate::actor_mesh::PyActorMesh::of_ref(mesh))?.into_any())
                });
                Ok(convert)
            },
        ))
    }

    /// A new queue of replies in arrival order (a channel's receiving end).
    fn reply_queue(&self) -> crate::call::PyReplyQueue {
        crate::call::PyReplyQueue::new(hyperactor_mesh::agent::ReplyQueue::open(&self.agent))
    }

    /// This process is stopping (`reason`): from now on, actors this agent is asked to
    /// spawn are refused (they count as stopped; the agent of their mesh's owner decides
    /// whether that is a failure, see `ProcAgent::close_spawns` in Rust), and
    /// `next_spawn` returns `None` once the spawns already queued are taken.
    #[pyo3(signature = (reason = "its process is shutting down"))]
    fn close_spawns(&self, reason: &str) {
        self.agent.close_spawns(reason);
        self.spawner.tx.lock().take();
    }

    /// The fan-out of casts sent from this process.
    #[getter]
    fn fanout(&self) -> usize {
        self.agent.fanout()
    }

    /// How long stopping procs waits for each proc's process to exit after asking it to
    /// stop, before its host kills it, in seconds (the `process_exit_timeout` config
    /// key); unless set, the stop timeout.
    #[getter]
    fn exit_timeout(&self) -> f64 {
        self.agent.exit_timeout().as_secs_f64()
    }

    #[setter]
    fn set_exit_timeout(&self, seconds: Option<f64>) -> PyResult<()> {
        let timeout = seconds.map(|s| duration("exit_timeout", s)).transpose()?;
        self.agent.set_exit_timeout(timeout);
        Ok(())
    }

    #[setter]
    fn set_fanout(&self, fanout: usize) -> PyResult<()> {
        if fanout == 0 {
            return Err(PyValueError::new_err("cast fan-out must be at least 1"));
        }
        self.agent.set_fanout(fanout);
        Ok(())
    }

    /// This machine's host, as a host mesh: the host agent of this process if it has
    /// one, else the host that spawned this proc.
    fn this_host(&self) -> PyResult<PyHostMesh> {
        PyHostMesh::of_agent(&self.agent)
    }

    /// This process's proc, as a proc mesh with no dimension.
    fn this_proc(&self) -> PyResult<PyProcMesh> {
        PyProcMesh::of_self(&self.agent)
    }

    /// Stops every proc this host spawned (each gets `timeout` seconds, then is
    /// killed), blocking without the GIL. Does nothing without a host.
    fn shutdown_host(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = duration("timeout", timeout)?;
        let agent = self.agent.clone();
        block_on(py, "ProcAgent.shutdown_host()", async move {
            agent.shutdown_host(timeout).await;
        })
    }

    /// Waits (without the GIL, at most `timeout` seconds) until this process knows, for
    /// every proc running actors of a mesh it owns, whether it still runs; the failures
    /// of those that died are then reported (see `ProcAgent::settle_owned`).
    fn settle_owned(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = duration("timeout", timeout)?;
        let agent = self.agent.clone();
        block_on(py, "ProcAgent.settle_owned()", async move {
            agent.settle_owned(timeout).await;
        })
    }

    /// The pids of the procs this host spawned that still run.
    fn running_pids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let pids: Vec<u32> = self
            .agent
            .host()
            .map(|h| {
                h.procs()
                    .iter()
                    .filter(|p| p.status().is_running())
                    .map(hyperactor_mesh::ProcHandle::pid)
                    .collect()
            })
            .unwrap_or_default();
        PyList::new(py, pids)
    }

    /// Removes the socket files this process serves (at exit: nothing is stopped).
    #[staticmethod]
    fn remove_socket_files() -> usize {
        hyperactor::channel::remove_socket_files()
    }

    fn __repr__(&self) -> String {
        format!("ProcAgent({})", self.agent.id())
    }
}

/// Uses `secret` to authenticate this process's TCP connections from now on.
#[pyfunction]
pub fn set_cluster_secret(secret: &str) -> PyResult<()> {
    hyperactor::channel::auth::set_cluster_secret(secret)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Accepts and makes TCP connections without authentication from now on (logs a
/// warning).
#[pyfunction]
pub fn set_trust_all_connections() {
    hyperactor::channel::auth::set_trust_all();
}

/// Uses mutual TLS for this process's TCP connections from now on: `ca` is the PEM file
/// of the cluster's CA certificate(s), `private_key` the PEM file of this node's private
/// key, followed by its certificate chain unless `cert` names a file of its own.
#[pyfunction]
#[pyo3(signature = (ca, private_key, cert = None))]
pub fn set_tls_credentials(
    ca: std::path::PathBuf,
    private_key: std::path::PathBuf,
    cert: Option<std::path::PathBuf>,
) -> PyResult<()> {
    let files = hyperactor::channel::auth::TlsFiles {
        ca,
        cert,
        key: private_key,
    };
    hyperactor::channel::auth::set_tls(&files).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The environment a process needs to use this process's TCP authentication (its
/// TLS files, cluster secret, or trust-all mode).
#[pyfunction]
pub fn cluster_auth_env() -> Vec<(String, String)> {
    hyperactor::channel::auth::child_env()
}

/// The proc id (printed) of the worker whose address is `address` (its advertised
/// part, for `ADVERTISE@BIND`).
#[pyfunction]
pub fn worker_proc_id(address: &str) -> PyResult<String> {
    let addr = WorkerAddress::dial(address).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(hyperactor_mesh::worker::worker_proc_id(&addr).to_string())
}

/// This machine's primary IP address (see `hyperactor::channel::primary_ip`), if any.
#[pyfunction]
pub fn primary_ip() -> Option<String> {
    hyperactor::channel::primary_ip().map(|ip| ip.to_string())
}
