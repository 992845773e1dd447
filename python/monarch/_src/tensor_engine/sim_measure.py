"""What a simulated command moves and computes, measured from the metadata of its
tensors (see :mod:`.simulator`): the tensors a command touches, their bytes, and an
operator's floating-point operations (torch's flop-counter formulas).

A tensor's metadata is ``(shape, strides, offset, dtype, device)``. torch is imported
only when a command is measured.
"""

from __future__ import annotations

from typing import Any

from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.sim_model import numel

__all__ = ["_dtype_name", "_flops", "_itemsize", "_nbytes", "_tensors_in"]


def _tensors_in(value: Any, metas: dict[int, Any]) -> list[Any]:
    """The metadata of every tensor in ``value`` (refs, and local tensors sent with a
    command), each once."""
    import torch

    out: list[Any] = []
    seen: set[int] = set()

    def walk(x: Any) -> None:
        if isinstance(x, wire.Ref):
            if x.id not in seen and x.id in metas:
                seen.add(x.id)
                out.append(metas[x.id])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, torch.Tensor):
            out.append((tuple(x.shape), (), 0, x.dtype, x.device))

    walk(value)
    return out


def _itemsize(dtype: Any) -> int:
    return int(getattr(dtype, "itemsize", 4))


def _nbytes(meta: Any) -> int:
    return numel(meta[0]) * _itemsize(meta[3])


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


_flop_formulas: dict[Any, Any] | None = None


def _flops(fn: Any, args: Any, kwargs: Any, outputs: list[Any], metas: dict[int, Any]) -> int:
    """The floating-point operations of operator ``fn`` (from torch's flop counter
    formulas: matmuls, convolutions, attention; 0 for the others)."""
    global _flop_formulas
    if fn is None:
        return 0
    if _flop_formulas is None:
        from torch.utils import flop_counter

        _flop_formulas = dict(getattr(flop_counter, "flop_registry", {}))
    formula = _flop_formulas.get(getattr(fn, "overloadpacket", None))
    if formula is None:
        return 0
    import torch

    def shape(x: Any) -> Any:
        if isinstance(x, wire.Ref):
            m = metas.get(x.id)
            return torch.Size(m[0]) if m is not None else torch.Size([])
        if type(x) is list or type(x) is tuple:
            return type(x)(shape(v) for v in x)
        return x

    try:
        sargs = [shape(a) for a in args]
        skwargs = {k: shape(v) for k, v in kwargs.items()}
        sizes = [torch.Size(m[0]) for m in outputs]
        out = sizes[0] if len(sizes) == 1 else tuple(sizes)
        inner = getattr(formula, "__wrapped__", None)
        if inner is not None:  # the formula on shapes, which ours already are
            return int(inner(*sargs, out_shape=out, **skwargs))
        return int(formula(*sargs, out_val=out, **skwargs))
    except Exception:
        return 0
