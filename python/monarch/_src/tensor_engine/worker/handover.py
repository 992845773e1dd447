"""The workers' side of a handover: tensors of a failed engine passed to a new one.

When a proc of a tensor engine's mesh dies, the engine refuses all work. Its tensors
still live in the tables of its workers on the surviving procs. A new engine, started on
a new root mesh made of those same procs and a replacement proc
(:mod:`monarch._src.tensor_engine.client.handover`), takes them over with these remote
functions, which its workers run:

- :func:`adopt`: a survivor's new worker takes the values of the old worker of the same
  process, by ref, without a copy (they are in the same process); a replacement's new
  worker allocates empty tensors of the same shapes instead;
- :func:`offer`: one survivor packs its values into one block of bytes and registers it
  as an ``RDMABuffer``;
- :func:`fill`: each replacement reads that block one-sided and copies it into its
  tensors;
- :func:`release`: the old workers' tables are emptied (the new engine owns the values).

:func:`mark` lets a client record, as the last command of a block of work, that the block
ran on a worker (a step's update, say); :func:`adopt` waits for the mark it is told to
expect, so that it never takes values the old worker has not finished updating.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from monarch._src.tensor_engine.wire import Failure, TensorMeta
from monarch._src.tensor_engine.worker.actor import worker_of

__all__ = ["adopt", "check", "drop_offer", "fill", "mark", "offer", "release"]

#: Marks recorded by :func:`mark`: (engine id, key) -> the last value.
_marks: dict[tuple[int, str], int] = {}
_marks_changed = threading.Condition()
#: Blocks offered by :func:`offer` (kept alive while registered), by offer id.
_offers: dict[int, tuple[torch.Tensor, Any]] = {}
_offer_ids = iter(range(1, 1 << 62))

#: Each tensor starts at a multiple of this many bytes in an offered block.
ALIGN = 64


def _rank() -> int:
    from monarch._src.actor.context import context

    return int(context().actor_instance.rank.rank)


def mark(engine_id: int, key: str, value: int) -> None:
    """Record that this worker of engine ``engine_id`` reached mark ``key`` = ``value``
    (run as a remote function, in order with the work before it)."""
    with _marks_changed:
        _marks[(engine_id, key)] = value
        _marks_changed.notify_all()


def _wait_mark(engine_id: int, key: str, expect: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout

    def reached() -> bool:
        got = _marks.get((engine_id, key))
        return got is not None and got >= expect

    with _marks_changed:
        while not reached():
            left = deadline - time.monotonic()
            if left <= 0 or not _marks_changed.wait(left):
                if reached():
                    break
                got = _marks.get((engine_id, key))
                raise TimeoutError(
                    f"rank {_rank()}: the tensor worker of the failed engine {engine_id} in "
                    f"this process did not reach {key} = {expect} within {timeout} s (it is "
                    f"at {got}): it is still busy with earlier work, so its tensors cannot "
                    "be handed over yet; raise the recovery timeout"
                )


def adopt(
    engine_id: int,
    refs: list[int],
    metas: list[TensorMeta],
    fill_ranks: list[int],
    key: str,
    expect: int | None,
    timeout: float,
) -> list[torch.Tensor]:
    """The values of ``refs`` in this process's worker of the failed engine
    ``engine_id`` (contiguous, else as they are: no copy), once it reached mark ``key``
    = ``expect`` (``None``: no wait); on the ranks ``fill_ranks`` (replacements, with no
    such worker), empty tensors of ``metas`` to :func:`fill` later."""
    if _rank() in fill_ranks:
        return [torch.empty(m.size, dtype=m.dtype, device=m.device) for m in metas]
    old = worker_of(engine_id)
    if old is None:
        raise RuntimeError(
            f"rank {_rank()}: this process has no tensor worker of the failed engine "
            f"{engine_id}, so it holds none of its tensors; a rank that is not a survivor "
            "of that engine must be among the ranks to fill"
        )
    if expect is not None:
        _wait_mark(engine_id, key, expect, timeout)
    out = []
    for ref, meta in zip(refs, metas, strict=True):
        value = old.values.get(ref)
        if value is None or isinstance(value, Failure) or not isinstance(value, torch.Tensor):
            why = value.error.strip() if isinstance(value, Failure) else repr(value)
            raise RuntimeError(
                f"rank {_rank()}: the failed engine {engine_id} holds no tensor for ref {ref} "
                f"here ({why}); only tensors whose work completed can be handed over"
            )
        if tuple(value.shape) != tuple(meta.size) or value.dtype != meta.dtype:
            raise RuntimeError(
                f"rank {_rank()}: the tensor of ref {ref} here is {tuple(value.shape)} "
                f"{value.dtype}, where the client expects {tuple(meta.size)} {meta.dtype}"
            )
        out.append(value.detach().contiguous())
    return out


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _layout(tensors: tuple[torch.Tensor, ...]) -> tuple[list[int], int]:
    offsets = []
    size = 0
    for t in tensors:
        offsets.append(size)
        size += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
    return offsets, max(size, 1)


def offer(*tensors: torch.Tensor) -> tuple[int, Any]:
    """Pack ``tensors`` (CPU) into one block and register it for one-sided reads:
    ``(offer id, RDMABuffer)``; the block stays registered until :func:`drop_offer`."""
    from monarch._src.rdma.buffer import RDMABuffer

    offsets, size = _layout(tensors)
    block = torch.empty(size, dtype=torch.uint8)
    for t, off in zip(tensors, offsets, strict=True):
        raw = _bytes_of(t.cpu().contiguous())
        block[off : off + raw.numel()].copy_(raw)
    buffer = RDMABuffer(block)
    oid = next(_offer_ids)
    _offers[oid] = (block, buffer)
    return oid, buffer


def drop_offer(oid: int) -> None:
    """Release the block of offer ``oid`` (a no-op where there is none)."""
    entry = _offers.pop(oid, None)
    if entry is not None:
        entry[1].drop().get(timeout=60)


def fill(
    buffer: Any, fill_ranks: list[int], timeout: float, *tensors: torch.Tensor
) -> list[torch.Tensor]:
    """On the ranks ``fill_ranks``: read ``buffer`` (an :func:`offer` of tensors of the
    same shapes) one-sided and copy it into ``tensors``; every rank returns
    ``tensors``."""
    if _rank() not in fill_ranks:
        return list(tensors)
    offsets, size = _layout(tensors)
    if buffer.size() < size:
        raise RuntimeError(
            f"rank {_rank()}: the offered block has {buffer.size()} bytes where the "
            f"tensors to fill need {size}"
        )
    block = torch.empty(buffer.size(), dtype=torch.uint8)
    buffer.read_into(block, timeout=timeout).get(timeout=timeout + 10)
    for t, off in zip(tensors, offsets, strict=True):
        raw = _bytes_of(t)
        raw.copy_(block[off : off + raw.numel()])
    return list(tensors)


def check(*tensors: torch.Tensor) -> torch.Tensor:
    """A scalar that exists once ``tensors`` do (fetch it to learn that they do)."""
    return torch.tensor(float(len(tensors)))


def release(engine_id: int) -> None:
    """Empty this process's worker of engine ``engine_id`` (its tensors were handed
    over), and forget its marks."""
    old = worker_of(engine_id)
    if old is not None:
        old.values.clear()
    with _marks_changed:
        for k in [k for k in _marks if k[0] == engine_id]:
            del _marks[k]
