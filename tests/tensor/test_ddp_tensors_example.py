"""``examples/ddp_tensors.py``: data-parallel training on 4 procs gives the losses
and the parameters of the same training in one process, with the gradient reductions
on the main stream and on a comms stream."""

from __future__ import annotations

import importlib.util
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests_tensor_helpers import preloading_torch

import monarch
from monarch.actor import ProcMesh, this_host

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_tensors.py"
STEPS = 3
RANKS = 4

ex: dict[str, Any] = runpy.run_path(str(EXAMPLE), run_name="ddp_tensors_example")

streams = pytest.mark.skipif(
    importlib.util.find_spec("monarch._src.tensor_engine.client.stream") is None,
    reason="monarch.Stream is not in this build yet",
)


@pytest.fixture(scope="module")
def mesh4() -> Iterator[ProcMesh]:
    with preloading_torch():
        pm = this_host().spawn_procs(per_host={"gpus": RANKS})
    assert pm.initialized.get(timeout=120) is True
    yield pm
    pm.stop().get(timeout=60)


def _train(mesh: ProcMesh, overlap: bool) -> tuple[list[float], list[list[torch.Tensor]]]:
    cfg = ex["Config"]()
    replica = ex["Replica"](mesh, cfg)
    comms = ex["comms_stream"]() if overlap else None
    for i in range(STEPS):
        replica.step(i, comms)
    losses = replica.fetch_losses()
    params = [monarch.inspect(replica.params, gpus=r) for r in range(RANKS)]
    return losses, params


def _check(mesh: ProcMesh, overlap: bool) -> None:
    got, per_rank = _train(mesh, overlap)
    want, model = ex["reference_run"](ex["Config"](), RANKS, STEPS)
    assert len(got) == STEPS
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert got[0] != got[1], "the parameters did not change between steps"
    for r, params in enumerate(per_rank):
        for p, q in zip(params, model.parameters(), strict=True):
            torch.testing.assert_close(p, q.detach(), msg=f"rank {r} differs from the reference")


def test_reductions_on_the_main_stream_match_one_process(mesh4: ProcMesh) -> None:
    _check(mesh4, overlap=False)


@streams
def test_reductions_on_a_comms_stream_match_one_process(mesh4: ProcMesh) -> None:
    _check(mesh4, overlap=True)


def test_the_reference_learns() -> None:
    losses = ex["train_reference"](ex["Config"](), RANKS, 12)
    assert losses[-1] < 0.7 * losses[0]
