"""All-reduce among the tensor workers of one host over cross-memory reads.

Within one host, gloo moves every byte through loopback TCP (two kernel copies per
transfer). Here each rank reads its peers' memory directly (``monarch.rdma``'s
same-host path: ``process_vm_readv``, one copy, no thread of the owner involved):

1. every rank registers the ``n`` chunks of its input and its own chunk of the result,
   and publishes the handles in the engine's store (which also tells the peers that
   its input is ready);
2. reduce-scatter: rank ``i`` reads chunk ``i`` of every peer's input and combines it
   into chunk ``i`` of its result;
3. once every rank says its chunk is done, all-gather: each rank reads the other
   chunks of the result from their owners, straight into its result;
4. once every rank says it has read, the registrations are dropped.

Every chunk is reduced by one rank, so every rank ends with the same bits. It is used
for large CPU all-reduces whose members are all on this host
(:data:`MIN_BYTES`); the rest goes through gloo.
"""

from __future__ import annotations

from typing import Any

import torch

from monarch._src.actor.pickling import dumps, loads

__all__ = ["MIN_BYTES", "REDUCTIONS", "Prefixed", "allreduce", "same_host"]

#: All-reduces of CPU tensors of at least this many bytes go this way (when possible).
MIN_BYTES = 4 << 20

#: How each reduction combines a peer's chunk into ours (``avg`` divides at the end).
REDUCTIONS = {
    "sum": lambda acc, x: acc.add_(x),
    "avg": lambda acc, x: acc.add_(x),
    "product": lambda acc, x: acc.mul_(x),
    "min": lambda acc, x: torch.minimum(acc, x, out=acc),
    "max": lambda acc, x: torch.maximum(acc, x, out=acc),
    "band": lambda acc, x: acc.bitwise_and_(x),
    "bor": lambda acc, x: acc.bitwise_or_(x),
    "bxor": lambda acc, x: acc.bitwise_xor_(x),
}


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


def same_host(store: Any, members: list[int], rank: int) -> bool:
    """Whether every member runs on this host and can register memory: each member
    publishes its host key (or that it cannot), so all of them decide the same."""
    try:
        from monarch._src.rdma.buffer import RDMABuffer, _host_key

        probe = RDMABuffer(torch.zeros(8, dtype=torch.uint8))
        probe.drop().get(timeout=10)
        mine = _host_key()
    except Exception:
        mine = ""
    store.set(f"host/{rank}", mine.encode())
    keys = [store.get(f"host/{m}") for m in members]
    return bool(mine) and all(k == mine.encode() for k in keys)


def _bounds(numel: int, n: int) -> list[tuple[int, int]]:
    step, extra = divmod(numel, n)
    out = []
    start = 0
    for i in range(n):
        end = start + step + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def allreduce(
    store: Any,
    count: int,
    members: list[int],
    rank: int,
    src: torch.Tensor,
    result: torch.Tensor,
    reduction: str,
    timeout: float,
) -> None:
    """``result`` (1-D, contiguous, the size of ``src``) = ``reduction`` of every
    member's ``src``. ``count`` numbers this group's collectives (keys of the store).

    ``result`` may be ``src`` itself (in place): peers read chunk ``i`` of this rank's
    input only before the reduce-scatter barrier, and this rank writes chunk ``i`` of it
    only after it (its own chunk, which peers never read as input, excepted)."""
    from monarch._src.rdma.buffer import RDMABuffer

    n = len(members)
    me = members.index(rank)
    bounds = _bounds(src.numel(), n)
    prefix = f"{count}/"
    mine_lo, mine_hi = bounds[me]
    registered = [RDMABuffer(src[lo:hi]) if hi > lo else None for lo, hi in bounds]
    own = RDMABuffer(result[mine_lo:mine_hi]) if mine_hi > mine_lo else None
    try:
        store.set(f"{prefix}reg/{me}", dumps((registered, own)))
        peers = {i: loads(store.get(f"{prefix}reg/{i}")) for i in range(n) if i != me}
        # Reduce-scatter: chunk ``me`` of every input, combined here.
        acc = result[mine_lo:mine_hi]
        if result.data_ptr() != src.data_ptr():
            acc.copy_(src[mine_lo:mine_hi])
        if mine_hi > mine_lo:
            combine: Any = REDUCTIONS[reduction]
            scratch = torch.empty(mine_hi - mine_lo, dtype=src.dtype)
            for their_chunks, _ in peers.values():
                their_chunks[me].read_into(scratch, timeout=timeout).get(timeout=timeout + 5)
                combine(acc, scratch)
            if reduction == "avg":
                acc.div_(n)
        store.set(f"{prefix}rs/{me}", b"1")
        for i in peers:
            store.get(f"{prefix}rs/{i}")
        # All-gather: the other chunks of the result, from their owners.
        for i, (_, theirs) in peers.items():
            lo, hi = bounds[i]
            if hi > lo:
                theirs.read_into(result[lo:hi], timeout=timeout).get(timeout=timeout + 5)
        store.set(f"{prefix}ag/{me}", b"1")
        for i in peers:
            store.get(f"{prefix}ag/{i}")
    finally:
        for buf in (*registered, own):
            if buf is not None:
                try:
                    buf.drop().get(timeout=10)
                except Exception:
                    pass  # the registration ends with the process anyway
    # Everyone is past this collective's keys but the last barrier's: free them.
    for stage in ("reg", "rs"):
        store.delete_key(f"{prefix}{stage}/{me}")
    if count > 1:
        store.delete_key(f"{count - 1}/ag/{me}")
