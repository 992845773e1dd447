"""The per-process runtime of Python actors: the process context, the agent and the
wire protocol.

Every process that takes part (the client, and each proc a host spawns) has one
:class:`ProcessContext`: a hyperactor proc, a client mailbox named ``agent`` on it, and
a keyed :class:`~monarch._rust_bindings.Inbox` — the single port through which the
process receives everything. A message's first part is a key (see
``hyperactor_mesh::inbox``):

- key ``0`` is the **agent**: spawn requests and process-level requests, handled in
  order by the agent thread;
- an **actor key** (chosen by the spawner, the same on every proc of an actor mesh) is
  one hosted actor: its thread drains the key's queue one message at a time (ACT-1);
- a **reply key** is one pending call of this process.

Because one sender's messages to one inbox keep their order, an actor's spawn request
reaches the agent before any message sent after it reaches the actor's queue, and the
actor runs ``__init__`` before draining that queue.

Wire formats (every part is bytes):

- to an actor, sent with ``Inbox.cast`` (which fans it out over a tree of procs, see
  ``hyperactor_mesh::inbox::cast``): ``[route, header, payload]`` as delivered;
  ``route`` is written by the inbox that delivers it (:data:`ROUTE`: the receiver's
  index in the view, the hops it took, the reply key, then the reply port id),
  ``header`` pickles ``(method, labels, sizes)`` and ``payload`` ``(args, kwargs)``,
  once per cast; large ``bytes`` arguments follow as parts of their own, the pickle's
  out-of-band buffers (:func:`dumps_call`): ``[route, header, payload, buffer...]``;
- a reply: ``[reply_key, index, body, index, body, ...]``: items of a 4-byte
  little-endian index and a body that pickles ``(status, value)`` with ``status`` one
  of :data:`OK`, :data:`ERROR` (an ``ActorError``'s parts) or :data:`FAILED` (the actor
  has failed or stopped: a ``SupervisionError`` message); a large ``bytes`` value
  travels out of band, in an item ``[index and 1 (two u32s), body, value]`` (see
  :func:`reply_items`). A reduced reply carries many items; an empty body means the
  rank is *lost* (its proc died before answering).
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import struct
import sys
import threading
import weakref
from typing import Any

from monarch._rust_bindings import Client, Host, Inbox, PortRef, Proc, Queue
from monarch._rust_bindings import find as _find

#: Reply statuses.
OK = 0
ERROR = 1
FAILED = 2

#: The agent's key.
AGENT_KEY = 0
AGENT_KEY_PART = AGENT_KEY.to_bytes(8, "little")

#: The key that stopped and failed actors are retired into (see ``Inbox.retire``): one
#: thread per process answers for all of them.
UNDERTAKER_KEY = 2

#: The variable that gives a spawned proc the root client's inbox port.
ROOT_PORT_ENV = "MONARCH_ROOT_PORT"

#: The number of tokio worker threads (monarch_extension/src/runtime.rs).
PROC_WORKER_THREADS_ENV = "MONARCH_TOKIO_WORKER_THREADS"

#: The first part of an agent message that reports a message that came back
#: undelivered (``Inbox.forward_undeliverable``).
UNDELIVERABLE_TAG = b"\0undeliverable"

#: The name of the mailbox that owns every process's inbox.
AGENT_NAME = "agent"


def key_part(key: int) -> bytes:
    return key.to_bytes(8, "little")


#: The fixed part of a route (``hyperactor_mesh::inbox::Route``): index, hops, reply key.
ROUTE = struct.Struct("<IBQ")

#: The route of a message nobody replies to (e.g. a supervision event).
NO_ROUTE = ROUTE.pack(0, 0, 0)


def decode_route(part: bytes) -> tuple[int, int, int, str | None]:
    """``(index, hops, reply_key, reply_port or None)`` of a delivered message."""
    index, hops, reply_key = ROUTE.unpack_from(part)
    port = part[ROUTE.size :]
    return index, hops, reply_key, port.decode() if port else None


def reply_items(parts: list[bytes]) -> list[tuple[int, int, int]]:
    """The reply items of a reply message's parts (after its key), as ``(index, start,
    end)`` slices of ``parts``: ``[index, body]``, or ``[index and n, body, n buffers]``
    for a body with out-of-band buffers (the layout of
    ``hyperactor_mesh::inbox::reply_items``). A malformed item ends the list."""
    items = []
    at, n = 0, len(parts)
    while at + 1 < n:
        head = parts[at]
        if len(head) == 4:
            index, attached = int.from_bytes(head, "little"), 0
        elif len(head) == 8:
            index, attached = _INDEX_AND_COUNT.unpack(head)
        else:
            break
        end = at + 2 + attached
        if end > n:
            break
        items.append((index, at, end))
        at = end
    return items


def reindexed(item: list[bytes], index: int) -> list[bytes]:
    """A reply item (its parts) with its index replaced by ``index``."""
    head = item[0]
    if len(head) == 8:
        return [_INDEX_AND_COUNT.pack(index, len(item) - 2), *item[1:]]
    return [index.to_bytes(4, "little"), *item[1:]]


_INDEX_AND_COUNT = struct.Struct("<II")


def decode_replies(parts: list[bytes]) -> list[tuple[int, int, Any]]:
    """The ``(index, status, value)`` of each reply item of a reply message; a lost
    rank (empty body) reads as ``FAILED``."""
    out = []
    for index, start, end in reply_items(parts):
        body = parts[start + 1]
        if body:
            status, value = loads(body, parts[start + 2 : end])
        else:
            status, value = (
                FAILED,
                f"the proc of rank {index} is gone: the message or its reply was lost with it",
            )
        out.append((index, status, value))
    return out


def reply_parts(index: int, status: int, value: Any) -> list[bytes]:
    """The reply item of ``(status, value)`` for rank ``index``: a ``bytes`` value of
    at least :data:`OUT_OF_BAND_MIN` bytes travels out of band, as the item's attached
    part (see :func:`dumps_call`)."""
    if type(value) is bytes and len(value) >= OUT_OF_BAND_MIN:
        body = dumps((status, pickle.PickleBuffer(value)), buffer_callback=_out_of_band)
        return [_INDEX_AND_COUNT.pack(index, 1), body, value]
    return [index.to_bytes(4, "little"), dumps((status, value))]


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False


def inbox_port_of(proc_id: str) -> str:
    """The inbox port id of the process serving ``proc_id``: the first port of its
    ``agent`` mailbox (checked by :meth:`ProcessContext.__init__`)."""
    return f"{proc_id}/{AGENT_NAME}[0]:1"


_MAIN = b"__main__"
#: Pickles at least this long are searched with the vectorized ``find``.
_LARGE_PICKLE = 1 << 16


#: Top-level call arguments and return values that are ``bytes`` of at least this size
#: travel out of band (see :func:`dumps_call`); the extension shares, rather than
#: copies, message parts from the same size on.
OUT_OF_BAND_MIN = 64 << 10


def dumps_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes]:
    """The payload parts of a call: the pickle of ``(args, kwargs)``, then, out of band
    (pickle protocol 5), every top-level argument that is a ``bytes`` object of at least
    :data:`OUT_OF_BAND_MIN` bytes. Those travel as message parts of their own: never
    copied into the pickle, nor out of it (:func:`loads` with the parts after the
    pickle as ``buffers`` gives the endpoint the received ``bytes`` object itself)."""
    big: dict[int, bytes] = {}
    seen_twice: set[int] = set()
    for v in (*args, *kwargs.values()):
        if type(v) is bytes and len(v) >= OUT_OF_BAND_MIN:
            if id(v) in big:
                # Out-of-band buffers are not memoized: an object passed twice stays in
                # the pickle, once, as before.
                seen_twice.add(id(v))
            big[id(v)] = v
    for key in seen_twice:
        del big[key]
    if not big:
        return [dumps((args, kwargs))]
    wrapped = {key: pickle.PickleBuffer(v) for key, v in big.items()}
    originals = {id(buffer): big[key] for key, buffer in wrapped.items()}

    def wrap(v: Any) -> Any:
        return wrapped.get(id(v), v) if type(v) is bytes else v

    buffers: list[pickle.PickleBuffer] = []
    data = dumps(
        (tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}),
        buffer_callback=buffers.append,
    )
    # The bytes objects themselves (shared by the message parts, not copied).
    parts = [data]
    parts += (originals[id(buffer)] for buffer in buffers)
    return parts


def dumps(obj: Any, buffer_callback: Any = None) -> bytes:
    """Pickle with the standard pickler when it can, cloudpickle otherwise: for what the
    standard pickler refuses (lambdas, closures) and for references into ``__main__``,
    which names a different module in the receiving process (a script's classes and
    functions travel by value). Both load with ``pickle.loads``."""
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    else:
        # A reference to __main__ spells the module name; a false positive (a string
        # that contains it) only costs the slower pickler. Small pickles: ``bytes.find``
        # (not ``in``, which first tries the operand as an int and builds a TypeError);
        # large ones: the vectorized search, ~10x faster than ``bytes.find``.
        if (data.find(_MAIN) if len(data) < _LARGE_PICKLE else _find(data, _MAIN)) < 0:
            return data
    import cloudpickle

    return cloudpickle.dumps(  # type: ignore[no-any-return]
        obj, protocol=5, buffer_callback=buffer_callback
    )


def loads(data: bytes, buffers: Any = ()) -> Any:
    """Unpickle ``data``; ``buffers``: its out-of-band buffers, in order."""
    return pickle.loads(data, buffers=buffers)


class ProcessContext:
    """This process's proc, mailbox and inbox; see the module docs."""

    def __init__(self, proc: Proc, *, is_root: bool, root_port: str | None = None) -> None:
        self.proc = proc
        self.proc_id: str = proc.proc_id
        self.client: Client = proc.client(AGENT_NAME)
        self.inbox = Inbox(self.client)
        self.port: PortRef = self.inbox.port
        self.port_id = str(self.port)
        if self.port_id != inbox_port_of(self.proc_id):
            raise RuntimeError(
                f"monarch: this process's inbox is {self.port_id}, not the expected "
                f"{inbox_port_of(self.proc_id)} (a bug in monarch)"
            )
        self.is_root = is_root
        #: The root client's inbox, for process-wide singletons (controllers).
        self.root_port: str = root_port if root_port is not None else self.port_id
        self.agent_queue: Queue = self.inbox.queue(AGENT_KEY)
        # Messages that come back undelivered (DEL-1) reach the agent (see run_agent).
        self.inbox.forward_undeliverable()
        self._ports: dict[str, PortRef] = {}
        self.controllers: dict[str, Any] = {}
        self.controllers_lock = threading.Lock()
        self.host: Host | None = None
        # Supervision state (see monarch._src.actor.supervision).
        #: Procs known dead, with the reason.
        self.dead: dict[str, str] = {}
        #: The proc groups of this process that include a proc, by proc id.
        self.groups_by_proc: dict[str, weakref.WeakSet[Any]] = {}
        #: The actor meshes spawned from this process, by mesh key.
        self.owned: dict[int, Any] = {}
        #: Root only: every proc this host spawned, and those it was asked to stop.
        self.spawned_procs: set[str] = set()
        self.stopping: set[str] = set()
        #: Procs of unknown origin that a message could not reach (logged once each),
        #: and a condition notified when one is added.
        self.unreachable_logged: set[str] = set()
        self.unreachable_changed = threading.Condition()
        #: Retired actor keys: what to answer a call to each (see ``retire``).
        self.retired: dict[int, str] = {}
        threading.Thread(target=self._undertake, name="monarch-undertaker", daemon=True).start()

    def retire(self, key: int, answer: str) -> None:
        """Stop hosting actor ``key``: from now on calls to it are answered with
        ``SupervisionError(answer)`` by this process's undertaker thread, and the
        actor's own thread can end."""
        self.retired[key] = answer
        self.inbox.retire(key, UNDERTAKER_KEY)

    def _undertake(self) -> None:
        queue = self.inbox.queue(UNDERTAKER_KEY)
        while True:
            try:
                parts = queue.get()
            except RuntimeError:
                return
            try:
                key = int.from_bytes(parts[0], "little")
                index, _, reply_key, reply_port = decode_route(parts[1])
                method = loads(parts[2])[0]
                if reply_port is None or method == "__supervise__":
                    continue
                if method == "__stop__":
                    self.reply(reply_port, reply_key, index, OK, None)
                else:
                    answer = self.retired.get(key, "the actor is gone")
                    self.reply(reply_port, reply_key, index, FAILED, f"{answer} ({method})")
            except Exception as e:  # keep answering for the others
                print(f"monarch: undertaker of {self.proc_id}: {e!r}", file=sys.stderr)

    def port_ref(self, port_id: str) -> PortRef:
        """A cached :class:`PortRef` for ``port_id``."""
        ref = self._ports.get(port_id)
        if ref is None:
            if len(self._ports) > 4096:
                self._ports.clear()
            ref = self._ports[port_id] = PortRef.from_string(port_id)
        return ref

    def send(self, port: PortRef, parts: list[bytes]) -> None:
        port.send(self.client, parts)

    def reply(self, port_id: str, reply_key: int, index: int, status: int, value: Any) -> None:
        """Send one reply; a value that cannot be pickled becomes an error reply."""
        try:
            item = reply_parts(index, status, value)
        except Exception as e:  # unpicklable result: tell the caller why
            from monarch._src.actor.actor_mesh import ActorError

            err = ActorError._from_local(
                TypeError(f"the endpoint's return value cannot be pickled: {e}"),
                "while sending the reply",
            )
            item = reply_parts(index, ERROR, err._to_wire())
        port = self._ports.get(port_id) or self.port_ref(port_id)
        port.send(self.client, [reply_key.to_bytes(8, "little"), *item])

    def fail_replies(self, port_id: str, reply_key: int, indices: Any, reason: str) -> None:
        """Answer ``indices`` with ``FAILED`` (``reason``) in one message."""
        body = dumps((FAILED, reason))
        parts = [key_part(reply_key)]
        for index in indices:
            parts += (index.to_bytes(4, "little"), body)
        if len(parts) > 1:
            self.send(self.port_ref(port_id), parts)

    # --- the agent -------------------------------------------------------------------

    def start_agent_thread(self) -> None:
        """Run the agent on a daemon thread (the client process)."""
        threading.Thread(target=self.run_agent, name="monarch-agent", daemon=True).start()

    def run_agent(self) -> None:
        """Handle agent requests in order until the agent queue is closed."""
        from monarch._src.actor import actor_host

        while True:
            try:
                parts = self.agent_queue.get()
            except RuntimeError:  # closed: the process is stopping
                return
            try:
                if parts[0] == UNDELIVERABLE_TAG:
                    from monarch._src.actor import supervision

                    supervision.undeliverable(self, parts[1].decode(), parts[2].decode())
                    continue
                request = loads(parts[0])
                actor_host.handle_agent_request(self, request, parts[1:])
            except BaseException as e:  # keep serving; say what went wrong
                print(
                    f"monarch: proc {self.proc_id}: agent request failed: {e!r}",
                    file=sys.stderr,
                    flush=True,
                )


_lock = threading.RLock()
_context: ProcessContext | None = None
_shutdown = False


def set_process_context(ctx: ProcessContext) -> None:
    global _context
    with _lock:
        _context = ctx


def process_context() -> ProcessContext:
    """This process's context, bootstrapping the root client on first use."""
    ctx = _context
    if ctx is not None:
        return ctx
    with _lock:
        if _context is None:
            _bootstrap_root()
        assert _context is not None
        return _context


def _bootstrap_root() -> None:
    global _context
    if _shutdown:
        raise RuntimeError(
            "the monarch client context was shut down (shutdown_context() or interpreter "
            "exit); it cannot be used again in this process"
        )
    proc = Proc.serve("unix", "client")
    ctx = ProcessContext(proc, is_root=True)
    ctx.host = Host(proc)
    ctx.start_agent_thread()
    from monarch._src.actor import supervision

    supervision.start_client_supervision(ctx)
    supervision.start_exit_watcher(ctx)
    _context = ctx
    atexit.register(_shutdown_at_exit)


def _shutdown_at_exit() -> None:
    try:
        shutdown(timeout=1.0)
    except Exception as e:  # at exit there is nobody left to raise to
        print(f"monarch: shutdown at exit failed: {e!r}", file=sys.stderr)


def shutdown(timeout: float = 1.0) -> None:
    """Stop every proc this process spawned (each gets ``timeout`` seconds, then is
    killed). Idempotent."""
    global _shutdown
    with _lock:
        ctx = _context
        if _shutdown or ctx is None:
            _shutdown = True
            return
        _shutdown = True
    if ctx.host is not None:
        ctx.host.shutdown(timeout)


def is_shut_down() -> bool:
    return _shutdown


def format_exception(exc: BaseException) -> str:
    import traceback

    out = io.StringIO()
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=out)
    return out.getvalue()


def child_environment() -> dict[str, str]:
    """The environment additions of a spawned proc: this process's import path, so the
    child imports what the parent does (modules given by reference in pickles)."""
    path = [p for p in sys.path if p]
    cwd = os.getcwd()
    if cwd not in path:
        path.insert(0, cwd)
    existing = os.environ.get("PYTHONPATH")
    if existing:
        path.append(existing)
    env = {"PYTHONPATH": os.pathsep.join(path)}
    if _context is not None:
        env[ROOT_PORT_ENV] = _context.root_port
    # A proc's runtime only moves messages between its sockets and its actors' threads:
    # one worker thread saves the wake-ups and work stealing of a second one (measured:
    # call() to 64 procs on 2 cores 6.4 -> 5.7 ms). An explicit setting is kept.
    if PROC_WORKER_THREADS_ENV not in os.environ:
        env[PROC_WORKER_THREADS_ENV] = "1"
    return env
