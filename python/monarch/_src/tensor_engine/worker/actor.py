"""The tensor worker: one actor per proc that runs the client's commands with torch.

A worker keeps a table from ref ids to values. A command whose input failed, or that
raises, stores a :class:`~monarch._src.tensor_engine.wire.Failure` under its outputs
instead of values: nothing the client sends kills a worker, and the failure is reported
by the fetches that depend on it (with the seq of the command that failed first).

Collectives, same-host all-reduces and point-to-point transfers are the worker's
:class:`~monarch._src.tensor_engine.worker.collectives.Collectives`.

Streams: the commands of stream 0 (``"main"``) run on the actor's own thread as they
arrive; every other stream has a thread of its own (and, on CUDA, a CUDA stream) fed by
a queue, so streams run concurrently. Their values share one table; ``Signal``/``Wait``
order them where the client asked (borrows). Collectives use process groups per stream,
so two streams' collectives never interleave on one group.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch

from monarch._src.actor.actor import Actor
from monarch._src.actor.channel import Port
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.pickling import loads
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.wire import Failure, GroupRef, Ref, TensorMeta
from monarch._src.tensor_engine.worker import interop as worker_interop
from monarch._src.tensor_engine.worker.collectives import Collectives, collective_timeout

__all__ = ["TensorWorker", "this_worker", "worker_of"]


logger = logging.getLogger(__name__)


class _StreamThread:
    """A stream other than "main" on this worker: a thread running the chunks of
    commands queued for it, in order."""

    def __init__(self, worker: TensorWorker, sid: int, name: str) -> None:
        self.worker = worker
        self.sid = sid
        self.name = name or f"stream-{sid}"
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cuda = torch.cuda.Stream() if torch.cuda.is_available() else None  # type: ignore[no-untyped-call]
        # The thread runs in a copy of the actor's context, so remote functions on a
        # stream see the same `monarch.actor.context()` as on "main".
        self.thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._loop,),
            name=f"monarch-stream-{self.name}",
            daemon=True,
        )
        self.thread.start()

    def _loop(self) -> None:
        worker = self.worker
        worker._local.sid = self.sid
        context: Any = (
            torch.cuda.stream(self.cuda) if self.cuda is not None else contextlib.nullcontext()
        )
        with context:
            while True:
                item = self.queue.get()
                if item is None:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                execute = worker._execute
                for cmd in item:
                    execute(cmd)

    def drain(self, timeout: float) -> bool:
        """Wait until the work queued before this call ran."""
        done = threading.Event()
        self.queue.put(done)
        return done.wait(timeout)


class _Local(threading.local):
    #: The stream of the running command (0 on the actor's thread).
    sid = 0


def _tensor_bytes(value: torch.Tensor) -> bytes:
    """A CPU tensor's elements as bytes, in row-major order: one copy, and no NumPy
    (torch installed alone has none)."""
    flat = value.contiguous().reshape(-1).view(torch.uint8)
    n = flat.numel()
    return ctypes.string_at(flat.data_ptr(), n) if n else b""


class TensorWorker(Actor):
    """Runs the commands of one tensor engine on this proc (see the module docs)."""

    def __init__(self, controller: Any, engine_id: int = 0) -> None:
        global _this_worker
        _this_worker = self
        _by_engine[engine_id] = self
        self.controller = controller
        #: The client's id of the engine this worker runs for.
        self.engine_id = engine_id
        self.rank = context().actor_instance.rank.rank
        self.values: dict[int, Any] = {}
        self.fns: dict[int, Any] = {}
        self.views: dict[int, Any] = {}
        self.streams: dict[int, _StreamThread] = {}
        self._local = _Local()
        #: SIGNAL token -> [reached, CUDA event or None] (see ``_signal``).
        self.signals: dict[int, list[Any]] = {}
        self.signals_lock = threading.Lock()
        self.seq = -1
        #: Why a whole batch could not be read, if one could not.
        self.broken: Failure | None = None
        self.collectives = Collectives(self)
        self._handlers = self._command_handlers()

    def __cleanup__(self, exc: Any) -> None:
        # The shared segments and sockets of same-host all-reduces (see ``shm``).
        self.collectives.close()
        if _by_engine.get(self.engine_id) is self:
            del _by_engine[self.engine_id]

    # --- endpoints ----------------------------------------------------------------------

    @endpoint
    def run(self, batch: bytes) -> None:
        try:
            cmds = loads(batch)
        except BaseException as e:
            self.broken = self._failure(-1, e)
            return
        execute = self._execute
        sid = 0
        start = 0
        set_stream = wire.SetStream
        for i, cmd in enumerate(cmds):
            kind = type(cmd)
            if kind is set_stream:
                self._dispatch(sid, cmds, start, i)
                sid = cmd.sid
                if sid and sid not in self.streams:
                    self.streams[sid] = _StreamThread(self, sid, cmd.name)
                start = i + 1
            elif sid and kind in _GLOBAL:
                # Definitions take effect at once, whatever the stream.
                self._dispatch(sid, cmds, start, i)
                execute(cmd)
                start = i + 1
        self._dispatch(sid, cmds, start, len(cmds))

    def _dispatch(self, sid: int, cmds: list[Any], start: int, end: int) -> None:
        if start >= end:
            return
        if sid == 0:
            execute = self._execute
            for i in range(start, end):
                execute(cmds[i])
        else:
            self.streams[sid].queue.put(cmds[start:end])

    def _sync(self, sids: list[int] | None) -> None:
        """Wait until the streams ``sids`` (every stream: ``None``) ran the work that
        arrived before now ("main" runs on this thread, so it has)."""
        timeout = collective_timeout()
        for sid in self.streams if sids is None else sids:
            stream = self.streams.get(sid)
            if stream is not None and not stream.drain(timeout):
                raise TimeoutError(
                    f"rank {self.rank}: {stream.name!r} did not reach the point asked for "
                    f"within {timeout} s (`tensor_collective_timeout`): a command on it is "
                    "stuck (a collective whose peers did not come?)"
                )

    @endpoint
    def fetch(self, refs: list[int], sids: list[int] | None = None) -> list[Any]:
        """The values of ``refs``, as CPU tensors (``Failure`` for failed ones), once
        the streams ``sids`` ran the work issued before the fetch."""
        try:
            self._sync(sids)
        except TimeoutError as e:
            return [Failure(-1, self.rank, f"TimeoutError: {e}\n", [], "timeout") for _ in refs]
        out = []
        for ref in refs:
            value = self._value(ref)
            if isinstance(value, torch.Tensor):
                value = value.detach()
                if value.device.type != "cpu":
                    value = value.cpu()
                nbytes = value.numel() * value.element_size()
                if nbytes < wire.SMALL_TENSOR_BYTES and not value.requires_grad:
                    # Small: raw bytes (torch's own pickling of a tensor costs more
                    # than the whole round trip of a small fetch).
                    data = _tensor_bytes(value)
                    value = wire.TensorData(str(value.dtype), tuple(value.shape), data)
                elif not value.is_contiguous() or value.untyped_storage().nbytes() != nbytes:
                    value = value.clone(memory_format=torch.contiguous_format)
            out.append(value)
        return out

    @endpoint
    def call_function(
        self, spec: tuple[Any, ...], args: Any, kwargs: Any, sids: list[int] | None = None
    ) -> Any:
        """Run a remote function now (its ``call``/``call_one``/... adverbs), after the
        work of the streams ``sids`` issued before, and give its value back."""
        self._sync(sids)
        fn = self._resolve_fn(spec)
        failed: list[Failure] = []
        args = self._resolve(args, failed)
        kwargs = self._resolve(kwargs, failed)
        if failed:
            from monarch._src.tensor_engine.errors import RemoteException

            f = failed[0]
            raise RemoteException(f.rank, None, f.error, f.frames, None, f.seq)
        return fn(*args, **kwargs)

    @endpoint
    def propagate(self, spec: tuple[Any, ...], args: Any, kwargs: Any) -> Any:
        """Run a remote function on placeholder inputs (zeros of the given metadata)
        and describe its result: the pytree with tensors replaced by their metadata."""
        fn = self._resolve_fn(spec)
        args, kwargs = _placeholders((args, kwargs))
        return _describe(fn(*args, **kwargs))

    @endpoint
    def describe(self, ref: int, sids: list[int] | None = None) -> Any:
        self._sync(sids)
        value = self._value(ref)
        if isinstance(value, Failure):
            return value
        return _describe(value)

    @endpoint
    def port_of(self) -> Port[Any]:
        return self.collectives.port

    # --- commands -----------------------------------------------------------------------

    def _execute(self, cmd: wire.Command) -> None:
        try:
            self._handlers[type(cmd)](cmd)
        except BaseException as e:  # never let a command end the worker
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self._fail_outputs(cmd, self._failure(wire.seq_of(cmd), e))

    def _command_handlers(self) -> dict[type, Callable[[Any], None]]:
        """What runs each command, by its type."""
        return {
            wire.Op: self._op,
            wire.Delete: self._delete,
            wire.DefineFn: self._define_fn,
            wire.DefineView: self._define_view,
            wire.Call: self._call,
            wire.Rank: self._rank,
            wire.Reduce: self.collectives.reduce,
            wire.Send: self.collectives.send,
            wire.Recv: self.collectives.recv,
            wire.Peers: self.collectives.set_peers,
            wire.Unpack: self._unpack,
            wire.Fail: self._fail,
            wire.Signal: self._on_signal,
            wire.Wait: self._on_wait,
            wire.Alias: self._alias,
            wire.ActorWork: self._actor_work,
        }

    def _delete(self, cmd: wire.Delete) -> None:
        pop = self.values.pop
        for ref in cmd.refs:
            pop(ref, None)

    def _define_fn(self, cmd: wire.DefineFn) -> None:
        self.fns[cmd.fid] = self._resolve_fn(cmd.spec)

    def _define_view(self, cmd: wire.DefineView) -> None:
        self.views[cmd.vid] = cmd.shape

    def _fail(self, cmd: wire.Fail) -> None:
        self._fail_outputs(cmd, Failure(cmd.seq, self.rank, cmd.error, []))

    def _on_signal(self, cmd: wire.Signal) -> None:
        self._signal(cmd.token)

    def _on_wait(self, cmd: wire.Wait) -> None:
        self._wait(cmd.token)

    def _alias(self, cmd: wire.Alias) -> None:
        self.values[cmd.out] = self._value(cmd.src)

    def _actor_work(self, cmd: wire.ActorWork) -> None:
        worker_interop.worker_actor_command(self, cmd)

    # --- streams ------------------------------------------------------------------------

    def _signal_slot(self, token: int) -> list[Any]:
        with self.signals_lock:
            slot = self.signals.get(token)
            if slot is None:
                slot = self.signals[token] = [threading.Event(), None]
            return slot

    def _signal(self, token: int) -> None:
        slot = self._signal_slot(token)
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            slot[1] = event
        slot[0].set()

    def _wait(self, token: int) -> None:
        slot = self._signal_slot(token)
        timeout = collective_timeout()
        if not slot[0].wait(timeout):
            logger.warning(
                "rank %s: a stream waited %s s for another stream's borrow point and goes on "
                "without it (tensor_collective_timeout); the other stream is stuck",
                self.rank,
                timeout,
            )
            return
        if slot[1] is not None:
            torch.cuda.current_stream().wait_event(slot[1])
        with self.signals_lock:
            self.signals.pop(token, None)

    def _fail_outputs(self, cmd: wire.Command, failure: Failure) -> None:
        for out in wire.outputs(cmd):
            self.values[out] = failure

    def _failure(self, seq: int, e: BaseException) -> Failure:
        frames = [
            (f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(e.__traceback__)
        ]
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return Failure(seq, self.rank, text, frames)

    def _value(self, ref: int) -> Any:
        try:
            return self.values[ref]
        except KeyError:
            if self.broken is not None:
                return self.broken
            return Failure(
                -1,
                self.rank,
                f"RuntimeError: the worker holds no value for tensor ref {ref} (it was "
                "deleted, or never created on this rank)\n",
                [],
                "missing",
            )

    def _resolve(self, x: Any, failed: list[Failure]) -> Any:
        t = type(x)
        if t is Ref:
            value = self._value(x.id)
            if type(value) is Failure:
                failed.append(value)
            return value
        if t is tuple or t is list:
            return t(self._resolve(v, failed) for v in x)
        if t is dict:
            return {k: self._resolve(v, failed) for k, v in x.items()}
        if t is GroupRef:
            return self.collectives.group_for(x)
        return x

    def _resolve_fn(self, spec: tuple[Any, ...]) -> Any:
        kind = spec[0]
        if kind == "op":
            _, namespace, name, overload = spec
            packet = getattr(getattr(torch.ops, namespace), name)
            return getattr(packet, overload)
        if kind == "path":
            return _import_path(spec[1], spec[2] if len(spec) > 2 else None)
        if kind == "pickle":
            return loads(spec[1])
        raise ValueError(f"unknown function spec {spec!r}")

    def _op(self, cmd: wire.Op) -> None:
        fid, args, kwargs, outs, writes = cmd.fid, cmd.args, cmd.kwargs, cmd.outs, cmd.writes
        failed: list[Failure] = []
        args = self._resolve(args, failed)
        if kwargs:
            kwargs = self._resolve(kwargs, failed)
        values = self.values
        if failed:
            # Outputs include the inputs an in-place op writes: all are failed now.
            for out in (*outs, *writes):
                values[out] = failed[0]
            return
        result = self.fns[fid](*args, **kwargs)
        if not outs:
            return
        if len(outs) == 1:
            values[outs[0]] = result
            return
        for out, value in zip(outs, result, strict=False):
            values[out] = value

    def _call(self, cmd: wire.Call) -> None:
        fid, args, kwargs, outs, whole = cmd.fid, cmd.args, cmd.kwargs, cmd.outs, cmd.whole
        failed: list[Failure] = []
        args = self._resolve(args, failed)
        kwargs = self._resolve(kwargs, failed)
        if failed:
            for out in outs:
                self.values[out] = failed[0]
            if whole is not None:
                self.values[whole] = failed[0]
            return
        result = self.fns[fid](*args, **kwargs)
        if whole is not None:
            self.values[whole] = result
        if outs:
            leaves = _tensor_leaves(result)
            if len(leaves) != len(outs):
                raise RuntimeError(
                    f"the remote function returned {len(leaves)} tensors where its "
                    f"propagation said {len(outs)}; make `propagate` return the same "
                    "structure as the function"
                )
            for out, value in zip(outs, leaves, strict=False):
                self.values[out] = value

    def _unpack(self, cmd: wire.Unpack) -> None:
        whole, outs = cmd.whole, cmd.outs
        value = self._value(whole)
        if type(value) is Failure:
            for out in outs:
                self.values[out] = value
            return
        for out, leaf in zip(outs, _tensor_leaves(value), strict=False):
            self.values[out] = leaf

    def _coords(self, vid: int) -> tuple[Any, dict[str, int]]:
        shape = self.views[vid]
        point = shape.coordinates(self.rank)
        return shape, {label: point[label] for label in shape.labels}

    def _rank(self, cmd: wire.Rank) -> None:
        out, vid, dims = cmd.out, cmd.vid, cmd.dims
        shape, coords = self._coords(vid)
        sizes = dict(shape.extent)
        value = 0
        for d in dims:
            value = value * sizes[d] + coords[d]
        self.values[out] = torch.tensor(value, dtype=torch.int64)


#: The tensor worker of this process started last (a proc belongs to one root mesh at a
#: time; after a recovery, to the new one, whose worker is started last).
_this_worker: TensorWorker | None = None
#: The tensor workers of this process, by the id of their engine: after a recovery, the
#: failed engine's worker here still holds its tensors until they are handed over.
_by_engine: dict[int, TensorWorker] = {}


def this_worker() -> TensorWorker | None:
    """The tensor worker of this process, if it has one."""
    return _this_worker


def worker_of(engine_id: int) -> TensorWorker | None:
    """The tensor worker of engine ``engine_id`` in this process, if there is one."""
    return _by_engine.get(engine_id)


#: Commands that define things for every stream (run at once, in any stream's place).
_GLOBAL = frozenset(wire.GLOBAL)


def _import_path(path: str, qualname: str | None) -> Any:
    """``"module.function"`` (or a module and a dotted qualified name) as an object."""
    import importlib

    if qualname is None:
        module, _, qualname = path.rpartition(".")
    else:
        module = path
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _describe(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
        return x

    return tree_map(meta, value)


def _placeholders(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    def make(x: Any) -> Any:
        if isinstance(x, TensorMeta):
            return torch.zeros(x.size, dtype=x.dtype, device=x.device)
        if isinstance(x, GroupRef):
            raise ValueError(
                "a process group cannot be passed to a remote function whose outputs are "
                "learned by running it (propagate='cached'); give `propagate=` a function"
            )
        return x

    return tree_map(make, value)
