"""Typed interface of ``monarch._rust_bindings``, the compiled extension module.

Built from the ``monarch_extension`` crate by maturin; ``make stubtest`` checks this file
against the built module.
"""

import asyncio
from collections.abc import Generator, ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from types import GenericAlias
from typing import (
    Any,
    ClassVar,
    Final,
    Generic,
    Literal,
    TypedDict,
    TypeVar,
    final,
    type_check_only,
)

__all__ = [
    "DELIVERY_CALL",
    "DELIVERY_ENDED",
    "DELIVERY_SKIP",
    "DELIVERY_STOP",
    "DELIVERY_SUPERVISE",
    "PYTHON_MESSAGE_PORT",
    "REPLY_ERROR",
    "REPLY_FAILED",
    "REPLY_OK",
    "REPLY_STOPPED",
    "ActorMeshHandle",
    "AdminConfig",
    "AdminServer",
    "CallReplies",
    "CastMode",
    "Client",
    "Delivery",
    "DeliveryKind",
    "DrivenActor",
    "Extent",
    "Future",
    "HostMeshHandle",
    "MeshFailure",
    "MessageTooLarge",
    "OutputReceiver",
    "Point",
    "PortHandle",
    "PortReceiver",
    "PortRef",
    "Proc",
    "ProcAgent",
    "ProcMeshHandle",
    "RdmaDropped",
    "RdmaOwnerGone",
    "RdmaRegion",
    "ReplyItem",
    "ReplyQueue",
    "ReplyStatus",
    "Shape",
    "Slice",
    "WouldBlockRuntime",
    "__version__",
    "_prepare_exit",
    "build_info",
    "cluster_auth_env",
    "find",
    "lend_bytearray",
    "max_message_len",
    "monitor_events",
    "monitor_kill_proc",
    "monitor_logs",
    "monitor_record_event",
    "monitor_snapshot",
    "monitor_stack",
    "monitor_stack_fd",
    "primary_ip",
    "rdma_allow_peer_access",
    "rdma_check_live",
    "rdma_choose",
    "rdma_deregister",
    "rdma_drop_remote",
    "rdma_host_key",
    "rdma_ibverbs_probe",
    "rdma_ibverbs_register",
    "rdma_read",
    "rdma_register",
    "rdma_register_device",
    "rdma_registered",
    "rdma_serve",
    "rdma_write",
    "set_call_spin",
    "set_channel_settings",
    "set_cluster_secret",
    "set_max_frame_len",
    "set_tls_credentials",
    "set_trust_all_connections",
    "worker_proc_id",
]

_R_co = TypeVar("_R_co", covariant=True)

__version__: str
"""The version of the ``monarch_extension`` crate, equal to the package version."""

@type_check_only
class _BuildInfo(TypedDict):
    version: str
    profile: Literal["debug", "release"]
    target: str
    rustc: str

def _prepare_exit() -> None:
    """Called at interpreter exit (registered by ``monarch``): stop runtime threads from
    entering Python, and wait for those inside to leave."""

def build_info() -> _BuildInfo:
    """Describe how this extension was built, for bug reports.

    Returns a new dict with the keys ``version``, ``profile`` (``"debug"`` or
    ``"release"``), ``target`` (the Rust target triple) and ``rustc`` (the compiler
    version).
    """

def max_message_len() -> int:
    """The largest payload (the sum of a message's parts, in bytes) a message may have in
    this process: the largest frame less room for the headers."""

def set_max_frame_len(len: int) -> int:
    """Set the largest frame this process sends or accepts, in bytes (the
    ``codec_max_frame_length`` config key); only before the first message. Returns the
    largest frame in force (another value if it was fixed already)."""

def set_channel_settings(
    delivery_timeout: float | None = None,
    tcp_keepalive_idle: float | None = None,
    tcp_congestion: str | None = None,
) -> None:
    """Set this process's channel settings for the links and connections made from now
    on: ``delivery_timeout`` (``message_delivery_timeout``) and ``tcp_keepalive_idle``
    (``channel_tcp_keepalive_idle``) in seconds (``None``: no limit, the kernel's
    default), ``tcp_congestion`` (``channel_tcp_congestion``; empty or ``None``: the
    kernel's default). ``ValueError`` for a negative or infinite duration."""

def set_call_spin(seconds: float) -> None:
    """Set the longest a thread of this process blocked on a call's replies spins before
    it sleeps, in seconds (``call_spin``; 0: never). ``ValueError`` for a negative or
    infinite duration."""

def set_cluster_secret(secret: str) -> None:
    """Authenticate this process's TCP connections with ``secret`` from now on."""

def set_trust_all_connections() -> None:
    """Accept and make TCP connections without authentication (logs a warning)."""

def set_tls_credentials(ca: str, private_key: str, cert: str | None = None) -> None:
    """Authenticate (and encrypt) this process's TCP connections with mutual TLS from now
    on: ``ca`` is the PEM file of the cluster's CA certificate(s), ``private_key`` the PEM
    file of this node's private key, followed by its certificate chain unless ``cert``
    names a file of its own. Raises ``ValueError`` naming the file that cannot be used."""

def cluster_auth_env() -> list[tuple[str, str]]:
    """The environment that makes a process use this process's TCP authentication."""

def worker_proc_id(address: str) -> str:
    """The proc id of the worker at ``address``."""

# Monitoring (JSON strings in the shapes of the monitoring API, version 1).

def monitor_snapshot(timeout_s: float) -> str:
    """Snapshot of every host, proc, mesh and actor this process knows (JSON)."""

def monitor_events(since: int = 0, limit: int = 1000) -> str:
    """Events with ``seq > since``, oldest first: ``{"version", "items", "next"}``."""

def monitor_logs(q: str | None = None, proc: str | None = None, limit: int = 200) -> str:
    """Kept proc output lines matching ``q`` (case-insensitive): ``{"version", "items"}``."""

def monitor_stack(proc: str, timeout_s: float) -> str:
    """Stacks of every thread of ``proc``: ``{"proc", "pid", "method", "text"}``."""

def monitor_kill_proc(proc: str, reason: str | None = None) -> None:
    """Kill ``proc`` through its host (an admin action); ``reason`` defaults to "killed
    from the admin"."""

def monitor_record_event(
    kind: str,
    message: str,
    mesh: str | None = None,
    actor: str | None = None,
    proc: str | None = None,
    rank: int | None = None,
) -> int:
    """Record an event (``breakpoint``, say); returns its sequence number."""

def monitor_stack_fd() -> tuple[int, int]:
    """``(fd, signal)`` for ``faulthandler.register`` (stack dumps on request)."""

def primary_ip() -> str | None:
    """This machine's primary IP address (never a loopback address), if any."""

# --- monarch.rdma ---------------------------------------------------------------------

@final
class RdmaRegion:
    """A registered region of some process's memory; pickles to its fields."""

    def __new__(cls, pid: int, id: int, addr: int, len: int, key: int, slot: int) -> RdmaRegion: ...
    @property
    def pid(self) -> int:
        """The owner's process id (on the owner's host)."""
    @property
    def id(self) -> int:
        """The registration id, unique within the owner process."""
    @property
    def addr(self) -> int:
        """The start address, in the owner's address space."""
    @property
    def len(self) -> int:
        """The length in bytes."""
    @property
    def key(self) -> int:
        """The registration's secret, which a peer presents to name it over a socket."""
    @property
    def slot(self) -> int:
        """Where the registration's liveness slot lies in the owner's memory (0: unknown)."""
    def with_len(self, len: int) -> RdmaRegion:
        """The same region, its first ``len`` bytes only (``ValueError`` if larger)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[RdmaRegion], tuple[int, int, int, int, int, int]]: ...

class RdmaOwnerGone(RuntimeError):
    """The owner of a registered buffer is gone or cannot be reached."""

class RdmaDropped(RuntimeError):
    """The registered buffer was dropped by its owner."""

def rdma_register(addr: int, len: int, keepalive: object) -> RdmaRegion:
    """Register ``[addr, addr + len)`` of this process in place; ``keepalive`` (what
    owns the memory) is held until the registration ends."""

def rdma_register_device(addr: int, len: int, keepalive: object) -> RdmaRegion:
    """Register device (CUDA) memory: host-memory paths refuse it."""

def rdma_deregister(id: int) -> bool:
    """End registration ``id`` of this process; whether it was registered."""

def rdma_registered() -> int:
    """How many regions this process has registered."""

def rdma_serve() -> str:
    """Start this process's transfer server (once); the address peers dial."""

def rdma_host_key() -> str:
    """This process's host identity: boot id, pid and network namespaces."""

def rdma_choose(
    region: RdmaRegion,
    host: str,
    rkey: int | None,
    allow_tcp: bool,
    disable_ibverbs: bool,
) -> Literal["cma", "ibverbs", "tcp"]:
    """The backend to a CPU buffer of ``host``; ``RuntimeError`` when none may be used."""

def rdma_check_live(region: RdmaRegion) -> None:
    """Check one-sided that a region of a process on this host is still registered."""

def rdma_allow_peer_access() -> None:
    """Let processes of the same user reach this process's registered memory."""

def rdma_ibverbs_probe(disabled: bool = False) -> tuple[bool, list[str], str | None]:
    """``(available, devices, reason)`` of the ibverbs probe."""

def rdma_ibverbs_register(region: RdmaRegion) -> int:
    """Register a live region with the RDMA device for peers; its rkey."""

def rdma_read(
    what: str,
    region: RdmaRegion,
    via: Literal["cma", "tcp", "ibverbs"],
    server: str | None,
    dst: int,
    keepalive: object,
    timeout: float | None,
    parallelism: int,
    chunk_bytes: int,
    rkey: int | None = None,
) -> Future[None]:
    """A lazy future copying the remote region into local memory at ``dst``."""

def rdma_write(
    what: str,
    region: RdmaRegion,
    via: Literal["cma", "tcp", "ibverbs"],
    server: str | None,
    src: int,
    keepalive: object,
    timeout: float | None,
    parallelism: int,
    chunk_bytes: int,
    rkey: int | None = None,
) -> Future[None]:
    """A lazy future copying local memory at ``src`` into the remote region."""

def rdma_drop_remote(region: RdmaRegion, server: str, timeout: float) -> Future[bool]:
    """A lazy future asking the owner to end the registration."""

def lend_bytearray(len: int) -> bytearray:
    """A ``bytearray`` of ``len`` bytes (contents arbitrary) to snapshot a writable buffer
    into before sending it as a message part: recycled when a free one of that length
    exists."""

def find(haystack: bytes, needle: bytes) -> int:
    """The index of the first occurrence of ``needle`` in ``haystack``, or -1 (as
    ``bytes.find``, with a vectorized search)."""

@final
class ReplyStatus:
    """What a reply is: the handler's value; its error (the actor lives on); the
    receiver cannot answer (failed, died, unreachable); it was stopped. Compares equal
    to its code (``ReplyStatus.ERROR == 1``). The statuses of reply items are these
    members themselves."""

    OK: ClassVar[ReplyStatus]
    ERROR: ClassVar[ReplyStatus]
    FAILED: ClassVar[ReplyStatus]
    STOPPED: ClassVar[ReplyStatus]
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

#: The names of earlier releases: aliases of ``ReplyStatus``'s members.
REPLY_OK: Final[ReplyStatus]
REPLY_ERROR: Final[ReplyStatus]
REPLY_FAILED: Final[ReplyStatus]
REPLY_STOPPED: Final[ReplyStatus]

@final
class DeliveryKind:
    """What a ``Delivery`` is: a call; a failure of an owned mesh; a stop; the actor
    ended; nothing to do (a message the runtime dealt with already). ``Delivery.kind``
    is one of these members itself."""

    CALL: ClassVar[DeliveryKind]
    SUPERVISE: ClassVar[DeliveryKind]
    STOP: ClassVar[DeliveryKind]
    ENDED: ClassVar[DeliveryKind]
    SKIP: ClassVar[DeliveryKind]
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

#: The names of earlier releases: aliases of ``DeliveryKind``'s members.
DELIVERY_CALL: Final[DeliveryKind]
DELIVERY_SUPERVISE: Final[DeliveryKind]
DELIVERY_STOP: Final[DeliveryKind]
DELIVERY_ENDED: Final[DeliveryKind]
DELIVERY_SKIP: Final[DeliveryKind]

@final
class CastMode:
    """What a cast to an actor mesh collects: nothing (``BROADCAST``); a reply per
    rank, reduced over the tree (``CALL``); one reply (``ONE``, ``CHOOSE``); replies in
    arrival order (``STREAM``); replies sent to a port (``PORT``)."""

    BROADCAST: ClassVar[CastMode]
    CALL: ClassVar[CastMode]
    ONE: ClassVar[CastMode]
    CHOOSE: ClassVar[CastMode]
    STREAM: ClassVar[CastMode]
    PORT: ClassVar[CastMode]
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class ReplyItem:
    """One rank's reply."""

    @property
    def index(self) -> int:
        """The replying rank's index in the view the call was cast to."""
    @property
    def status(self) -> ReplyStatus:
        """What the reply is."""
    @property
    def parts(self) -> list[bytes]:
        """The value's parts (a pickle, then its out-of-band buffers); for ``FAILED``
        and ``STOPPED``, the reason (UTF-8)."""

#: The port of a Python actor that takes its calls (a message's parts: the endpoint's
#: name, the pickled arguments, their out-of-band buffers).
PYTHON_MESSAGE_PORT: Final[int]

class MessageTooLarge(ValueError):
    """A message is over the largest message size a channel carries (the
    ``codec_max_frame_length`` config key): it was not sent."""

class WouldBlockRuntime(RuntimeError):
    """A blocking call (such as ``Future.get()``) was made on a thread of Monarch's tokio
    runtime, where blocking would stall the runtime. Await instead, or block from a thread
    of your own."""

@final
class Future(Generic[_R_co]):
    """The result of work running on Monarch's tokio runtime.

    Not user-constructible (``TypeError``). The work is lazy: it starts the first time
    someone waits. The result, or the exception, is cached: repeated waits return the
    same object or re-raise the same exception object.
    """

    def get(self, timeout: float | None = None) -> _R_co:
        """Block until the result is ready, without holding the GIL, and return it.

        ``timeout`` (seconds, finite and >= 0) raises ``TimeoutError`` if the work is not
        done by then; the work keeps running, and a later ``get()`` or ``await`` still
        sees its result. A negative or non-finite timeout raises ``ValueError``. Called on
        a thread running an asyncio loop it still works but warns (``UserWarning``); on a
        tokio runtime thread it raises ``WouldBlockRuntime``.
        """

    def result(self, timeout: float | None = None) -> _R_co:
        """Same as ``get``."""

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like ``get``; return the work's exception, or ``None`` if it succeeded."""

    def as_asyncio(self) -> asyncio.Future[_R_co]:
        """A new ``asyncio.Future`` on the running loop that completes with this future
        (``RuntimeError`` without a running loop)."""

    def __await__(self) -> Generator[Any, None, _R_co]:
        """Await the result on any running asyncio loop, any number of times
        (``ValueError`` without a running loop). The loop is never blocked."""

    def __class_getitem__(cls, key: Any) -> GenericAlias:
        """``Future[int]`` is valid at runtime."""

@final
class Proc:
    """A hyperactor proc: it serves one channel address and routes messages.

    No public constructor: use ``Proc.serve``.
    """

    @staticmethod
    def serve(transport: Literal["local", "unix", "ipc", "tcp"], name: str = "proc") -> Proc:
        """Start a proc listening on a fresh address of ``transport``.

        ``ValueError`` for an unknown transport or an invalid name; ``RuntimeError`` if the
        address cannot be bound.
        """

    @property
    def proc_id(self) -> str:
        """This proc's id, its address included."""

    def client(self, name: str = "client") -> Client:
        """A new client (a mailbox that is not an actor) on this proc."""

@final
class Client:
    """A mailbox on a proc for code that is not an actor: it sends and opens ports."""

    @property
    def actor_id(self) -> str:
        """This client's actor id."""

    def next_supervision(self, timeout: float | None = None) -> MeshFailure | None:
        """The next failure of a mesh this client owns, or None."""

    def take_supervision(self, timeout: float | None = None) -> MeshFailure | None:
        """The next failure of a mesh this client owns, marked in hand until
        ``supervision_judged()``; None once drained, closed, or after ``timeout``."""

    def supervision_judged(self) -> None:
        """The failure ``take_supervision`` handed out is judged."""

    def drain_supervision(self, taker: bool = False) -> list[MeshFailure]:
        """End ``take_supervision``, wait until no failure it handed out is being judged
        (unless ``taker``), and return the failures still waiting."""

    def open_port(self) -> tuple[PortRef, PortReceiver]:
        """Open a streaming port on this client's mailbox, carrying lists of byte parts."""

@final
class PortRef:
    """A reference to a port, to send to. Picklable; its ``str`` is the port id."""

    @staticmethod
    def from_string(port_id: str) -> PortRef:
        """Parse a port id (the ``str`` of a ``PortRef``); ``ValueError`` if malformed."""

    def send(self, client: Client, parts: Sequence[bytes | bytearray] | bytes) -> None:
        """Send one message, ``bytes`` or a list of ``bytes`` parts (kept apart on the
        wire), from ``client``. Never waits. ``TypeError`` for anything else."""

    def __reduce__(self) -> tuple[Any, tuple[str]]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class PortReceiver:
    """The receiving end of a port opened by ``Client.open_port()``."""

    @property
    def port_id(self) -> str:
        """The id of the port (the ``str`` of its ``PortRef``)."""

    def recv(self) -> Future[list[bytes]]:
        """The next message, as a lazy future of its byte parts. Raises ``RuntimeError``
        naming the port once the port is closed."""

    def close(self) -> None:
        """Close the port: pending and later ``recv()`` futures raise ``RuntimeError``;
        messages sent to the port later go back to their senders."""

@final
class ProcAgent:
    """This process's mesh agent (see monarch_extension/src/agent.rs)."""

    @staticmethod
    def serve_root(
        transport: Literal["unix", "ipc", "tcp", "tcp-localhost"] | str = "unix",
        ready_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        heartbeat_interval: float = 0.25,
        heartbeat_timeout: float = 2.0,
        client_lease: float = 10.0,
        log_dir: str | None = None,
    ) -> ProcAgent:
        """Serve the root client's proc, with this machine's host agent; procs' log
        files go to ``log_dir`` (default: a per-user folder under the temp dir)."""

    @staticmethod
    def serve_worker(
        address: str,
        ready_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        heartbeat_interval: float = 0.25,
        heartbeat_timeout: float = 2.0,
        client_lease: float = 10.0,
        log_dir: str | None = None,
    ) -> ProcAgent:
        """Serve a worker (a host agent for clients on other machines) at ``address``;
        procs' log files go to ``log_dir`` (default: a per-user folder under the temp
        dir)."""

    @staticmethod
    def attach_root(
        address: str,
        stop_timeout: float = 10.0,
        heartbeat_interval: float = 0.25,
        heartbeat_timeout: float = 2.0,
        client_lease: float = 10.0,
    ) -> ProcAgent:
        """Start the root client's proc attached to the gateway (a worker) at
        ``address``: every message goes through it; no host of its own."""

    @property
    def gateway(self) -> str | None:
        """The gateway this proc is attached to (the address it dialed), if any."""

    @staticmethod
    def bootstrap(
        transport: Literal["auto", "unix", "ipc", "tcp"] = "auto",
        stop_timeout: float = 10.0,
        heartbeat_interval: float = 0.25,
        heartbeat_timeout: float = 2.0,
        client_lease: float = 10.0,
    ) -> ProcAgent:
        """Serve this proc, started by a host agent."""

    def report_ready(self) -> None:
        """Tell the host that spawned this proc that it is ready."""

    def wait_for_stop(self) -> None:
        """Block until the host asks this proc to stop."""

    @property
    def log_dir(self) -> str | None:
        """Where this host agent's host writes its procs' log files."""
    @property
    def proc_id(self) -> str:
        """The agent's proc id, printed."""

    @property
    def boot_rank(self) -> tuple[int, int]:
        """This proc's rank in its spawn and the spawn's size."""

    def client(self, name: str) -> Client:
        """A new client mailbox on this proc."""

    def set_singleton_owner(self, client: Client) -> None:
        """Make `client` the owner of singletons other processes ask for."""

    def next_spawn(self, timeout: float | None = None) -> DrivenActor | None:
        """The next Python actor to host, or None."""

    def singleton(
        self,
        sender: Client | DrivenActor,
        root: str | None,
        name: str,
        class_name: str,
        parts: Sequence[bytes | bytearray] | bytes,
    ) -> Future[ActorMeshHandle]:
        """The root process's singleton actor `name`, spawned on first request."""

    def reply_queue(self) -> ReplyQueue:
        """A new queue of replies in arrival order."""

    def close_spawns(self, reason: str = "its process is shutting down") -> None:
        """Refuse new actors from now on: this process is stopping (``reason``)."""

    fanout: int

    @property
    def exit_timeout(self) -> float:
        """How long stopping procs waits for each one's process to exit after asking it
        to stop, before its host kills it, in seconds (``process_exit_timeout``); unless
        set, the stop timeout. Set ``None`` to go back to the stop timeout."""

    @exit_timeout.setter
    def exit_timeout(self, seconds: float | None) -> None: ...
    def this_host(self) -> HostMeshHandle:
        """This machine's host as a host mesh."""

    def this_proc(self) -> ProcMeshHandle:
        """This process's proc as a proc mesh."""

    def shutdown_host(self, timeout: float) -> None:
        """Stop every proc this host spawned."""

    def settle_owned(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until this process knows, for every proc
        running actors of a mesh it owns, whether it still runs; the failures of those
        that died are then reported."""

    def running_pids(self) -> list[int]:
        """The pids of the procs this host spawned that still run."""

    @staticmethod
    def remove_socket_files() -> int:
        """Remove the socket files this process serves."""

@final
class DrivenActor:
    """A Python actor hosted by the runtime."""

    @property
    def actor_id(self) -> str: ...
    @property
    def proc_id(self) -> str: ...
    @property
    def mesh_name(self) -> str: ...
    @property
    def mesh_id(self) -> int: ...
    @property
    def class_name(self) -> str: ...
    @property
    def rank(self) -> int: ...
    def extent(self) -> Extent:
        """The extent of the proc mesh the actor was spawned on."""

    @property
    def creator(self) -> str: ...
    @property
    def creator_name(self) -> str: ...
    def spawn_parts(self) -> list[bytes]:
        """The pickled class, then the pickled arguments."""

    def next(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery, or None on timeout."""

    def try_next(self) -> Delivery | None:
        """The next delivery if one is queued."""

    def next_async(self) -> Future[Delivery]:
        """The next delivery, as a future to await."""

    def started(self) -> None: ...
    def idle(self) -> None: ...
    def fail(self, reason: str, cause: MeshFailure | None = None) -> bool: ...
    def stopped(self, reason: str | None = None) -> bool: ...
    def request_stop(self) -> bool:
        """Ask the actor to stop after the messages queued so far (a ``STOP`` delivery
        follows them). False if it had ended."""
    @property
    def status(self) -> str: ...
    def stop_owned(self, reason: str) -> None:
        """Stop the meshes this actor owns."""

@final
class Delivery:
    """One item of a driven actor's queue."""

    @property
    def kind(self) -> DeliveryKind: ...
    @property
    def method(self) -> str: ...
    @property
    def malformed(self) -> str | None: ...
    @property
    def args(self) -> list[bytes]: ...
    @property
    def index(self) -> int: ...
    @property
    def hops(self) -> int: ...
    def extent(self) -> Extent: ...
    @property
    def has_reply(self) -> bool: ...
    @property
    def failure(self) -> MeshFailure | None: ...
    def reply(
        self, status: ReplyStatus | int, parts: Sequence[bytes | bytearray] | bytes
    ) -> None: ...
    def port(self) -> PortHandle | None: ...

@final
class HostMeshHandle:
    """A mesh of hosts."""

    def extent(self) -> Extent: ...
    def spawn_procs(
        self,
        sender: Client | DrivenActor,
        name: str,
        per_host: Extent,
        commands: list[tuple[str, list[str], list[tuple[str, str]]]],
        fork_server: list[str] | None = None,
        forward_output: bool = True,
        log_files: bool = True,
        tail_lines: int = 20,
    ) -> ProcMeshHandle:
        """Start the procs, each running a ``(program, args, env)`` of ``commands``: one
        for every proc (forked from ``program fork_server...`` when given), or one per
        proc of the proc mesh, by rank. Their output comes to this process unless
        ``forward_output`` is false, and goes to per-proc log files with ``log_files``;
        each host keeps the last ``tail_lines`` lines of each proc's stderr (shown when
        a proc exits before it is ready)."""
    def abandon(self) -> None:
        """Record that these hosts are about to end by this process's doing."""
    def end_workers(
        self, sender: Client | DrivenActor, reason: str, timeout: float
    ) -> Future[list[str]]:
        """End the workers (each stops its procs and exits); resolves to the failures."""
    @staticmethod
    def attached(addresses: list[str], extent: Extent, timeout: float) -> HostMeshHandle:
        """The workers at ``addresses``; first contact in the background."""
    def hosts(self) -> list[str]: ...
    def view(self, shape: Shape) -> HostMeshHandle: ...
    def probe(self) -> Future[bool]: ...
    @staticmethod
    def _from_bytes(data: bytes) -> HostMeshHandle: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class ProcMeshHandle:
    """A view of a proc mesh that may still be starting."""

    @property
    def name(self) -> str: ...
    @property
    def mesh_id(self) -> int | None:
        """The proc mesh's id once its procs are ready, else ``None``."""
    def view(self, shape: Shape) -> ProcMeshHandle: ...
    def wait_ready(self, timeout: float | None = None) -> None: ...
    def is_ready(self) -> bool: ...
    def initialized(self) -> Future[bool]: ...
    def pids(self) -> list[int]: ...
    def proc_ids(self) -> list[str]: ...
    def spawn(
        self,
        sender: Client | DrivenActor,
        name: str,
        class_name: str,
        parts: Sequence[bytes | bytearray] | bytes,
    ) -> ActorMeshHandle: ...
    def abandon(self) -> None:
        """Mark the mesh stopped without stopping its procs (they end with their hosts)."""
    def stop(self, sender: Client | DrivenActor, reason: str) -> Future[None]: ...
    def error(self) -> str | None: ...
    @staticmethod
    def compose(
        name: str, extent: Extent, members: Sequence[ProcMeshHandle], timeout: float | None = None
    ) -> ProcMeshHandle:
        """A new proc mesh of running procs: rank ``i`` is the one proc of
        ``members[i]``; stopping it stops the meshes that spawned them."""
    @staticmethod
    def _from_bytes(data: bytes) -> ProcMeshHandle: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class ActorMeshHandle:
    """A view of a mesh of Python actors."""

    @property
    def name(self) -> str: ...
    @property
    def class_name(self) -> str: ...
    @property
    def mesh_id(self) -> int: ...
    def view(self, shape: Shape) -> ActorMeshHandle: ...
    def cast(
        self,
        sender: Client | DrivenActor,
        method: str,
        parts: Sequence[bytes | bytearray] | bytes,
        mode: CastMode,
        port: PortHandle | None = None,
        index: int | None = None,
        count: int | None = None,
    ) -> CallReplies | ReplyQueue | None: ...
    def stop(self, sender: Client | DrivenActor, reason: str, count: int) -> CallReplies: ...
    def probe(self, sender: Client | DrivenActor, count: int) -> CallReplies: ...
    @staticmethod
    def _from_bytes(data: bytes) -> ActorMeshHandle: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class CallReplies:
    """The replies of one call."""

    def get(self, timeout: float | None = None) -> list[ReplyItem]: ...
    def wait(self) -> Future[list[ReplyItem]]: ...
    def done(self) -> bool: ...
    @property
    def messages(self) -> int: ...

@final
class ReplyQueue:
    """Replies in arrival order."""

    def get(self, timeout: float | None = None) -> ReplyItem: ...
    def try_get(self) -> ReplyItem | None: ...
    def recv(self) -> Future[ReplyItem]: ...
    def port(self, index: int = 0) -> PortHandle: ...

@final
class PortHandle:
    """Where a reply goes; picklable."""

    @property
    def index(self) -> int: ...
    def send(
        self,
        sender: Client | DrivenActor,
        status: ReplyStatus | int,
        parts: Sequence[bytes | bytearray] | bytes,
    ) -> None: ...
    @staticmethod
    def _from_bytes(data: bytes) -> PortHandle: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class OutputReceiver:
    """The client's queue of its procs' output (monarch_extension/src/output.rs)."""

    @staticmethod
    def install(prefix: bool = True) -> OutputReceiver:
        """Make this process's agent queue its procs' output instead of printing it."""
    def next(self, timeout: float | None = None) -> list[tuple[bool, str]] | None:
        """For the writer thread: ``(is_stderr, text)`` runs to write (the previous ones
        count as written); ``[]`` after ``timeout``; ``None`` once closed."""
    def set_mode(self, mesh_id: int, stream: bool, aggregate_window: float | None = None) -> None:
        """How the output of proc mesh ``mesh_id`` is shown."""
    def mode(self, mesh_id: int) -> tuple[bool, float | None]:
        """``(stream, aggregate_window)`` of proc mesh ``mesh_id``."""
    def flush(self, timeout: float = 1.0, host: bool = True) -> bool:
        """Wait until the writer wrote what was queued; False on timeout."""
    def close(self) -> None:
        """Make the writer's ``next()`` return ``None``."""

@final
class MeshFailure:
    """A failure of one rank of an actor mesh."""

    @property
    def mesh_name(self) -> str: ...
    @property
    def mesh_id(self) -> int: ...
    @property
    def class_name(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def proc_id(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def actor_id(self) -> str | None: ...
    @property
    def reason(self) -> str: ...
    @property
    def cause(self) -> MeshFailure | None: ...
    @property
    def path(self) -> str | None: ...
    def with_path(self, path: str) -> MeshFailure: ...
    def attribution(self) -> str: ...
    def headline(self) -> str: ...
    def report(self) -> str: ...
    @staticmethod
    def _from_bytes(data: bytes) -> MeshFailure: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class Extent(Mapping[str, int]):
    """The ordered, named sizes of a mesh: a ``Mapping`` from dimension label to size
    (registered as a ``collections.abc.Mapping``).

    ``TypeError`` for a label that is not a ``str`` (or labels given as one ``str``) or a
    size that is not an ``int``; ``ValueError`` for a count mismatch, a negative size or a
    repeated label. An unknown label raises ``ValueError`` (not ``KeyError``).
    """

    def __new__(cls, labels: Sequence[str], sizes: Sequence[int]) -> Extent: ...
    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a fresh list)."""

    @property
    def sizes(self) -> list[int]:
        """The dimension sizes, in label order (a fresh list)."""

    @property
    def nelements(self) -> int:
        """The number of points: the product of the sizes (1 with no dimensions)."""

    @property
    def region(self) -> Shape:
        """The dense, row-major region this extent spans, as a ``Shape`` at offset 0."""

    def __getitem__(self, label: str, /) -> int: ...
    def __contains__(self, label: object, /) -> bool: ...
    def get(self, label: str, default: Any = None) -> Any:
        """``self[label]``, or ``default`` when there is no such dimension."""

    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def keys(self) -> KeysView[str]:
        """A ``KeysView`` of the labels."""

    def values(self) -> ValuesView[int]:
        """A ``ValuesView`` of the sizes."""

    def items(self) -> ItemsView[str, int]:
        """An ``ItemsView`` of ``(label, size)`` pairs."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Extent], tuple[list[str], list[int]]]: ...

@final
class Point(Mapping[str, int]):
    """A position in a mesh: a ``Mapping`` from dimension label to coordinate
    (registered as a ``collections.abc.Mapping``).

    ``rank`` is the row-major linear index of the point within ``extent``. ``TypeError``
    if ``rank`` is not an ``int`` or ``extent`` not an ``Extent``; ``IndexError`` unless
    ``0 <= rank < extent.nelements``. An unknown label raises ``ValueError``.
    """

    def __new__(cls, rank: int, extent: Extent) -> Point: ...
    @property
    def rank(self) -> int:
        """The row-major linear index of this point within ``extent``."""

    @property
    def extent(self) -> Extent:
        """The extent this point lies in."""

    def size(self, label: str) -> int:
        """The size of dimension ``label`` of ``extent`` (``ValueError`` if unknown)."""

    def __getitem__(self, label: str, /) -> int: ...
    def __contains__(self, label: object, /) -> bool: ...
    def get(self, label: str, default: Any = None) -> Any:
        """``self[label]``, or ``default`` when there is no such dimension."""

    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def keys(self) -> KeysView[str]:
        """A ``KeysView`` of the labels."""

    def values(self) -> ValuesView[int]:
        """A ``ValuesView`` of the coordinates."""

    def items(self) -> ItemsView[str, int]:
        """An ``ItemsView`` of ``(label, coordinate)`` pairs."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]: ...

@final
class Slice:
    """An ``offset`` plus per-dimension ``sizes`` and ``strides`` over global ranks: local
    coordinate ``(c_0, ..., c_n)`` is global rank ``offset + sum(c_i * strides[i])``, and
    local indices enumerate coordinates in row-major order.

    ``TypeError`` for a value that is not an int; ``ValueError`` for a negative offset or
    size, a stride below 1, or not one stride per size.
    """

    def __new__(cls, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Slice: ...
    @staticmethod
    def _from_parts(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Slice:
        """Rebuild a pickled ``Slice`` (the constructor takes keywords only)."""

    @staticmethod
    def new_row_major(sizes: Sequence[int], offset: int | None = None) -> Slice:
        """A dense slice over ``sizes`` starting at ``offset`` (default 0; row-major
        strides)."""

    @property
    def offset(self) -> int:
        """The global rank of local index 0."""

    @property
    def sizes(self) -> list[int]:
        """The per-dimension sizes (a fresh list)."""

    @property
    def strides(self) -> list[int]:
        """The per-dimension strides, in global ranks (a fresh list)."""

    @property
    def ndim(self) -> int:
        """The number of dimensions."""

    def __len__(self) -> int: ...
    def is_dense(self) -> bool:
        """Whether the slice covers ``len(self)`` consecutive global ranks in order.
        Dimensions of size 1 do not matter; an empty slice is dense."""

    def __getitem__(self, index: int, /) -> int:
        """The global rank at local (row-major) ``index`` (``IndexError`` out of range)."""

    def __iter__(self) -> Iterator[int]: ...
    def ranks(self) -> list[int]:
        """The global ranks covered, in local (row-major) order."""

    def index(self, rank: int) -> int:
        """The local (row-major) index of global ``rank`` (``ValueError`` if not
        covered)."""

    def __contains__(self, rank: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[Any, tuple[int, list[int], list[int]]]: ...

@final
class Shape:
    """The labels and ``Slice`` of a mesh view: which global ranks, laid out how.

    ``TypeError`` if ``slice`` is not a ``Slice`` or a label not a ``str``; ``ValueError``
    for a count mismatch or a repeated label.
    """

    def __new__(cls, labels: Sequence[str], slice: Slice) -> Shape: ...
    @staticmethod
    def unity() -> Shape:
        """The zero-dimensional shape of the single rank 0."""

    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a fresh list)."""

    @property
    def ndslice(self) -> Slice:
        """The ``Slice`` mapping local coordinates to global ranks."""

    @property
    def extent(self) -> Extent:
        """The extent of this view: its labels with their sizes."""

    def ranks(self) -> list[int]:
        """The global ranks of this view, in row-major order of its coordinates."""

    def __len__(self) -> int: ...
    def coordinates(self, rank: int) -> Point:
        """The ``Point`` (relative to ``extent``) of global ``rank`` (``ValueError`` if
        the view does not cover it)."""

    def select(self, label: str, index: int | slice) -> Shape:
        """Restrict dimension ``label``: an int selects one coordinate and removes the
        dimension (``IndexError`` out of range, negative included); a ``slice`` keeps
        it, restricted (``ValueError`` unless the step is positive). ``ValueError`` for
        an unknown label, ``TypeError`` for another kind of index."""

    def at(self, label: str, index: int) -> Shape:
        """Select coordinate ``index`` of dimension ``label`` and remove the dimension,
        as ``select`` with an int: ``ValueError`` for an unknown label or an index out
        of range, ``OverflowError`` for a negative index."""

    def split(self, spec: Mapping[str, Sequence[str] | int]) -> Shape:
        """Split dimensions into several: ``spec`` maps an existing label to a tuple of
        new names (outermost first) and a new name to its size; at most one size per
        split may be left out, and is inferred (``ValueError``/``TypeError`` otherwise)."""

    def rename(self, old_to_new: Mapping[str, str]) -> Shape:
        """Relabel dimensions (``ValueError`` for an unknown label or a clash,
        ``TypeError`` for a new name that is not a ``str``)."""

    def flatten(self, name: str) -> Shape:
        """Merge all dimensions of a dense view into one named ``name`` (``ValueError``
        if the view is not dense)."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Shape], tuple[list[str], Slice]]: ...

# --- the admin server (monarch_admin) ---------------------------------------------------

@final
class AdminConfig:
    """How an ``AdminServer`` listens and whom it lets in."""

    bind: str
    allowed_hosts: list[str]
    actions: bool
    tls_cert: str | None
    tls_key: str | None
    token: str | None
    def __new__(
        cls,
        bind: str = ...,
        allowed_hosts: list[str] = ...,
        actions: bool = False,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
    ) -> AdminConfig:
        """``bind`` defaults to ``"127.0.0.1:0"`` (port 0: any free port), and
        ``allowed_hosts`` to none beyond the local names."""

@final
class AdminServer:
    """A running admin server (JSON API, event stream, /metrics and the dashboard)."""

    @staticmethod
    def serve_recorded(path: str, config: AdminConfig | None = None) -> AdminServer:
        """Serve the recorded job in the JSON file at ``path``. Raises ``ValueError`` for
        a bad file or setting, ``OSError`` if the address cannot be listened on."""
    @staticmethod
    def serve_live(
        agent: ProcAgent, config: AdminConfig | None = None, program: str | None = None
    ) -> AdminServer:
        """Serve this process's live job, as seen by ``agent`` (its mesh agent);
        ``program`` names the program in the summary. Raises
        ``ValueError`` for a bad setting, ``OSError`` if the address cannot be listened on."""
    @property
    def url(self) -> str:
        """The URL to give users: the base URL with ``?token=``."""
    @property
    def base_url(self) -> str:
        """The base URL, without the token."""
    @property
    def token(self) -> str:
        """The access token."""
    @property
    def port(self) -> int:
        """The port the server listens on."""
    def stop(self) -> None:
        """Stop serving: no new connections, event streams end. Idempotent."""
