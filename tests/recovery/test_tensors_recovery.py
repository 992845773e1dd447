"""Recovery of data-parallel training written with distributed tensors
(``monarch.recovery.TensorTrainer``): a run that loses a proc goes on from the same step,
without restarting the survivors, and ends with the weights of a run without failures.

The model is a tiny MLP trained with SGD and momentum; each rank's batch is a function of
(step, rank) only, made on the workers. Procs are killed with SIGKILL from the test, or
kill themselves at a chosen point of a step (inside the remote function that makes the
batch, or inside the update) when they find a fault file the test created in the
directory named by ``FAULTS`` (which the procs inherit).
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

import monarch  # noqa: E402
import monarch.actor  # noqa: E402
from monarch.actor import this_host  # noqa: E402
from monarch.recovery import RecoveryError, TensorTrainer, WhenNoSpare  # noqa: E402

IN, HIDDEN, BATCH, REPLICAS, STEPS = 8, 16, 16, 3, 8
LR, MOMENTUM = 0.05, 0.9


@monarch.remote(propagate=lambda step, rank: (torch.empty(BATCH, IN), torch.empty(BATCH, 1)))
def batch(step: int, rank: Any) -> tuple[Any, Any]:
    """This rank's batch of ``step``; a rank with a fault file ``batch-<step>-<rank>``
    dies here, in the middle of the step (before the gradients' average)."""
    if fire(f"batch-{step}-{int(rank)}"):
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.Generator().manual_seed(step * 1000 + int(rank))
    x = torch.randn(BATCH, IN, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


@monarch.remote(propagate=lambda step: None)
def die_in_update(step: int) -> None:
    """A rank with a fault file ``update-<step>-<rank>`` dies here, in its update."""
    from monarch.actor import context

    if fire(f"update-{step}-{context().actor_instance.rank.rank}"):
        os.kill(os.getpid(), signal.SIGKILL)


def init(rank: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    with monarch.no_mesh.activate():
        local = torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        )
        values = {k: v.detach().clone() for k, v in local.state_dict().items()}
    params = {k: torch.tensor(v.numpy()) for k, v in values.items()}
    return {"params": params, "momentum": {k: torch.zeros_like(v) for k, v in params.items()}}


def compute(state: dict[str, Any], step: int, rank: Any) -> tuple[Any, dict[str, Any]]:
    p = {k: v.detach().requires_grad_() for k, v in state["params"].items()}
    x, y = batch(step, rank)
    h = torch.tanh(x @ p["0.weight"].t() + p["0.bias"])
    out = h @ p["2.weight"].t() + p["2.bias"]
    loss = torch.nn.functional.mse_loss(out, y)
    grads = torch.autograd.grad(loss, list(p.values()))
    return loss, dict(zip(p, grads, strict=True))


def update(state: dict[str, Any], grads: dict[str, Any], step: int) -> dict[str, Any]:
    """SGD with momentum, in place."""
    with torch.no_grad():
        for k, p in state["params"].items():
            m = state["momentum"][k]
            m.mul_(MOMENTUM).add_(grads[k])
            p.sub_(LR * m)
    die_in_update(step)
    return state


def trainer(**kwargs: Any) -> TensorTrainer:
    replicas = kwargs.pop("replicas", REPLICAS)
    return TensorTrainer(init, compute, update, this_host(), replicas, timeout=30, **kwargs)


def _flat(state: dict[str, Any]) -> Any:
    return torch.cat([v.reshape(-1) for part in state.values() for v in part.values()])


def _state_of_every_rank(t: TensorTrainer) -> Any:
    states = [_flat(t.fetch_state(r)) for r in range(t.world)]
    for s in states[1:]:
        assert torch.equal(s, states[0]), "the ranks disagree"
    return states[0]


@pytest.fixture(scope="module")
def reference() -> Any:
    """Parameters and momentum after ``STEPS`` steps of 3 ranks without a failure."""
    with trainer() as t:
        t.train(STEPS)
        return _state_of_every_rank(t)


@pytest.mark.timeout(240)
def test_a_killed_proc_is_replaced_and_the_run_equals_one_without_failures(
    faults: Path, reference: Any
) -> None:
    with trainer(spares=1) as t:
        t.train(2)
        pids = t.pids()
        # 1. SIGKILL between steps: a warm spare takes rank 1's place.
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        r = t.step().recovery
        kill_to_step = time.monotonic() - killed
        assert r is not None and r.lost == (1,) and r.source == 0 and r.attempts == 1, r
        assert r.replaced == {1: 0} and r.step == 2 and t.world == REPLICAS
        after = t.pids()
        assert after[0] == pids[0] and after[2] == pids[2], "a survivor was restarted"
        assert after[1] != pids[1]
        # 2. A proc dies in the middle of step 3's compute (its peers are in the
        # gradients' average with it): the step is computed again.
        (faults / "batch-3-2").touch()
        r = t.step().recovery
        assert r is not None and r.lost == (2,) and r.step == 3, r
        # 3. A proc dies in step 4's update, after every rank computed it: the
        # survivors' update stands, and the replacement copies the updated state.
        (faults / "update-4-0").touch()
        assert t.step().recovery is None
        r = t.step().recovery
        assert r is not None and r.lost == (0,) and r.step == 5 and r.source == 1, r
        survivors = t.pids()
        t.train(STEPS - t.step_count)
        assert len(t.recoveries) == 3
        got = _state_of_every_rank(t)
        print(f"kill -> next step done: {kill_to_step:.2f} s; recoveries: {t.recoveries}")
    assert (got - reference).abs().max() <= 1e-6
    assert not any(alive(p) for p in survivors), "a proc outlived the trainer"
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(240)
def test_a_second_failure_during_recovery_starts_it_over(
    faults: Path, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monarch._src.recovery import tensors

    with trainer(spares=1) as t:
        t.train(2)
        pids = t.pids()
        real = tensors.handover  # type: ignore[attr-defined]
        killed: list[int] = []

        def handover_after_a_kill(*args: Any, **kwargs: Any) -> Any:
            # The survivor whose state the replacement would copy dies as the
            # handover starts: recovery starts over without it.
            if not killed:
                killed.append(pids[0])
                os.kill(pids[0], signal.SIGKILL)
            return real(*args, **kwargs)

        monkeypatch.setattr(tensors, "handover", handover_after_a_kill)
        os.kill(pids[1], signal.SIGKILL)
        r = t.step().recovery
        assert r is not None and set(r.lost) == {0, 1} and r.attempts == 2, r
        assert r.source == 2 and t.world == REPLICAS and t.pids()[2] == pids[2]
        t.train(STEPS - t.step_count)
        got = _state_of_every_rank(t)
    assert (got - reference).abs().max() <= 1e-6
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", [WhenNoSpare.COLOCATE, WhenNoSpare.SHRINK, WhenNoSpare.FAIL])
def test_without_a_spare_the_policy_decides(faults: Path, policy: WhenNoSpare) -> None:
    with trainer(when_no_spare=policy) as t:
        t.step()
        os.kill(t.pids()[1], signal.SIGKILL)
        if policy is WhenNoSpare.FAIL:
            with pytest.raises(RecoveryError, match=r"rank 1 was lost and no spare is left"):
                t.step()
            return
        r = t.step().recovery
        assert r is not None and r.lost == (1,), r
        if policy is WhenNoSpare.COLOCATE:
            assert r.replaced == {1: 0} and t.world == REPLICAS
        else:
            assert r.replaced == {} and t.world == REPLICAS - 1
        t.step()
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(120)
def test_no_rank_left_is_an_error_naming_the_lost_ranks(faults: Path) -> None:
    with trainer(replicas=1) as t:
        t.step()
        os.kill(t.pids()[0], signal.SIGKILL)
        with pytest.raises(RecoveryError, match=r"every rank of .* was lost \(ranks \[0\]"):
            t.step()
    assert not unhandled, [f.report() for f in unhandled]


@pytest.mark.timeout(120)
def test_a_composed_mesh_runs_actors_on_running_procs_and_stops_their_meshes() -> None:
    from monarch._rust_bindings import Extent, ProcMeshHandle
    from monarch._src.actor.proc_mesh import ProcMesh

    a = this_host().spawn_procs(per_host={"r": 2})
    b = this_host().spawn_procs(per_host={"s": 1})
    try:
        extent = Extent(["r"], [2])
        with pytest.raises(ValueError, match=r"1 member procs for an extent of 2 ranks"):
            ProcMeshHandle.compose("c", extent, [b._handle], 30)
        with pytest.raises(ValueError, match=r"member 0 is a view of 2 procs"):
            ProcMeshHandle.compose("c", extent, [a._handle, b._handle], 30)
        members = [b._handle, a.slice(r=1)._handle]
        c = ProcMesh(ProcMeshHandle.compose("c", extent, members, 30), extent.region)
        pids = a._handle.pids() + b._handle.pids()
        assert c._handle.pids() == [pids[2], pids[1]]
        with c.activate():
            t = torch.ones(2) * (c.rank_tensor("r") + 1)
        assert monarch.inspect(t, r=1).tolist() == [2.0, 2.0]
        c.stop().get(timeout=60)
        assert not any(alive(p) for p in pids), "stopping the composed mesh left a proc"
    finally:
        a.stop().get(timeout=60)
        b.stop().get(timeout=60)
