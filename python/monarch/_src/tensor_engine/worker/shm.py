"""All-reduce among the tensor workers of one host, through a shared segment.

Within one host, gloo moves every byte through loopback TCP (two kernel copies per
transfer, and a few wake-ups per message). Here the members of a group share memory
and wake each other directly; nothing goes through the engine's controller once the
group is set up.

Set-up (once per group and stream: :meth:`Group.setup`)
    Every rank makes a ``memfd`` segment (a header with a random token, then two
    staging slots of :data:`SLOT_BYTES`), reserves its memory with
    ``posix_fallocate`` (memory that runs short fails here, with ENOSPC, rather than
    as a SIGBUS at some later write), and binds a Unix datagram socket in the abstract
    namespace (``"\\0monarch-shm-<random>-<rank>"``: no file to remove). It publishes
    ``(pid, fd, token, socket name)`` in the engine's store. Each rank then maps every
    peer's segment through ``/proc/<pid>/fd/<fd>``, checks the token there (which
    proves that the peer is on this host and in reach), and greets every peer on its
    socket. A second round of the store says whether all of that worked for everyone,
    so all members decide alike: the shared path, or gloo for this group. Neither the
    memfd nor the abstract socket has a name in any file system, so nothing is left
    behind, even by a killed process.

An all-reduce (:meth:`Group.allreduce`), piece by piece (a piece fills one slot):
    1. every rank copies its piece of the input into its slot of this piece's parity;
    2. barrier;
    3. rank ``i`` reduces chunk ``i`` of the piece over the ``n`` slots, in the fixed
       order of ranks ``0 .. n-1``, into chunk ``i`` of its own slot (so each chunk is
       computed by one rank, the same way on every run, and every rank gets the same
       bits);
    4. barrier;
    5. every rank copies chunk ``j`` of rank ``j``'s slot, for every ``j``, into its
       result.

    A piece of at most :data:`SMALL_BYTES` skips steps 4 and 5: after the barrier,
    every rank reduces the whole piece over the ``n`` slots, in the same fixed order,
    straight into its result. Every rank then runs the same element-wise operations on
    the same bytes, so it gets the same bits; the piece costs one barrier, not two
    (a barrier, a few wake-ups of every process, costs more than reducing a small
    piece ``n`` times).

    A barrier sends one datagram with the barrier's sequence number to every peer,
    then receives until it heard every peer's datagram of that number (see
    :class:`Barrier`). Copies are single ``memmove`` calls; torch's reductions work on
    at most :data:`_SPAN` elements at a time. Both keep the work off torch's OpenMP
    threads (see :data:`_SPAN` why).

Why two slots, alternating, make a third barrier needless
    Pieces alternate between the two slots of every rank (parity ``k % 2``, counted
    over all the group's pieces, across calls). A rank reads slots of piece ``k`` only
    between its first barrier of piece ``k`` and its first barrier of piece ``k + 1``.
    Rank ``r`` writes its slot of parity ``p`` again for piece ``k + 2``, in step 1,
    after it left the (first) barrier of piece ``k + 1``. Leaving that barrier means
    that every peer *entered* it, so every peer is done reading piece ``k``'s slots.
    Within a piece, step 3 writes only chunk ``i`` of rank ``i``'s slot, which no other
    rank reads before barrier 4 (in step 3 they read the other chunks); step 1 of the
    next piece writes the other parity. So no read of a slot overlaps a write of it.
    Since a rank enters a barrier only after leaving the one before, a peer's datagram
    may be at most one barrier ahead of ours (it is kept until we get there).

    ``result`` may be the input itself (in place): step 1 of a piece reads the input's
    piece before step 5 (or the small piece's reduction) writes it, and no peer reads
    it.

Failures
    Every wait (a barrier, a send to a full socket) is bounded by the collective's
    timeout; a barrier that times out raises :class:`CollectiveTimeout` with the ranks
    it did not hear from, and a peer whose socket is gone (a dead process) is named at
    once. A barrier also watches each peer's process (a ``pidfd``, readable when the
    process exits), so a peer that dies while the others wait for it is named at once
    too. A member that died therefore never makes the others hang. After a failure
    the group's slots and sequence numbers are out of step among its members, so the
    group is *broken* on that rank: its later all-reduces raise at once rather than
    exchange wrong data. A reduction a dtype does not have (``bxor`` of floats) is
    refused before any barrier, by every rank alike.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch

__all__ = [
    "REDUCTIONS",
    "SLOT_BYTES",
    "SMALL_BYTES",
    "Barrier",
    "CollectiveTimeout",
    "Group",
    "Prefixed",
    "check_reduction",
]

#: Bytes of one staging slot (each rank has two): the size of a piece. Larger tensors
#: go in several pieces; bigger slots mean fewer barriers but more memory per group.
SLOT_BYTES = 2 << 20

#: Pieces of at most this many bytes are reduced whole by every rank (one barrier
#: per piece instead of two; see the module docs).
SMALL_BYTES = 256 << 10

#: Elements per tensor operation. Torch runs an element-wise operation on more than
#: 32768 elements on its OpenMP threads, which then spin a while after it, waiting for
#: more work: with several workers on few cores, they take the cores from the peers
#: that this rank waits for at the next barrier (a 1 MiB all-reduce took 200 ms so).
#: Smaller operations run on the calling thread alone.
_SPAN = 16384

#: The header before the slots: the token that proves a mapping is the right one.
_HEADER = 4096
_TOKEN_BYTES = 16

#: A barrier's datagram: (the sender's index in the group, the barrier's number).
_WORD = struct.Struct("<iq")

#: How each reduction combines a peer's chunk into ours (``avg`` divides at the end).
REDUCTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "sum": lambda acc, x: acc.add_(x),
    "avg": lambda acc, x: acc.add_(x),
    "product": lambda acc, x: acc.mul_(x),
    "min": lambda acc, x: torch.minimum(acc, x, out=acc),
    "max": lambda acc, x: torch.maximum(acc, x, out=acc),
    "band": lambda acc, x: acc.bitwise_and_(x),
    "bor": lambda acc, x: acc.bitwise_or_(x),
    "bxor": lambda acc, x: acc.bitwise_xor_(x),
}

#: The same, as ``out = a (op) b`` (the first step of a reduction, see ``_reduce_span``).
_BINARY: dict[str, Callable[..., Any]] = {
    "sum": torch.add,
    "avg": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


class CollectiveTimeout(TimeoutError):
    """A barrier did not hear from every peer in time (``missing``: their ranks)."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


class Prefixed:
    """A store's keys under ``prefix`` (plain Python: torch's own prefix store cannot
    delete keys of a store written in Python)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self.prefix + key, value)

    def get(self, key: str) -> bytes:
        return self.store.get(self.prefix + key)  # type: ignore[no-any-return]

    def delete_key(self, key: str) -> bool:
        return bool(self.store.delete_key(self.prefix + key))


_checked: dict[tuple[str, torch.dtype], str | None] = {}


def check_reduction(reduction: str, dtype: torch.dtype) -> None:
    """Raise (``TypeError``) where ``reduction`` has no meaning for ``dtype``: checked
    before any barrier, on a tiny tensor, since a rank that failed mid-way would leave
    its peers waiting for it."""
    key = (reduction, dtype)
    if key not in _checked:
        a, b = torch.zeros(1, dtype=dtype), torch.zeros(1, dtype=dtype)
        try:
            _BINARY[reduction](a, b, out=a)
            REDUCTIONS[reduction](a, b)
            if reduction == "avg":
                a.div_(2)
            _checked[key] = None
        except Exception as e:
            _checked[key] = f"the reduction {reduction!r} does not apply to {dtype}: {e}"
    problem = _checked[key]
    if problem is not None:
        raise TypeError(problem)


def _bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """``n`` consecutive chunks of ``numel`` elements, the first ones one longer."""
    step, extra = divmod(numel, n)
    out = []
    start = 0
    for i in range(n):
        end = start + step + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def _spans(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` in ranges of at most :data:`_SPAN` elements."""
    return [(a, min(a + _SPAN, hi)) for a in range(lo, hi, _SPAN)]


def _memcpy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for contiguous tensors of one dtype and size, as one
    ``memmove`` on this thread (a torch copy of more than :data:`_SPAN` elements
    would wake its OpenMP threads; one of fewer costs more than the copy itself)."""
    if src.numel():
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())


def _slot(mapped: mmap.mmap, parity: int) -> torch.Tensor:
    """A segment's slot of ``parity``, as bytes."""
    offset = _HEADER + parity * SLOT_BYTES
    return torch.frombuffer(mapped, dtype=torch.uint8, offset=offset, count=SLOT_BYTES)


def _socket_name(tag: str, index: int) -> str:
    return f"\0monarch-shm-{tag}-{index}"


class Barrier:
    """Datagram barriers among ``n`` members: member ``me`` owns ``sock`` (bound to
    ``names[me]``) and reaches member ``i`` at ``names[i]``; ``ranks`` name them in
    errors.

    Barriers are numbered; a peer may already be in the next one (it left this one as
    soon as it heard from everyone), so what arrives early is kept by number.

    With ``pids`` (each member's process id), a wait watches the peers' processes and
    raises ``ConnectionError`` as soon as one it waits for has exited."""

    def __init__(
        self,
        sock: socket.socket,
        me: int,
        names: list[str],
        ranks: list[int],
        pids: list[int] | None = None,
    ) -> None:
        self.sock = sock
        self.me = me
        self.names = names
        self.ranks = ranks
        #: Barrier number -> the members heard from for it, ahead of time.
        self.early: dict[int, set[int]] = {}
        #: Each peer's pid and pidfd (``None``: not watched).
        self.pids = pids
        self.pidfds: list[int | None] = [None] * len(names)
        if pids is not None:
            for i, pid in enumerate(pids):
                if i != me:
                    self.pidfds[i] = _pidfd(pid)

    def close(self) -> None:
        """Close the pidfds (idempotent; the socket is the owner's to close)."""
        fds, self.pidfds = self.pidfds, [None] * len(self.names)
        for fd in fds:
            if fd is not None:
                os.close(fd)

    def _gone(self, waiting: set[int], left: float) -> bool:
        """Wait up to ``left`` seconds until a datagram arrives (True) or a peer of
        ``waiting`` exits (raise ``ConnectionError``); False when neither happened."""
        watch = {fd: i for i in waiting if (fd := self.pidfds[i]) is not None}
        sock = self.sock.fileno()
        readable, _, _ = select.select([sock, *watch], [], [], left)
        if sock in readable:
            return True
        for fd in readable:
            if fd in watch:
                i = watch[fd]
                pid = self.pids[i] if self.pids is not None else "?"
                raise ConnectionError(
                    f"rank {self.ranks[i]} is gone (its process, pid {pid}, exited)"
                )
        return False

    def wait(self, seq: int, timeout: float) -> None:
        """Tell every peer that this member reached barrier ``seq``, and return once
        every peer said the same (raise :class:`CollectiveTimeout` after ``timeout``
        seconds, or ``ConnectionError`` where a peer's socket is gone)."""
        deadline = time.monotonic() + timeout
        word = _WORD.pack(self.me, seq)
        for i, name in enumerate(self.names):
            if i != self.me:
                self._send(word, i, name, deadline, timeout)
        waiting = set(range(len(self.names))) - {self.me} - self.early.pop(seq, set())
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out(waiting, timeout)
            if any(self.pidfds[i] is not None for i in waiting) and not self._gone(waiting, left):
                continue
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(64)
            except TimeoutError:
                self._timed_out(waiting, timeout)
            if len(data) != _WORD.size:
                continue  # not one of ours
            sender, number = _WORD.unpack(data)
            if number == seq:
                waiting.discard(sender)
            elif number > seq:
                self.early.setdefault(number, set()).add(sender)
            # Older numbers: left over from a barrier that failed; dropped.

    def _send(self, word: bytes, i: int, name: str, deadline: float, timeout: float) -> None:
        # A datagram waits only if the peer's queue is full; bounded all the same.
        self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        try:
            self.sock.sendto(word, name)
        except TimeoutError:
            self._timed_out({i}, timeout)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise ConnectionError(
                f"rank {self.ranks[i]} is gone (its socket refuses datagrams: {e})"
            ) from e

    def _timed_out(self, waiting: set[int], timeout: float) -> NoReturn:
        missing = sorted(self.ranks[i] for i in waiting)
        raise CollectiveTimeout(
            f"the shared-memory all-reduce heard nothing from ranks {missing} within {timeout} s",
            missing,
        )


class _Segment:
    """A memfd of ``size`` bytes, its memory reserved, mapped here, with a random
    token in its header."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("monarch-shm", os.MFD_CLOEXEC)
        try:
            os.posix_fallocate(self.fd, 0, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.map[:_TOKEN_BYTES] = self.token

    def close(self) -> None:
        """Unmap it and close the memfd, once (the number may be another file's
        later)."""
        if self.fd < 0:
            return
        _unmap(self.map)
        os.close(self.fd)
        self.fd = -1


def _open_peer(pid: int, fd: int, size: int, token: bytes) -> mmap.mmap:
    """A peer's segment, mapped here (``ValueError`` where it is not the one
    published: another host's pid, say)."""
    peer_fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        if os.fstat(peer_fd).st_size != size:
            raise ValueError("the peer's segment has another size")
        mapped = mmap.mmap(peer_fd, size)
    finally:
        os.close(peer_fd)  # the mapping keeps the memory
    if mapped[:_TOKEN_BYTES] != token:
        mapped.close()
        raise ValueError("the peer's segment has another token")
    return mapped


class Group:
    """The shared path of one group of ``n`` members on this host: this rank's index
    ``me``, every member's segment mapped here, and the datagram barrier."""

    def __init__(
        self,
        members: list[int],
        me: int,
        own: _Segment,
        maps: list[mmap.mmap],
        barrier: Barrier,
    ) -> None:
        self.members = members
        self.n = len(members)
        self.me = me
        self.own = own
        self.maps = maps
        self.barrier = barrier
        #: Barriers and pieces done so far (a piece's parity picks its slots).
        self.seq = 0
        self.pieces = 0
        #: Why the group stopped, if it did (see the module docs: "Failures").
        self.broken: str | None = None
        #: Every member's two slots, as bytes.
        self.slots: list[list[torch.Tensor]] = [[_slot(m, 0), _slot(m, 1)] for m in maps]
        #: A span's worth of scratch (this rank's own input, see ``_reduce_span``).
        self.scratch = torch.empty(_SPAN * 16, dtype=torch.uint8)

    # --- set-up ---------------------------------------------------------------------------

    @classmethod
    def setup(cls, store: Any, members: list[int], rank: int, timeout: float) -> Group | None:
        """The group's shared path, or ``None`` where it cannot be had (then every
        member gets ``None``: the group uses gloo). The store's waits raise where a
        member does not come in time; then this rank publishes no verdict, so no
        member can decide for the shared path either."""
        n = len(members)
        me = members.index(rank)
        size = _HEADER + 2 * SLOT_BYTES
        own, sock, info = _make_own(size, me)
        maps: list[mmap.mmap] | None = None
        barrier: Barrier | None = None
        try:
            store.set(f"info/{me}", info)
            infos = [store.get(f"info/{i}") for i in range(n)]
            if not all(infos):
                raise _NoSharedPath()  # every member sees the same: no verdict needed
            assert own is not None and sock is not None
            peers = [json.loads(x) for x in infos]
            names = [_socket_name(p["tag"], i) for i, p in enumerate(peers)]
            barrier = Barrier(sock, me, names, members, [p["pid"] for p in peers])
            maps = _map_peers(peers, me, own, size)
            # Greet even where the maps failed, so that no peer waits for us in vain.
            greeted = _greet(barrier, timeout)
            store.set(f"ok/{me}", b"1" if maps is not None and greeted else b"0")
            if maps is None or not all(store.get(f"ok/{i}") == b"1" for i in range(n)):
                raise _NoSharedPath()
            return cls(members, me, own, maps, barrier)
        except BaseException as e:
            if barrier is not None:
                barrier.close()
            _close_all(own, sock, maps or [])
            if isinstance(e, _NoSharedPath):
                return None
            raise

    # --- the all-reduce -------------------------------------------------------------------

    def allreduce(
        self, src: torch.Tensor, result: torch.Tensor, reduction: str, timeout: float
    ) -> None:
        """``result`` (1-D, contiguous, the size of ``src``, possibly ``src`` itself) =
        ``reduction`` of every member's ``src``."""
        if self.broken is not None:
            raise RuntimeError(
                f"an earlier all-reduce of this group failed on this rank ({self.broken}); "
                "its shared memory is out of step with the other members"
            )
        check_reduction(reduction, src.dtype)
        # Copies are raw memory moves (``_memcpy``): the shapes must be what they say.
        if not (src.is_contiguous() and result.is_contiguous()) or (
            src.dtype != result.dtype or src.shape != result.shape or src.dim() != 1
        ):
            raise ValueError("allreduce takes contiguous 1-D tensors of one dtype and size")
        per_piece = SLOT_BYTES // src.element_size()
        try:
            for lo in range(0, src.numel(), per_piece):
                hi = min(lo + per_piece, src.numel())
                self._piece(src[lo:hi], result[lo:hi], reduction, timeout)
        except BaseException as e:
            self.broken = str(e) or type(e).__name__
            raise

    def _piece(self, src: torch.Tensor, out: torch.Tensor, reduction: str, timeout: float) -> None:
        parity = self.pieces % 2
        self.pieces += 1
        numel, dtype = src.numel(), src.dtype
        slots = [s[parity][: numel * src.element_size()].view(dtype) for s in self.slots]
        _memcpy(slots[self.me], src)
        self._barrier(timeout)
        if numel * src.element_size() <= SMALL_BYTES:
            # Every rank reduces the whole piece (the same operations on the same
            # bytes: the same bits), which saves the second barrier.
            for a, b in _spans(0, numel):
                self._fold_span([s[a:b] for s in slots], out[a:b], reduction)
            return
        bounds = _bounds(numel, self.n)
        for a, b in _spans(*bounds[self.me]):
            self._reduce_span([s[a:b] for s in slots], reduction)
        self._barrier(timeout)
        for j, (lo, hi) in enumerate(bounds):
            _memcpy(out[lo:hi], slots[j][lo:hi])

    def _reduce_span(self, spans: list[torch.Tensor], reduction: str) -> None:
        """``spans[me]`` = ``spans[0] (op) spans[1] (op) ... (op) spans[n-1]``, in that
        order (floating-point sums depend on it), in place."""
        acc = spans[self.me]
        combine = REDUCTIONS[reduction]
        if self.me == 0:
            for x in spans[1:]:
                combine(acc, x)
        else:
            # ``acc`` is overwritten by the first step, but it is also the ``me``-th
            # operand: keep a copy of it.
            mine = self.scratch[: acc.numel() * acc.element_size()].view(acc.dtype)
            mine.copy_(acc)
            _BINARY[reduction](spans[0], spans[1] if self.me != 1 else mine, out=acc)
            for i in range(2, self.n):
                combine(acc, mine if i == self.me else spans[i])
        if reduction == "avg":
            acc.div_(self.n)

    def _fold_span(self, spans: list[torch.Tensor], out: torch.Tensor, reduction: str) -> None:
        """``out`` = ``spans[0] (op) spans[1] (op) ... (op) spans[n-1]``."""
        if self.n == 1:
            out.copy_(spans[0])
        else:
            _BINARY[reduction](spans[0], spans[1], out=out)
            combine = REDUCTIONS[reduction]
            for x in spans[2:]:
                combine(out, x)
        if reduction == "avg":
            out.div_(self.n)

    def _barrier(self, timeout: float) -> None:
        self.seq += 1
        self.barrier.wait(self.seq, timeout)

    # --- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the segments and close the socket and the memfd (idempotent)."""
        self.slots = []
        self.scratch = torch.empty(0, dtype=torch.uint8)
        self.broken = self.broken or "the group was closed"
        self.barrier.close()
        _close_all(self.own, self.barrier.sock, self.maps)
        self.maps = []


def _pidfd(pid: int) -> int | None:
    """A pidfd of process ``pid`` (readable once it exits), or ``None`` where the
    system has none (not Linux, or a kernel before 5.3) or the process is gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:
        return None


class _NoSharedPath(Exception):
    """Some member cannot take the shared path: the group uses gloo."""


def _make_own(size: int, me: int) -> tuple[_Segment | None, socket.socket | None, bytes]:
    """This rank's segment and socket, and what it publishes of them (``b""``: it
    cannot have them)."""
    own: _Segment | None = None
    sock: socket.socket | None = None
    try:
        own = _Segment(size)
        tag = secrets.token_hex(8)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.bind(_socket_name(tag, me))
        info = {"pid": os.getpid(), "fd": own.fd, "token": own.token.hex(), "tag": tag}
        return own, sock, json.dumps(info).encode()
    except (OSError, AttributeError):  # AttributeError: no memfd (not Linux)
        _close_all(own, sock, [])
        return None, None, b""


def _map_peers(
    peers: list[dict[str, Any]], me: int, own: _Segment, size: int
) -> list[mmap.mmap] | None:
    """Every member's segment mapped here (``own``'s for ``me``), or ``None``."""
    maps: list[mmap.mmap] = []
    try:
        for i, p in enumerate(peers):
            if i == me:
                maps.append(own.map)
            else:
                maps.append(_open_peer(p["pid"], p["fd"], size, bytes.fromhex(p["token"])))
        return maps
    except (OSError, ValueError):
        for m in maps:
            if m is not own.map:
                m.close()
        return None


def _greet(barrier: Barrier, timeout: float) -> bool:
    """Barrier 0: whether every peer's socket is in reach (and ours in theirs)."""
    try:
        barrier.wait(0, timeout)
        return True
    except (OSError, CollectiveTimeout):
        return False


def _close_all(own: _Segment | None, sock: socket.socket | None, maps: list[mmap.mmap]) -> None:
    for m in maps:
        if own is None or m is not own.map:
            _unmap(m)
    if own is not None:
        own.close()
    if sock is not None:
        sock.close()


def _unmap(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:
        pass  # a tensor still views it: the mapping goes with the last one
