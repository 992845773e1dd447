"""Recovery of data-parallel training written with distributed tensors:
:class:`TensorTrainer`.

The training runs from one controller (this process) on a root proc mesh of
``replicas`` procs along one dimension: every rank holds the same state (parameters and
optimizer state, a pytree of monarch tensors) and trains on its own share of each step's
data; the gradients are averaged over the dimension. A step has two phases, as for
:class:`~monarch._src.recovery.trainer.ElasticTrainer`:

1. *compute*: the user's ``compute(state, step, rank)`` (forward and backward), then the
   gradients' average as one flat ``reduce_(dim, "avg")``; the trainer then fetches a
   scalar of the result from every rank, so it knows every rank completed the average.
   Nothing of the state changes in this phase.
2. *commit*: the user's ``update(state, grads, step)`` (the optimizer step, local to each
   rank), sent to the workers as one message (``Engine.whole``) that ends with a mark.

When a proc dies (its tensor engine records it from supervision), the trainer

1. takes a replacement proc: a warm spare (started ahead), else a new proc on the lost
   proc's host (``WhenNoSpare.COLOCATE``), or goes on with fewer ranks
   (``WhenNoSpare.SHRINK``), or raises (``WhenNoSpare.FAIL``);
2. composes a new root mesh of the survivors' procs (their processes keep running) and
   the replacements (``ProcMeshHandle.compose``), whose new engine starts new workers and
   forms its process groups fresh;
3. hands the state over (:func:`~monarch._src.tensor_engine.client.handover.handover`):
   the survivors' new workers take their old workers' tensors in the same process, once
   these reached the mark of the last commit that was sent; the replacements read a
   survivor's tensors one-sided with ``monarch.rdma``;
4. computes the interrupted step again.

A proc lost during these steps starts them over with what is left. The run ends with the
state an uninterrupted run with the same data order ends with.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch._rust_bindings import Extent as _Extent
from monarch._rust_bindings import ProcMeshHandle
from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.proc_mesh import HostMesh, ProcMesh
from monarch._src.recovery.trainer import (
    REPORT_WAIT,
    Recovery,
    RecoveryError,
    StepResult,
    WhenNoSpare,
    _host_list,
)
from monarch._src.tensor_engine.client.api import fetch_shard, reduce_
from monarch._src.tensor_engine.client.engine import Engine, engine_of
from monarch._src.tensor_engine.client.handover import HandoverError, handover, record_mark
from monarch._src.tensor_engine.errors import RemoteException

__all__ = ["TensorTrainer"]

#: The mark each worker reaches after each commit: the next step its state is at.
_MARK = "monarch.recovery.step"


@dataclass
class _Rank:
    """One rank of the training: its proc (a one-proc mesh of its own) and its host."""

    procs: ProcMesh
    host: int


@dataclass
class _Attempt:
    """What one recovery found lost so far."""

    #: Ranks (of the mesh that failed) lost, with the failures' headlines.
    lost: dict[int, str] = field(default_factory=dict)
    #: Replacement procs that died during the recovery (never used again).
    dead: list[ProcMesh] = field(default_factory=list)


def _warm() -> None:
    """Run in each proc as it starts (before ``initialized`` completes): import what a
    tensor worker needs (torch), so that a spare takes over without importing it."""
    import monarch._src.tensor_engine.worker.handover  # noqa: F401


class _Lost(Exception):
    """The step was interrupted by the loss of a proc."""


class TensorTrainer:
    """Data-parallel training with distributed tensors that goes on when procs are lost
    (see the module docs and the [Recovery](../recovery.md#distributed-tensors) guide).

    ``init(rank)`` builds the state on the mesh (it runs under ``mesh.activate()``;
    ``rank`` is ``mesh.rank_tensor(dim)``) and returns it: a pytree (dicts, lists,
    tuples) of monarch tensors, the same on every rank. ``compute(state, step, rank)``
    records step ``step``'s forward and backward on this rank's data (a function of
    ``step`` and ``rank`` only, so that a recomputed step sees the same data) and
    returns ``(loss, grads)``: a scalar monarch tensor and a pytree of gradients. The
    trainer averages the gradients over the ranks. ``update(state, grads, step)``
    records the optimizer step with the averaged gradients (same structure) and returns
    the new state (or the same one, updated in place); it must not fetch.

    ``hosts`` is where the procs run: rank ``i`` on host ``i`` (wrapping around); hosts
    beyond the first ``replicas`` are spare hosts. ``spares`` procs are started ahead
    (on the spare hosts first) and wait; a lost proc is replaced by one at once, and a
    new spare is started in the background. ``timeout`` bounds a step's wait for its
    ranks and each recovery's handover, in seconds; ``max_attempts`` bounds how often
    one recovery may start over.
    """

    def __init__(
        self,
        init: Callable[[Any], Any],
        compute: Callable[[Any, int, Any], tuple[Any, Any]],
        update: Callable[[Any, Any, int], Any],
        hosts: HostMesh,
        replicas: int,
        *,
        spares: int = 0,
        when_no_spare: WhenNoSpare = WhenNoSpare.COLOCATE,
        dim: str = "replicas",
        timeout: float = 60.0,
        max_attempts: int = 5,
        name: str = "tensor_replica",
    ) -> None:
        for what, fn in (("init", init), ("compute", compute), ("update", update)):
            if not callable(fn):
                raise TypeError(f"TensorTrainer: {what} must be a function, got {fn!r}")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"TensorTrainer: replicas must be a positive int, got {replicas!r}")
        if not isinstance(spares, int) or isinstance(spares, bool) or spares < 0:
            raise ValueError(f"TensorTrainer: spares must be an int >= 0, got {spares!r}")
        if not isinstance(when_no_spare, WhenNoSpare):
            raise TypeError(
                f"TensorTrainer: when_no_spare must be a WhenNoSpare (COLOCATE, SHRINK or "
                f"FAIL), got {when_no_spare!r}"
            )
        self._init = init
        self._compute = compute
        self._update = update
        self._hosts = _host_list(hosts)
        self._replicas = replicas
        self._spare_count = spares
        self._policy = when_no_spare
        self._dim = dim
        self._timeout = float(timeout)
        self._max_attempts = max_attempts
        self._name = name
        self._run = uuid.uuid4().hex[:8]
        self._spawned = 0
        self._ranks: list[_Rank] = []
        self._spares: list[_Rank] = []
        #: Every proc mesh spawned, to stop at the end.
        self._all: list[ProcMesh] = []
        self._mesh: ProcMesh | None = None
        self._state: Any = None
        self._rank_tensor: Any = None
        self._next_step = 0
        self._started = False
        self._stopped = False
        #: Every recovery so far, in order.
        self.recoveries: list[Recovery] = []

    # ------------------------------------------------------------------ public

    @property
    def mesh(self) -> ProcMesh:
        """The root mesh the training runs on now (a new one after each recovery)."""
        if self._mesh is None:
            raise RuntimeError("TensorTrainer: not started; call start() or use `with`")
        return self._mesh

    @property
    def state(self) -> Any:
        """The state (monarch tensors of :attr:`mesh`), as of the last step."""
        return self._state

    @property
    def step_count(self) -> int:
        """The next step to train (how many steps are done)."""
        return self._next_step

    @property
    def world(self) -> int:
        """How many ranks train now."""
        return len(self._ranks)

    def pids(self) -> list[int]:
        """The OS process ids of the ranks' procs, by rank."""
        return [r.procs._handle.pids()[0] for r in self._ranks]

    def hosts_of_ranks(self) -> list[int]:
        """The index (in ``hosts``) of the host each rank runs on, by rank."""
        return [r.host for r in self._ranks]

    def start(self) -> TensorTrainer:
        """Spawn the procs and the spares, and build the state. Returns ``self``."""
        if self._started:
            raise RuntimeError("TensorTrainer.start(): already started")
        self._started = True
        n_hosts = len(self._hosts)
        self._ranks = [self._spawn(rank % n_hosts) for rank in range(self._replicas)]
        self._refill_spares()
        for r in self._ranks:
            r.procs.initialized.get(timeout=self._timeout)
        mesh = self._compose([r.procs for r in self._ranks])
        with mesh.activate():
            rank = mesh.rank_tensor(self._dim)
            state = self._init(rank)
        record_mark(mesh, _MARK, 0)
        self._mesh, self._state, self._rank_tensor = mesh, state, rank
        return self

    def step(self) -> StepResult:
        """Train one step on every rank; when a proc was lost, recover first and
        compute the interrupted step again. Raises :class:`RecoveryError` when the run
        cannot go on."""
        self._check_running()
        recovery: Recovery | None = None
        while True:
            if self._engine().failed.is_set():
                recovery = self._recover()
            step = self._next_step
            try:
                losses = self._try_step(step)
            except _Lost:
                continue
            self._next_step = step + 1
            return StepResult(step=step, losses=losses, recovery=recovery)

    def train(self, steps: int) -> list[StepResult]:
        """Train ``steps`` steps (see :meth:`step`)."""
        return [self.step() for _ in range(steps)]

    def fetch_state(self, rank: int = 0) -> Any:
        """The state of ``rank`` as local CPU tensors (waits for the steps issued)."""
        self._check_running()
        return fetch_shard(self._state, {self._dim: rank}).get(timeout=self._timeout)

    def stop(self) -> None:
        """Stop every proc of the run (the ranks' and the spares')."""
        if self._stopped:
            return
        self._stopped = True
        if self._mesh is not None:
            for engine in self._mesh._tensor_engine:
                engine.close()

        def stop(procs: ProcMesh) -> None:
            try:
                procs.stop("the tensor trainer stopped").get(timeout=60)
            except Exception:  # a lost host: its procs are gone or going already
                pass

        # Each mesh's stop waits for its procs: stop them all at once.
        threads = [threading.Thread(target=stop, args=(p,), daemon=True) for p in self._all]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._ranks, self._spares, self._all = [], [], []
        self._state = self._rank_tensor = None

    def __enter__(self) -> TensorTrainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ procs

    def _check_running(self) -> None:
        if not self._started:
            raise RuntimeError("TensorTrainer: not started; call start() or use `with`")
        if self._stopped:
            raise RuntimeError("TensorTrainer: stopped; start a new one")

    def _spawn(self, host: int) -> _Rank:
        self._spawned += 1
        procs = self._hosts[host].spawn_procs(
            per_host={"proc": 1},
            name=f"{self._name}-{self._run}-{self._spawned}",
            bootstrap=_warm,
        )
        self._all.append(procs)
        return _Rank(procs=procs, host=host)

    def _refill_spares(self) -> None:
        """Start spares until there are ``spares`` of them (on the spare hosts first)."""
        n_hosts = len(self._hosts)
        while len(self._spares) < self._spare_count:
            used = {r.host for r in self._ranks} | {s.host for s in self._spares}
            free = [h for h in range(self._replicas, n_hosts) if h not in used]
            host = free[0] if free else (self._replicas + len(self._spares)) % n_hosts
            self._spares.append(self._spawn(host))

    def _compose(self, members: list[ProcMesh]) -> ProcMesh:
        extent = _Extent([self._dim], [len(members)])
        handle = ProcMeshHandle.compose(
            f"{self._name}-{self._run}", extent, [m._handle for m in members], self._timeout
        )
        return ProcMesh(handle, extent.region)

    def _engine(self) -> Engine:
        return engine_of(self.mesh)

    # ------------------------------------------------------------------ a step

    def _try_step(self, step: int) -> tuple[float, ...]:
        mesh = self.mesh
        engine = self._engine()
        ranks = range(len(self._ranks))
        try:
            with mesh.activate():
                loss, grads = self._compute(self._state, step, self._rank_tensor)
                leaves, spec = tree_flatten(grads)
                flat = torch.cat([g.reshape(-1) for g in leaves])
                reduce_(flat, self._dim, "avg")
                probe = (loss.detach().reshape(()), flat[:1])
            futures = [fetch_shard(probe, {self._dim: r}) for r in ranks]
            values = self._gate(engine, futures)
            with mesh.activate(), engine.whole(engine.view(mesh)) as sent:
                averaged = []
                offset = 0
                for g in leaves:
                    n = g.numel()
                    averaged.append(flat[offset : offset + n].view(g.shape))
                    offset += n
                state = self._update(self._state, tree_unflatten(averaged, spec), step)
                record_mark(mesh, _MARK, step + 1)
        except SupervisionError:
            if engine.failed.is_set():
                raise _Lost from None
            raise
        if not sent:
            raise _Lost
        self._state = state
        return tuple(float(v[0]) for v in values)

    def _gate(self, engine: Engine, futures: list[Any]) -> list[Any]:
        """The values of ``futures`` (one fetch per rank); raises :class:`_Lost` as soon
        as the engine records a lost proc."""
        box: dict[str, Any] = {}
        done = threading.Event()
        cond = engine.failure_cond
        timeout = self._timeout

        def run() -> None:
            try:
                box["values"] = [f.get(timeout=timeout + 10) for f in futures]
            except BaseException as e:
                box["error"] = e
            finally:
                done.set()
                with cond:
                    cond.notify_all()

        threading.Thread(target=run, name="monarch-tensor-trainer-gate", daemon=True).start()
        with cond:
            cond.wait_for(lambda: done.is_set() or engine.failed.is_set(), timeout + 20)
        if engine.failed.is_set():
            raise _Lost
        if not done.is_set():
            raise TimeoutError(
                f"TensorTrainer: the ranks did not finish computing a step within "
                f"{timeout} s, and no proc was reported lost"
            )
        error = box.get("error")
        if error is None:
            return list(box["values"])
        if isinstance(error, (RemoteException, SupervisionError)):
            # A collective with a dead peer fails at once; the report of the death may
            # come a little later.
            with cond:
                cond.wait_for(engine.failed.is_set, REPORT_WAIT)
            if engine.failed.is_set():
                raise _Lost from None
        raise error

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> Recovery:
        """Replace the lost procs, hand the state over to a new mesh of the survivors and
        the replacements, and return what was done."""
        engine = self._engine()
        first = engine.failed_at if engine.failed_at is not None else time.monotonic()
        step = self._next_step
        old_ranks = list(self._ranks)
        attempt = _Attempt()
        for attempts in range(1, self._max_attempts + 1):
            attempt.lost.update(engine.lost)
            lost = sorted(attempt.lost)
            survivors = [r for r in range(len(old_ranks)) if r not in attempt.lost]
            if not survivors:
                raise RecoveryError(
                    f"TensorTrainer: every rank of {self._mesh!r} was lost (ranks {lost}: "
                    f"{'; '.join(attempt.lost.values())}); no survivor holds the state to "
                    "copy, so restart from a checkpoint"
                )
            members, fill = self._plan(old_ranks, survivors)
            mesh = self._compose([m.procs for m in members])
            source = next(i for i in range(len(members)) if i not in fill)
            try:
                state = handover(
                    self._state,
                    mesh,
                    fill,
                    source,
                    mark=(_MARK, step),
                    timeout=self._timeout,
                )
            except HandoverError:
                new_engine = engine_of(mesh)
                # Wait for the report of what failed, if it is not in yet.
                with new_engine.failure_cond:
                    new_engine.failure_cond.wait_for(new_engine.failed.is_set, REPORT_WAIT)
                if not new_engine.failed.is_set():
                    raise
                for i in new_engine.lost:
                    if i in fill:
                        attempt.dead.append(members[i].procs)
                        self._forget(members[i])
                    else:
                        old = old_ranks.index(members[i])
                        attempt.lost.setdefault(old, new_engine.lost[i])
                new_engine.close()
                self._stop_old_workers(new_engine)
                for r in members:
                    if r not in old_ranks and r.procs not in attempt.dead:
                        self._spares.insert(0, r)  # unused this time: a spare again
                continue
            engine.close()
            self._stop_old_workers(engine)
            self._ranks = members
            self._mesh = mesh
            self._state = state
            with mesh.activate():
                self._rank_tensor = mesh.rank_tensor(self._dim)
            self._refill_spares()
            recovery = Recovery(
                step=step,
                lost=tuple(lost),
                failures=tuple(attempt.lost[r] for r in lost),
                replaced={i: members[i].host for i in fill},
                world=len(members),
                source=source,
                seconds=time.monotonic() - first,
                attempts=attempts,
            )
            self.recoveries.append(recovery)
            return recovery
        raise RecoveryError(
            f"TensorTrainer: recovery of step {step} failed {self._max_attempts} times in a "
            f"row (ranks lost: {sorted(attempt.lost)}); giving up"
        )

    def _plan(self, old_ranks: list[_Rank], survivors: list[int]) -> tuple[list[_Rank], list[int]]:
        """The new mesh's ranks, and those among them to fill (the replacements)."""
        members: list[_Rank] = []
        fill: list[int] = []
        for r in range(len(old_ranks)):
            if r in survivors:
                members.append(old_ranks[r])
                continue
            replacement = self._replacement(old_ranks[r], survivors, old_ranks)
            if replacement is None:
                continue  # SHRINK: the survivors are renumbered
            fill.append(len(members))
            members.append(replacement)
        return members, fill

    def _replacement(self, lost: _Rank, survivors: list[int], old: list[_Rank]) -> _Rank | None:
        while self._spares:
            spare = self._spares.pop(0)
            try:
                spare.procs.initialized.get(timeout=self._timeout)
                return spare
            except Exception:  # it could not start: try the next one
                self._forget(spare)
        if self._policy is WhenNoSpare.FAIL:
            raise RecoveryError(
                f"TensorTrainer: rank {old.index(lost)} was lost and no spare is left "
                "(when_no_spare=FAIL); give spares=N, or COLOCATE or SHRINK"
            )
        if self._policy is WhenNoSpare.SHRINK:
            return None
        # COLOCATE: a new proc on the lost one's host, else beside a survivor.
        for host in [lost.host] + [old[s].host for s in survivors]:
            candidate = self._spawn(host)
            try:
                candidate.procs.initialized.get(timeout=self._timeout)
                return candidate
            except Exception:
                self._forget(candidate)
        raise RecoveryError(
            f"TensorTrainer: no host could start a proc to replace rank {old.index(lost)}"
        )

    def _forget(self, rank: _Rank) -> None:
        if rank in self._spares:
            self._spares.remove(rank)

    def _stop_old_workers(self, engine: Engine) -> None:
        """Stop the failed engine's controller (and so its workers, whose tables the
        handover emptied), without waiting: a survivor's old worker stuck in a collective
        with the lost proc stops when the collective times out."""
        try:
            engine.controller.stop("its tensors were handed over to a recovered mesh")
        except Exception:
            pass
