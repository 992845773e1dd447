"""The collectives of a tensor worker: process groups, all-reduces and the rest,
same-host all-reduces through shared memory, and point-to-point transfers.

Collectives run over torch process groups built directly (not ``init_process_group``,
so any number coexist): one per set of member ranks, device type and stream, created at
first use. Every member sees the same commands in the same order, so lazy creation
cannot deadlock. Rendezvous goes through the controller's store over monarch's messaging
(:class:`MeshStore`). An input that failed takes part with zeros of its shape so that
its peers do not wait for it. On one host, CPU all-reduces go through a shared segment
(:mod:`monarch._src.tensor_engine.worker.shm`).

Point-to-point transfers (``to_mesh``) go over monarch ports: the sender sends its value
to the receiving worker's port; the receiver waits for it (bounded by the collective
timeout).

A worker owns one :class:`Collectives` and hands it the ``Reduce``, ``Send``, ``Recv``
and ``Peers`` commands.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from monarch._src.actor.channel import Channel, Port
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.wire import Failure, GroupRef
from monarch._src.tensor_engine.worker import shm

if TYPE_CHECKING:
    from monarch._src.tensor_engine.worker.actor import TensorWorker

__all__ = ["Collectives", "MeshStore", "collective_timeout"]

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


def collective_timeout() -> float:
    """How long a collective may wait for its members (``tensor_collective_timeout``)."""
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


class Collectives:
    """The collectives of one :class:`~monarch._src.tensor_engine.worker.actor.TensorWorker`
    (see the module docs)."""

    def __init__(self, worker: TensorWorker) -> None:
        self.worker = worker
        self.rank = worker.rank
        self.controller = worker.controller
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
        #: Where each worker receives point-to-point data, by global rank (``Peers``).
        self.peers: list[Port[Any]] | None = None
        self.port: Port[Any]
        self.receiver: Any
        self.port, self.receiver = Channel.open()
        self.inbox: dict[tuple[int, int], Any] = {}
        self.inbox_changed = threading.Condition()
        self.pump: threading.Thread | None = None

    def set_peers(self, cmd: wire.Peers) -> None:
        self.peers = cmd.ports

    def _members(self, vid: int, dims: tuple[str, ...]) -> list[int]:
        shape, mine = self.worker._coords(vid)
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
        sid = self.worker._local.sid
        key = (tuple(members), device, sid)
        pg = self.groups.get(key)
        if pg is None:
            timeout = collective_timeout()
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

    def group_for(self, ref: GroupRef) -> Any:
        """The group a remote function gets for a ``RemoteProcessGroup``: gloo for CPU
        tensors and, where CUDA is present, NCCL for CUDA tensors, in one group (as
        ``torch.distributed``'s default ``"cpu:gloo,cuda:nccl"``), so user code can reduce
        either kind of tensor with it."""
        members = self._members(ref.vid, ref.dims)
        if not torch.cuda.is_available():
            pg = self._group(members, "cpu")
            _register_group(pg, members, "cpu")
            return pg
        key = (tuple(members), "cpu+cuda", self.worker._local.sid)
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

    def reduce(self, cmd: wire.Reduce) -> None:
        out, inp, vid, dims = cmd.out, cmd.inp, cmd.vid, cmd.dims
        reduction, scatter, inplace, meta = cmd.reduction, cmd.scatter, cmd.inplace, cmd.meta
        members = self._members(vid, dims)
        value = self.worker._value(inp)
        failure = value if type(value) is Failure else None
        if failure is None and inplace:
            target = self.worker._value(out)
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
            self.worker.values[out] = failure
        elif inplace:
            target = self.worker.values[out]
            if target is not result:
                target.copy_(result)
        else:
            self.worker.values[out] = result

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
            timeout = collective_timeout()
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
        return f"{self.worker._local.sid}/{'.'.join(map(str, members))}"

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
            timeout = collective_timeout()
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

    def close(self) -> None:
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
        timeout = collective_timeout()
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

    def send(self, cmd: wire.Send) -> None:
        seq, ref, routes = cmd.seq, cmd.ref, cmd.routes
        dests = routes.get(self.rank, ())
        value = self.worker._value(ref)
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

    def recv(self, cmd: wire.Recv) -> None:
        seq, out, sources = cmd.seq, cmd.out, cmd.sources
        src = sources[self.rank]
        key = (seq, src)
        timeout = collective_timeout()
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
        self.worker.values[out] = value

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
