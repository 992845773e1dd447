"""``monarch.rdma`` with CUDA memory on one host (CUDA IPC, pinned staging). Needs a GPU:
skipped, with the reason, where torch has no CUDA (CI never has a GPU; these run where a
GPU machine is lent)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from monarch.actor import Actor, ProcMesh, endpoint, this_host  # noqa: E402
from monarch.rdma import (  # noqa: E402
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMAWriteTransferWarning,
)

pytestmark = [
    pytest.mark.timeout(120),
    # Not a module-level skip: procs without CUDA unpickle this module's actors too.
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch.cuda.is_available() is False: no GPU here"
    ),
]

MiB = 1 << 20
ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def pattern(n: int, seed: int, device: str = "cpu") -> Any:
    return ((torch.arange(n, dtype=torch.int64, device=device) * 7 + seed) % 251).to(torch.uint8)


class GpuOwner(Actor):
    def __init__(self, n: int, seed: int, device: str) -> None:
        self.t = pattern(n, seed, device)

    @endpoint
    def buffer(self) -> RDMABuffer:
        return RDMABuffer(self.t)

    @endpoint
    def checksum(self) -> list[int]:
        return [*self.t.cpu().tolist()[:64], int(self.t.to(torch.int64).sum())]


class GpuReader(Actor):
    @endpoint
    def read(self, buf: RDMABuffer, device: str) -> list[int]:
        dst = torch.zeros(buf.size(), dtype=torch.uint8, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RDMAReadTransferWarning)
            buf.read_into(dst).get(timeout=60)
        return [*dst.cpu().tolist()[:64], int(dst.to(torch.int64).sum())]

    @endpoint
    def write(self, buf: RDMABuffer, seed: int, device: str) -> None:
        src = pattern(buf.size(), seed, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RDMAWriteTransferWarning)
            buf.write_from(src).get(timeout=60)

    @endpoint
    def bandwidth(self, buf: RDMABuffer, reps: int) -> tuple[str, float]:
        import time

        dst = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
        buf.read_into(dst).get(timeout=60)
        start = time.perf_counter()
        for _ in range(reps):
            buf.read_into(dst).get(timeout=60)
        return buf.backend, buf.size() * reps / (time.perf_counter() - start) / 1e9

    @endpoint
    def try_read(self, buf: RDMABuffer) -> str:
        try:
            buf.read_into(torch.zeros(buf.size(), dtype=torch.uint8)).get(timeout=60)
        except RuntimeError as e:
            return str(e)
        return "no error"


def expected(n: int, seed: int) -> list[int]:
    p = pattern(n, seed)
    return [*p.tolist()[:64], int(p.to(torch.int64).sum())]


@pytest.fixture(scope="module")
def gpu_procs() -> Any:
    procs = this_host().spawn_procs(per_host={"procs": 2}, env=ENV)
    # Wait, so that they exist before the leak checks' snapshot of the first test.
    assert procs.initialized.get(timeout=60) is True
    yield procs
    procs.stop().get(timeout=30)


@pytest.mark.parametrize(
    ("owner_dev", "reader_dev"), [("cuda", "cuda"), ("cuda", "cpu"), ("cpu", "cuda")]
)
def test_reads_and_writes_between_procs(
    gpu_procs: ProcMesh, owner_dev: str, reader_dev: str
) -> None:
    n = 3 * MiB + 5
    owner = gpu_procs.slice(procs=0).spawn(
        f"owner_{owner_dev}_{reader_dev}", GpuOwner, n, 3, owner_dev
    )
    reader = gpu_procs.slice(procs=1).spawn(f"reader_{owner_dev}_{reader_dev}", GpuReader)
    buf = owner.buffer.call_one().get(timeout=60)
    assert buf.device.startswith(owner_dev)
    # The reader's memory is not known here: the backend says how the owner's is reached.
    assert buf.backend == ("cuda_ipc" if owner_dev == "cuda" else "cma")
    assert reader.read.call_one(buf, reader_dev).get(timeout=60) == expected(n, 3)
    reader.write.call_one(buf, 11, reader_dev).get(timeout=60)
    assert owner.checksum.call_one().get(timeout=60) == expected(n, 11)


def test_the_client_reads_gpu_memory_of_an_actor(gpu_procs: ProcMesh) -> None:
    n = 1 * MiB
    owner = gpu_procs.slice(procs=0).spawn("owner_client", GpuOwner, n, 5, "cuda")
    buf = owner.buffer.call_one().get(timeout=60)
    dst = torch.zeros(n, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=60)
    assert [*dst.tolist()[:64], int(dst.to(torch.int64).sum())] == expected(n, 5)


def test_a_process_without_cuda_gets_a_clear_error(gpu_procs: ProcMesh) -> None:
    owner = gpu_procs.slice(procs=0).spawn("owner_nocuda", GpuOwner, 4096, 1, "cuda")
    buf = owner.buffer.call_one().get(timeout=60)
    blind = this_host().spawn_procs(per_host={"procs": 1}, env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        reader = blind.spawn("blind_reader", GpuReader)
        message = reader.try_read.call_one(buf).get(timeout=60)
        assert "no CUDA" in message and "CUDA memory" in message, message
    finally:
        blind.stop().get(timeout=30)


def test_gpu_to_gpu_bandwidth_is_reported(gpu_procs: ProcMesh) -> None:
    owner = gpu_procs.slice(procs=0).spawn("owner_bw", GpuOwner, 256 * MiB, 2, "cuda")
    reader = gpu_procs.slice(procs=1).spawn("reader_bw", GpuReader)
    buf = owner.buffer.call_one().get(timeout=60)
    backend, gbps = reader.bandwidth.call_one(buf, 10).get(timeout=60)
    assert backend == "cuda_ipc"
    print(f"CUDA IPC read of 256 MiB between procs: {gbps:.1f} GB/s")
