"""A replica's state as one block of bytes plus a skeleton, for one-sided copies.

:func:`pack` walks a state dict (nested dicts, lists and tuples of tensors and plain
values, as ``module.state_dict()`` and ``optimizer.state_dict()`` return) and copies every
tensor into one contiguous byte tensor, leaving a :class:`TensorSlot` in its place: the
skeleton is small and travels in a message, the bytes are registered once as an
``RDMABuffer`` and read by the new replica in one transfer. :func:`unpack` rebuilds the
state dict from the skeleton and the bytes it read.

>>> import torch
>>> state = {"w": torch.arange(3.0), "meta": {"step": torch.tensor(7), "lr": 0.1}}
>>> packed = pack(state)
>>> back = unpack(packed.skeleton, packed.data.clone())
>>> back["w"].tolist(), int(back["meta"]["step"]), back["meta"]["lr"]
([0.0, 1.0, 2.0], 7, 0.1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Packed", "TensorSlot", "pack", "unpack"]

#: Every tensor starts at a multiple of this many bytes in the block, so that a slice of
#: the block can be viewed as any dtype.
ALIGN = 64


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor of a packed state lies in its block of bytes."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass(frozen=True)
class Packed:
    """A packed state: the skeleton (the state with a :class:`TensorSlot` for every
    tensor) and the block of bytes the slots point into."""

    skeleton: Any
    data: torch.Tensor


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").reshape(-1).contiguous().view(torch.uint8)


def pack(state: Any) -> Packed:
    """Copy every tensor of ``state`` into one block (see the module docs)."""
    tensors: list[torch.Tensor] = []
    size = 0

    def walk(value: Any) -> Any:
        nonlocal size
        if isinstance(value, torch.Tensor):
            raw = _bytes_of(value)
            slot = TensorSlot(
                offset=size,
                nbytes=raw.numel(),
                shape=tuple(value.shape),
                dtype=value.dtype,
                requires_grad=value.requires_grad,
            )
            tensors.append(raw)
            size += -(-raw.numel() // ALIGN) * ALIGN
            return slot
        if isinstance(value, dict):
            return type(value)((k, walk(v)) for k, v in value.items())
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value

    skeleton = walk(state)
    data = torch.empty(max(size, 1), dtype=torch.uint8)
    offset = 0
    for raw in tensors:
        data[offset : offset + raw.numel()].copy_(raw)
        offset += -(-raw.numel() // ALIGN) * ALIGN
    return Packed(skeleton=skeleton, data=data)


def unpack(skeleton: Any, data: torch.Tensor) -> Any:
    """The state that :func:`pack` packed into ``skeleton`` and ``data`` (the tensors
    are views of ``data``, which they keep alive)."""

    def walk(value: Any) -> Any:
        if isinstance(value, TensorSlot):
            raw = data[value.offset : value.offset + value.nbytes]
            t = raw.view(value.dtype).reshape(value.shape)
            return t.requires_grad_(value.requires_grad) if value.requires_grad else t
        if isinstance(value, dict):
            return type(value)((k, walk(v)) for k, v in value.items())
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value

    return walk(skeleton)
