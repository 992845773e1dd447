"""Hand the tensors of an engine that lost a proc over to a new mesh.

A tensor engine whose mesh lost a proc refuses all work (``SupervisionError``). Its
tensors are not lost on the survivors: their workers still hold them. :func:`handover`
gives them to the engine of ``mesh``, a new root mesh whose ranks are the survivors'
procs and replacement procs (``ProcMeshHandle.compose``). The survivors' processes keep
running; their new workers take the old workers' values in the same process, without a
copy, and each replacement reads the values of one survivor one-sided, with
``monarch.rdma``, in one transfer (see
:mod:`monarch._src.tensor_engine.worker.handover`). The new engine forms its process
groups fresh, at their first use, under keys of its own store.

Only tensors whose work is complete on every survivor can be handed over: a client
that updates tensors in place records a mark after each update (:func:`record_mark`),
and the handover waits for the mark it is told to expect on every survivor before it
takes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client.api import Remote, call_on_shard_and_fetch, fetch_shard
from monarch._src.tensor_engine.client.engine import Engine, engine_of
from monarch._src.tensor_engine.client.tensor import Tensor
from monarch._src.tensor_engine.worker import handover as _worker

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh

__all__ = ["HandoverError", "handover", "record_mark"]


class HandoverError(RuntimeError):
    """The tensors could not be handed over: a survivor or a replacement failed during
    the handover (the message says which rank and why), or the tensors are not of one
    failed engine."""


def _metas(leaves: list[Tensor]) -> list[wire.TensorMeta]:
    out = []
    for t in leaves:
        size, _, _, dtype, device = t._meta
        strides = []
        acc = 1
        for n in reversed(size):
            strides.append(acc)
            acc *= max(n, 1)
        out.append(wire.TensorMeta(tuple(size), tuple(reversed(strides)), dtype, str(device)))
    return out


def _like(metas: list[wire.TensorMeta]) -> list[torch.Tensor]:
    return [torch.empty(m.size, dtype=m.dtype, device=m.device) for m in metas]


_adopt = Remote(
    _worker.adopt,
    propagate=lambda engine_id, refs, metas, fill_ranks, key, expect, timeout: _like(metas),
)
_fill = Remote(
    _worker.fill,
    propagate=lambda buffer, fill_ranks, timeout, *tensors: [torch.empty_like(t) for t in tensors],
)
_check = Remote(_worker.check, propagate=lambda *tensors: torch.empty(()))
_release = Remote(_worker.release, propagate=lambda engine_id: None)
_mark = Remote(_worker.mark, propagate=lambda engine_id, key, value: None)
_offer = Remote(_worker.offer)
_drop_offer = Remote(_worker.drop_offer)


def record_mark(mesh: ProcMesh, key: str, value: int) -> None:
    """Record, after the work recorded so far on ``mesh`` (the active stream), that each
    of its workers reached mark ``key`` = ``value`` (what :func:`handover` can wait
    for)."""
    engine = engine_of(mesh)
    with mesh.activate():
        _mark(engine.id, key, value)


def _engine_of(leaves: list[Tensor]) -> Engine:
    engines = {id(t._view.engine): t._view.engine for t in leaves}
    if len(engines) != 1:
        raise HandoverError(
            f"handover: the tensors belong to {len(engines)} engines; hand over the "
            "tensors of one failed mesh at a time"
        )
    return next(iter(engines.values()))


def handover(
    tensors: Any,
    mesh: ProcMesh,
    fill: Sequence[int],
    source: int,
    mark: tuple[str, int] | None = None,
    timeout: float = 60.0,
) -> Any:
    """``tensors`` (a pytree whose monarch tensors belong to one failed engine) as
    tensors of ``mesh``, a root mesh whose ranks not in ``fill`` are procs of that
    engine's survivors and whose ranks in ``fill`` are replacements. The replacements
    copy the values of rank ``source`` of ``mesh`` (a survivor) one-sided. With ``mark``
    ``(key, value)``, each survivor's values are taken once its old worker reached that
    mark (:func:`record_mark`). Returns the pytree with new tensors, on the main
    stream.

    Raises :class:`HandoverError` when a rank fails during the handover (the new
    engine's ``SupervisionError`` says which proc was lost), or after ``timeout``
    seconds.
    """
    leaves, spec = tree_flatten(tensors)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    olds = [leaves[i] for i in positions]
    if not olds:
        return tensors
    old = _engine_of(olds)
    fill = sorted(set(fill))
    if source in fill:
        raise HandoverError(
            f"handover: the source rank {source} is one of the ranks to fill {fill}; give a "
            "survivor as the source"
        )
    engine = engine_of(mesh)
    metas = _metas(olds)
    refs = [t._h.ref.id for t in olds]
    key, expect = mark if mark is not None else ("", None)
    shape = mesh._shape
    labels = list(shape.labels)

    def coords(rank: int) -> dict[str, int]:
        point = shape.coordinates(rank)
        return {label: point[label] for label in labels}

    try:
        with mesh.activate(), torch.no_grad():
            adopted = _adopt(old.id, refs, metas, fill, key, expect, timeout)
            new = adopted
            if fill:
                oid, buffer = call_on_shard_and_fetch(_offer, *adopted, shard=coords(source)).get(
                    timeout=timeout
                )
                new = _fill(buffer, fill, timeout, *adopted)
                for t in adopted:
                    t.drop()
            done = _check(*new)
            futures = [fetch_shard(done, coords(r)) for r in shape.ranks()]
            for fut in futures:
                fut.get(timeout=timeout + 10)
            if fill:
                call_on_shard_and_fetch(_drop_offer, oid, shard=coords(source)).get(timeout=timeout)
            _release(old.id)
            engine.flush()
    except Exception as e:
        raise HandoverError(
            f"handing the tensors of the failed engine of {old.root!r} over to {mesh!r} "
            f"failed: {type(e).__name__}: {e}"
        ) from e
    out = list(leaves)
    for i, t in zip(positions, new, strict=True):
        out[i] = t
    return tree_unflatten(out, spec)
