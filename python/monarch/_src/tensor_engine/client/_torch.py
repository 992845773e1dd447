"""Every semi-private torch API the tensor engine relies on, in one place.

- tensor subclasses without storage (``Tensor._make_wrapper_subclass``);
- dispatch modes (``TorchDispatchMode``, ``_disable_current_modes``);
- shape inference on fake tensors (``FakeTensorMode``).

If a torch release changes one of them, this module is what changes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes

__all__ = [
    "Meta",
    "TorchDispatchMode",
    "disable_modes",
    "fake_mode",
    "fake_of",
    "make_wrapper",
    "meta_of",
]


class _Mode(_TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The base of the engine's dispatch modes. torch wraps a mode's
    ``__torch_dispatch__`` to keep its compiler out of it unless the mode opts out;
    the wrapper imports the compiler (seconds) on the first operation and costs every
    operation after: ours run no compiled code, so they opt out."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


#: The base class of dispatch modes (untyped in torch).
TorchDispatchMode: Any = _Mode

#: A tensor's metadata: (size, stride, storage offset, dtype, device).
Meta = tuple[tuple[int, ...], tuple[int, ...], int, torch.dtype, torch.device]

_fake: Any = None


def fake_mode() -> Any:
    """The process's fake tensor mode (shape inference with no data)."""
    global _fake
    if _fake is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        _fake = FakeTensorMode(allow_non_fake_inputs=True)
    return _fake


def disable_modes() -> Any:
    """A context in which no dispatch mode is active (local torch)."""
    return _disable_current_modes()


def make_wrapper(cls: type, meta: Meta) -> Any:
    """A ``cls`` tensor with ``meta``'s metadata and no storage."""
    size, stride, offset, dtype, device = meta
    return torch.Tensor._make_wrapper_subclass(
        cls,
        size,
        strides=stride,
        storage_offset=offset,
        dtype=dtype,
        device=device,
        requires_grad=False,
    )


def meta_of(t: torch.Tensor) -> Meta:
    return (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), t.dtype, t.device)


def fake_of(meta: Meta) -> torch.Tensor:
    """A fake tensor with ``meta`` (call inside :func:`fake_mode`)."""
    size, stride, offset, dtype, device = meta
    if any(s == 0 for s in size):
        extent = offset
    else:
        extent = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=False))
    base = torch.empty((max(extent, 1),), dtype=dtype, device=device)
    return base.as_strided(size, stride, offset)
