"""Same-host all-reduces through a shared segment (``monarch._src.tensor_engine.worker.shm``):
the barrier and the group in this process (threads as ranks), then on a mesh of
procs of this host."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from monarch import Stream, inspect, remote
from monarch._src.tensor_engine.worker import shm
from monarch.actor import ProcMesh

#: Elements of a float32 tensor that fills two and a half slots (three pieces).
PIECES_NUMEL = shm.SLOT_BYTES * 5 // 2 // 4 + 3


def _inputs(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input: floats with roundings that depend on the order of a sum
    (and near 1, for products), integers of many bits (and small ones, for products)."""
    i = torch.arange(numel, dtype=torch.float64)
    if dtype.is_floating_point:
        return (1 + 0.3 * torch.sin(i * (rank + 1) + rank)).to(dtype)
    if dtype == torch.bool:
        return (i.long() * (rank + 1)) % 3 == 0
    bits = torch.iinfo(dtype).bits
    top = 1 << min(bits - 2, 20)
    return ((i.long() * 2654435761 + 97 * rank) % top - top // 2 * dtype.is_signed).to(dtype)


def _fold(xs: list[torch.Tensor], reduction: str) -> torch.Tensor:
    """What the all-reduce must give: rank 0's input combined with rank 1's, then
    rank 2's ... (the order that decides the bits of a floating-point sum)."""
    acc = xs[0].clone()
    for x in xs[1:]:
        shm.REDUCTIONS[reduction](acc, x)
    if reduction == "avg":
        acc.div_(len(xs))
    return acc


# --- the barrier ------------------------------------------------------------------------------


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    socks = []
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(f"\0monarch-shm-test-{os.getpid()}-{id(s)}")
        socks.append(s)
    yield socks
    for s in socks:
        s.close()


def _barriers(socks: list[socket.socket]) -> list[shm.Barrier]:
    names = [s.getsockname() for s in socks]
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    ranks = [10 + i for i in range(len(socks))]
    return [shm.Barrier(s, i, names, ranks) for i, s in enumerate(socks)]


def test_a_barrier_keeps_a_peer_word_of_the_next_number(sockets: list[socket.socket]) -> None:
    b0, b1, b2 = _barriers(sockets)
    # Members 1 and 2 are already through barrier 1 and in barrier 2 before member 0
    # looks; an old word (barrier 0) is dropped.
    for b in (b1, b2):
        b.sock.sendto(shm._WORD.pack(b.me, 0), b0.names[0])
        b.sock.sendto(shm._WORD.pack(b.me, 1), b0.names[0])
        b.sock.sendto(shm._WORD.pack(b.me, 2), b0.names[0])
    b0.wait(1, timeout=5)
    assert b0.early.keys() <= {2}
    b0.wait(2, timeout=5)  # heard already (kept, or still queued)
    assert b0.early == {}
    b0.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        b0.sock.recv(64)  # every word was taken


def test_barriers_of_threads_pass_in_step(sockets: list[socket.socket]) -> None:
    barriers = _barriers(sockets)
    passed = [0, 0, 0]
    errors: list[BaseException] = []

    def member(i: int) -> None:
        try:
            for seq in range(1, 201):
                barriers[i].wait(seq, timeout=10)
                # Nobody passes barrier ``seq`` before every member reached it.
                assert min(passed) >= seq - 1
                passed[i] = seq
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and passed == [200, 200, 200]


def test_a_barrier_names_the_silent_members_after_its_timeout(
    sockets: list[socket.socket],
) -> None:
    b0, b1, _ = _barriers(sockets)
    b1.sock.sendto(shm._WORD.pack(1, 1), b0.names[0])
    start = time.monotonic()
    with pytest.raises(shm.CollectiveTimeout, match=r"from ranks \[12\] within 0.3 s") as info:
        b0.wait(1, timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 3
    assert info.value.missing == [12]


def test_a_barrier_names_a_member_whose_socket_is_gone(sockets: list[socket.socket]) -> None:
    b0, _, _ = _barriers(sockets)
    sockets[2].close()
    with pytest.raises(ConnectionError, match="rank 12 is gone"):
        b0.wait(1, timeout=5)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open on this system")
def test_a_barrier_names_a_member_whose_process_exits_while_it_waits(
    sockets: list[socket.socket],
) -> None:
    import subprocess
    import sys

    # Member 2's socket still takes datagrams (it is ours), but its process (a child
    # standing for it) dies: the wait ends at once, not after its timeout.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        names = [
            n.decode() if isinstance(n, bytes) else n for n in (s.getsockname() for s in sockets)
        ]
        pids = [os.getpid(), os.getpid(), child.pid]
        b0 = shm.Barrier(sockets[0], 0, names, [10, 11, 12], pids)
        sockets[1].sendto(shm._WORD.pack(1, 1), names[0])  # member 1 came
        child.kill()
        start = time.monotonic()
        with pytest.raises(
            ConnectionError, match=rf"rank 12 is gone \(its process, pid {child.pid}"
        ):
            b0.wait(1, timeout=60)
        assert time.monotonic() - start < 30
        b0.close()
        assert b0.pidfds == [None, None, None]
    finally:
        child.kill()
        child.wait(timeout=30)


# --- the group, with threads as ranks ----------------------------------------------------------


class _Store:
    """The engine's store, in this process: ``get`` waits for the key."""

    def __init__(self, drop: str | None = None) -> None:
        self.kv: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.drop = drop  # a key whose value reads empty (a member without the path)

    def set(self, key: str, value: bytes) -> None:
        with self.changed:
            self.kv[key] = b"" if key == self.drop else value
            self.changed.notify_all()

    def get(self, key: str) -> bytes:
        with self.changed:
            assert self.changed.wait_for(lambda: key in self.kv, 30), key
            return self.kv[key]


def _on_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return out


def _setup(n: int, store: _Store | None = None) -> list[shm.Group | None]:
    store = store or _Store()
    members = [3 * i + 1 for i in range(n)]  # ranks need not be 0 .. n-1
    return _on_threads(n, lambda i: shm.Group.setup(store, members, members[i], 10.0))


def _memfds() -> int:
    return sum("monarch-shm" in os.readlink(f"/proc/self/fd/{fd}") for fd in _fds())


def _fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
            found.append(fd)
        except OSError:
            pass  # the directory's own fd, gone
    return found


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_group_of_threads_reduces_like_a_fold(n: int) -> None:
    groups = _setup(n)
    try:
        cases = [
            ("sum", torch.float32, 0),
            ("sum", torch.float32, 1),
            ("sum", torch.float32, 1001),
            ("sum", torch.float64, PIECES_NUMEL),
            ("avg", torch.float32, PIECES_NUMEL),
            ("avg", torch.bfloat16, 999),
            ("product", torch.float64, 7),
            ("product", torch.int32, 1003),
            ("min", torch.float32, 1001),
            ("max", torch.int16, 3),
            ("band", torch.int64, 1001),
            ("bor", torch.uint8, shm.SLOT_BYTES + 1),
            ("bxor", torch.int64, PIECES_NUMEL),
            ("max", torch.bool, 11),
        ]
        for reduction, dtype, numel in cases:
            xs = [_inputs(i, numel, dtype) for i in range(n)]
            expected = _fold(xs, reduction)
            outs = [torch.empty_like(x) for x in xs]
            ins = [x.clone() for x in xs]

            def run(
                i: int,
                reduction: str = reduction,
                xs: list[torch.Tensor] = xs,
                outs: list[torch.Tensor] = outs,
                ins: list[torch.Tensor] = ins,
            ) -> None:
                g = groups[i]
                assert g is not None
                g.allreduce(xs[i], outs[i], reduction, 10.0)  # out of place
                g.allreduce(ins[i], ins[i], reduction, 10.0)  # in place

            _on_threads(n, run)
            for i in range(n):
                assert torch.equal(outs[i], expected), (reduction, dtype, numel, i)
                assert torch.equal(ins[i], expected), (reduction, dtype, numel, i)
    finally:
        for g in groups:
            if g is not None:
                g.close()


def test_a_group_refuses_a_reduction_its_dtype_lacks_before_any_barrier() -> None:
    groups = _setup(2)
    try:
        for g in groups:
            assert g is not None
            with pytest.raises(TypeError, match=r"'bxor' does not apply to torch\.float32"):
                g.allreduce(torch.ones(3), torch.ones(3), "bxor", 0.1)
            assert g.broken is None and g.seq == 0  # still usable
    finally:
        for g in groups:
            if g is not None:
                g.close()


def test_a_group_without_one_member_takes_gloo_everywhere_and_leaks_nothing() -> None:
    before = len(_fds())
    # The member of index 1 could not make its segment: nobody takes the shared path.
    assert _setup(3, _Store(drop="info/1")) == [None, None, None]
    assert len(_fds()) == before


def test_a_closed_group_leaves_no_fd_nor_mapping_and_refuses_work() -> None:
    before = len(_fds())
    groups = _setup(3)
    assert _memfds() == 3 + 9  # each segment, and each mapping (Python's mmap has a dup)
    with open("/proc/self/maps") as f:
        assert f.read().count("monarch-shm") >= 9  # three segments, each mapped thrice
    for g in groups:
        assert g is not None
        g.close()
        g.close()  # closing twice is harmless
    assert len(_fds()) == before and _memfds() == 0
    with open("/proc/self/maps") as f:
        assert "monarch-shm" not in f.read()
    assert groups[0] is not None
    with pytest.raises(RuntimeError, match="out of step"):
        groups[0].allreduce(torch.ones(2), torch.ones(2), "sum", 1.0)


def test_a_failed_all_reduce_breaks_the_group_on_that_rank() -> None:
    groups = _setup(2)
    try:
        g = groups[0]
        assert g is not None
        with pytest.raises(shm.CollectiveTimeout, match=r"ranks \[4\]"):
            g.allreduce(torch.ones(2), torch.ones(2), "sum", 0.2)  # rank 4 never comes
        with pytest.raises(RuntimeError, match="earlier all-reduce of this group failed"):
            g.allreduce(torch.ones(2), torch.ones(2), "sum", 0.2)
    finally:
        for g in groups:
            if g is not None:
                g.close()


# --- on a mesh ----------------------------------------------------------------------------------

_CASES = [
    ("sum", torch.float32),
    ("sum", torch.int64),
    ("avg", torch.float64),
    ("product", torch.float64),
    ("product", torch.int32),
    ("min", torch.float32),
    ("max", torch.int16),
    ("band", torch.int64),
    ("bor", torch.uint8),
    ("bxor", torch.int32),
]


@pytest.mark.parametrize("numel", [1, 1001, PIECES_NUMEL])
def test_every_reduction_gives_the_fold_bit_for_bit_on_every_rank(
    mesh: ProcMesh, numel: int
) -> None:
    @remote(propagate=lambda r, numel, dtype: torch.empty(numel, dtype=dtype))
    def make(r: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        i = torch.arange(numel, dtype=torch.float64)
        rank = int(r)
        if dtype.is_floating_point:
            return (1 + 0.3 * torch.sin(i * (rank + 1) + rank)).to(dtype)
        bits = torch.iinfo(dtype).bits
        top = 1 << min(bits - 2, 20)
        return ((i.long() * 2654435761 + 97 * rank) % top - top // 2 * dtype.is_signed).to(dtype)

    results: dict[tuple[str, torch.dtype], tuple[Any, Any, Any]] = {}
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        for reduction, dtype in _CASES:
            x = make(r, numel, dtype)
            y = x.clone()
            y.reduce_(("hosts", "gpus"), reduction)  # in place, all four
            pairs = x.reduce("gpus", reduction)  # out of place, two by two
            results[(reduction, dtype)] = (x.reduce(("hosts", "gpus"), reduction), y, pairs)
    for (reduction, dtype), (out, y, pairs) in results.items():
        xs = [_inputs(rank, numel, dtype) for rank in range(4)]
        every, rows = _fold(xs, reduction), [_fold(xs[:2], reduction), _fold(xs[2:], reduction)]
        for h in range(2):
            for g in range(2):
                case = (reduction, dtype, numel, h, g)
                assert torch.equal(inspect(out, hosts=h, gpus=g), every), case
                assert torch.equal(inspect(y, hosts=h, gpus=g), every), case
                assert torch.equal(inspect(pairs, hosts=h, gpus=g), rows[h]), case


def test_all_reduces_on_two_streams_at_once_keep_apart(mesh: ProcMesh) -> None:
    side = Stream("side")
    n = PIECES_NUMEL  # several pieces each, so that the two streams' pieces overlap
    outs: list[tuple[int, Any, Any]] = []
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        with side.activate():
            rs = mesh.rank_tensor(("hosts", "gpus"))
        for k in range(6):
            a = (torch.ones(n) * (r + 1) + k).reduce(("hosts", "gpus"), "sum")
            with side.activate():
                b = (torch.ones(n) * (rs + 1) * 100 + k).reduce(("hosts", "gpus"), "max")
            outs.append((k, a, b))

    @remote(propagate=lambda: torch.zeros(()))
    def groups_used() -> torch.Tensor:
        from monarch._src.tensor_engine.worker.actor import this_worker

        w = this_worker()
        assert w is not None
        return torch.tensor(float(sum(w.collectives.shm_groups.values())))

    for k, a, b in outs:
        for g in range(2):
            assert bool((inspect(a, hosts=1, gpus=g) == 10 + 4 * k).all()), k
            assert bool((inspect(b, hosts=0, gpus=g) == 400 + k).all()), k
    with mesh.activate():
        used = groups_used()
    assert inspect(used, hosts=0, gpus=0).item() >= 2  # one group per stream


def test_the_workers_keep_no_file_of_it_in_dev_shm_or_tmp(mesh: ProcMesh) -> None:
    # The segments are memfds (no name in any file system): every descriptor and mapping
    # of one must be a memfd, and there must be some (the shared path was taken).
    @remote(propagate=lambda: torch.zeros(2))
    def segments_as_memfds_and_as_files() -> torch.Tensor:
        import os as _os

        targets = []
        for fd in _os.listdir("/proc/self/fd"):
            try:
                targets.append(_os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        with open("/proc/self/maps") as f:
            targets += [line.split(maxsplit=5)[-1].strip() for line in f]
        ours = [t for t in targets if "monarch-shm" in t]
        memfds = sum(t.startswith("/memfd:") for t in ours)
        return torch.tensor([float(memfds), float(len(ours) - memfds)])

    with mesh.activate():
        x = torch.ones(1000).reduce(("hosts", "gpus"), "sum")
        found = segments_as_memfds_and_as_files()
    assert inspect(x, hosts=0, gpus=0)[0].item() == 4.0
    for h in range(2):
        for g in range(2):
            memfds, files = inspect(found, hosts=h, gpus=g).tolist()
            assert memfds > 0 and files == 0.0
    names = os.listdir("/dev/shm") + os.listdir("/tmp")
    assert not [name for name in names if "monarch-shm" in name]


# A member that stalls past the timeout, at set-up and at a barrier:
# test_tensors.py::test_a_collective_with_a_missing_rank_fails_within_the_timeout.
