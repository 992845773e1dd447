//! The proc agent: the mesh layer's presence in every process.
//!
//! Every process that takes part in meshes — a client, a proc spawned by a host — runs
//! one [`ProcAgent`] on its [`Proc`]. The agent is a mailbox named [`AGENT_NAME`] with
//! three ports whose handlers run on the task that delivers each message (no hop
//! through another task):
//!
//! - the **cast port** ([`cast_port`]) receives cast frames (see [`crate::cast`]): it
//!   relays them down the tree, opens reducers for `call` replies, puts each sender's
//!   messages back in order (ORD-1) and executes them on the target actor of this proc:
//!   deliver a message, spawn the actor, stop it, or report when it has started;
//! - the **control port** ([`control_port`]) receives control messages: proc deaths
//!   and the output of the procs this process spawned from host agents (see
//!   [`output`]), and, when the agent has a host, requests to spawn, watch and stop
//!   procs;
//! - the **reply port** ([`reply_port`]) receives replies, keyed: to a reducer of a cast
//!   this agent relays, or to a collector of a call made from this process.
//!
//! The agent owns (in the runtime's sense) every actor it spawns, so their failures come
//! to it; it reports each as a [`MeshFailure`](crate::supervision::MeshFailure) to the
//! mesh's owner (MSUP-1). It watches the procs it casts to at their hosts, so a proc's
//! death fails the calls waiting on it at once, releases what waits for it, and reaches
//! the owners of meshes on it.
//!
//! The agent's ids are derived from its proc's id ([`agent_id`] and the port functions),
//! so any process can address the agent of any proc it knows.
//!
//! ```
//! use hyperactor::ChannelTransport;
//! use hyperactor_mesh::agent::{AgentOptions, ProcAgent};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = ProcAgent::serve(ChannelTransport::Unix, "client", AgentOptions::default()).await?;
//! assert_eq!(agent.id().name(), "mesh");
//! assert!(ProcAgent::of(agent.proc().proc_id()).is_some());
//! # Ok(())
//! # }
//! ```

pub(crate) mod address;
mod cast_in;
mod cast_out;
mod control;
pub mod liveness;
mod local;
pub(crate) mod lock;
mod monitor;
pub mod output;
mod replies;
mod supervise;

use hyperactor::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use hyperactor::actor::AnyActorHandle;
use hyperactor::mailbox::DirectPort;
use hyperactor::message::{Envelope, EnvelopeHeader, Serialized, UNDELIVERABLE_PORT};
use hyperactor::{Actor, ActorId, Client, PortId, Proc, ProcId, SendContext};
use serde::de::DeserializeOwned;

pub use address::{agent_id, cast_port, control_port, reply_port, AGENT_NAME};
use address::{CAST_PORT, CONTROL_PORT, REPLY_PORT};
pub use cast_out::{CastOutcome, CastTarget};
pub use control::{
    Control, MemberAnswer, ProcInfo, RelayAnswer, RelayMembers, RelayTarget, SpawnProcsRequest,
};
pub use liveness::Liveness;
pub use local::{ForeignSpawn, ForeignSpawner, Registry};
pub use output::OutputSink;
pub use replies::{CallReplies, ReplyQueue, ReplySink, Waited};

use crate::error::{EndHostError, MeshError, ProbeError, RemoteError};
use crate::host::Host;
use crate::supervision::ProcDeath;

/// How long a stopping actor gets before it is aborted, unless set in [`AgentOptions`].
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The default fan-out of casts sent from this process.
pub const DEFAULT_FANOUT: usize = 16;

/// How much longer than the procs' stop timeout [`ProcAgent::end_host`] waits for the
/// worker's answer.
const END_HOST_SLACK: Duration = Duration::from_secs(2);

/// How long [`ProcAgent::settle_owned`] waits, beyond its timeout, for the host's report
/// of a proc found unreachable (a killed proc's host, busy, may report it late).
pub const SETTLE_UNREACHABLE_WAIT: Duration = Duration::from_secs(5);

/// How an agent is set up.
#[derive(Default)]
pub struct AgentOptions {
    registry: Registry,
    foreign: Option<Arc<dyn ForeignSpawner>>,
    host: Option<Host>,
    stop_timeout: Option<Duration>,
    spawned_by: Option<ProcId>,
    liveness: Liveness,
    on_end: Option<EndHook>,
}

/// What a worker does when a client ends it ([`ProcAgent::end_host`]), after its procs
/// are reaped; called with the client's reason.
pub type EndHook = Arc<dyn Fn(&str) + Send + Sync>;

impl std::fmt::Debug for AgentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentOptions")
            .field("registry", &self.registry)
            .field("foreign", &self.foreign.is_some())
            .field("host", &self.host)
            .field("stop_timeout", &self.stop_timeout)
            .field("spawned_by", &self.spawned_by)
            .field("liveness", &self.liveness)
            .field("on_end", &self.on_end.is_some())
            .finish()
    }
}

impl AgentOptions {
    /// Lets this agent spawn actors of type `A` (see [`Registry::register`]).
    #[must_use]
    pub fn register<A>(mut self) -> Self
    where
        A: Actor,
        A::Params: DeserializeOwned,
    {
        self.registry.register::<A>();
        self
    }

    /// Hands spawns of foreign actors (another language's) to `spawner`.
    #[must_use]
    pub fn foreign(mut self, spawner: Arc<dyn ForeignSpawner>) -> Self {
        self.foreign = Some(spawner);
        self
    }

    /// Makes this agent a host agent: it serves requests to spawn, watch and stop procs
    /// with `host`.
    #[must_use]
    pub fn host(mut self, host: Host) -> Self {
        self.host = Some(host);
        self
    }

    /// Says that this proc was spawned by the host agent on `host` (which watches it):
    /// references to this proc name that host, and [`ProcAgent::spawned_by`] returns it.
    #[must_use]
    pub fn spawned_by(mut self, host: ProcId) -> Self {
        self.spawned_by = Some(host);
        self
    }

    /// The host given with [`AgentOptions::host`].
    pub fn host_ref(&self) -> Option<&Host> {
        self.host.as_ref()
    }

    /// How long a stopping actor gets before it is aborted.
    #[must_use]
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = Some(timeout);
        self
    }

    /// The timing of heartbeats to hosts and of leases on clients' procs (see
    /// [`liveness`]).
    #[must_use]
    pub fn liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = liveness;
        self
    }

    /// Makes this host agent a worker that clients may end ([`ProcAgent::end_host`]):
    /// after stopping every proc of its host it calls `on_end` (which typically makes
    /// the worker process exit). Without it, requests to end the host are refused.
    #[must_use]
    pub fn on_end(mut self, on_end: EndHook) -> Self {
        self.on_end = Some(on_end);
        self
    }
}

/// The agent of this process's proc: see the [module docs](self). Clones share it.
#[derive(Clone)]
pub struct ProcAgent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcAgent({})", self.inner.id)
    }
}

/// The agent's hook into its proc's singleton registry. The registry makes the mesh
/// handles a singleton is (a one-proc `ProcMesh`, the `ActorMeshRef` it answers with),
/// which sit on the layer above the agent: it lives there (`crate::singleton`, which
/// also defines [`ProcAgent::singleton`] and its kin) and fills this hook when it starts
/// an agent ([`ProcAgent::new`]), so the agent never names the mesh handles.
pub(crate) trait SingletonService: Send + Sync + 'static {
    /// A [`Control::Singleton`] request arrived at `agent` (on the delivering task):
    /// answers `reply` with singleton `name` (made of type `class` from `parts` if it
    /// does not exist yet), or why it could not be made.
    fn on_request(
        &self,
        agent: &ProcAgent,
        name: &str,
        class: &str,
        parts: Vec<Bytes>,
        reply: PortId,
    );

    /// The registry itself, for the methods of its module.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The state of one agent: what never changes once it started, and its components.
///
/// Each component owns its state behind one lock of its own, taken only by its methods
/// ([`lock`] checks their order in debug builds): local actors ([`local::LocalActors`]),
/// casts in ([`cast_in::CastsIn`]) and out ([`cast_out::CastsOut`]), the reply router
/// ([`replies::Router`]), proc deaths and supervision ([`supervise::Supervisor`]), host
/// liveness ([`liveness::HostLiveness`]) and output ([`output::OutputForward`]). The
/// host's side, if any, is [`control::HostService`]; the singletons are the layer
/// above's ([`SingletonService`]).
pub(crate) struct Inner {
    proc: Proc,
    client: Client,
    id: ActorId,
    /// This agent's id as a cast sender (ORD-1 sequencing at the receivers).
    sender_id: u64,
    fanout: AtomicUsize,
    stop_timeout: Duration,
    /// How long stopping procs waits for each one's process to exit before its host
    /// kills it, in milliseconds ([`ProcAgent::set_exit_timeout`]); `u64::MAX`: the
    /// stop timeout.
    exit_timeout_ms: AtomicU64,
    /// The agent's three ports, kept open while it lives.
    ports: OnceLock<[DirectPort; 3]>,
    local: local::LocalActors,
    incoming: cast_in::CastsIn,
    casts_out: cast_out::CastsOut,
    replies: replies::Router,
    supervisor: supervise::Supervisor,
    liveness: liveness::HostLiveness,
    output: output::OutputForward,
    /// What ending this worker does; `None` if this agent is not a worker's.
    on_end: Option<EndHook>,
    registry: Registry,
    foreign: Option<Arc<dyn ForeignSpawner>>,
    host: Option<Arc<control::HostService>>,
    spawned_by: Option<ProcId>,
    /// The singletons of this proc (see [`SingletonService`]).
    singletons: Arc<dyn SingletonService>,
}

fn agents() -> &'static Mutex<HashMap<ProcId, Weak<Inner>>> {
    static AGENTS: OnceLock<Mutex<HashMap<ProcId, Weak<Inner>>>> = OnceLock::new();
    AGENTS.get_or_init(Default::default)
}

impl ProcAgent {
    /// Starts the agent of `proc` with `singletons`, its singleton registry (see
    /// [`SingletonService`]): what [`ProcAgent::new`] does, from the layer above.
    ///
    /// # Errors
    ///
    /// As [`ProcAgent::new`].
    pub(crate) fn start(
        proc: Proc,
        options: AgentOptions,
        singletons: Arc<dyn SingletonService>,
    ) -> Result<Self, MeshError> {
        let proc_id = proc.proc_id().clone();
        let mut registered = agents().lock();
        if registered
            .get(&proc_id)
            .is_some_and(|w| w.strong_count() > 0)
        {
            return Err(MeshError::AgentExists { proc: proc_id });
        }
        let client = proc.client(AGENT_NAME).map_err(|source| MeshError::Agent {
            proc: proc_id.clone(),
            source,
        })?;
        let id = client.actor_id().clone();
        if id != agent_id(&proc_id) {
            return Err(MeshError::AgentExists { proc: proc_id });
        }
        let host = options
            .host
            .map(|host| Arc::new(control::HostService::new(host)));
        let inner = Arc::new(Inner {
            proc,
            client,
            id,
            sender_id: random_id(),
            fanout: AtomicUsize::new(DEFAULT_FANOUT),
            stop_timeout: options.stop_timeout.unwrap_or(DEFAULT_STOP_TIMEOUT),
            exit_timeout_ms: AtomicU64::new(u64::MAX),
            ports: OnceLock::new(),
            local: local::LocalActors::default(),
            incoming: cast_in::CastsIn::default(),
            casts_out: cast_out::CastsOut::default(),
            replies: replies::Router::default(),
            supervisor: supervise::Supervisor::default(),
            liveness: liveness::HostLiveness::new(options.liveness),
            output: output::OutputForward::default(),
            on_end: options.on_end,
            registry: options.registry,
            foreign: options.foreign,
            host,
            spawned_by: options.spawned_by,
            singletons,
        });
        Inner::open_ports(&inner)?;
        supervise::start_tasks(&inner);
        if let Some(host) = &inner.host {
            host.start(&inner);
            host.start_leases(inner.liveness.config().lease);
        }
        registered.retain(|_, w| w.strong_count() > 0);
        registered.insert(proc_id, Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// The agent serving `proc` in this process, if any.
    pub fn of(proc: &ProcId) -> Option<Self> {
        let inner = agents().lock().get(proc)?.upgrade()?;
        Some(Self { inner })
    }

    /// The agent's proc.
    pub fn proc(&self) -> &Proc {
        &self.inner.proc
    }

    /// The agent's own mailbox: the runtime owner of the actors it spawns.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The agent's id.
    pub fn id(&self) -> &ActorId {
        &self.inner.id
    }

    /// Whether this agent serves host requests (it has a host).
    pub fn is_host(&self) -> bool {
        self.inner.host.is_some()
    }

    /// The host of this agent, when it is a host agent.
    pub fn host(&self) -> Option<&Host> {
        self.inner.host.as_ref().map(|h| h.host())
    }

    /// The host agent that spawned this proc, if one did.
    pub fn spawned_by(&self) -> Option<&ProcId> {
        self.inner.spawned_by.as_ref()
    }

    /// This proc as a member of a proc mesh (rank 0).
    pub fn self_info(&self) -> ProcInfo {
        ProcInfo {
            rank: 0,
            proc_id: self.inner.proc.proc_id().clone(),
            pid: std::process::id(),
            host: self.inner.spawned_by.clone(),
        }
    }

    /// The singleton registry this agent was started with.
    pub(crate) fn singletons(&self) -> &dyn SingletonService {
        &*self.inner.singletons
    }

    /// Sends `control` to the agent of `proc` (from this agent).
    pub(crate) fn send_control(&self, proc: &ProcId, control: &Control) {
        self.inner.send_control(proc, control);
    }

    /// Stops every proc this host agent spawned (each gets `timeout`, then is killed);
    /// their deaths are expected, not failures. Does nothing without a host.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: procs already asked to stop go on stopping.
    pub async fn shutdown_host(&self, timeout: Duration) {
        if let Some(host) = &self.inner.host {
            host.shutdown(timeout).await;
        }
    }

    /// Monitors `host` (a host agent's proc) with heartbeats, so that its loss fails
    /// the procs of it this agent knows of (see [`liveness`]). Idempotent.
    pub fn monitor_host(&self, host: &ProcId) {
        self.inner.monitor_host(host);
    }

    /// How many heartbeats this agent sent to the hosts it monitors, directly and
    /// through relays (see [`liveness`]).
    pub fn heartbeat_counts(&self) -> liveness::HeartbeatCounts {
        self.inner.liveness.counts()
    }

    /// Sends one heartbeat to the agent of `proc` and waits for its answer: `Ok` once
    /// it answered.
    ///
    /// # Errors
    ///
    /// [`ProbeError::Unreachable`] if its connection failed (refused, authentication
    /// failed, ...), [`ProbeError::Timeout`] if `timeout` passed,
    /// [`ProbeError::NoReply`] if this process stopped waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn probe(&self, proc: &ProcId, timeout: Duration) -> Result<(), ProbeError> {
        let (port, receiver) = self.inner.client.open_once_port::<Control>();
        self.inner.send_control(
            proc,
            &Control::Heartbeat {
                from: port.port_id().clone(),
            },
        );
        let failed = self.remote_link_failed(proc);
        tokio::select! {
            answer = receiver.recv() => answer.map(|_| ()).map_err(|source| ProbeError::NoReply {
                proc: proc.clone(),
                source,
            }),
            source = failed => Err(ProbeError::Unreachable {
                proc: proc.clone(),
                source,
            }),
            () = tokio::time::sleep(timeout) => Err(ProbeError::Timeout {
                proc: proc.clone(),
                timeout,
            }),
        }
    }

    /// Records that `host` is about to end by this process's doing without asking it
    /// (its job is being killed): its loss is then expected and only logged at info
    /// level, as for a host asked to end ([`Self::end_host`]).
    pub fn expect_host_end(&self, host: &ProcId) {
        self.inner.liveness.mark_ending(host);
    }

    /// Asks the worker `host` to stop all its procs (each gets `timeout`) and end
    /// ([`Control::EndHost`]); returns once it answered, its link failed, it was found
    /// lost (it stopped answering heartbeats for [`Liveness::timeout`]), or `timeout`
    /// plus a little slack passed. A host already known lost is neither asked nor waited
    /// on (a request delivered when it comes back could end it while it serves another
    /// client). The host's loss while it ends is not a failure of its procs.
    ///
    /// # Errors
    ///
    /// Why the host did not confirm its end ([`EndHostError`]: unreachable, lost, no
    /// answer in time), or its refusal ([`EndHostError::Refused`]: it is not a worker).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the request stays sent.
    pub async fn end_host(
        &self,
        host: &ProcId,
        reason: &str,
        timeout: Duration,
    ) -> Result<(), EndHostError> {
        if let Some(why) = self.inner.lost_reason(host) {
            return Err(EndHostError::AlreadyLost {
                host: host.clone(),
                reason: why,
            });
        }
        // Watched while it ends, so that one that goes silent is found lost.
        self.inner.monitor_host(host);
        self.inner.liveness.mark_ending(host);
        let (port, receiver) = self
            .inner
            .client
            .open_once_port::<Result<(), RemoteError>>();
        self.inner.send_control(
            host,
            &Control::EndHost {
                reason: reason.to_string(),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                reply: port.port_id().clone(),
            },
        );
        let failed = self.remote_link_failed(host);
        let limit = timeout + END_HOST_SLACK;
        let result = tokio::select! {
            answer = receiver.recv() => match answer {
                Ok(Ok(())) => Ok(()),
                Ok(Err(source)) => Err(EndHostError::Refused {
                    host: host.clone(),
                    source,
                }),
                Err(source) => Err(EndHostError::NoReply {
                    host: host.clone(),
                    source,
                }),
            },
            source = failed => Err(EndHostError::Unreachable {
                host: host.clone(),
                source,
            }),
            why = self.inner.host_lost_wait(host) => Err(EndHostError::Lost {
                host: host.clone(),
                reason: why,
            }),
            () = tokio::time::sleep(limit) => Err(EndHostError::Timeout {
                host: host.clone(),
                timeout: limit,
            }),
        };
        self.inner.unmonitor_host(host);
        result
    }

    /// Waits until this process knows, for every proc running actors of a mesh owned
    /// here that is not stopped, whether it still runs: both the proc and its host
    /// answered a heartbeat sent now, or the proc's death was handled (its failures
    /// reported to their owners), or its host was found lost (which handles the deaths
    /// of its procs). A proc killed, or whose host was killed, before this call has its
    /// failures reported when this returns, whatever the timing of the reports. At most
    /// `timeout` (a frozen proc never answers; a silent host takes [`Liveness::timeout`]
    /// to be found lost), except for a proc found unreachable meanwhile (its link
    /// failed: it died, or its host is going): its host's report of how it ended, which
    /// a busy host may take longer to send, is waited for up to
    /// [`SETTLE_UNREACHABLE_WAIT`] more.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn settle_owned(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let by_host = self.inner.running_owned_procs();
        let waits = by_host.into_iter().map(|(host, procs)| {
            let inner = Arc::clone(&self.inner);
            async move {
                let host_known = async {
                    if let Some(host) = &host {
                        let known = async {
                            tokio::select! {
                                () = inner.answered(host) => {}
                                _ = inner.host_lost_wait(host) => {}
                            }
                        };
                        let _ = tokio::time::timeout_at(deadline, known).await;
                    }
                };
                let procs_known = futures::future::join_all(procs.iter().map(|proc| {
                    let inner = &inner;
                    async move {
                        let known = async {
                            tokio::select! {
                                () = inner.answered(proc) => false,
                                () = inner.death_handled_wait(proc) => false,
                                _ = inner.link_failed_remote(proc) => true,
                            }
                        };
                        if let Ok(true) = tokio::time::timeout_at(deadline, known).await {
                            let reported = inner.death_handled_wait(proc);
                            let _ = tokio::time::timeout(SETTLE_UNREACHABLE_WAIT, reported).await;
                        }
                    }
                }));
                futures::future::join(host_known, procs_known).await;
            }
        });
        futures::future::join_all(waits).await;
    }

    /// Completes with the error when this proc's link to `proc` fails; never for this
    /// agent's own proc, which it reaches without a link.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn remote_link_failed(
        &self,
        proc: &ProcId,
    ) -> hyperactor::channel::ChannelError {
        self.inner.link_failed_remote(proc).await
    }

    /// The fan-out of casts sent from this process.
    pub fn fanout(&self) -> usize {
        self.inner.fanout.load(Ordering::Relaxed)
    }

    /// Sets the fan-out of casts sent from this process (at least 1).
    pub fn set_fanout(&self, fanout: usize) {
        self.inner.fanout.store(fanout.max(1), Ordering::Relaxed);
    }

    /// How long stopping procs (a proc mesh this agent's actors own) waits for each
    /// proc's process to exit after asking it to stop, before its host kills it: the
    /// value of [`ProcAgent::set_exit_timeout`], else the stop timeout
    /// ([`AgentOptions::stop_timeout`]).
    pub fn exit_timeout(&self) -> Duration {
        self.inner.exit_timeout()
    }

    /// Sets [`ProcAgent::exit_timeout`] for the stops that start from now on (`None`:
    /// back to the stop timeout).
    pub fn set_exit_timeout(&self, timeout: Option<Duration>) {
        let ms = timeout.map_or(u64::MAX, |t| {
            u64::try_from(t.as_millis())
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1)
        });
        self.inner.exit_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether `proc` is known to be gone, and how it ended.
    pub fn death_of(&self, proc: &ProcId) -> Option<ProcDeath> {
        self.inner.supervisor.death_of(proc)
    }

    /// Records why the local actor `name` stopped (it stopped itself): calls to it
    /// are then answered with that reason.
    pub fn note_stop_reason(&self, name: &str, reason: &str) {
        self.inner.local.note_stop_reason(name, reason);
    }

    /// The local actor named `name` (spawned by this agent), if it exists.
    pub fn local_actor(&self, name: &str) -> Option<AnyActorHandle> {
        self.inner.local.handle(name)
    }

    /// This proc is stopping (`reason`, e.g. its host asked it to): from now on the
    /// agent refuses to spawn actors. A refused actor counts as stopped here, and the
    /// refusal goes to the agent of its mesh's owner, which reports it to the owner as
    /// a failure unless that process stopped this proc or the mesh itself (a stop it
    /// asked for is not a failure). Idempotent: the first reason is kept.
    pub fn close_spawns(&self, reason: &str) {
        self.inner.local.close(reason);
    }

    /// Sends `parts` from `sender` to `dest` (a plain message, not a cast): failures come
    /// back to the agent (DEL-1) and are logged.
    pub fn post_parts(&self, sender: &ActorId, dest: PortId, parts: Vec<Bytes>) {
        self.inner.post(sender, dest, None, parts);
    }
}

impl Inner {
    /// See [`ProcAgent::exit_timeout`].
    pub(crate) fn exit_timeout(&self) -> Duration {
        match self.exit_timeout_ms.load(Ordering::Relaxed) {
            u64::MAX => self.stop_timeout,
            ms => Duration::from_millis(ms),
        }
    }

    /// Completes with the error when this proc's link to `proc` fails; never for this
    /// agent's own proc, which it reaches without a link.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    async fn link_failed_remote(&self, proc: &ProcId) -> hyperactor::channel::ChannelError {
        if proc == self.proc.proc_id() {
            std::future::pending().await
        } else {
            self.proc.link_failed(proc).await
        }
    }

    /// Sends the agent of `proc` a heartbeat and completes once it answered (never, if
    /// it does not).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    async fn answered(&self, proc: &ProcId) {
        let (port, receiver) = self.client.open_once_port::<Control>();
        self.send_control(
            proc,
            &Control::Heartbeat {
                from: port.port_id().clone(),
            },
        );
        if receiver.recv().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn open_ports(this: &Arc<Self>) -> Result<(), MeshError> {
        let mailbox = this.client.mailbox();
        let weak = Arc::downgrade(this);
        let cast = {
            let weak = weak.clone();
            mailbox.open_direct_port::<Vec<Bytes>>(Arc::new(move |envelope: Envelope| {
                if let Some(inner) = weak.upgrade() {
                    inner.on_cast(envelope);
                }
            }))
        };
        let control = {
            let weak = weak.clone();
            mailbox.open_direct_port::<Vec<Bytes>>(Arc::new(move |envelope: Envelope| {
                if let Some(inner) = weak.upgrade() {
                    inner.on_control(envelope);
                }
            }))
        };
        let reply = mailbox.open_direct_port::<Vec<Bytes>>(Arc::new(move |envelope: Envelope| {
            if let Some(inner) = weak.upgrade() {
                inner.on_reply(envelope.payload.into_parts());
            }
        }));
        let expected = [CAST_PORT, CONTROL_PORT, REPLY_PORT];
        let got = [&cast.1, &control.1, &reply.1].map(|p| p.port_id().index());
        if got != expected {
            return Err(MeshError::AgentExists {
                proc: this.proc.proc_id().clone(),
            });
        }
        let _ = this.ports.set([cast.1, control.1, reply.1]);
        Ok(())
    }

    /// Posts `parts` from `sender` to `dest`; returned messages come to the agent.
    fn post(&self, sender: &ActorId, dest: PortId, extra: Option<Bytes>, parts: Vec<Bytes>) {
        self.proc.post(Envelope {
            header: EnvelopeHeader {
                sender: sender.clone(),
                dest,
                return_to: Some(self.id.port_id(UNDELIVERABLE_PORT)),
                extra,
            },
            payload: Serialized::from_parts(parts),
        });
    }

    fn reply_port(&self) -> PortId {
        self.id.port_id(REPLY_PORT)
    }
}

/// A random id (std's hasher keys are random per process; mixed with the pid and the
/// time, so that two agents of one process differ too).
pub fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}
