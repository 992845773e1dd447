"""The client side of the tensor engine: one :class:`Engine` per proc mesh.

An engine is started the first time a mesh (or any view of it) is used for tensors:
it spawns a :class:`Controller` actor in this process, which spawns one
:class:`~monarch._src.tensor_engine.worker.actor.TensorWorker` per proc of the *root* proc
mesh (views reuse them) and owns them: a proc that dies is reported to the controller,
which records it (:attr:`Engine.lost`, by rank), and the next use of the engine raises
``SupervisionError``. The controller also serves the key-value store the workers'
process groups rendezvous through, so no extra server or port is opened for it.

An engine that lost a proc is not repaired in place: ``monarch.recovery`` starts a new
engine on a new root mesh (the survivors' procs and a replacement) and hands the
tensors over to it (:mod:`monarch._src.tensor_engine.client.handover`). What that needs
from the engine is here: the lost ranks, an event set at the failure (:attr:`Engine.failed`)
and :meth:`Engine.whole`, which sends a block of work as one message and says whether
it was sent.

Commands are buffered per engine and sent as one message per *flush*: before a fetch,
when the target view changes, when the buffer is full (:data:`BATCH_MAX`), and by a
flusher thread about :data:`FLUSH_DELAY` seconds after the first buffered command
(not inside ``monarch.coalescing()``).

Each command runs on a stream (``monarch.Stream``): a batch starts on stream 0
(``"main"``) and a ``STREAM`` command switches the stream of the commands after it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import concurrent_endpoint, endpoint
from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.future import Future
from monarch._src.actor.pickling import dumps
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client.stream import _stack as _streams

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh
    from monarch._src.actor.proc_mesh import ProcMesh
    from monarch._src.actor.shape import Shape
    from monarch._src.tensor_engine.client.stream import Stream

__all__ = [
    "BATCH_MAX",
    "FLUSH_DELAY",
    "Controller",
    "Engine",
    "Sent",
    "View",
    "coalescing_depth",
    "engine_of",
    "flush_all",
]

#: Commands buffered before a flush is forced.
BATCH_MAX = 2048
#: How long the first buffered command may wait for more before it is sent (seconds).
FLUSH_DELAY = 0.001
#: How often dropped tensors are freed on the workers when no batch carries them (s).
DELETE_ROUND = 0.05
#: How many recent commands keep the client line that issued them (for errors).
FRAME_RING = 1 << 16

#: How many ``coalescing()`` blocks are open (the flusher does not flush inside one).
coalescing_depth = [0]

_ids = itertools.count(1)
#: Live engines by id: the in-process controller reports failures through it.
_engines: weakref.WeakValueDictionary[int, Engine] = weakref.WeakValueDictionary()


class View:
    """A view of an engine's proc mesh that commands run on: ``vid`` (its id on the
    wire), ``shape`` (over the root's global ranks), ``slot`` (one per distinct set of
    ranks: tensors of views with the same ranks mix), and what its workers know."""

    __slots__ = (
        "defined_fns",
        "defined_views",
        "engine",
        "mesh",
        "shape",
        "slot",
        "vid",
        "workers",
    )

    def __init__(self, engine: Engine, vid: int, mesh: ProcMesh, slot: int) -> None:
        self.engine = engine
        self.vid = vid
        self.mesh = mesh
        self.shape: Shape = mesh._shape
        self.slot = slot
        self.workers: ActorMesh[Any] | None = None
        #: Function ids and view ids already defined to these ranks.
        self.defined_fns: set[int] = set()
        self.defined_views: set[int] = set()

    def coords(self, rank: int) -> dict[str, int]:
        point = self.shape.coordinates(rank)
        return {label: point[label] for label in self.shape.labels}


class Engine:
    """The tensor engine of one proc mesh (see the module docs)."""

    #: Whether :meth:`tensor_made` is called for each new tensor (the simulator's
    #: engine, which needs the metadata that commands do not carry).
    tracks_meta = False

    def tensor_made(self, ref: int, meta: Any) -> None:
        """A tensor bound to ``ref`` with metadata ``meta`` was made (called only when
        :attr:`tracks_meta`)."""

    def __init__(self, root: ProcMesh) -> None:
        self.id = next(_ids)
        self.root = root
        self.lock = threading.RLock()
        self._refs = itertools.count(1)
        self.seq = 0
        self.pending: list[wire.Command] = []
        self.pending_view: View | None = None
        #: The stream of the last buffered command (a batch starts on "main").
        self.pending_sid = 0
        self._tokens = itertools.count(1)
        #: Refs dropped (by garbage collection, from any thread): (slot, stream, ref).
        self.deletes: collections.deque[tuple[int, int, int]] = collections.deque()
        self.views: dict[Shape, View] = {}
        self.slots: dict[Any, int] = {}
        self.fn_ids: dict[Any, int] = {}
        self.fn_specs: dict[int, tuple[Any, ...]] = {}
        #: seq -> client frames, for the last FRAME_RING commands.
        self.frames: list[Any] = [None] * FRAME_RING
        self.failure: BaseException | None = None
        #: The ranks (of the root mesh) whose procs were lost, with the failure's
        #: headline; set by the controller's supervision.
        self.lost: dict[int, str] = {}
        #: Set once :attr:`failure` is, with the time (``time.monotonic()``) it was;
        #: :attr:`failure_cond` is notified then.
        self.failed = threading.Event()
        self.failed_at: float | None = None
        self.failure_cond = threading.Condition()
        #: While above 0, the buffer is never flushed before the end of the block
        #: (:meth:`whole`).
        self.holding = 0
        self.closed = False
        self.peers_sent: set[int] = set()
        self.ports: list[Any] | None = None
        self._wake = threading.Event()
        _engines[self.id] = self
        self._start()
        threading.Thread(
            target=_flusher,
            args=(weakref.ref(self), self._wake),
            name="monarch-tensor-flush",
            daemon=True,
        ).start()

    # --- start ---------------------------------------------------------------------------

    def _start(self) -> None:
        from monarch._src import config
        from monarch._src.actor.proc_mesh import this_proc

        self.controller = this_proc().spawn("tensor_engine", Controller, self.id)
        timeout = float(config.get("tensor_engine_start_timeout"))
        self.workers = self.controller.start.call_one(self.root, self.controller).get(
            timeout=timeout
        )

    # --- refs and ids ---------------------------------------------------------------------

    def new_ref(self) -> wire.Ref:
        return wire.Ref(next(self._refs))

    def new_token(self) -> int:
        """A fresh ``SIGNAL``/``WAIT`` token."""
        return next(self._tokens)

    def view(self, mesh: ProcMesh) -> View:
        """The view for ``mesh`` (a view of this engine's root)."""
        shape = mesh._shape
        view = self.views.get(shape)
        if view is None:
            with self.lock:
                view = self.views.get(shape)
                if view is None:
                    key = tuple(shape.ranks())
                    slot = self.slots.setdefault(key, len(self.slots))
                    view = View(self, len(self.views) + 1, mesh, slot)
                    view.workers = self.workers._new_with_shape(shape)
                    self.views[shape] = view
        return view

    def fn_id(self, key: Any, spec: tuple[Any, ...]) -> int:
        fid = self.fn_ids.get(key)
        if fid is None:
            with self.lock:
                fid = self.fn_ids.get(key)
                if fid is None:
                    fid = len(self.fn_ids) + 1
                    self.fn_specs[fid] = spec
                    self.fn_ids[key] = fid
        return fid

    # --- recording ------------------------------------------------------------------------

    def check(self) -> None:
        """Raise if the engine cannot take work (a proc died, or it is shut down)."""
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise RuntimeError(
                f"the tensor engine of {self.root!r} is shut down (its procs were stopped); "
                "spawn new procs to use tensors again"
            )

    def issue(
        self,
        view: View,
        cmd: wire.Command,
        fid: int = 0,
        frame: Any = None,
        stream: Stream | None = None,
    ) -> None:
        """Buffer ``cmd`` for ``view`` on ``stream`` (default: the active stream),
        defining function ``fid`` there first if new. A command that carries ``frame``
        carries the seq :meth:`next_seq` gave it."""
        if stream is None:
            stream = _streams[-1]
        with self.lock:
            if self.pending_view is not view:
                if self.pending:
                    self._flush_locked()
                self.pending_view = view
            pending = self.pending
            if fid and fid not in view.defined_fns:
                pending.append(wire.DefineFn(fid, self.fn_specs[fid]))
                view.defined_fns.add(fid)
            if not pending:
                self._wake.set()
            if stream.sid != self.pending_sid:
                pending.append(wire.SetStream(stream.sid, stream.name))
                self.pending_sid = stream.sid
            pending.append(cmd)
            if frame is not None:
                seq = wire.seq_of(cmd)
                self.frames[seq % FRAME_RING] = (seq, frame)
            if len(pending) >= BATCH_MAX and not self.holding:
                self._flush_locked()

    def define_view(self, target: View, vid_view: View) -> None:
        """Make sure ``target``'s workers know view ``vid_view`` (call with the lock)."""
        if vid_view.vid not in target.defined_views:
            self.issue(target, wire.DefineView(vid_view.vid, vid_view.shape))
            target.defined_views.add(vid_view.vid)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def dropped(self, slot: int, ref: int, sid: int = 0) -> None:
        """A tensor's ref (of stream ``sid``) is gone (any thread, garbage collection
        included: so this takes no lock; the next flush, or the flusher's next round,
        sends it)."""
        self.deletes.append((slot, sid, ref))

    # --- flushing -------------------------------------------------------------------------

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()
        if self.failure is not None:
            raise self.failure

    def _flush_locked(self) -> None:
        deletes: dict[int, dict[int, list[int]]] = {}
        pop = self.deletes.popleft
        while self.deletes:
            slot, sid, ref = pop()
            deletes.setdefault(slot, {}).setdefault(sid, []).append(ref)
        view = self.pending_view
        batches: list[tuple[View, list[wire.Command]]] = []
        current = self.pending_sid
        self.pending_sid = 0
        if self.pending and view is not None:
            cmds = self.pending
            self.pending = []
            extra = deletes.pop(view.slot, None)
            if extra:
                _append_deletes(cmds, extra, current)
            batches.append((view, cmds))
        if deletes:
            by_slot = {v.slot: v for v in self.views.values()}
            for slot, by_sid in deletes.items():
                cmds = []
                _append_deletes(cmds, by_sid, 0)
                batches.append((by_slot[slot], cmds))
        for target, cmds in batches:
            self._send(target, cmds)

    def _send(self, view: View, cmds: list[wire.Command]) -> bool:
        """Send one batch to ``view``'s workers; whether it was sent (not after a
        failure, nor once closed)."""
        if self.failure is not None or self.closed:
            return False
        try:
            payload = dumps(cmds)
        except Exception:
            payload = dumps([_sendable(cmd) for cmd in cmds])
        assert view.workers is not None
        try:
            view.workers.run.broadcast(payload)
        except SupervisionError as e:
            self.fail(e)
            return False
        except Exception as e:  # the mesh was stopped: nothing more can run
            self.fail(SupervisionError(f"the tensor engine of {self.root!r} cannot run: {e}"))
            return False
        return True

    @contextlib.contextmanager
    def whole(self, view: View) -> Iterator[Sent]:
        """Record a block of work for ``view`` that its workers get as one message, or
        not at all: nothing recorded in the block is sent before it ends (neither by the
        flusher nor when the buffer is full). The yielded :class:`Sent` says, after the
        block, whether the message went out. Use one view in the block, and fetch
        nothing in it. Raises what the block raises (nothing is sent then)."""
        sent = Sent()
        with self.lock:
            if self.pending:
                self._flush_locked()
            self.holding += 1
        try:
            yield sent
        except BaseException:
            with self.lock:
                self.holding -= 1
                self.pending = []
                self.pending_view = None
                self.pending_sid = 0
            raise
        with self.lock:
            self.holding -= 1
            if self.pending_view is not None and self.pending_view is not view:
                raise RuntimeError(
                    f"Engine.whole: the block recorded work for another view of "
                    f"{self.root!r} than the one it was opened for; record one view's work"
                )
            cmds, self.pending = self.pending, []
            self.pending_view = None
            self.pending_sid = 0
            sent.value = bool(cmds) and self._send(view, cmds)

    def close(self) -> None:
        """The procs are being stopped: send what is buffered, then take no more work."""
        if self.closed:
            return
        try:
            with self.lock:
                self._flush_locked()
        except Exception:
            pass  # stopping anyway
        self.closed = True
        self._wake.set()

    # --- failures -------------------------------------------------------------------------

    def fail(self, error: BaseException, rank: int | None = None, headline: str = "") -> None:
        """Record that the engine cannot run (``rank``: the root's rank that was
        lost, if one was)."""
        if rank is not None:
            self.lost.setdefault(rank, headline)
        if self.failure is None and not self.closed:
            self.failure = error
        if self.failed_at is None:
            self.failed_at = time.monotonic()
        self.failed.set()
        with self.failure_cond:
            self.failure_cond.notify_all()

    def frames_of(self, seq: int) -> Any:
        entry = self.frames[seq % FRAME_RING]
        if entry is not None and entry[0] == seq:
            return entry[1]
        return None

    # --- fetching -------------------------------------------------------------------------

    def fetch(self, view: View, rank: int, refs: list[int], sids: list[int]) -> Future[Any]:
        """The values of ``refs`` on global ``rank`` (``wire.Failure`` for failed
        ones), once the streams ``sids`` ran the work issued before this call."""
        return self.workers_at(view, rank).fetch.call_one(refs, sorted(set(sids)))  # type: ignore[no-any-return]

    def workers_at(self, view: View, rank: int) -> ActorMesh[Any]:
        """The worker of global ``rank`` (in ``view``), as a one-actor mesh."""
        coords = view.coords(rank)
        mesh = view.mesh.slice(**coords) if coords else view.mesh
        workers: ActorMesh[Any] = self.workers._new_with_shape(mesh._shape)
        return workers

    def ensure_peers(self) -> None:
        """Give every worker the ports of all workers (for point-to-point transfers),
        once."""
        if self.ports is not None:
            return
        from monarch._src import config

        timeout = float(config.get("tensor_engine_start_timeout"))
        self.flush()
        ports = self.workers.port_of.call().get(timeout=timeout)
        self.ports = [ports.item(**p) if p else ports.item() for p in _points(self.root)]
        root_view = self.view(self.root)
        self.issue(root_view, wire.Peers(self.ports))


def _append_deletes(cmds: list[wire.Command], by_sid: dict[int, list[int]], current: int) -> None:
    """Append the deletes of ``by_sid`` to a batch whose last command ran on stream
    ``current``: each on its own stream (after that stream's uses of the refs)."""
    for sid in sorted(by_sid, key=lambda s: s != current):
        if sid != current:
            cmds.append(wire.SetStream(sid, ""))
            current = sid
        cmds.append(wire.Delete(by_sid[sid]))


def _sendable(cmd: wire.Command) -> wire.Command:
    """``cmd``, or, when it does not pickle, a command that fails its outputs with why
    (one bad argument fails one command, never the batch)."""
    try:
        dumps(cmd)
    except Exception as e:
        error = (
            f"TypeError: the arguments of this command cannot be sent to the workers: "
            f"{type(e).__name__}: {e}\n"
        )
        return wire.Fail(wire.seq_of(cmd), wire.outputs(cmd), error)
    return cmd


def _points(mesh: ProcMesh) -> list[dict[str, int]]:
    shape = mesh._shape
    out = []
    for rank in shape.ranks():
        point = shape.coordinates(rank)
        out.append({label: point[label] for label in shape.labels})
    return out


def _flusher(ref: weakref.ReferenceType[Engine], wake: threading.Event) -> None:
    """Flush an engine's buffer shortly after work arrives in it, and send the deletes
    of dropped tensors every :data:`DELETE_ROUND` seconds when nothing else does."""
    while True:
        woke = wake.wait(DELETE_ROUND)
        if woke:
            time.sleep(FLUSH_DELAY)
            wake.clear()
        engine = ref()
        if engine is None or engine.closed:
            return
        if (engine.pending or engine.deletes) and not coalescing_depth[0] and not engine.holding:
            try:
                with engine.lock:
                    engine._flush_locked()
            except BaseException as e:  # never die silently: the next use raises it
                engine.fail(e)
        del engine


def engine_of(mesh: ProcMesh) -> Engine:
    """The engine of ``mesh``'s root proc mesh, started on first use."""
    root = mesh._root
    holder = root._tensor_engine
    engine = holder[0] if holder else None
    if engine is None:
        with _start_lock:
            engine = holder[0] if holder else None
            if engine is None:
                stopped = root._stopped_error()
                if stopped is not None:
                    raise stopped
                engine = Engine(root)
                holder.append(engine)
    return engine


_start_lock = threading.Lock()


def flush_all() -> None:
    """Send what every live engine has buffered (the end of a ``coalescing()`` block)."""
    for engine in list(_engines.values()):
        if (engine.pending or engine.deletes) and not engine.holding:
            try:
                with engine.lock:
                    engine._flush_locked()
            except BaseException as e:  # the next use raises it
                engine.fail(e)


def engine_failed(
    engine_id: int, error: BaseException, rank: int | None = None, headline: str = ""
) -> None:
    engine = _engines.get(engine_id)
    if engine is not None:
        engine.fail(error, rank, headline)


class Sent:
    """Whether the block of :meth:`Engine.whole` was sent (``value``, set at its end)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def __bool__(self) -> bool:
        return self.value


# --- the controller ------------------------------------------------------------------------


class Controller(Actor):
    """The engine's actor in the client process: spawns and owns the workers, records
    their failures, and serves the store their process groups rendezvous through."""

    def __init__(self, engine_id: int) -> None:
        self.engine_id = engine_id
        self.kv: dict[str, bytes] = {}
        self.changed: asyncio.Condition | None = None
        self.workers: Any = None
        self.arrived: dict[str, dict[int, int]] = {}

    def _cond(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    @endpoint
    async def start(self, procs: ProcMesh, me: Any) -> Any:
        from monarch._src.tensor_engine.worker.actor import TensorWorker

        self.workers = procs.spawn("tensor_worker", TensorWorker, me, self.engine_id)
        return self.workers

    def __supervise__(self, failure: Any) -> bool:
        from monarch._src.actor.supervision import MeshFailure

        if isinstance(failure, MeshFailure):
            text = failure.report()
            headline = failure.headline()
        else:
            text = str(failure)
            headline = text.strip().splitlines()[0] if text.strip() else ""
        rank = getattr(failure, "rank", None)
        engine_failed(
            self.engine_id,
            SupervisionError(
                f"a proc of the tensor engine's mesh failed, so the tensors on it are lost "
                f"(rank {'?' if rank is None else rank}): {text.strip()}"
            ),
            rank if isinstance(rank, int) else None,
            headline,
        )
        return True

    # --- arrivals at collectives (to name the ranks missing from one that times out) ---

    @endpoint
    async def arrive(self, group: str, rank: int, count: int) -> None:
        self.arrived.setdefault(group, {})[rank] = count

    @endpoint
    async def arrivals_of(self, group: str) -> dict[int, int]:
        return dict(self.arrived.get(group, {}))

    # --- the store (torch.distributed.Store semantics) -----------------------------------

    @endpoint
    async def store_set(self, key: str, value: bytes) -> None:
        cond = self._cond()
        async with cond:
            self.kv[key] = value
            cond.notify_all()

    @concurrent_endpoint
    async def store_get(self, key: str, timeout: float) -> bytes | None:
        await self._wait([key], timeout)
        return self.kv.get(key)

    @concurrent_endpoint
    async def store_wait(self, keys: list[str], timeout: float) -> bool:
        return await self._wait(keys, timeout)

    @endpoint
    async def store_add(self, key: str, amount: int) -> int:
        cond = self._cond()
        async with cond:
            value = int(self.kv.get(key, b"0")) + amount
            self.kv[key] = str(value).encode()
            cond.notify_all()
            return value

    @endpoint
    async def store_check(self, keys: list[str]) -> bool:
        return all(k in self.kv for k in keys)

    @endpoint
    async def store_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        cond = self._cond()
        async with cond:
            current = self.kv.get(key)
            if (current is None and not expected) or current == expected:
                self.kv[key] = desired
                cond.notify_all()
                return desired
            return current if current is not None else expected

    @endpoint
    async def store_delete(self, key: str) -> bool:
        return self.kv.pop(key, None) is not None

    @endpoint
    async def store_num_keys(self) -> int:
        return len(self.kv)

    async def _wait(self, keys: list[str], timeout: float) -> bool:
        cond = self._cond()
        deadline = time.monotonic() + timeout
        async with cond:
            while not all(k in self.kv for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(cond.wait(), left)
                except asyncio.TimeoutError:
                    return False
        return True
