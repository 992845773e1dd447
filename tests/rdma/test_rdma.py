"""``monarch.rdma`` on one host: registration of tensors and memoryviews in place, one-sided
reads and writes between the client and actors in other procs (the same-host "cma"
backend), ``RDMAAction``, dropping, and what a dead owner does to transfers.

Contents are checked byte for byte against ``pattern(n, seed)`` (a cheap torch pattern in
which every 8-byte word differs); memory around a registered or destination region is
filled with ``SENTINEL`` and checked to be untouched. Every test has a timeout; the
harness fails a test that leaves a process or a non-daemon thread behind.
"""

from __future__ import annotations

import array
import asyncio
import os
import pickle
import re
import signal
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

torch = pytest.importorskip("torch")

from monarch.actor import (  # noqa: E402
    Actor,
    Channel,
    Port,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
    this_host,
)
from monarch.rdma import (  # noqa: E402
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from rdma_content import (  # noqa: E402
    SENTINEL,
    MiB,
    mismatch,
    outcome,
    pattern,
    read_until_gone,
    sentinel,
)

if TYPE_CHECKING:  # not imported at run time: procs unpickling this module lack it
    from conftest import Faults

pytestmark = pytest.mark.timeout(90)


# --- content helpers (used by the client and by the actors) -------------------------


def layout(base: Any, offset: int, n: int, segments: list[tuple[int, int, int]]) -> str:
    """'' if ``base`` holds SENTINEL outside ``[offset, offset + n)`` and, for each
    ``(start, end, seed)``, ``pattern(end, seed)[start:end]`` at ``offset + start``."""
    errors = [
        mismatch(base[:offset], sentinel(offset), "bytes before the region"),
        mismatch(base[offset + n :], sentinel(base.numel() - offset - n), "bytes after the region"),
    ]
    for start, end, seed in segments:
        errors.append(
            mismatch(
                base[offset + start : offset + end],
                pattern(end, seed)[start:end],
                f"bytes [{start}, {end}) (seed {seed})",
            )
        )
    return "; ".join(e for e in errors if e)


def do_read(buf: RDMABuffer, seed: int, dst_offset: int = 0, extra: int = 0) -> str:
    """Read ``buf`` into a fresh destination at ``dst_offset`` of a SENTINEL tensor with
    ``extra`` bytes more than needed; '' if it holds ``pattern(size, seed)`` and nothing
    else changed."""
    n = buf.size()
    base = sentinel(dst_offset + n + extra)
    buf.read_into(base[dst_offset:], timeout=60).get(timeout=90)
    return layout(base, dst_offset, n, [(0, n, seed)])


async def do_read_async(buf: RDMABuffer, seed: int, dst_offset: int = 0, extra: int = 0) -> str:
    n = buf.size()
    base = sentinel(dst_offset + n + extra)
    await buf.read_into(base[dst_offset:], timeout=60)
    return layout(base, dst_offset, n, [(0, n, seed)])


def source(seed: int, nbytes: int, src_offset: int) -> Any:
    """``pattern(nbytes, seed)`` at ``src_offset`` of a larger tensor (a view into it)."""
    base = sentinel(src_offset + nbytes + 1)
    base[src_offset : src_offset + nbytes] = pattern(nbytes, seed)
    return base[src_offset : src_offset + nbytes]


def do_write(buf: RDMABuffer, seed: int, nbytes: int, src_offset: int = 0) -> None:
    buf.write_from(source(seed, nbytes, src_offset), timeout=60).get(timeout=90)


async def do_write_async(buf: RDMABuffer, seed: int, nbytes: int, src_offset: int = 0) -> None:
    await buf.write_from(source(seed, nbytes, src_offset), timeout=60)


def no_warnings(record: list[warnings.WarningMessage]) -> str:
    return "; ".join(f"warned {w.category.__name__}: {w.message}" for w in record)


def _register(holder: Any, key: str, nbytes: int, seed: int, offset: int, pad: int) -> RDMABuffer:
    """Register ``nbytes`` of ``pattern(nbytes, seed)`` at ``offset`` of a tensor with
    SENTINEL around (``offset`` bytes before, ``pad`` after); remembered under ``key``."""
    base = sentinel(offset + nbytes + pad)
    base[offset : offset + nbytes] = pattern(nbytes, seed)
    buf = RDMABuffer(base[offset : offset + nbytes])
    holder.mem[key] = (base, offset, nbytes)
    holder.bufs[key] = buf
    return buf


def _check(holder: Any, key: str, segments: list[tuple[int, int, int]]) -> str:
    base, offset, n = holder.mem[key]
    return layout(base, offset, n, segments)


def _joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


class Holder(Actor):
    """Owns buffers over its own memory, and uses the buffers of others (sync endpoints)."""

    def __init__(self) -> None:
        #: key -> (the tensor around the registered region, its offset, its length)
        self.mem: dict[str, tuple[Any, int, int]] = {}
        self.bufs: dict[str, RDMABuffer] = {}
        self.keep: list[object] = []

    @endpoint
    def whoami(self) -> tuple[str, int]:
        return context().actor_instance.actor_id, os.getpid()

    @endpoint
    def backend_info(self) -> tuple[str, bool]:
        return get_rdma_backend(), is_ibverbs_available()

    @endpoint
    def own(self, key: str, nbytes: int, seed: int, offset: int = 0, pad: int = 0) -> RDMABuffer:
        return _register(self, key, nbytes, seed, offset, pad)

    @endpoint
    def own_memoryview(self, key: str, nbytes: int, seed: int, offset: int) -> RDMABuffer:
        """Like ``own``, over a slice of a memoryview of a bytearray."""
        raw = bytearray(b"\xa5" * (offset + nbytes + 3))
        base = torch.frombuffer(raw, dtype=torch.uint8)  # shares raw's memory
        base[offset : offset + nbytes] = pattern(nbytes, seed)
        buf = RDMABuffer(memoryview(raw)[offset : offset + nbytes])
        self.keep.append(raw)
        self.mem[key] = (base, offset, nbytes)
        self.bufs[key] = buf
        return buf

    @endpoint
    def refill(self, key: str, seed: int) -> None:
        base, offset, n = self.mem[key]
        base[offset : offset + n] = pattern(n, seed)

    @endpoint
    def check(self, key: str, segments: list[tuple[int, int, int]]) -> str:
        """'' if the region of ``key`` holds ``segments`` (see ``layout``), untouched around."""
        return _check(self, key, segments)

    @endpoint
    def drop(self, key: str) -> None:
        self.bufs[key].drop().get(timeout=30)

    # --- as a holder of the buffers of others ---

    @endpoint
    def describe(self, buf: RDMABuffer) -> tuple[int, str, str]:
        return buf.size(), buf.owner, buf.backend

    @endpoint
    def read(self, buf: RDMABuffer, seed: int, dst_offset: int = 0, extra: int = 0) -> str:
        return do_read(buf, seed, dst_offset, extra)

    @endpoint
    def write(self, buf: RDMABuffer, seed: int, nbytes: int, src_offset: int = 0) -> None:
        do_write(buf, seed, nbytes, src_offset)

    @endpoint
    def write_tensor(self, buf: RDMABuffer, data: Any) -> None:
        buf.write_from(data).get(timeout=60)

    @endpoint
    def try_read(self, buf: RDMABuffer) -> tuple[str, str]:
        dst = sentinel(buf.size())
        return outcome(lambda: buf.read_into(dst, timeout=30).get(timeout=45))

    @endpoint
    def try_write(self, buf: RDMABuffer, nbytes: int) -> tuple[str, str]:
        src = pattern(nbytes, 999)
        return outcome(lambda: buf.write_from(src, timeout=30).get(timeout=45))

    @endpoint
    def drop_handle(self, buf: RDMABuffer) -> None:
        buf.drop().get(timeout=30)

    @endpoint
    def repickle(self, buf: RDMABuffer) -> RDMABuffer:
        copy: RDMABuffer = pickle.loads(pickle.dumps(buf))
        return copy

    @endpoint
    def read_either(self, buf: RDMABuffer, old: int, new: int, count: int) -> list[str]:
        return read_either(buf, old, new, count)

    @endpoint
    def read_until_gone(self, buf: RDMABuffer, seed: int, started: Port[str]) -> dict[str, Any]:
        return read_until_gone(buf, seed, lambda: started.send("reading"))

    @endpoint
    def action(self, src: RDMABuffer, src_seed: int, dst: RDMABuffer, dst_seed: int) -> str:
        """One RDMAAction: read ``src`` and write ``pattern(dst.size(), dst_seed)`` to ``dst``."""
        local = sentinel(src.size())
        RDMAAction().read_remote(local, src).write_remote(
            dst, pattern(dst.size(), dst_seed)
        ).submit(timeout=60).get(timeout=90)
        return mismatch(local, pattern(src.size(), src_seed))


class AsyncHolder(Actor):
    """``Holder``'s roles with async endpoints (an actor's endpoints are all sync or all
    async). Each reports any warning its awaits raised (``Future.get()`` in a running
    loop would warn)."""

    def __init__(self) -> None:
        self.mem: dict[str, tuple[Any, int, int]] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    async def whoami(self) -> tuple[str, int]:
        return context().actor_instance.actor_id, os.getpid()

    @endpoint
    async def own(
        self, key: str, nbytes: int, seed: int, offset: int = 0, pad: int = 0
    ) -> RDMABuffer:
        return _register(self, key, nbytes, seed, offset, pad)

    @endpoint
    async def check(self, key: str, segments: list[tuple[int, int, int]]) -> str:
        return _check(self, key, segments)

    @endpoint
    async def drop(self, key: str) -> str:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            await self.bufs[key].drop()
        return no_warnings(record)

    @endpoint
    async def read(self, buf: RDMABuffer, seed: int, dst_offset: int = 0, extra: int = 0) -> str:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = await do_read_async(buf, seed, dst_offset, extra)
        return _joined(result, no_warnings(record))

    @endpoint
    async def write(self, buf: RDMABuffer, seed: int, nbytes: int, src_offset: int = 0) -> str:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            await do_write_async(buf, seed, nbytes, src_offset)
        return no_warnings(record)

    @endpoint
    async def try_read(self, buf: RDMABuffer) -> tuple[str, str]:
        try:
            await buf.read_into(sentinel(buf.size()), timeout=30)
        except SupervisionError as e:
            return "SupervisionError", str(e)
        except RuntimeError as e:
            return ("dropped" if "dropped" in str(e) else type(e).__name__), str(e)
        except Exception as e:
            return type(e).__name__, str(e)
        return "ok", ""

    @endpoint
    async def read_many(self, buf: RDMABuffer, seed: int, count: int) -> list[str]:
        """``count`` reads at once (one event loop), each checked."""
        results = await asyncio.gather(*(do_read_async(buf, seed) for _ in range(count)))
        return [r for r in results if r]

    @endpoint
    async def write_many(self, buf: RDMABuffer, seed: int, lengths: list[int]) -> None:
        await asyncio.gather(*(do_write_async(buf, seed, n) for n in lengths))

    @endpoint
    async def action(self, src: RDMABuffer, src_seed: int, dst: RDMABuffer, dst_seed: int) -> str:
        local = sentinel(src.size())
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            await (
                RDMAAction()
                .read_remote(local, src)
                .write_remote(dst, pattern(dst.size(), dst_seed))
                .submit(timeout=60)
            )
        return _joined(mismatch(local, pattern(src.size(), src_seed)), no_warnings(record))


def read_either(buf: RDMABuffer, old: int, new: int, count: int) -> list[str]:
    """``count`` reads while writers replace ``pattern(old)`` by ``pattern(new)``: each
    byte read is the old or the new one."""
    n = buf.size()
    was, will = pattern(n, old), pattern(n, new)
    bad = []
    for _ in range(count):
        dst = sentinel(n)
        buf.read_into(dst, timeout=60).get(timeout=90)
        wrong = ~((dst == was) | (dst == will))
        if wrong.any():
            bad.append(f"{int(wrong.sum())} byte(s) neither old nor new")
    return bad


def _spawn(procs: ProcMesh, name: str) -> tuple[Any, Any, Any, str]:
    """Holders on the three procs, and the id of the one on proc 0."""
    h = procs.spawn(name, Holder)
    owner_id, _ = h.slice(procs=0).whoami.call_one().get(timeout=60)
    return h.slice(procs=0), h.slice(procs=1), h.slice(procs=2), owner_id


def _spawn_async(procs: ProcMesh, name: str) -> tuple[Any, Any, Any, str]:
    """AsyncHolders on the three procs, and the id of the one on proc 0."""
    h = procs.spawn(name, AsyncHolder)
    owner_id, _ = h.slice(procs=0).whoami.call_one().get(timeout=60)
    return h.slice(procs=0), h.slice(procs=1), h.slice(procs=2), owner_id


# --- the module's API ---------------------------------------------------------------


def test_exports_backend_and_warning_classes() -> None:
    import monarch.rdma

    for name in [
        "RDMABuffer",
        "RDMAAction",
        "is_ibverbs_available",
        "is_rdma_available",
        "get_rdma_backend",
        "RDMATcpFallbackWarning",
        "RDMAReadTransferWarning",
        "RDMAWriteTransferWarning",
    ]:
        assert hasattr(monarch.rdma, name), name
    for cls in (RDMATcpFallbackWarning, RDMAReadTransferWarning, RDMAWriteTransferWarning):
        assert issubclass(cls, Warning), cls
    available = is_ibverbs_available()
    assert isinstance(available, bool)
    with pytest.warns(DeprecationWarning):
        assert is_rdma_available() == available
    backend = get_rdma_backend()
    assert backend in ("ibverbs", "tcp", "none")
    # ibverbs exactly where the devices are; without them the TCP fallback (allowed by
    # default: rdma_allow_tcp_fallback).
    assert backend == ("ibverbs" if available else "tcp")


@pytest.mark.timeout(120)
def test_backend_is_the_same_inside_actors(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_backend_info")
    assert owner.backend_info.call_one().get(timeout=60) == (
        get_rdma_backend(),
        is_ibverbs_available(),
    )


def test_registration_in_place_size_and_owner_of_client_buffers() -> None:
    me = context().actor_instance.actor_id
    t = torch.arange(10, dtype=torch.float32)
    buf = RDMABuffer(t)
    assert buf.size() == 40 and isinstance(buf.owner, str) and buf.owner == me
    views = [
        torch.zeros(6, 7, dtype=torch.float64).view(torch.uint8).flatten(),  # 336 bytes
        torch.arange(100, dtype=torch.int16)[3:],  # a slice at an offset: 194 bytes
        torch.zeros(3, dtype=torch.bfloat16),
        torch.zeros(5, dtype=torch.bool),
    ]
    sizes = [RDMABuffer(v).size() for v in views]
    assert sizes == [336, 194, 6, 5]
    assert RDMABuffer(memoryview(bytearray(13))).size() == 13
    assert RDMABuffer(memoryview(bytearray(20))[3:16]).size() == 13
    assert RDMABuffer(memoryview(array.array("i", range(7)))).size() == 28
    assert RDMABuffer(memoryview(b"read only")).size() == 9
    # A pickled copy keeps what it describes.
    copy = pickle.loads(pickle.dumps(buf))
    assert (copy.size(), copy.owner) == (40, me)
    buf.drop().get(timeout=30)


def test_empty_non_contiguous_and_not_1d_data_are_refused_with_the_fix() -> None:
    for empty in (
        torch.empty(0, dtype=torch.uint8),
        torch.arange(10)[5:5],
        memoryview(bytearray(0)),
        memoryview(bytearray(8))[4:4],
    ):
        with pytest.raises(ValueError):
            RDMABuffer(empty)
    for bad in (
        torch.arange(20)[::2],  # 1-D, not contiguous
        torch.zeros(4, 5),  # contiguous, 2-D
        torch.zeros(5, 4).t(),  # 2-D, not contiguous
        torch.tensor(3.0),  # 0-D
    ):
        with pytest.raises(ValueError) as info:
            RDMABuffer(bad)
        message = str(info.value)
        assert ".contiguous()" in message or ".view(torch.uint8).flatten()" in message, message
    for bad_view in (
        memoryview(bytearray(10))[::2],  # not contiguous
        memoryview(bytearray(16)).cast("B", (4, 4)),  # 2-D
    ):
        with pytest.raises(ValueError):
            RDMABuffer(bad_view)
    with pytest.raises((TypeError, ValueError)):
        RDMABuffer([1, 2, 3])  # type: ignore[arg-type]


# --- transfers between the client and actors ----------------------------------------


@pytest.mark.timeout(120)
def test_actor_owned_buffers_read_and_written_by_the_client(procs: ProcMesh) -> None:
    sync_owner, _, _, sync_id = _spawn(procs, "rdma_client_uses")
    async_owner, _, _, async_id = _spawn_async(procs, "rdma_client_uses_async")
    n = 3 * MiB + 5
    for key, owner, owner_id in (("sync", sync_owner, sync_id), ("async", async_owner, async_id)):
        buf = owner.own.call_one(key, n, 1, 3, 2).get(timeout=60)
        assert (buf.size(), buf.owner, buf.backend) == (n, owner_id, "cma")
        assert do_read(buf, 1) == ""
        # Into the leading bytes of a larger destination at an odd offset: the rest of it
        # is untouched.
        assert do_read(buf, 1, dst_offset=5, extra=11) == ""
        do_write(buf, 2, n)
        assert owner.check.call_one(key, [(0, n, 2)]).get(timeout=60) == ""
        # A shorter source from an odd offset: only the leading bytes change.
        do_write(buf, 3, n - 1001, src_offset=7)
        expected = [(0, n - 1001, 3), (n - 1001, n, 2)]
        assert owner.check.call_one(key, expected).get(timeout=60) == ""
        # A completed future stays completed.
        done = buf.read_into(sentinel(n))
        assert done.get(timeout=60) is None and done.get(timeout=1) is None


@pytest.mark.timeout(120)
def test_actor_owned_buffers_used_by_actors_in_other_procs(procs: ProcMesh) -> None:
    # Sync endpoints on procs 0 and 1, async ones on procs 0 and 2.
    sync_owner, r1, _, sync_id = _spawn(procs, "rdma_actor_uses")
    async_owner, _, r2, async_id = _spawn_async(procs, "rdma_actor_uses_async")
    n = 2 * MiB + 3
    for key, owner, owner_id in (("sync", sync_owner, sync_id), ("async", async_owner, async_id)):
        buf = owner.own.call_one(key, n, 10, 1, 4).get(timeout=60)
        assert r1.describe.call_one(buf).get(timeout=60) == (n, owner_id, "cma")
        assert r1.read.call_one(buf, 10).get(timeout=60) == ""
        assert r2.read.call_one(buf, 10, 3, 5).get(timeout=60) == ""
        r1.write.call_one(buf, 11, n).get(timeout=60)
        assert owner.check.call_one(key, [(0, n, 11)]).get(timeout=60) == ""
        assert r2.write.call_one(buf, 12, n - 2, 1).get(timeout=60) == ""
        expected = [(0, n - 2, 12), (n - 2, n, 11)]
        assert owner.check.call_one(key, expected).get(timeout=60) == ""


@pytest.mark.timeout(120)
def test_client_owned_buffer_is_in_place_for_actor_readers_and_writers(procs: ProcMesh) -> None:
    _, r1, _, _ = _spawn(procs, "rdma_client_owned")
    _, _, r2, _ = _spawn_async(procs, "rdma_client_owned_async")
    me = context().actor_instance.actor_id
    n = MiB + 7
    base = sentinel(3 + n + 4)
    base[3 : 3 + n] = pattern(n, 20)
    buf = RDMABuffer(base[3 : 3 + n])
    assert r1.describe.call_one(buf).get(timeout=60) == (n, me, "cma")
    assert r1.read.call_one(buf, 20).get(timeout=60) == ""
    assert r2.read.call_one(buf, 20, 1, 2).get(timeout=60) == ""
    # Registered in place: what the owner changes, the next reader sees.
    base[3 : 3 + n] = pattern(n, 21)
    assert r1.read.call_one(buf, 21).get(timeout=60) == ""
    # And what a holder writes lands in the owner's tensor.
    assert r2.write.call_one(buf, 22, n).get(timeout=60) == ""
    assert layout(base, 3, n, [(0, n, 22)]) == ""
    r1.write.call_one(buf, 23, 10, 1).get(timeout=60)
    assert layout(base, 3, n, [(0, 10, 23), (10, n, 22)]) == ""
    buf.drop().get(timeout=30)


@pytest.mark.timeout(120)
def test_any_dtype_and_views_are_written_in_place(procs: ProcMesh) -> None:
    _, r1, _, _ = _spawn(procs, "rdma_dtypes")
    for seed, dtype in enumerate(
        [torch.float32, torch.float64, torch.bfloat16, torch.int16, torch.bool, torch.complex64]
    ):
        t = torch.zeros(1001, dtype=dtype)
        raw = t.view(torch.uint8)
        buf = RDMABuffer(t)
        assert buf.size() == 1001 * t.element_size(), dtype
        r1.write.call_one(buf, 30 + seed, buf.size()).get(timeout=60)
        assert mismatch(raw, pattern(buf.size(), 30 + seed), str(dtype)) == ""
        raw.copy_(pattern(buf.size(), 40 + seed))
        assert r1.read.call_one(buf, 40 + seed).get(timeout=60) == "", dtype
        buf.drop().get(timeout=30)
    # A 2-D tensor through a flat byte view of it, and a slice of a float tensor.
    w = torch.zeros(64, 33)
    values = torch.randn(64, 33)
    flat = RDMABuffer(w.view(torch.uint8).flatten())
    r1.write_tensor.call_one(flat, values.view(torch.uint8).flatten()).get(timeout=60)
    assert torch.equal(w, values)
    t = torch.zeros(100)
    tail = RDMABuffer(t[3:])
    assert tail.size() == 97 * 4
    r1.write_tensor.call_one(tail, torch.arange(97, dtype=torch.float32)).get(timeout=60)
    assert torch.equal(t[3:], torch.arange(97, dtype=torch.float32))
    assert torch.equal(t[:3], torch.zeros(3))
    # A memoryview of a bytearray.
    raw_bytes = bytearray(b"\xa5" * 50)
    mv = RDMABuffer(memoryview(raw_bytes)[7:40])
    r1.write_tensor.call_one(mv, torch.arange(33, dtype=torch.uint8)).get(timeout=60)
    assert raw_bytes == b"\xa5" * 7 + bytes(range(33)) + b"\xa5" * 10
    for b in (flat, tail, mv):
        b.drop().get(timeout=30)


@pytest.mark.timeout(120)
def test_one_byte_buffers(procs: ProcMesh) -> None:
    owner, r1, _, _ = _spawn(procs, "rdma_one_byte")
    buf = owner.own.call_one("one", 1, 50, 1, 1).get(timeout=60)
    assert buf.size() == 1
    assert do_read(buf, 50) == ""
    assert do_read(buf, 50, dst_offset=1, extra=2) == ""
    do_write(buf, 51, 1, src_offset=1)
    assert owner.check.call_one("one", [(0, 1, 51)]).get(timeout=60) == ""
    assert r1.read.call_one(buf, 51).get(timeout=60) == ""
    r1.write.call_one(buf, 52, 1).get(timeout=60)
    assert owner.check.call_one("one", [(0, 1, 52)]).get(timeout=60) == ""
    # A one-byte buffer of the client, at an odd offset of its tensor.
    base = sentinel(3)
    base[1] = pattern(1, 53)[0]
    mine = RDMABuffer(base[1:2])
    assert r1.read.call_one(mine, 53).get(timeout=60) == ""
    r1.write.call_one(mine, 54, 1).get(timeout=60)
    assert layout(base, 1, 1, [(0, 1, 54)]) == ""
    mine.drop().get(timeout=30)


@pytest.mark.timeout(120)
def test_unaligned_regions_of_tensors_and_memoryviews(procs: ProcMesh) -> None:
    owner, r1, _, _ = _spawn(procs, "rdma_unaligned")
    _, _, r2, _ = _spawn_async(procs, "rdma_unaligned_async")
    n = 1001  # odd length, at odd offsets
    for key, make in (
        ("tensor", lambda: owner.own.call_one("tensor", n, 60, 3, 5)),
        ("memoryview", lambda: owner.own_memoryview.call_one("memoryview", n, 60, 3)),
    ):
        buf = make().get(timeout=60)
        assert buf.size() == n
        assert do_read(buf, 60, dst_offset=5, extra=7) == "", key
        assert r1.read.call_one(buf, 60, 1, 3).get(timeout=60) == "", key
        # The client reads into a memoryview at an odd offset of a bytearray.
        raw = bytearray(b"\xa5" * (n + 12))
        buf.read_into(memoryview(raw)[5:], timeout=60).get(timeout=90)
        got = torch.frombuffer(raw, dtype=torch.uint8)
        assert layout(got, 5, n, [(0, n, 60)]) == "", key
        # Writes of fewer bytes, from odd offsets.
        do_write(buf, 61, n - 2, src_offset=1)
        assert r2.write.call_one(buf, 62, 499, 3).get(timeout=60) == ""
        expected = [(0, 499, 62), (499, n - 2, 61), (n - 2, n, 60)]
        assert owner.check.call_one(key, expected).get(timeout=60) == "", key
        src = bytearray(b"\x00" + bytes(pattern(7, 63).tolist()))
        buf.write_from(memoryview(src)[1:], timeout=60).get(timeout=90)
        expected = [(0, 7, 63), (7, 499, 62), (499, n - 2, 61), (n - 2, n, 60)]
        assert owner.check.call_one(key, expected).get(timeout=60) == "", key
        owner.refill.call_one(key, 60).get(timeout=60)


@pytest.mark.timeout(240)
def test_256_mib_buffers_both_ways(procs: ProcMesh) -> None:
    owner, r1, _, _ = _spawn(procs, "rdma_big")
    n = 256 * MiB
    buf = owner.own.call_one("big", n, 70).get(timeout=120)
    assert buf.size() == n
    dst = sentinel(n)
    buf.read_into(dst, timeout=120).get(timeout=150)
    assert mismatch(dst, pattern(n, 70)) == ""
    del dst
    buf.write_from(pattern(n, 71), timeout=120).get(timeout=150)
    assert owner.check.call_one("big", [(0, n, 71)]).get(timeout=120) == ""
    owner.drop.call_one("big").get(timeout=60)
    # 256 MiB of the client, read and written by an actor.
    t = pattern(n, 72)
    mine = RDMABuffer(t)
    assert r1.read.call_one(mine, 72).get(timeout=120) == ""
    r1.write.call_one(mine, 73, n).get(timeout=120)
    assert mismatch(t, pattern(n, 73)) == ""
    mine.drop().get(timeout=60)


@pytest.mark.timeout(120)
def test_transfers_are_lazy(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_lazy")
    buf = owner.own.call_one("lazy", 1, 80).get(timeout=60)
    dst = sentinel(1)
    pending_read = buf.read_into(dst)
    pending_write = buf.write_from(pattern(1, 81))
    # A round trip to the owner: a transfer started without being waited for would be
    # over by now.
    assert owner.check.call_one("lazy", [(0, 1, 80)]).get(timeout=60) == ""
    assert int(dst[0]) == SENTINEL
    assert pending_read.get(timeout=60) is None
    assert mismatch(dst, pattern(1, 80)) == ""
    assert pending_write.get(timeout=60) is None
    assert owner.check.call_one("lazy", [(0, 1, 81)]).get(timeout=60) == ""


@pytest.mark.timeout(120)
def test_bad_destinations_and_sources_are_refused(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_bad_args")
    n = 100
    buf = owner.own.call_one("args", n, 90).get(timeout=60)
    for dst in (
        sentinel(n - 1),  # too small
        sentinel(0),
        memoryview(bytearray(n - 1)),
        memoryview(bytes(n)),  # read-only
        sentinel(2 * n)[::2],  # not contiguous
    ):
        with pytest.raises(ValueError):
            buf.read_into(dst).get(timeout=30)
    # Too large, or not contiguous (small enough: only the layout is wrong).
    for src in (sentinel(n + 1), memoryview(bytearray(n + 1)), sentinel(n)[::2]):
        with pytest.raises(ValueError):
            buf.write_from(src).get(timeout=30)
    # Nothing was written by the refused writes, and the buffer still works.
    assert owner.check.call_one("args", [(0, n, 90)]).get(timeout=60) == ""
    assert do_read(buf, 90) == ""


@pytest.mark.timeout(120)
def test_read_only_memoryview_is_readable_not_writable(procs: ProcMesh) -> None:
    _, r1, _, _ = _spawn(procs, "rdma_read_only")
    _, _, r2, _ = _spawn_async(procs, "rdma_read_only_async")
    n = 333
    data = bytes(pattern(n, 100).tolist())
    buf = RDMABuffer(memoryview(data))
    assert buf.size() == n
    assert r1.read.call_one(buf, 100).get(timeout=60) == ""
    assert r2.read.call_one(buf, 100).get(timeout=60) == ""
    for nbytes in (n, 1):
        kind, message = r1.try_write.call_one(buf, nbytes).get(timeout=60)
        assert kind == "ValueError", (kind, message)
    assert data == bytes(pattern(n, 100).tolist())
    buf.drop().get(timeout=30)


@pytest.mark.timeout(120)
def test_handles_pickle_and_travel_between_actors(procs: ProcMesh) -> None:
    owner, r1, r2, owner_id = _spawn(procs, "rdma_pickle")
    n = 4096 + 5
    buf = owner.own.call_one("p", n, 110, 1, 1).get(timeout=60)
    copy = pickle.loads(pickle.dumps(buf))
    assert (copy.size(), copy.owner, copy.backend) == (n, owner_id, "cma")
    assert do_read(copy, 110) == ""
    do_write(copy, 111, n)
    assert owner.check.call_one("p", [(0, n, 111)]).get(timeout=60) == ""
    # Through an actor that pickles it again, then to another actor.
    again = r1.repickle.call_one(buf).get(timeout=60)
    assert (again.size(), again.owner) == (n, owner_id)
    assert do_read(again, 111) == ""
    assert r2.read.call_one(again, 111).get(timeout=60) == ""
    # A client buffer's handle, pickled, still reaches the client's memory.
    t = pattern(77, 112)
    mine = RDMABuffer(t)
    mine_copy = pickle.loads(pickle.dumps(mine))
    assert r1.read.call_one(mine_copy, 112).get(timeout=60) == ""
    # Dropping through a copy drops the buffer.
    mine_copy.drop().get(timeout=30)
    assert r2.try_read.call_one(mine).get(timeout=60)[0] == "dropped"
    copy.drop().get(timeout=30)
    with pytest.raises(RuntimeError, match="dropped"):
        buf.read_into(sentinel(n)).get(timeout=30)


# --- concurrency ----------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_concurrent_reads_and_writes_of_one_buffer(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_concurrent")
    _, r1, r2, _ = _spawn_async(procs, "rdma_concurrent_async")
    n = 4 * MiB + 1
    buf = owner.own.call_one("c", n, 120).get(timeout=60)
    # Concurrent reads: two actors (several at once each) and four client threads.
    pending = [r.read_many.call_one(buf, 120, 6) for r in (r1, r2)]
    with ThreadPoolExecutor(4) as pool:
        mine = [pool.submit(lambda: [do_read(buf, 120) for _ in range(4)]) for _ in range(4)]
        client_results = [r for f in mine for r in f.result(timeout=120) if r]
    assert client_results == []
    assert [p.get(timeout=120) for p in pending] == [[], []]
    # Concurrent writes of one new content (full length and shorter) while others read:
    # every byte read is the old or the new one, and the new content is there in the end.
    lengths = [n, n // 2 + 1, 1, n - 3]
    writers = [r1.write_many.call_one(buf, 121, lengths), r2.write_many.call_one(buf, 121, lengths)]
    with ThreadPoolExecutor(4) as pool:
        reads = [pool.submit(read_either, buf, 120, 121, 5) for _ in range(2)]
        writes = [pool.submit(do_write, buf, 121, k) for k in lengths[:2]]
        for w in writes:
            w.result(timeout=120)
        read_results = [r for f in reads for r in f.result(timeout=120)]
    for w in writers:
        w.get(timeout=120)
    assert read_results == []
    assert owner.check.call_one("c", [(0, n, 121)]).get(timeout=60) == ""


# --- dropping -------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_owner_drops_then_holders_cannot_use_it(procs: ProcMesh) -> None:
    owner, r1, _, _ = _spawn(procs, "rdma_owner_drops")
    n = 4096
    buf = owner.own.call_one("d", n, 130).get(timeout=60)
    assert do_read(buf, 130) == ""
    owner.drop.call_one("d").get(timeout=60)
    with pytest.raises(RuntimeError, match="dropped") as info:
        buf.read_into(sentinel(n)).get(timeout=30)
    assert not isinstance(info.value, SupervisionError)  # the owner is alive
    with pytest.raises(RuntimeError, match="dropped"):
        buf.write_from(pattern(n, 131)).get(timeout=30)
    assert r1.try_read.call_one(buf).get(timeout=60)[0] == "dropped"
    assert r1.try_write.call_one(buf, n).get(timeout=60)[0] == "dropped"
    assert owner.check.call_one("d", [(0, n, 130)]).get(timeout=60) == ""
    # Dropping again is fine, by the owner and by a holder.
    owner.drop.call_one("d").get(timeout=60)
    buf.drop().get(timeout=30)
    # And so is the owner dropping in async code.
    async_owner, _, a2, _ = _spawn_async(procs, "rdma_owner_drops_async")
    buf2 = async_owner.own.call_one("d2", n, 132).get(timeout=60)
    assert async_owner.drop.call_one("d2").get(timeout=60) == ""
    assert r1.try_read.call_one(buf2).get(timeout=60)[0] == "dropped"
    assert a2.try_read.call_one(buf2).get(timeout=60)[0] == "dropped"


@pytest.mark.timeout(120)
def test_a_holder_drops_then_nobody_can_use_it(procs: ProcMesh) -> None:
    owner, r1, r2, _ = _spawn(procs, "rdma_holder_drops")
    n = 4096
    # The client, a holder, drops an actor's buffer.
    buf = owner.own.call_one("h", n, 140).get(timeout=60)
    assert r1.read.call_one(buf, 140).get(timeout=60) == ""
    buf.drop().get(timeout=30)
    with pytest.raises(RuntimeError, match="dropped"):
        buf.read_into(sentinel(n)).get(timeout=30)
    assert r1.try_read.call_one(buf).get(timeout=60)[0] == "dropped"
    assert r2.try_write.call_one(buf, n).get(timeout=60)[0] == "dropped"
    buf.drop().get(timeout=30)
    owner.drop.call_one("h").get(timeout=60)
    # An actor, a holder, drops an actor's buffer, and one of the client.
    buf = owner.own.call_one("h2", n, 141).get(timeout=60)
    r1.drop_handle.call_one(buf).get(timeout=60)
    assert r2.try_read.call_one(buf).get(timeout=60)[0] == "dropped"
    with pytest.raises(RuntimeError, match="dropped"):
        buf.write_from(pattern(n, 142)).get(timeout=30)
    assert owner.check.call_one("h2", [(0, n, 141)]).get(timeout=60) == ""
    t = pattern(n, 143)
    mine = RDMABuffer(t)
    assert r1.read.call_one(mine, 143).get(timeout=60) == ""
    r2.drop_handle.call_one(mine).get(timeout=60)
    assert r1.try_read.call_one(mine).get(timeout=60)[0] == "dropped"
    assert r1.try_write.call_one(mine, n).get(timeout=60)[0] == "dropped"
    assert mismatch(t, pattern(n, 143)) == ""
    mine.drop().get(timeout=30)


# --- RDMAAction -----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_action_mixing_reads_and_writes_submitted_twice(procs: ProcMesh) -> None:
    a, b, _, _ = _spawn(procs, "rdma_action")
    na, nb, nc = MiB, MiB + 3, 777
    buf_a = a.own.call_one("a", na, 150).get(timeout=60)
    buf_b = b.own.call_one("b", nb, 151, 1, 2).get(timeout=60)
    buf_c = b.own.call_one("c", nc, 152, 3, 3).get(timeout=60)
    dst_a = sentinel(na)
    dst_c_base = sentinel(nc + 10)
    src_b = pattern(nb, 153)
    action = RDMAAction()
    chained = (
        action.read_remote(dst_a, buf_a)
        .write_remote(buf_b, src_b)
        .read_remote(dst_c_base[5:], buf_c)
    )
    chained.submit(timeout=60).get(timeout=90)
    assert mismatch(dst_a, pattern(na, 150)) == ""
    assert b.check.call_one("b", [(0, nb, 153)]).get(timeout=60) == ""
    assert layout(dst_c_base, 5, nc, [(0, nc, 152)]) == ""
    # Submitted again, every op runs again: the reads see the new remote contents, and
    # the write lands again over what its owner put there meanwhile.
    a.refill.call_one("a", 154).get(timeout=60)
    b.refill.call_one("b", 155).get(timeout=60)
    b.refill.call_one("c", 156).get(timeout=60)
    dst_a.fill_(SENTINEL)
    dst_c_base.fill_(SENTINEL)
    chained.submit(timeout=60).get(timeout=90)
    assert mismatch(dst_a, pattern(na, 154)) == ""
    assert b.check.call_one("b", [(0, nb, 153)]).get(timeout=60) == ""
    assert layout(dst_c_base, 5, nc, [(0, nc, 156)]) == ""


@pytest.mark.timeout(120)
def test_actions_inside_actors_sync_and_async(procs: ProcMesh) -> None:
    a, b, _, _ = _spawn(procs, "rdma_action_actors")
    _, _, c, _ = _spawn_async(procs, "rdma_action_actors_async")
    src = a.own.call_one("src", 5000, 160).get(timeout=60)
    dst = a.own.call_one("dst", 3001, 161, 1, 1).get(timeout=60)
    assert b.action.call_one(src, 160, dst, 162).get(timeout=60) == ""
    assert a.check.call_one("dst", [(0, 3001, 162)]).get(timeout=60) == ""
    assert c.action.call_one(src, 160, dst, 163).get(timeout=60) == ""
    assert a.check.call_one("dst", [(0, 3001, 163)]).get(timeout=60) == ""
    # Buffers of the client, from an actor's action.
    t_src, t_dst = pattern(999, 164), sentinel(998)
    mine_src, mine_dst = RDMABuffer(t_src), RDMABuffer(t_dst)
    assert c.action.call_one(mine_src, 164, mine_dst, 165).get(timeout=60) == ""
    assert mismatch(t_dst, pattern(998, 165)) == ""
    mine_src.drop().get(timeout=30)
    mine_dst.drop().get(timeout=30)


@pytest.mark.timeout(120)
def test_action_fails_if_any_op_fails_and_atomics_are_not_implemented(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_action_fails")
    good = owner.own.call_one("good", 1000, 170).get(timeout=60)
    gone = owner.own.call_one("gone", 1000, 171).get(timeout=60)
    owner.drop.call_one("gone").get(timeout=60)
    action = RDMAAction().read_remote(sentinel(1000), good).read_remote(sentinel(1000), gone)
    with pytest.raises(RuntimeError, match="dropped"):
        action.submit(timeout=60).get(timeout=90)
    action = RDMAAction().read_remote(sentinel(1000), good).write_remote(gone, pattern(1000, 1))
    with pytest.raises(RuntimeError, match="dropped"):
        action.submit(timeout=60).get(timeout=90)
    with pytest.raises(ValueError):
        RDMAAction().read_remote(sentinel(999), good).submit(timeout=60).get(timeout=90)
    with pytest.raises(ValueError):
        RDMAAction().write_remote(good, sentinel(1001)).submit(timeout=60).get(timeout=90)
    assert owner.check.call_one("good", [(0, 1000, 170)]).get(timeout=60) == ""
    local = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(NotImplementedError):
        RDMAAction().fetch_add(good, local, 1)
    with pytest.raises(NotImplementedError):
        RDMAAction().compare_and_swap(good, local, 0, 1)


# --- async client ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_every_operation_from_async_client_code(procs: ProcMesh) -> None:
    owner, _, _, _ = _spawn(procs, "rdma_async_client")
    _, r1, _, _ = _spawn_async(procs, "rdma_async_client_async")
    n = MiB + 1

    async def main() -> None:
        buf = await owner.own.call_one("x", n, 180, 1, 1)
        assert await do_read_async(buf, 180, 3, 3) == ""
        await do_write_async(buf, 181, n, 1)
        assert await owner.check.call_one("x", [(0, n, 181)]) == ""
        # Registered in async code, read and written by an actor.
        t = pattern(n, 182)
        mine = RDMABuffer(t)
        assert await r1.read.call_one(mine, 182) == ""
        assert await r1.write.call_one(mine, 183, n) == ""
        assert mismatch(t, pattern(n, 183)) == ""
        # An action, awaited twice over (two submissions).
        dst = sentinel(n)
        action = RDMAAction().read_remote(dst, buf).write_remote(mine, pattern(n, 184))
        await action.submit(timeout=60)
        assert mismatch(dst, pattern(n, 181)) == "" and mismatch(t, pattern(n, 184)) == ""
        dst.fill_(SENTINEL)
        await action.submit()
        assert mismatch(dst, pattern(n, 181)) == ""
        # Errors are raised where awaited.
        with pytest.raises(ValueError):
            await buf.read_into(sentinel(n - 1))
        await buf.drop()
        await buf.drop()
        with pytest.raises(RuntimeError, match="dropped"):
            await buf.read_into(dst)
        with pytest.raises(RuntimeError, match="dropped"):
            await RDMAAction().write_remote(buf, dst).submit()
        await mine.drop()
        assert (await r1.try_read.call_one(mine))[0] == "dropped"

    with warnings.catch_warnings():
        # Future.get() on a thread running an event loop warns: an error here.
        warnings.simplefilter("error")
        asyncio.run(main())


# --- a dead owner ---------------------------------------------------------------------


def _assert_owner_gone(report: dict[str, Any], owner_id: str, killed_at: float, who: str) -> None:
    assert report["bad"] == [], f"{who}: reads gave wrong content: {report['bad']}"
    assert report["ok"] >= 1, f"{who}: no read succeeded before the kill: {report}"
    assert report["error"] is not None, f"{who}: reads went on succeeding after the kill"
    kind, message = report["error"]
    assert kind == "SupervisionError", f"{who}: {kind}: {message}"
    assert owner_id in message, f"{who}: the error does not name the owner: {message}"
    assert report["failed_at"] - killed_at < 10, f"{who}: not prompt: {report}"
    assert len(report["after"]) == 2
    for kind, message, took in report["after"]:
        assert kind == "SupervisionError", f"{who}, after: {kind}: {message}"
        assert owner_id in message, f"{who}, after: {message}"
        assert took < 10, f"{who}, after: took {took:.1f} s"


@pytest.mark.timeout(180)
def test_owner_killed_mid_transfer(own_procs: ProcMesh, faults: Faults) -> None:
    name = "rdma_killed_owner"
    owner, r1, r2, owner_id = _spawn(own_procs, name)
    owner_pid = owner.whoami.call_one().get(timeout=60)[1]
    n = 32 * MiB
    buf = owner.own.call_one("victim", n, 190).get(timeout=60)
    port, receiver = Channel.open()
    loops = [r.read_until_gone.call_one(buf, 190, port) for r in (r1, r2)]
    reading = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        mine = pool.submit(read_until_gone, buf, 190, reading.set)
        for _ in loops:
            assert receiver.recv().get(timeout=60) == "reading"
        assert reading.wait(60)
        killed_at = time.monotonic()
        os.kill(owner_pid, signal.SIGKILL)
        client_report = mine.result(timeout=120)
    _assert_owner_gone(client_report, owner_id, killed_at, "client")
    for i, loop in enumerate(loops, 1):
        _assert_owner_gone(loop.get(timeout=120), owner_id, killed_at, f"actor on proc {i}")
    [failure] = faults.wait_for(1, name)
    assert failure.rank == 0
    # Later transfers and actions fail the same way, promptly.
    start = time.monotonic()
    with pytest.raises(SupervisionError, match=re.escape(owner_id)):
        buf.write_from(pattern(n, 191), timeout=30).get(timeout=45)
    with pytest.raises(SupervisionError, match=re.escape(owner_id)):
        RDMAAction().read_remote(sentinel(n), buf).submit(timeout=30).get(timeout=45)
    assert time.monotonic() - start < 10


@pytest.mark.timeout(120)
def test_transfers_to_a_stopped_owner_raise_supervision_error() -> None:
    pm = this_host().spawn_procs(per_host={"procs": 1})
    stopped = False
    try:
        h = pm.spawn("rdma_stopped_owner", Holder)
        owner_id, _ = h.whoami.call_one().get(timeout=60)
        buf = h.own.call_one("s", 4096, 200).get(timeout=60)
        assert do_read(buf, 200) == ""
        pm.stop().get(timeout=60)
        stopped = True
        start = time.monotonic()
        with pytest.raises(SupervisionError, match=re.escape(owner_id)):
            buf.read_into(sentinel(4096), timeout=30).get(timeout=45)
        with pytest.raises(SupervisionError, match=re.escape(owner_id)):
            buf.write_from(sentinel(4096), timeout=30).get(timeout=45)
        assert time.monotonic() - start < 10
    finally:
        if not stopped:
            pm.stop().get(timeout=60)
