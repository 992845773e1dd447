"""The recovery library: a data-parallel run that loses replicas goes on from the same
step and ends with the weights of a run without failures.

Failures are injected by the replicas themselves, once each, through files in a
directory the test names (``FAULTS``, inherited by the procs): a replica that finds its
file removes it and kills its own process at that point (joining a new membership,
offering its state). The kills from outside are SIGKILLs of a replica's pid, or of a
worker (a whole host) of a ``ProcessJob``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from injected_faults import alive, fire, unhandled  # noqa: E402

from monarch.actor import endpoint, this_host  # noqa: E402
from monarch.job import ProcessJob  # noqa: E402
from monarch.recovery import (  # noqa: E402
    ElasticTrainer,
    Membership,
    RecoveryError,
    Replica,
    WhenNoSpare,
)

IN, HIDDEN, BATCH = 8, 16, 16


class Net(Replica):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.w = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    def batch(self, step: int) -> tuple[Any, Any]:
        g = torch.Generator().manual_seed(step * 100 + self.replica_rank)
        x = torch.randn(BATCH, IN, generator=g)
        return x, x @ self.w

    def loss(self, batch: tuple[Any, Any]) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def on_membership(self, membership: Membership) -> None:
        if fire(f"join-{membership.generation}-{membership.rank}") and self.step == 0:
            os._exit(7)
        if fire(f"hang-join-{membership.rank}"):
            (Path(os.environ["FAULTS"]) / "hung-pid").write_text(str(os.getpid()))
            time.sleep(600)  # never answers the join (the test ends it before)

    def state_dict(self) -> dict[str, Any]:
        if fire(f"offer-{self.replica_rank}"):
            os._exit(7)
        return super().state_dict()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def weights(self) -> list[float]:
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]


def _weights(trainer: ElasticTrainer[Net]) -> list[float]:
    every = [r.weights.call_one().get(timeout=60) for r in trainer.replicas]
    assert all(w == every[0] for w in every), "the replicas disagree"
    return every[0]


def _kill(trainer: ElasticTrainer[Net], rank: int) -> None:
    os.kill(trainer.replicas[rank].pid.call_one().get(timeout=60), signal.SIGKILL)


STEPS = 7


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """The weights after ``STEPS`` steps of 3 replicas without a failure."""
    with ElasticTrainer(Net, this_host(), 3) as trainer:
        trainer.train(STEPS)
        return _weights(trainer)


@pytest.mark.timeout(240)
def test_lost_replicas_are_replaced_and_the_run_equals_one_without_failures(
    faults: Path, reference: list[float]
) -> None:
    with ElasticTrainer(Net, this_host(), 3, spares=1) as trainer:
        trainer.train(2)
        # 1. A replica killed between steps: a warm spare takes its place.
        _kill(trainer, 1)
        r = trainer.step().recovery
        assert r is not None and r.lost == (1,) and r.source == 0 and r.attempts == 1, r
        # 2. A second failure during recovery: the replica that takes rank 2's place
        # dies as it joins the new group; recovery starts over and replaces it too.
        (faults / "join-2-2").touch()
        _kill(trainer, 2)
        r = trainer.step().recovery
        assert r is not None and set(r.lost) == {2} and r.attempts == 2, r
        # 3. The survivor whose state is being copied dies while it offers it: the copy
        # comes from another survivor.
        (faults / "offer-0").touch()
        _kill(trainer, 1)
        r = trainer.step().recovery
        assert r is not None and set(r.lost) == {0, 1} and r.source == 2, r
        assert trainer.step_count == 5
        trainer.train(STEPS - trainer.step_count)
        assert len(trainer.recoveries) == 3
        got = _weights(trainer)
    assert max(abs(a - b) for a, b in zip(got, reference, strict=True)) <= 1e-6
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(120)
def test_no_replica_left_is_an_error_naming_the_lost_ranks(faults: Path) -> None:
    with ElasticTrainer(Net, this_host(), 1) as trainer:
        trainer.step()
        _kill(trainer, 0)
        with pytest.raises(RecoveryError, match=r"every replica .* was lost \(ranks \[0\]\)"):
            trainer.step()
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(120)
def test_a_replica_that_never_answers_is_a_timeout_naming_it_and_nothing_is_left(
    faults: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's calls other than a step are bounded: a start whose replica 1
    never answers its join raises, names it, and stops every replica (none outlives the
    failed start)."""
    from monarch._src.recovery import trainer as trainer_module

    # Room for two procs to start and import torch on a loaded machine (with 3 s, a
    # CI run's replica 0 had not answered either): only replica 1 may be named.
    monkeypatch.setattr(trainer_module, "STARTUP_ALLOWANCE", 20.0)
    (faults / "hang-join-1").touch()
    trainer = ElasticTrainer(Net, this_host(), 2, timeout=2.0)
    hung = r"replica\(s\) \[1\] .* did not answer the call to join"
    with pytest.raises(TimeoutError, match=hung):
        trainer.start()
    pid = int((faults / "hung-pid").read_text())
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the stopped proc's exit; nothing to wait on
    assert not alive(pid), f"the hung replica's process {pid} outlived the failed start"
    assert not unhandled, [f.report() for f in unhandled]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _worker_of(job: ProcessJob, pid: int) -> int:
    """The pid of the job's worker that ``pid`` (a proc) descends from."""
    workers = {w.pid for w in job._workers.all()}  # type: ignore[union-attr]
    while pid > 1:
        if pid in workers:
            return pid
        pid = _ppid(pid)
    raise AssertionError(f"no worker of the job is an ancestor of pid {pid}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("policy", [WhenNoSpare.COLOCATE, WhenNoSpare.SHRINK, WhenNoSpare.FAIL])
def test_a_lost_host_without_a_spare_follows_the_policy(faults: Path, policy: WhenNoSpare) -> None:
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        with ElasticTrainer(Net, hosts, 2, when_no_spare=policy) as trainer:
            trainer.step()
            victim = trainer.replicas[1].pid.call_one().get(timeout=60)
            os.kill(_worker_of(job, victim), signal.SIGKILL)  # host 1, with replica 1
            # The replica's proc ends once it sees its host gone; a step issued before
            # that could still be answered by it (a CI run's was, and recovered
            # nothing). The loss is what this test is about: wait for it.
            deadline = time.monotonic() + 30
            while alive(victim) and time.monotonic() < deadline:
                time.sleep(0.05)  # polling the killed host's proc; nothing to wait on
            assert not alive(victim), f"replica 1's proc {victim} outlived its host"
            if policy is WhenNoSpare.FAIL:
                with pytest.raises(RecoveryError, match=r"replica 1 was lost .*no host"):
                    trainer.step()
                return
            r = trainer.step().recovery
            assert r is not None and r.lost == (1,), r
            if policy is WhenNoSpare.COLOCATE:
                assert r.replaced == {1: 0} and trainer.world == 2
                assert trainer.hosts_of_replicas() == [0, 0]
            else:
                assert r.replaced == {} and trainer.world == 1
            trainer.step()
    finally:
        job.kill()
    assert not unhandled, [f.report() for f in unhandled]
