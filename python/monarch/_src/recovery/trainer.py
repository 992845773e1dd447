"""The controller of a recoverable data-parallel run: :class:`ElasticTrainer`.

It spawns one proc per replica on the hosts it is given, forms the replicas' process
group, and drives the steps (see :mod:`.replica` for the two phases of a step). The
failures of the replicas' meshes come to it, not to the unhandled-failure hook; when a
replica is lost it

1. places a new replica on a host: the lost one's own host when it still answers, else a
   spare host, else (by the :class:`WhenNoSpare` policy) a surviving host, or no new
   replica at all;
2. forms a new process group of the survivors and the new replicas;
3. copies a survivor's state to the new replicas with ``monarch.rdma``;
4. computes the interrupted step again, so the run equals one without the failure.

A second failure during these steps starts them again with what is left. Nothing is
restarted but the lost replicas, and no checkpoint file is written.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from monarch._src.actor import supervision
from monarch._src.actor.actor_mesh import ActorMesh
from monarch._src.actor.context import context
from monarch._src.actor.errors import ActorError, SupervisionError
from monarch._src.actor.future import Future
from monarch._src.actor.proc_mesh import HostMesh, ProcMesh
from monarch._src.actor.supervision import MeshFailure
from monarch._src.recovery.replica import Membership, Replica, StateOffer, StepDone

__all__ = ["ElasticTrainer", "Recovery", "RecoveryError", "StepResult", "WhenNoSpare"]

R = TypeVar("R", bound=Replica)

#: How long, after a replica's step failed, the controller waits for the failure report
#: that says which replica was lost, before it treats the error as the step's own (a
#: bug in the step, not a lost replica). Above the hosts' heartbeat timeout (2 s).
REPORT_WAIT = 5.0
#: Seconds allowed, beyond the trainer's timeouts, for a new replica's process to start
#: and build its model before it answers the controller's first call.
STARTUP_ALLOWANCE = 60.0


class WhenNoSpare(enum.Enum):
    """What to do for a lost replica when neither its own host nor a spare host can take
    a new one."""

    #: Put the new replica on a surviving host, beside another replica (the default).
    COLOCATE = "colocate"
    #: Go on with fewer replicas: the survivors are renumbered and share the data.
    SHRINK = "shrink"
    #: Raise :class:`RecoveryError`.
    FAIL = "fail"


class RecoveryError(RuntimeError):
    """The run cannot go on: every replica was lost, no host could take a new one, or
    recovery failed more times in a row than allowed. The message names the lost
    replicas and why."""


@dataclass(frozen=True)
class Recovery:
    """What one recovery did."""

    #: The step that was interrupted and computed again (or, for a failure between
    #: steps, the next step).
    step: int
    #: The replicas lost (their ranks before the recovery), and the failures' headlines.
    lost: tuple[int, ...]
    failures: tuple[str, ...]
    #: Each replaced rank, with the index of the host its new replica runs on.
    replaced: dict[int, int]
    #: How many replicas train after it.
    world: int
    #: The rank whose state the new replicas copied (``None`` when none was copied).
    source: int | None
    #: Seconds from the first sign of the failure until the new membership was ready.
    seconds: float
    #: How many times recovery started over (a failure during recovery).
    attempts: int


@dataclass(frozen=True)
class StepResult:
    """One completed step: its number, each replica's loss (by rank), and the recovery
    that preceded it, if any."""

    step: int
    losses: tuple[float, ...]
    recovery: Recovery | None = None


@dataclass
class _Slot:
    """One replica: its rank, host, procs and actor."""

    rank: int
    host: int
    procs: ProcMesh
    actor: ActorMesh[Any]
    mesh_id: int
    failure: MeshFailure | None = None
    #: Whether it holds the run's state (false for a new replica until it copied it).
    has_state: bool = False


@dataclass
class _Failures:
    """Failures of the replicas' meshes, as the supervision thread hands them over."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    by_mesh: dict[int, MeshFailure] = field(default_factory=dict)
    first_at: float | None = None


class _StepFailed(Exception):
    """A step did not complete on every replica."""


def _host_list(hosts: HostMesh) -> list[HostMesh]:
    """One single-host view per host of ``hosts``, in rank order."""
    sizes = hosts.sizes
    if not sizes:
        return [hosts]
    labels = list(sizes)
    return [
        hosts.slice(**dict(zip(labels, point, strict=True)))
        for point in itertools.product(*(range(sizes[label]) for label in labels))
    ]


def _store_host() -> str:
    """The address the replicas reach this process's rendezvous store at: the IP this
    process serves monarch on, or the loopback address when it serves Unix sockets
    (every proc is on this machine then)."""
    proc_id = str(context().actor_instance.proc_id)
    _, _, addr = proc_id.partition("@")
    scheme, _, rest = addr.partition(":")
    if scheme == "tcp":
        host = rest.rsplit(":", 1)[0].strip("[]")
        if host not in ("", "0.0.0.0", "::"):
            return host
    return "127.0.0.1"


class ElasticTrainer(Generic[R]):
    """Data-parallel training on ``replicas`` replicas of ``replica`` (a
    :class:`Replica` subclass, built with ``args`` and ``kwargs``) that goes on when
    replicas are lost (see the module docs and the [Recovery](../recovery.md) guide).

    ``hosts`` is where they run: replica ``i`` on host ``i`` (wrapping around when there
    are fewer hosts than replicas); hosts beyond the first ``replicas`` are spare hosts.
    ``spares`` replicas are kept built and waiting (warm spares, on the spare hosts
    first): a lost replica is replaced by one at once, without starting a process, and a
    new spare is started in the background.
    ``backend`` is the process group's (``"gloo"``, or ``"nccl"`` for CUDA models);
    ``timeout`` bounds forming a group and each collective, in seconds;
    ``max_attempts`` bounds how often one recovery may start over.
    """

    def __init__(
        self,
        replica: type[R],
        hosts: HostMesh,
        replicas: int,
        *args: Any,
        spares: int = 0,
        when_no_spare: WhenNoSpare = WhenNoSpare.COLOCATE,
        backend: str = "gloo",
        timeout: float = 60.0,
        max_attempts: int = 5,
        name: str = "replica",
        **kwargs: Any,
    ) -> None:
        if not (isinstance(replica, type) and issubclass(replica, Replica)):
            raise TypeError(
                f"ElasticTrainer needs a subclass of monarch.recovery.Replica, got {replica!r}"
            )
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a positive int, got {replicas!r}")
        if not isinstance(spares, int) or spares < 0:
            raise ValueError(f"spares must be an int >= 0, got {spares!r}")
        if not isinstance(when_no_spare, WhenNoSpare):
            raise TypeError(
                f"when_no_spare must be a WhenNoSpare (COLOCATE, SHRINK or FAIL), got "
                f"{when_no_spare!r}"
            )
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        self._cls = replica
        self._args = args
        self._kwargs = kwargs
        self._hosts = _host_list(hosts)
        self._dead_hosts: set[int] = set()
        self._replicas = replicas
        self._spare_count = spares
        #: Warm spares: replicas built and waiting outside the group, promoted when a
        #: replica is lost (then replaced by a new spare in the background).
        self._spares: list[_Slot] = []
        self._policy = when_no_spare
        self._backend = backend
        self._timeout = float(timeout)
        self._max_attempts = max_attempts
        self._name = name
        self._run = uuid.uuid4().hex[:12]
        self._generation = 0
        self._next_step = 0
        self._slots: list[_Slot] = []
        self._failures = _Failures()
        self._store: Any = None
        self._loop = asyncio.new_event_loop()
        self._started = False
        self._stopped = False
        self._spawned = 0
        #: Every recovery so far, in order.
        self.recoveries: list[Recovery] = []

    # ------------------------------------------------------------------ public

    @property
    def step_count(self) -> int:
        """The next step to train (how many steps are done)."""
        return self._next_step

    @property
    def world(self) -> int:
        """How many replicas train now."""
        return len(self._slots)

    @property
    def replicas(self) -> list[ActorMesh[R]]:
        """The replicas' actors, by rank (each a one-actor mesh), to call your own
        endpoints; the list changes when replicas are replaced."""
        return [s.actor for s in self._slots]

    def hosts_of_replicas(self) -> list[int]:
        """The index (in ``hosts``) of the host each replica runs on, by rank."""
        return [s.host for s in self._slots]

    def start(self) -> ElasticTrainer[R]:
        """Spawn the replicas, form their group and give every replica replica 0's
        state. Returns ``self``."""
        if self._started:
            raise RuntimeError("ElasticTrainer.start(): already started")
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()  # the replicas spawned so far go; nothing is left running
            raise
        return self

    def _start(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            "0.0.0.0",
            0,
            is_master=True,
            timeout=datetime.timedelta(seconds=self._timeout),
            wait_for_workers=False,
        )
        n_hosts = len(self._hosts)
        self._slots = [self._spawn(rank, rank % n_hosts) for rank in range(self._replicas)]
        self._refill_spares()
        self._run_async(self._join_all())
        self._slots[0].has_state = True
        if len(self._slots) > 1:
            self._run_async(self._copy_state(self._slots[0], self._slots[1:]))

    def step(self) -> StepResult:
        """Train one step on every replica; when replicas are lost, recover first and
        compute the interrupted step again. Raises :class:`RecoveryError` when the run
        cannot go on."""
        self._check_running()
        recovery: Recovery | None = None
        attempts = 0
        while True:
            if self._lost():
                recovery = self._recover(self._next_step)
            step = self._next_step
            try:
                losses = self._run_async(self._train(step))
            except _StepFailed:
                attempts += 1
                if attempts > self._max_attempts:
                    raise RecoveryError(
                        f"step {step} failed {attempts} times in a row; giving up"
                    ) from None
                continue
            self._next_step = step + 1
            return StepResult(step=step, losses=losses, recovery=recovery)

    def train(self, steps: int) -> list[StepResult]:
        """Train ``steps`` steps (see :meth:`step`)."""
        return [self.step() for _ in range(steps)]

    def stop(self) -> None:
        """Stop every replica's procs and the rendezvous store."""
        if self._stopped:
            return
        self._stopped = True
        futures = []
        for slot in self._slots + self._spares:
            stopping = slot.procs.stop("the elastic trainer stopped")
            if slot.host not in self._dead_hosts:  # a lost host's procs are gone already
                futures.append(stopping)
        for f in futures:
            try:
                f.get(timeout=30)
            except Exception:  # a host lost meanwhile: its procs are gone or going
                pass
        for slot in self._slots + self._spares:
            supervision.route_failures(slot.mesh_id, None)
        self._slots = []
        self._spares = []
        self._store = None
        # Calls of failed steps still waited for (a replica stuck in a collective with a
        # lost peer answers when the collective times out): stop waiting for them.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def __enter__(self) -> ElasticTrainer[R]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ spawning

    def _check_running(self) -> None:
        if not self._started:
            raise RuntimeError("ElasticTrainer: call start() (or use `with`) first")
        if self._stopped:
            raise RuntimeError("ElasticTrainer: stopped; make a new one")

    def _spawn(self, rank: int, host: int) -> _Slot:
        """A new replica of ``rank`` on host ``host`` (its actor spawned; not joined)."""
        self._spawned += 1
        procs = self._hosts[host].spawn_procs(per_host={"replica": 1})
        actor = cast(
            ActorMesh[Any],
            procs.spawn(f"{self._name}{self._spawned}", self._cls, *self._args, **self._kwargs),
        )
        mesh_id = actor._shared.handle.mesh_id
        supervision.route_failures(mesh_id, self._on_failure)
        return _Slot(
            rank=rank,
            host=host,
            procs=procs,
            actor=actor,
            mesh_id=mesh_id,
        )

    def _refill_spares(self) -> None:
        """Start spares until there are ``spares`` of them (not waited for), on the
        hosts with the fewest replicas, spare hosts first; drop spares that failed."""
        failed = self._failures.by_mesh
        for spare in self._spares:
            if _host_lost(failed.get(spare.mesh_id)):
                self._dead_hosts.add(spare.host)
        self._spares = [s for s in self._spares if s.mesh_id not in failed]
        while len(self._spares) < self._spare_count:
            alive = [h for h in range(len(self._hosts)) if h not in self._dead_hosts]
            if not alive:
                return
            load = {h: 0 for h in alive}
            for s in self._slots + self._spares:
                if s.host in load:
                    load[s.host] += 1
            host = min(alive, key=lambda h: (load[h], h))
            self._spares.append(self._spawn(-1, host))

    def _take_spare(self, rank: int, avoid: set[int]) -> _Slot | None:
        """A warm spare that is still alive and not on a host in ``avoid``, as rank
        ``rank``; ``None`` when there is none."""
        failed = self._failures.by_mesh
        for spare in list(self._spares):
            if spare.mesh_id in failed or spare.host in self._dead_hosts or spare.host in avoid:
                continue
            try:
                spare.actor.initialized.get(timeout=self._timeout)
            except Exception:
                continue
            self._spares.remove(spare)
            spare.rank = rank
            return spare
        return None

    def _on_failure(self, failure: MeshFailure) -> None:
        """A replica's mesh failed (on the supervision thread): note it; the training
        thread acts on it."""
        f = self._failures
        active = {s.mesh_id for s in self._slots}
        with f.cond:
            f.by_mesh.setdefault(failure.mesh_id, failure)
            # The clock of a recovery starts at the first failure of a training replica
            # (not of a spare, nor a late report of one already replaced).
            if f.first_at is None and failure.mesh_id in active:
                f.first_at = time.monotonic()
            f.cond.notify_all()

    def _lost(self) -> list[_Slot]:
        f = self._failures
        with f.cond:
            for slot in self._slots:
                if slot.failure is None and slot.mesh_id in f.by_mesh:
                    slot.failure = f.by_mesh[slot.mesh_id]
        return [s for s in self._slots if s.failure is not None]

    def _wait_for_report(self, timeout: float) -> bool:
        """Whether a failure of a replica is known, waiting up to ``timeout``."""
        f = self._failures
        ids = {s.mesh_id for s in self._slots}
        deadline = time.monotonic() + timeout
        with f.cond:
            while not ids & f.by_mesh.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                f.cond.wait(left)
        return True

    # ------------------------------------------------------------------ async parts

    def _run_async(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    async def _all(
        self, futures: dict[int, Future[Any]], bound: tuple[str, float] | None = None
    ) -> dict[int, Any]:
        """Every future's value by key; raises the first error as soon as it comes
        (the others are left to finish on their own, their outcome ignored). With
        ``bound`` (what the calls do, and seconds), raises :class:`_CallsTimedOut` when
        some have not answered in that time."""
        tasks = {key: asyncio.ensure_future(f.as_asyncio()) for key, f in futures.items()}
        for task in tasks.values():
            task.add_done_callback(_ignore_outcome)
        timeout = None if bound is None else bound[1]
        done, pending = await asyncio.wait(
            tasks.values(), timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        for task in done:
            error = task.exception()
            if error is not None:
                raise error
        if pending and bound is not None:
            silent = sorted(key for key, task in tasks.items() if task in pending)
            raise _CallsTimedOut(
                f"replica(s) {silent} of the elastic run did not answer {bound[0]} within "
                f"{bound[1]:g} s (the trainer's timeout is {self._timeout:g} s: "
                "ElasticTrainer(timeout=...) bounds forming a group and each collective)"
            )
        return {key: task.result() for key, task in tasks.items()}

    def _bound(self, what: str) -> tuple[str, float]:
        """The bound of the controller's calls that are not a step: each of them waits
        at most twice the trainer's timeout inside a replica (forming a group connects
        to the store and then to the peers), plus time for a new replica to start."""
        return what, 2 * self._timeout + STARTUP_ALLOWANCE

    async def _train(self, step: int) -> tuple[float, ...]:
        """Compute ``step`` everywhere, then commit it everywhere."""
        generation = self._generation
        try:
            done: dict[int, StepDone] = await self._all(
                {s.rank: s.actor.recovery_compute.call_one(step, generation) for s in self._slots}
            )
        except (ActorError, SupervisionError) as error:
            if isinstance(error, ActorError) and not self._wait_for_report(REPORT_WAIT):
                raise  # no replica was lost: the step itself failed
            raise _StepFailed() from error
        # Commit: local on each replica. A replica lost meanwhile does not undo the
        # step for the others; it is replaced before the next step.
        commits = [s.actor.recovery_commit.call_one(step) for s in self._slots]
        for future in commits:
            try:
                await future
            except SupervisionError:
                pass
        return tuple(done[s.rank].loss for s in self._slots)

    def _membership(self, slot: _Slot) -> Membership:
        return Membership(
            run=self._run,
            generation=self._generation,
            rank=slot.rank,
            world=len(self._slots),
            store_host=_store_host(),
            store_port=int(self._store.port),
            backend=self._backend,
            timeout=self._timeout,
        )

    async def _join_all(self) -> None:
        await self._all(
            {s.rank: s.actor.recovery_join.call_one(self._membership(s)) for s in self._slots},
            self._bound(f"the call to join generation {self._generation}"),
        )

    async def _copy_state(self, source: _Slot, targets: Sequence[_Slot]) -> None:
        offered = await self._all(
            {source.rank: source.actor.recovery_offer_state.call_one()},
            self._bound("the call to offer its state"),
        )
        offer: StateOffer = offered[source.rank]
        try:
            await self._all(
                {t.rank: t.actor.recovery_load_state.call_one(offer) for t in targets},
                self._bound(f"the call to copy replica {source.rank}'s state"),
            )
            for t in targets:
                t.has_state = True
        finally:
            try:
                await self._all(
                    {source.rank: source.actor.recovery_release_state.call_one()},
                    self._bound("the call to release its state"),
                )
            except (ActorError, SupervisionError, _CallsTimedOut):
                pass

    # ------------------------------------------------------------------ recovery

    def _recover(self, step: int) -> Recovery:
        """Replace the lost replicas (see the module docs); starts over on a failure
        during recovery, up to ``max_attempts`` times."""
        began = self._failures.first_at or time.monotonic()
        lost_ranks: list[int] = []
        headlines: list[str] = []
        replaced: dict[int, int] = {}
        source_rank: int | None = None
        for attempt in range(1, self._max_attempts + 1):
            lost = self._lost()
            for slot in lost:
                lost_ranks.append(slot.rank)
                assert slot.failure is not None
                headlines.append(slot.failure.headline())
                if _host_lost(slot.failure):
                    self._dead_hosts.add(slot.host)
                slot.procs.stop("replaced after a failure")  # not waited for: may be lost
            survivors = [s for s in self._slots if s.failure is None]
            holders = [s for s in survivors if s.has_state]
            if not holders:
                raise RecoveryError(self._all_lost(lost_ranks, headlines))
            new = self._replace(lost, survivors, replaced)
            self._slots = sorted(survivors + new, key=lambda s: s.rank)
            if self._policy is WhenNoSpare.SHRINK:
                for rank, slot in enumerate(self._slots):
                    slot.rank = rank
            self._generation += 1
            try:
                self._run_async(self._join_all())
                targets = [s for s in self._slots if not s.has_state]
                if targets:
                    source = min(holders, key=lambda s: s.rank)
                    source_rank = source.rank
                    self._run_async(self._copy_state(source, targets))
            except (ActorError, SupervisionError, _CallsTimedOut):
                self._wait_for_report(REPORT_WAIT)
                continue
            if self._lost():
                continue
            self._refill_spares()
            with self._failures.cond:
                self._failures.first_at = None
            recovery = Recovery(
                step=step,
                lost=tuple(sorted(set(lost_ranks))),
                failures=tuple(headlines),
                replaced=replaced,
                world=len(self._slots),
                source=source_rank,
                seconds=time.monotonic() - began,
                attempts=attempt,
            )
            self.recoveries.append(recovery)
            return recovery
        raise RecoveryError(
            f"recovery after losing replica(s) {sorted(set(lost_ranks))} failed "
            f"{self._max_attempts} times in a row; the failures: " + "; ".join(headlines)
        )

    def _all_lost(self, ranks: list[int], headlines: list[str]) -> str:
        return (
            f"every replica of the elastic run was lost (ranks {sorted(set(ranks))}): there "
            "is no state left to copy to new replicas; restart the run from a checkpoint. "
            "The failures: " + "; ".join(headlines)
        )

    def _replace(
        self, lost: list[_Slot], survivors: list[_Slot], replaced: dict[int, int]
    ) -> list[_Slot]:
        """New replicas for ``lost``, placed by the policy; with ``SHRINK``, none for
        those that no host can take."""
        new: list[_Slot] = []
        for slot in lost:
            avoid = {slot.host} if _host_lost(slot.failure) else set()
            placed = self._take_spare(slot.rank, avoid)
            for host in [] if placed else self._candidates(slot, survivors + new):
                try:
                    candidate = self._spawn(slot.rank, host)
                    candidate.procs.initialized.get(timeout=self._timeout)
                except Exception:
                    self._dead_hosts.add(host)
                    continue
                placed = candidate
                break
            if placed is not None:
                new.append(placed)
                replaced[slot.rank] = placed.host
            elif self._policy is not WhenNoSpare.SHRINK:
                why = slot.failure.headline() if slot.failure else "no report"
                raise RecoveryError(
                    f"replica {slot.rank} was lost ({why}) "
                    f"and no host could take a new one (policy {self._policy.name}; hosts "
                    f"tried and lost: {sorted(self._dead_hosts)}); add hosts, or use "
                    "WhenNoSpare.SHRINK to go on with fewer replicas"
                )
        return new

    def _candidates(self, slot: _Slot, taken: list[_Slot]) -> list[int]:
        """Hosts to try for a new replica of ``slot``, best first."""
        alive = [h for h in range(len(self._hosts)) if h not in self._dead_hosts]
        busy = {s.host for s in taken}
        own = [slot.host] if slot.host in alive and not _host_lost(slot.failure) else []
        spares = [h for h in alive if h not in busy and h != slot.host]
        order = own + spares
        if self._policy is WhenNoSpare.COLOCATE:
            order += sorted(
                (h for h in alive if h in busy and h not in order),
                key=lambda h: sum(1 for s in taken if s.host == h),
            )
        return order


class _CallsTimedOut(TimeoutError):
    """Replicas did not answer a call of the controller (other than a step) in time."""


def _ignore_outcome(task: asyncio.Future[Any]) -> None:
    """Mark a call's outcome as seen: the calls of a failed step end with errors nobody
    needs."""
    if not task.cancelled():
        task.exception()


def _host_lost(failure: MeshFailure | None) -> bool:
    """Whether ``failure`` says the replica's host was lost (its worker killed or cut
    off), not only its process, so that a new replica should go elsewhere. A hint only:
    spawning on the host is what decides."""
    if failure is None:
        return False
    return "its host " in failure.reason and " was lost" in failure.reason
