"""Distributed tensors and actor endpoints, the worker's side (the client's is
:mod:`monarch._src.tensor_engine.client.interop`, whose docs describe the protocol).

A worker runs an ``ActorWork`` command (:mod:`~monarch._src.tensor_engine.wire`) here:
it replaces the refs in the call's arguments by its local shards and sends the call to
the actor of its proc
(or, for an rref, waits for the result and keeps its tensors), and it publishes the
shards of a spawn's tensor arguments for the actors of its proc to take when they
unpickle them (:func:`spawn_shard`). Nothing here imports the client side.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch._rust_bindings import CastMode
from monarch._src.actor.replies import OK, decode
from monarch._src.tensor_engine import wire

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh

__all__ = ["spawn_shard", "worker_actor_command"]


def worker_actor_command(worker: Any, cmd: wire.ActorWork) -> None:
    """Run ``cmd`` on ``worker`` (a ``TensorWorker``): see the module docs. An exception
    fails the command's outputs."""
    payload = cmd.payload
    if isinstance(payload, wire.SpawnArgs):
        _publish_spawn_args(worker, cmd.seq, payload)
        return
    index = payload.targets.get(worker.rank)
    if index is None:
        return  # no actor of the call on this proc
    failed: list[wire.Failure] = []
    args, kwargs = _resolve(worker, (payload.args, payload.kwargs), failed)
    if payload.kind == "call":
        _deliver(
            worker,
            cmd.seq,
            payload.mesh,
            payload.method,
            args,
            kwargs,
            payload.port,
            index,
            payload.size,
            failed,
        )
    elif payload.kind == "rref":
        if failed:
            for out in cmd.outs:
                worker.values[out] = failed[0]
            return
        _run(
            worker,
            payload.mesh,
            payload.method,
            args,
            kwargs,
            index,
            payload.size,
            payload.metas,
            cmd.outs,
        )
    else:
        raise ValueError(f"unknown actor command {payload.kind!r}")


def _resolve(worker: Any, value: Any, failed: list[wire.Failure]) -> Any:
    """``value`` with each ref replaced by this rank's shard (detached: an actor gets
    values, not a piece of the worker's autograd graph)."""
    leaves, spec = tree_flatten(value)
    out = []
    for leaf in leaves:
        if type(leaf) is wire.Ref:
            v = worker._value(leaf.id)
            if type(v) is wire.Failure:
                failed.append(v)
            elif isinstance(v, torch.Tensor):
                v = v.detach()
            out.append(v)
        else:
            out.append(leaf)
    return tree_unflatten(out, spec)


def _deliver(
    worker: Any,
    seq: int,
    mesh: ActorMesh[Any],
    method: str,
    args: Any,
    kwargs: Any,
    port: Any,
    index: int,
    count: int,
    failed: list[wire.Failure],
) -> None:
    from monarch._src.actor.context import sender
    from monarch._src.actor.pickling import dumps_call, dumps_value

    failure = failed[0] if failed else None
    parts = None
    if failure is None:
        try:
            parts = dumps_call(tuple(args), dict(kwargs))
        except Exception as e:
            failure = worker._failure(seq, e)
    if failure is not None or parts is None:
        # The caller hears why (a broadcast's caller waits for nothing).
        if port is not None and failure is not None:
            port.send(sender(), OK, dumps_value(wire.InputFailed(failure, index)))
        return
    mode = CastMode.PORT if port is not None else CastMode.BROADCAST
    mesh._handle.cast(sender(), method, parts, mode, port, index, count)


def _run(
    worker: Any,
    mesh: ActorMesh[Any],
    method: str,
    args: Any,
    kwargs: Any,
    index: int,
    count: int,
    metas: list[tuple[tuple[int, ...], torch.dtype]] | None,
    outs: list[int],
) -> None:
    """An rref on this rank: call the local actor, wait for its result, keep its
    tensors under ``outs`` (this blocks the worker's thread, never the actor's: every
    actor runs on a thread of its own)."""
    from monarch._src import config
    from monarch._src.actor import process
    from monarch._src.actor.context import sender
    from monarch._src.actor.pickling import dumps_call

    qualname = f"{mesh._class_name}.{method}"
    parts = dumps_call(tuple(args), dict(kwargs))
    queue = process.get().agent.reply_queue()
    mesh._handle.cast(sender(), method, parts, CastMode.PORT, queue.port(), index, count)
    timeout = float(config.get("tensor_collective_timeout"))
    try:
        item = queue.get(timeout)
    except TimeoutError:
        raise TimeoutError(
            f"{qualname}.rref(...): the actor at index {index} did not return within "
            f"{timeout} s (tensor_collective_timeout); its result is lost"
        ) from None
    result = decode([item], mesh._view_info(), qualname)[0]
    if metas is None:  # propagate="inspect": run for its effect
        return
    leaves, _ = tree_flatten(result)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if len(tensors) != len(outs):
        raise ValueError(
            f"{qualname}.rref(...): the endpoint returned {len(tensors)} tensors, but its "
            f"propagate function said {len(outs)}; make them agree"
        )
    for i, (t, (size, dtype)) in enumerate(zip(tensors, metas, strict=True)):
        if tuple(t.shape) != tuple(size) or t.dtype != dtype:
            # As upstream, the real result is kept; the client's tensor still has the
            # propagated shape, so work on it may go wrong: say so, naming both.
            warnings.warn(
                f"{qualname}.rref(...) on rank {worker.rank}: tensor {i} of the endpoint's "
                f"result is {tuple(t.shape)} {t.dtype}, but its propagate function said "
                f"{tuple(size)} {dtype}; the result is kept as the endpoint returned it, "
                "while the client's tensor has the propagated shape: make them agree",
                RuntimeWarning,
                stacklevel=1,
            )
    values = worker.values
    for out, t in zip(outs, tensors, strict=True):
        values[out] = t


#: In a proc: the shards published for spawns, by token: ``[values, left to take]``.
_spawn_values: dict[int, list[Any]] = {}
_spawn_changed = threading.Condition()


def _publish_spawn_args(worker: Any, seq: int, payload: wire.SpawnArgs) -> None:
    """On a worker: publish copies of this rank's shards of a spawn's tensors (a
    ``wire.Failure`` for one that holds no value), if an actor of the spawn is here."""
    token, refs, ranks = payload.token, payload.refs, payload.ranks
    if worker.rank not in ranks:
        return
    values: list[Any] = []
    for ref in refs:
        value = worker._value(ref.id)
        if isinstance(value, torch.Tensor):
            try:
                copy = value.detach().clone()
                if copy.is_cuda:  # made on the worker's stream: done before the actor reads
                    torch.cuda.current_stream(copy.device).synchronize()
                value = copy
            except Exception as e:
                value = worker._failure(seq, e)
        values.append(value)
    with _spawn_changed:
        _spawn_values[token] = [values, len(values)]
        _spawn_changed.notify_all()


def spawn_shard(token: int, index: int) -> Any:
    """In an actor's proc, unpickling its spawn arguments: its shard of the spawn's
    tensor ``index``, once this proc's worker published it."""
    from monarch._src import config

    timeout = float(config.get("tensor_collective_timeout"))
    with _spawn_changed:
        if not _spawn_changed.wait_for(lambda: token in _spawn_values, timeout):
            raise TimeoutError(
                f"the shard of a monarch tensor passed to spawn did not reach this proc "
                f"within {timeout} s (tensor_collective_timeout): its tensor worker is stuck "
                "or gone"
            )
        entry = _spawn_values[token]
        value = entry[0][index]
        entry[1] -= 1
        if entry[1] <= 0:
            del _spawn_values[token]
    if type(value) is wire.Failure:
        raise RuntimeError(
            f"a monarch tensor passed to spawn holds no value on rank {value.rank}: the work "
            f"that produced it failed:\n{value.error}"
        )
    return value
