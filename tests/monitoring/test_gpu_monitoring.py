"""GPUs in the monitoring snapshot: NVML (loaded at run time) reports each device and
the memory each process holds on it. Skipped, with the reason, without a CUDA device;
CI has none, a machine with a GPU runs it (tests/gpu/run_on_gpu.sh)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from monarch._rust_bindings import monitor_snapshot  # noqa: E402
from monarch.actor import Actor, ProcMesh, endpoint, this_host  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device on this machine (torch.cuda)"
    ),
    pytest.mark.timeout(120),
]

HELD = 256 << 20


class Holder(Actor):
    @endpoint
    def hold(self, nbytes: int) -> int:
        self.block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return os.getpid()


@pytest.fixture
def gpu_proc() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=60)


def test_the_snapshot_shows_the_gpu_and_the_memory_a_proc_holds(gpu_proc: ProcMesh) -> None:
    holder = gpu_proc.spawn("holder", Holder)
    pid = holder.hold.call_one(HELD).get(timeout=60)
    snap = json.loads(monitor_snapshot(10.0))
    gpus = [g for h in snap["hosts"] for g in h["gpus"]]
    assert gpus, f"no GPU in the snapshot: {snap['hosts']}"
    gpu = gpus[0]
    assert gpu["name"] == torch.cuda.get_device_name(0)
    assert gpu["mem_total"] == pytest.approx(
        torch.cuda.get_device_properties(0).total_memory, rel=0.05
    )
    assert gpu["mem_used"] >= HELD
    held = {p["pid"]: p["mem_used"] for g in gpus for p in g["procs"]}
    assert held.get(pid, 0) >= HELD, f"pid {pid} not listed with >= {HELD} bytes: {held}"
