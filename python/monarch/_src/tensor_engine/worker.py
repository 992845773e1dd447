"""The tensor worker: one actor per proc that runs the client's commands with torch.

A worker keeps a table from ref ids to values. A command whose input failed, or that
raises, stores a :class:`~monarch._src.tensor_engine.wire.Failure` under its outputs
instead of values: nothing the client sends kills a worker, and the failure is reported
by the fetches that depend on it (with the seq of the command that failed first).

Collectives run over torch process groups built directly (not
``init_process_group``, so any number coexist): one per set of member ranks and device
type, created at first use. Every member sees the same commands in the same order, so
lazy creation cannot deadlock. Rendezvous goes through the controller's store over
monarch's messaging (:class:`MeshStore`). An input that failed takes part with zeros of
its shape so that its peers do not wait for it.

Point-to-point transfers (``to_mesh``) go over monarch ports: the sender sends its
value to the receiving worker's port; the receiver waits for it (bounded by the
collective timeout).

Streams: the commands of stream 0 (``"main"``) run on the actor's own thread as they
arrive; every other stream has a thread of its own (and, on CUDA, a CUDA stream) fed by
a queue, so streams run concurrently. Their values share one table; ``SIGNAL``/``WAIT``
order them where the client asked (borrows). Collectives use process groups per stream,
so two streams' collectives never interleave on one group.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import datetime
import logging
import os
import queue
import re
import threading
import traceback
from typing import Any

import torch
import torch.distributed as dist

from monarch._src.actor.actor import Actor
from monarch._src.actor.channel import Channel, Port
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.pickling import loads
from monarch._src.tensor_engine import shm, wire, worker_interop
from monarch._src.tensor_engine.wire import Failure, GroupRef, Ref, TensorMeta

__all__ = ["MeshStore", "TensorWorker", "this_worker"]

#: torch's store base class (its stubs hide it behind a platform check).
_StoreBase: Any = getattr(dist, "Store")  # noqa: B009
_PrefixStore: Any = getattr(dist, "PrefixStore")  # noqa: B009

_REDUCE_OPS = {
    "sum": "SUM",
    "avg": "AVG",
    "product": "PRODUCT",
    "min": "MIN",
    "max": "MAX",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}


#: Collective results of at least this many bytes (CPU) reuse pooled memory.
POOL_MIN_BYTES = 1 << 20
#: How many buffers of one size the pool keeps.
POOL_PER_SIZE = 4

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


def _collective_timeout() -> float:
    from monarch._src import config

    return float(config.get("tensor_collective_timeout"))


class MeshStore(_StoreBase):  # type: ignore[misc]
    """A ``torch.distributed.Store`` kept by the engine's controller actor: process
    groups rendezvous over monarch's authenticated messaging, with no server of their
    own."""

    def __init__(self, controller: Any, timeout: float) -> None:
        super().__init__()
        self.controller = controller
        self._wait_s = timeout

    def _get(self, fut: Any) -> Any:
        return fut.get(timeout=self._wait_s + 10)

    def set(self, key: str, value: Any) -> None:
        self._get(self.controller.store_set.call_one(key, _as_bytes(value)))

    def get(self, key: str) -> bytes:
        value = self._get(self.controller.store_get.call_one(key, self._wait_s))
        if value is None:
            raise dist.DistStoreError(
                f"the key {key!r} was not set within {self._wait_s} s: a member of the "
                "process group did not join it"
            )
        return value  # type: ignore[no-any-return]

    def add(self, key: str, amount: int) -> int:
        return int(self._get(self.controller.store_add.call_one(key, int(amount))))

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if not self._get(self.controller.store_wait.call_one(list(keys), self._wait_s)):
            raise dist.DistStoreError(f"the keys {keys} were not set within {self._wait_s} s")

    def check(self, keys: list[str]) -> bool:
        return bool(self._get(self.controller.store_check.call_one(list(keys))))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._get(  # type: ignore[no-any-return]
            self.controller.store_compare_set.call_one(key, _as_bytes(expected), _as_bytes(desired))
        )

    def delete_key(self, key: str) -> bool:
        return bool(self._get(self.controller.store_delete.call_one(key)))

    def num_keys(self) -> int:
        return int(self._get(self.controller.store_num_keys.call_one()))

    def set_timeout(self, timeout: Any) -> None:
        pass


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _tensor_bytes(value: torch.Tensor) -> bytes:
    """A CPU tensor's elements as bytes, in row-major order: one copy, and no NumPy
    (torch installed alone has none)."""
    flat = value.contiguous().reshape(-1).view(torch.uint8)
    n = flat.numel()
    return ctypes.string_at(flat.data_ptr(), n) if n else b""


def _local_address() -> str:
    """The address gloo listens on: the IP this proc's monarch address uses (so peers
    on other hosts reach it), else loopback.

    A proc id is ``<uid>@<address>``; a TCP address is ``tcp:<ipv4>:<port>`` or
    ``tcp:[<ipv6>]:<port>`` (the IPv6 one without its brackets here)."""
    from monarch._src.actor import process

    proc_id = process.get().proc_id
    match = re.search(r"@tcp:(?:\[([^\]]+)\]|([^:\[\]]+)):\d+$", proc_id)
    if match:
        return match.group(1) or match.group(2)
    return "127.0.0.1"


class TensorWorker(Actor):
    """Runs the commands of one tensor engine on this proc (see the module docs)."""

    def __init__(self, controller: Any) -> None:
        global _this_worker
        _this_worker = self
        self.controller = controller
        self.rank = context().actor_instance.rank.rank
        self.values: dict[int, Any] = {}
        self.fns: dict[int, Any] = {}
        self.views: dict[int, Any] = {}
        self.groups: dict[tuple[Any, ...], Any] = {}
        self.stores: list[MeshStore] = []
        #: Collectives reached, per group (see ``_arrive``).
        self.arrivals: dict[str, int] = {}
        #: Large CPU buffers of collective results, by size, kept for reuse (``_empty``).
        self.pool: dict[int, list[Any]] = {}
        #: Same-host all-reduces (``shm``), per group and stream: whether the group uses
        #: the shared path, and its segments and sockets where it does.
        self.shm_groups: dict[str, bool] = {}
        self.shm_links: dict[str, shm.Group] = {}
        self.peers: list[Port[Any]] | None = None
        self.port: Port[Any]
        self.receiver: Any
        self.port, self.receiver = Channel.open()
        self.inbox: dict[tuple[int, int], Any] = {}
        self.inbox_changed = threading.Condition()
        self.pump: threading.Thread | None = None
        self.streams: dict[int, _StreamThread] = {}
        self._local = _Local()
        #: SIGNAL token -> [reached, CUDA event or None] (see ``_signal``).
        self.signals: dict[int, list[Any]] = {}
        self.signals_lock = threading.Lock()
        self.seq = -1
        #: Why a whole batch could not be read, if one could not.
        self.broken: Failure | None = None

    def __cleanup__(self, exc: Any) -> None:
        # The shared segments and sockets of same-host all-reduces (see ``shm``).
        self._close_shm()

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
        stream_op = wire.STREAM
        for i, cmd in enumerate(cmds):
            op = cmd[0]
            if op == stream_op:
                self._dispatch(sid, cmds, start, i)
                sid = cmd[2]
                if sid and sid not in self.streams:
                    self.streams[sid] = _StreamThread(self, sid, cmd[3])
                start = i + 1
            elif sid and op in _GLOBAL:
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
        timeout = _collective_timeout()
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
        return self.port

    # --- commands -----------------------------------------------------------------------

    def _execute(self, cmd: tuple[Any, ...]) -> None:
        op = cmd[0]
        try:
            if op == wire.OP:
                self._op(cmd)
            elif op == wire.DELETE:
                pop = self.values.pop
                for ref in cmd[2]:
                    pop(ref, None)
            elif op == wire.DEFINE_FN:
                self.fns[cmd[1]] = self._resolve_fn(cmd[2])
            elif op == wire.DEFINE_VIEW:
                self.views[cmd[2]] = cmd[3]
            elif op == wire.CALL:
                self._call(cmd)
            elif op == wire.RANK:
                self._rank(cmd)
            elif op == wire.REDUCE:
                self._reduce(cmd)
            elif op == wire.SEND:
                self._send(cmd)
            elif op == wire.RECV:
                self._recv(cmd)
            elif op == wire.PEERS:
                self.peers = cmd[2]
            elif op == wire.UNPACK:
                self._unpack(cmd)
            elif op == wire.FAIL:
                self._fail_outputs(cmd, Failure(cmd[1], self.rank, cmd[3], []))
            elif op == wire.SIGNAL:
                self._signal(cmd[2])
            elif op == wire.WAIT:
                self._wait(cmd[2])
            elif op == wire.ALIAS:
                self.values[cmd[2]] = self._value(cmd[3])
            elif op == wire.ACTOR:
                worker_interop.worker_actor_command(self, cmd)
        except BaseException as e:  # never let a command end the worker
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self._fail_outputs(cmd, self._failure(cmd[1], e))

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
        timeout = _collective_timeout()
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

    def _fail_outputs(self, cmd: tuple[Any, ...], failure: Failure) -> None:
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
            return self._group_for(x)
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

    def _op(self, cmd: tuple[Any, ...]) -> None:
        _, _seq, fid, args, kwargs, outs, writes = cmd
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

    def _call(self, cmd: tuple[Any, ...]) -> None:
        _, _seq, fid, args, kwargs, outs, whole = cmd
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

    def _unpack(self, cmd: tuple[Any, ...]) -> None:
        _, _seq, whole, outs = cmd
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

    def _rank(self, cmd: tuple[Any, ...]) -> None:
        _, _seq, out, vid, dims = cmd
        shape, coords = self._coords(vid)
        sizes = dict(shape.extent)
        value = 0
        for d in dims:
            value = value * sizes[d] + coords[d]
        self.values[out] = torch.tensor(value, dtype=torch.int64)

    # --- collectives --------------------------------------------------------------------

    def _members(self, vid: int, dims: tuple[str, ...]) -> list[int]:
        shape, mine = self._coords(vid)
        others = [label for label in shape.labels if label not in dims]
        members = []
        for r in shape.ranks():
            point = shape.coordinates(r)
            if all(point[label] == mine[label] for label in others):
                members.append(r)
        return members

    def _group(self, members: list[int], device: str) -> Any:
        """The process group of ``members`` for ``device`` tensors on the current
        stream (each stream has its own, so their collectives never interleave)."""
        sid = self._local.sid
        key = (tuple(members), device, sid)
        pg = self.groups.get(key)
        if pg is None:
            timeout = _collective_timeout()
            # The Python store must outlive the group: torch keeps only its C++ half.
            mesh_store = MeshStore(self.controller, timeout)
            self.stores.append(mesh_store)
            store = _PrefixStore(f"pg/{device}/{sid}/{'.'.join(map(str, members))}/", mesh_store)
            rank = members.index(self.rank)
            td = datetime.timedelta(seconds=timeout)
            if device == "cuda":
                pg = dist.ProcessGroupNCCL(
                    store, rank, len(members), dist.ProcessGroupNCCL.Options()
                )
            else:
                from torch._C._distributed_c10d import ProcessGroupGloo

                iface = os.environ.get("GLOO_SOCKET_IFNAME")
                if iface:
                    dev = ProcessGroupGloo.create_device(interface=iface)
                else:
                    dev = ProcessGroupGloo.create_device(hostname=_local_address())
                opts = getattr(ProcessGroupGloo, "_Options")()  # noqa: B009
                opts._devices = [dev]
                opts._timeout = td
                pg = ProcessGroupGloo(store, rank, len(members), opts)
            self.groups[key] = pg
        return pg

    def _group_for(self, ref: GroupRef) -> Any:
        """The group a remote function gets for a ``RemoteProcessGroup``: gloo for CPU
        tensors and, where CUDA is present, NCCL for CUDA tensors, in one group (as
        ``torch.distributed``'s default ``"cpu:gloo,cuda:nccl"``), so user code can reduce
        either kind of tensor with it."""
        members = self._members(ref.vid, ref.dims)
        if not torch.cuda.is_available():
            pg = self._group(members, "cpu")
            _register_group(pg, members, "cpu")
            return pg
        key = (tuple(members), "cpu+cuda", self._local.sid)
        pg = self.groups.get(key)
        if pg is None:
            pg = _two_backend_group(
                self._group(members, "cpu"),
                self._group(members, "cuda"),
                members.index(self.rank),
                len(members),
            )
            self.groups[key] = pg
        _register_group(pg, members, "cpu+cuda")
        return pg

    def _reduce(self, cmd: tuple[Any, ...]) -> None:
        _, _seq, out, inp, vid, dims, reduction, scatter, inplace, meta = cmd
        members = self._members(vid, dims)
        value = self._value(inp)
        failure = value if type(value) is Failure else None
        if failure is None and inplace:
            target = self._value(out)
            if type(target) is Failure:
                failure = target
        if failure is not None:
            # Take part with zeros so that peers do not wait for us.
            size, dtype, device = meta
            value = torch.zeros(size, dtype=dtype, device=device)
        device = "cuda" if value.device.type == "cuda" else "cpu"
        try:
            in_place = inplace and out == inp and failure is None
            result = self._collective(value, members, device, reduction, scatter, in_place)
        except Exception as e:
            raise RuntimeError(self._collective_error(e, members, reduction, dims)) from e
        if failure is not None:
            self.values[out] = failure
        elif inplace:
            target = self.values[out]
            if target is not result:
                target.copy_(result)
        else:
            self.values[out] = result

    def _empty(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A 1-D tensor for a collective's result. Large CPU ones reuse the memory of an
        earlier result that is no longer used (at most :data:`POOL_PER_SIZE` buffers per
        size are kept): fresh memory of that size comes from the OS page by page, which
        costs more than the collective's own copy."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if device.type != "cpu" or nbytes < POOL_MIN_BYTES:
            return torch.empty(numel, dtype=dtype, device=device)
        kept = self.pool.setdefault(nbytes, [])
        for storage in kept:
            if torch._C._storage_Use_Count(storage._cdata) == 1:  # only the pool has it
                return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))
        fresh = torch.empty(numel, dtype=dtype)
        if len(kept) < POOL_PER_SIZE:
            kept.append(fresh.untyped_storage())
        return fresh

    def _collective(
        self,
        value: torch.Tensor,
        members: list[int],
        device: str,
        reduction: str,
        scatter: bool,
        in_place: bool = False,
    ) -> torch.Tensor:
        """The result of ``reduction`` over ``members``: a new tensor, or with
        ``in_place`` (an all-reduce into ``value``) possibly ``value`` itself; the
        caller copies it where an in-place form asks."""
        from torch._C._distributed_c10d import AllreduceOptions, ReduceOp, ReduceScatterOptions

        n = len(members)
        src = value.contiguous()
        if n > 1 and not self._on_shm(members, src, reduction, scatter):
            self._arrive(members, device)
        if n == 1:
            if reduction == "stack":
                return src.clone() if scatter else src.unsqueeze(0).clone()
            return src[0].clone() if scatter else src.clone()
        pg = self._group(members, device)
        empty = self._empty
        if reduction == "stack":
            if scatter:
                flat = empty(src.numel(), src.dtype, src.device)
                pg.alltoall_base(flat, src.reshape(-1), [], []).wait()
                result = flat.view(src.shape)
            else:
                flat = empty(n * src.numel(), src.dtype, src.device)
                pg._allgather_base(flat, src.reshape(-1)).wait()
                result = flat.view(n, *src.shape)
            return result
        op = getattr(ReduceOp, _REDUCE_OPS[reduction])
        if scatter:
            flat = empty(src.numel() // n, src.dtype, src.device)
            rs_opts = ReduceScatterOptions()
            rs_opts.reduceOp = op
            pg._reduce_scatter_base(flat, src.reshape(-1), rs_opts).wait()
            return flat.view(src.shape[1:])
        if self._use_shm(members, src, reduction):
            # Same host: through the group's shared segment, straight into the result:
            # ``value`` itself where in place (so that the caller copies nothing).
            link = self.shm_links[self._group_key(members)]
            timeout = _collective_timeout()
            if in_place and src is value:
                link.allreduce(src.reshape(-1), src.reshape(-1), reduction, timeout)
                return src
            flat = empty(src.numel(), src.dtype, src.device)
            link.allreduce(src.reshape(-1), flat, reduction, timeout)
            return flat.view(src.shape)
        opts = AllreduceOptions()
        opts.reduceOp = op
        if in_place or src is not value:
            result = src
        else:
            result = empty(src.numel(), src.dtype, src.device).view(src.shape)
            result.copy_(src)
        pg.allreduce([result], opts).wait()
        return result

    def _group_key(self, members: list[int]) -> str:
        """The members and the current stream, as a key of per-group state."""
        return f"{self._local.sid}/{'.'.join(map(str, members))}"

    def _use_shm(self, members: list[int], src: torch.Tensor, reduction: str) -> bool:
        """Whether this all-reduce goes through a shared segment (see ``shm``): CPU, a
        reduction it has, and every member on this host (set up once per group and
        stream, decided by all members alike; the store is used only then). Every size
        goes this way: it beats gloo's loopback TCP at every size measured (1 KiB to
        64 MiB)."""
        if (
            src.device.type != "cpu"
            or reduction not in shm.REDUCTIONS
            or (reduction == "avg" and not src.dtype.is_floating_point)
        ):
            return False
        key = self._group_key(members)
        known = self.shm_groups.get(key)
        if known is None:
            timeout = _collective_timeout()
            store = shm.Prefixed(MeshStore(self.controller, timeout), f"shm/{key}/")
            try:
                link = shm.Group.setup(store, members, self.rank, timeout)
            except Exception:
                # A member did not come in time, so none can decide for the shared path
                # (see ``shm.Group.setup``): the group's later all-reduces use gloo.
                self.shm_groups[key] = False
                raise
            known = link is not None
            if link is not None:
                self.shm_links[key] = link
            self.shm_groups[key] = known
        return known

    def _on_shm(self, members: list[int], src: torch.Tensor, reduction: str, scatter: bool) -> bool:
        """Whether this collective is an all-reduce of a group already on the shared
        path: its barrier names the ranks that did not come, so it skips ``_arrive``
        (whose message costs more than a small all-reduce)."""
        return (
            not scatter
            and self.shm_groups.get(self._group_key(members)) is True
            and self._use_shm(members, src, reduction)
        )

    def _close_shm(self) -> None:
        """Close every group's shared segments and sockets."""
        links, self.shm_links = self.shm_links, {}
        for link in links.values():
            link.close()

    def _arrive(self, members: list[int], device: str) -> None:
        """Tell the controller this rank reached its next collective of this group (so
        that a timeout can name the ranks that did not)."""
        key = f"{device}/{self._group_key(members)}"
        count = self.arrivals.get(key, 0) + 1
        self.arrivals[key] = count
        self.controller.arrive.broadcast(key, self.rank, count)

    def _collective_error(self, e: Exception, members: list[int], reduction: str, dims: Any) -> str:
        if isinstance(e, shm.CollectiveTimeout):
            missing = e.missing  # the shared path's barrier knows whom it did not hear
        else:
            missing = self._missing(members, "cuda" if "NCCL" in str(e) else "cpu")
        timeout = _collective_timeout()
        who = (
            f"ranks {missing} did not join it within {timeout} s (tensor_collective_timeout)"
            if missing
            else "every member joined it"
        )
        return (
            f"the collective {reduction!r} over dims {tuple(dims)} (ranks {members}) failed "
            f"on rank {self.rank}; {who}: {e}"
        )

    def _missing(self, members: list[int], device: str) -> list[int]:
        key = f"{device}/{self._group_key(members)}"
        mine = self.arrivals.get(key, 0)
        try:
            counts = self.controller.arrivals_of.call_one(key).get(timeout=10)
        except Exception:
            return []
        return [m for m in members if counts.get(m, 0) < mine]

    # --- point to point -----------------------------------------------------------------

    def _send(self, cmd: tuple[Any, ...]) -> None:
        _, seq, ref, routes = cmd
        dests = routes.get(self.rank, ())
        value = self._value(ref)
        if isinstance(value, torch.Tensor):
            value = value.detach()
        for dest in dests:
            if dest == self.rank:
                # A copy, as a peer receives one (the two may be used on different
                # streams, and in place).
                copy = value.clone() if isinstance(value, torch.Tensor) else value
                with self.inbox_changed:
                    self.inbox[(seq, self.rank)] = copy
                    self.inbox_changed.notify_all()
            else:
                assert self.peers is not None, "no peer ports (PEERS) were sent"
                self.peers[dest].send((seq, self.rank, value))

    def _recv(self, cmd: tuple[Any, ...]) -> None:
        _, seq, out, sources = cmd
        src = sources[self.rank]
        key = (seq, src)
        timeout = _collective_timeout()
        if src != self.rank and self.pump is None:
            self.pump = threading.Thread(
                target=self._pump, name="monarch-tensor-inbox", daemon=True
            )
            self.pump.start()
        with self.inbox_changed:
            if not self.inbox_changed.wait_for(lambda: key in self.inbox, timeout):
                raise RuntimeError(
                    f"to_mesh: rank {self.rank} received nothing from rank {src} within "
                    f"{timeout} s (`tensor_collective_timeout`); the sender may have died"
                )
            value = self.inbox.pop(key)
        self.values[out] = value

    def _pump(self) -> None:
        """Move what peers send to this worker's port into the inbox (any stream may
        be waiting for it)."""
        while True:
            try:
                s, sender, value = self.receiver.recv().get()
            except Exception:
                logger.exception("rank %s: the tensor inbox stopped", self.rank)
                return
            with self.inbox_changed:
                self.inbox[(s, sender)] = value
                self.inbox_changed.notify_all()


#: The tensor worker of this process (a proc belongs to one mesh: it has at most one).
_this_worker: TensorWorker | None = None


def this_worker() -> TensorWorker | None:
    """The tensor worker of this process, if it has one."""
    return _this_worker


#: Commands that define things for every stream (run at once, in any stream's place).
_GLOBAL = frozenset((wire.DEFINE_FN, wire.DEFINE_VIEW, wire.PEERS))


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


def _two_backend_group(cpu: Any, cuda: Any, rank: int, size: int) -> Any:
    """One ``ProcessGroup`` that sends CPU tensors through ``cpu`` (gloo) and CUDA
    tensors through ``cuda`` (NCCL), built as ``torch.distributed`` builds its own
    multi-backend groups."""
    kinds = dist.ProcessGroup.BackendType
    pg = dist.ProcessGroup(getattr(dist, "HashStore")(), rank, size)  # noqa: B009
    pg._set_default_backend(kinds.NCCL)
    pg._register_backend(torch.device("cpu"), kinds.GLOO, cpu)
    pg._register_backend(torch.device("cuda"), kinds.NCCL, cuda)
    return pg


def _register_group(pg: Any, members: list[int], device: str) -> None:
    """Make ``pg`` usable with ``torch.distributed``'s functions (``dist.all_reduce(t,
    group=pg)``): register it as the c10d world registers the groups it creates."""
    from torch.distributed import distributed_c10d as c10d

    world: Any = c10d._world
    if pg in world.pg_map:
        return
    backend = {"cuda": "nccl", "cpu": "gloo"}.get(device, "cpu:gloo,cuda:nccl")
    world.pg_map[pg] = (backend, None)
    world.pg_names[pg] = f"monarch:{'.'.join(map(str, members))}:{device}"
    world.pg_group_ranks[pg] = {g: i for i, g in enumerate(members)}
    world.pg_backend_config[pg] = backend
    try:
        pg._set_group_name(world.pg_names[pg])
    except Exception:
        pass  # older torch: the name is only for its logs
