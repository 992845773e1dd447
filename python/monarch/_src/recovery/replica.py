"""One replica of a data-parallel run that can be recovered: the :class:`Replica` actor.

A replica holds a model and its optimizer and trains on its own share of each step's
data; gradients are averaged over a torch.distributed process group of all replicas.
The controller (:mod:`.trainer`) drives it in two phases per step, so that a failure in
the middle of a step never leaves the survivors in different states:

1. ``recovery_compute(step, generation)``: forward, backward, and the gradients' average
   over the group; nothing of the model changes yet;
2. ``recovery_commit(step)``: the optimizer step, once every replica computed.

When a replica is lost, the survivors join a new group (``recovery_join``, a new
*generation* of the membership), a new replica copies the state of a survivor one-sided
(``recovery_offer_state`` / ``recovery_load_state``), and the step is computed again.
Joining and computing run on threads of their own, so a replica stuck in a collective
with a lost peer still answers the new membership; what that stale collective returns
later is thrown away.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import concurrent_endpoint, endpoint
from monarch._src.rdma.buffer import RDMABuffer
from monarch._src.recovery.state import pack, unpack

__all__ = ["Membership", "Replica", "StaleStep", "StateOffer", "StepDone"]


@dataclass(frozen=True)
class Membership:
    """Who trains together: one generation of the replicas' process group."""

    #: The run's id: the prefix of its keys in the rendezvous store.
    run: str
    #: Counts up at every change of membership.
    generation: int
    #: This replica's rank among the replicas, and how many there are.
    rank: int
    world: int
    #: The rendezvous store (a ``TCPStore`` served by the controller).
    store_host: str
    store_port: int
    #: ``"gloo"`` or ``"nccl"``.
    backend: str
    #: How long joining and each collective may take, in seconds.
    timeout: float


@dataclass(frozen=True)
class StepDone:
    """What one replica reports of a computed step."""

    rank: int
    step: int
    loss: float


@dataclass(frozen=True)
class StateOffer:
    """A replica's state, offered for a one-sided copy: the skeleton of its state dict,
    the registered block of bytes, and the step it is at."""

    rank: int
    step: int
    skeleton: Any
    buffer: RDMABuffer


class StaleStep(RuntimeError):
    """A step computed under a membership that has changed since; the controller
    ignores it."""


class _ReplicaState:
    """The controller's bookkeeping in a replica, apart from the user's attributes."""

    def __init__(self) -> None:
        #: Guards the fields below: joining and computing run on threads of their own.
        self.lock = threading.Lock()
        #: The generation of the current membership (-1 before the first).
        self.generation = -1
        #: The averaged gradients of a computed step, until committed: (step, the
        #: parameters, their gradients as one flat tensor).
        self.pending: tuple[int, list[torch.Tensor], torch.Tensor] | None = None
        #: The packed state and its registration, while offered.
        self.offer: tuple[Any, RDMABuffer] | None = None


def _local_address(peer: str) -> str:
    """This machine's address on the route to ``peer``: what the other replicas can reach
    this one at (the hostname may resolve to a loopback address, as on Debian)."""
    with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # no packet is sent: this only picks the route
        return str(s.getsockname()[0])


def _group(m: Membership) -> Any:
    """The process group of membership ``m``: its own keys in the shared store, so that
    each generation rendezvouses apart from the earlier ones. Gloo listens on the
    address that routes to the store (``GLOO_SOCKET_IFNAME``, when set, decides)."""
    timeout = datetime.timedelta(seconds=m.timeout)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        m.store_host, m.store_port, is_master=False, timeout=timeout, wait_for_workers=False
    )
    prefix = f"monarch/recovery/{m.run}/{m.generation}/"
    prefixed = dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
    if m.backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        interface = os.environ.get("GLOO_SOCKET_IFNAME")
        if interface:
            options._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
        else:
            address = _local_address(m.store_host)
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
        return dist.ProcessGroupGloo(prefixed, m.rank, m.world, options)
    if m.backend == "nccl":
        nccl = dist.ProcessGroupNCCL.Options()
        nccl._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, m.rank, m.world, nccl)
    raise ValueError(f"unknown backend {m.backend!r}; expected 'gloo' or 'nccl'")


class Replica(Actor):
    """One replica of a recoverable data-parallel run (see the [Recovery](../recovery.md)
    guide).

    Subclass it: in ``__init__`` set ``self.model`` (a ``torch.nn.Module``) and
    ``self.optimizer``, building them the same way in every replica; define
    :meth:`batch` and :meth:`loss`. During training, ``self.replica_rank`` and
    ``self.num_replicas`` say which share of the data is this replica's, and
    ``self.process_group`` is the current group of all replicas. Endpoints of your own
    must be ``async def`` (a replica is an async actor).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    #: This replica's rank among the replicas, and how many there are (set by joining).
    replica_rank: int = 0
    num_replicas: int = 1
    #: The process group of the current membership (``None`` before the first): a
    #: torch.distributed backend of the membership's ranks (``ProcessGroupGloo`` or
    #: ``ProcessGroupNCCL``), whose collectives (``allreduce``, ``broadcast``, ...) take
    #: lists of tensors and return a work to ``wait()`` on.
    process_group: Any = None
    #: The next step to train: how many steps this replica's state has taken.
    step: int = 0

    # ------------------------------------------------------------------ user hooks

    def batch(self, step: int) -> Any:
        """This replica's data for ``step``: a function of ``step``, ``replica_rank``
        and ``num_replicas`` only, so that a recomputed step sees the same data."""
        raise NotImplementedError(
            f"{type(self).__name__} must define batch(self, step) -> this replica's data"
        )

    def loss(self, batch: Any) -> torch.Tensor:
        """The loss of ``batch`` under ``self.model`` (a scalar tensor)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define loss(self, batch) -> a scalar tensor"
        )

    def state_dict(self) -> dict[str, Any]:
        """What a new replica copies from a survivor: by default the model's and the
        optimizer's state dicts. Override both this and :meth:`load_state_dict` to carry
        more (a learning-rate scheduler, a data cursor)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state a survivor offered (see :meth:`state_dict`)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def on_membership(self, membership: Membership) -> None:
        """Called after this replica joined a new membership (``self.process_group``
        is the new group): rebuild what depends on the group here."""

    # ------------------------------------------------------------------ endpoints

    @property
    def _recovery(self) -> _ReplicaState:
        state: _ReplicaState | None = self.__dict__.get("_recovery_state")
        if state is None:  # subclasses need not call Replica.__init__
            state = self.__dict__.setdefault("_recovery_state", _ReplicaState())
        return state

    @concurrent_endpoint
    async def recovery_join(self, membership: Membership) -> None:
        """Join the process group of ``membership`` (all its replicas call this at
        once); a later generation than this one's replaces the current group."""
        group = await asyncio.to_thread(_group, membership)
        r = self._recovery
        with r.lock:
            if membership.generation < r.generation:
                return
            r.generation = membership.generation
            r.pending = None
            self.process_group = group
            self.replica_rank = membership.rank
            self.num_replicas = membership.world
        self.on_membership(membership)

    @concurrent_endpoint
    async def recovery_compute(self, step: int, generation: int) -> StepDone:
        """Forward and backward on this replica's batch of ``step``, and the average of
        the gradients over the group; the model is not changed until
        ``recovery_commit``."""
        return await asyncio.to_thread(self._compute, step, generation)

    def _compute(self, step: int, generation: int) -> StepDone:
        r = self._recovery
        with r.lock:
            if generation != r.generation:
                raise StaleStep(f"step {step} of generation {generation} is stale")
            group, world = self.process_group, self.num_replicas
        assert group is not None
        self.optimizer.zero_grad(set_to_none=False)
        loss = self.loss(self.batch(step))
        loss.backward()  # type: ignore[no-untyped-call]
        params: list[torch.Tensor] = [p for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        group.allreduce([flat]).wait()
        flat /= world
        with r.lock:
            if generation != r.generation:
                raise StaleStep(f"step {step} of generation {generation} is stale")
            r.pending = (step, params, flat)
        return StepDone(rank=self.replica_rank, step=step, loss=float(loss.detach()))

    @endpoint
    async def recovery_commit(self, step: int) -> int:
        """Apply the averaged gradients of ``step`` (the optimizer step); the next step
        to train."""
        r = self._recovery
        with r.lock:
            pending, r.pending = r.pending, None
        if pending is None or pending[0] != step:
            raise RuntimeError(
                f"replica {self.replica_rank}: no computed gradients of step {step} to "
                "commit; the controller commits only steps every replica computed"
            )
        _, params, flat = pending
        offset = 0
        for p in params:
            n = p.numel()
            assert p.grad is not None
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        self.optimizer.step()
        self.step = step + 1
        return self.step

    @endpoint
    async def recovery_offer_state(self) -> StateOffer:
        """This replica's state, packed and registered for a one-sided copy; it stays
        registered until ``recovery_release_state``."""
        packed = pack(self.state_dict())
        buffer = RDMABuffer(packed.data)
        self._recovery.offer = (packed, buffer)
        return StateOffer(
            rank=self.replica_rank, step=self.step, skeleton=packed.skeleton, buffer=buffer
        )

    @endpoint
    async def recovery_release_state(self) -> None:
        """Drop the state offered last."""
        offer, self._recovery.offer = self._recovery.offer, None
        if offer is not None:
            await offer[1].drop()

    @endpoint
    async def recovery_load_state(self, offer: StateOffer) -> int:
        """Copy ``offer`` (a survivor's state) into this replica, one-sided; the step
        this replica is at afterwards."""
        data = torch.empty(offer.buffer.size(), dtype=torch.uint8)
        await offer.buffer.read_into(data)
        self.load_state_dict(unpack(offer.skeleton, data))
        self.step = offer.step
        r = self._recovery
        with r.lock:
            r.pending = None
        return self.step

    @endpoint
    async def recovery_step(self) -> int:
        """The next step this replica would train."""
        return self.step
