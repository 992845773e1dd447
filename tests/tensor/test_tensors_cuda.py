"""Distributed tensors on CUDA: ops on CUDA tensors, and NCCL collectives over the
ranks that fit (one proc per GPU). They skip, with the reason, on machines without a
CUDA device; CI has none, a machine with GPUs runs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from monarch import inspect
from monarch.actor import Actor, ProcMesh, as_endpoint, endpoint, this_host

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine (torch.cuda)"
)


@pytest.fixture(scope="module")
def gpus() -> Iterator[ProcMesh]:
    count = min(torch.cuda.device_count(), 4)
    pm = this_host().spawn_procs(per_host={"gpus": count})
    assert pm.initialized.get(timeout=120) is True
    yield pm
    pm.stop().get(timeout=60)


def test_ops_on_cuda_tensors(gpus: ProcMesh) -> None:
    with gpus.activate():
        t = torch.ones(3, 4, device="cuda") * 2
        m = t @ t.T
    assert t.device.type == "cuda"
    value = inspect(m)
    assert value.device.type == "cpu"
    assert torch.equal(value, torch.full((3, 3), 16.0))


def test_rank_tensors_moved_to_cuda(gpus: ProcMesh) -> None:
    with gpus.activate():
        f = 10 * gpus.rank_tensor("gpus").cuda()
    last = gpus.size("gpus") - 1
    assert inspect(f, gpus=last).item() == 10 * last


def test_nccl_reductions_over_the_gpus_that_fit(gpus: ProcMesh) -> None:
    n = gpus.size("gpus")
    with gpus.activate():
        r = gpus.rank_tensor("gpus").cuda().float() + 1
        x = torch.ones(4, device="cuda") * r
        total = x.reduce("gpus", "sum")
        biggest = x.reduce("gpus", "max")
        stacked = x.reduce("gpus", "stack")
    expected = n * (n + 1) / 2
    assert inspect(total, gpus=n - 1).tolist() == [expected] * 4
    assert inspect(biggest).tolist() == [float(n)] * 4
    assert inspect(stacked).shape == (n, 4)


def test_cuda_and_cpu_tensors_do_not_mix_in_a_collective(gpus: ProcMesh) -> None:
    with gpus.activate():
        on_gpu = torch.ones(2, device="cuda")
        on_cpu = torch.ones(2)
    with pytest.raises(TypeError, match="CROSS_DEVICE_REQUIRES_CUDA"):
        on_cpu.reduce("gpus", "sum", out=on_gpu)


def _all_reduce(x: torch.Tensor, group: object) -> torch.Tensor:
    import torch.distributed as dist

    y = x.clone()
    dist.all_reduce(y, group=group)  # type: ignore[arg-type]
    return y


def test_process_groups_in_remote_functions_take_cpu_and_cuda_tensors(gpus: ProcMesh) -> None:
    """A ``RemoteProcessGroup`` is one group with gloo for CPU tensors and NCCL for CUDA
    ones, as torch.distributed's default group is."""
    from monarch import remote

    n = gpus.size("gpus")
    fn = remote(_all_reduce, propagate=lambda x, group: x)
    with gpus.activate():
        r = gpus.rank_tensor("gpus").float() + 1
        pg = gpus.process_group("gpus")
        on_cpu = fn(torch.ones(2) * r, pg)
        on_gpu = fn(torch.ones(2, device="cuda") * r.cuda(), pg)
    expected = n * (n + 1) / 2
    assert inspect(on_cpu).tolist() == [expected] * 2
    assert inspect(on_gpu).tolist() == [expected] * 2


class _AddWithState(Actor):
    """Holds the CUDA shard given to its constructor (upstream's test_actor_with_tensors)."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    @endpoint
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.state.device.type == "cuda"  # its shard, where the worker had it
        return (x.to(self.state.device) + self.state).cpu()

    @endpoint
    def count(self, x: object) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        return self.calls - 1

    def times(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.state


def test_actors_get_their_cuda_shards_at_spawn_and_in_calls_in_order(gpus: ProcMesh) -> None:
    with gpus.activate():
        r = gpus.rank_tensor("gpus").cuda().float()
        state = r + 1  # computed on the workers' CUDA streams just before the spawn
        adders = gpus.spawn("cuda_adders", _AddWithState, state)
        y = torch.ones((), device="cuda")
        added = adders.forward.call(y).get(timeout=60)
        counts = []
        for _ in range(5):
            counts.append(adders.count.call(y))  # through the workers
            counts.append(adders.count.call(1))  # the same way: in order
        # A result of another shape than propagate said is kept (with a warning).
        wrong = as_endpoint(adders.times, propagate=lambda x: torch.rand(2)).rref(
            torch.ones(3, device="cuda")
        )
    for point, value in added.items():
        assert value.item() == point["gpus"] + 2
    for i, fut in enumerate(counts):
        assert set(fut.get(timeout=60).values()) == {i}
    assert inspect(wrong, gpus=0).tolist() == [1.0, 1.0, 1.0]
