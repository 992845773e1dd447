"""What the client sends tensor workers: commands, and the references inside them.

A batch is one pickle of a list of commands; each command is a tuple whose first item
is its opcode. Tensors travel as :class:`Ref` (an engine-wide integer id), process
groups as :class:`GroupRef`. Functions (aten operators and remote functions) are
defined once per worker with :data:`DEFINE_FN` and referred to by id after; views (the
mesh view a command runs on) likewise with :data:`DEFINE_VIEW`.

This module imports nothing heavy: both sides use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACTOR",
    "ALIAS",
    "CALL",
    "DEFINE_FN",
    "DEFINE_VIEW",
    "DELETE",
    "FAIL",
    "OP",
    "PEERS",
    "RANK",
    "RECV",
    "REDUCE",
    "SEND",
    "SIGNAL",
    "STREAM",
    "UNPACK",
    "WAIT",
    "Failure",
    "GroupRef",
    "InputFailed",
    "Ref",
    "TensorData",
    "TensorMeta",
    "outputs",
]

#: ``(DEFINE_FN, fid, spec)``: ``spec`` is ``("op", namespace, name, overload)`` for a
#: torch operator, ``("path", "module.qualname")`` or ``("pickle", bytes)`` otherwise.
DEFINE_FN = 0
#: ``(DEFINE_VIEW, vid, shape)``: the view's :class:`~monarch._src.actor.shape.Shape`
#: over the global ranks of the engine's proc mesh.
DEFINE_VIEW = 1
#: ``(OP, seq, fid, args, kwargs, outs)``: run a torch operator; ``outs[i]`` is the ref
#: of its i-th tensor output, or ``None`` where that output is an input (in place).
OP = 2
#: ``(CALL, seq, fid, args, kwargs, outs, whole)``: run a remote function; the tensor
#: leaves of its result are stored under ``outs`` (in pytree order); with ``whole`` the
#: whole result is also kept under that ref (``propagate="inspect"``).
CALL = 3
#: ``(DELETE, [ref, ...])``: forget these values.
DELETE = 4
#: ``(RANK, seq, out, vid, dims)``: ``out`` = this rank's coordinate in view ``vid``
#: along ``dims`` (row-major over several), an int64 scalar.
RANK = 5
#: ``(REDUCE, seq, out, inp, vid, dims, reduction, scatter, inplace)``.
REDUCE = 6
#: ``(SEND, seq, ref, {src_rank: [dst_rank, ...]})``.
SEND = 7
#: ``(RECV, seq, out, {dst_rank: src_rank})``.
RECV = 8
#: ``(PEERS, [port by global rank])``: where each worker receives point-to-point data.
PEERS = 9
#: ``(UNPACK, seq, whole, outs)``: store the tensor leaves of the value under ``whole``.
UNPACK = 10
#: ``(FAIL, seq, outs, error)``: a command that could not be sent (its arguments do not
#: pickle): its outputs are failed with ``error``.
FAIL = 11
#: ``(STREAM, -1, sid, name)``: the commands after this one in the batch run on stream
#: ``sid`` (named ``name``; created on first sight), until the next ``STREAM``. Every
#: batch starts on stream 0, ``"main"``. ``DEFINE_FN``, ``DEFINE_VIEW`` and ``PEERS``
#: are global: they take effect at once whatever stream is current.
STREAM = 12
#: ``(SIGNAL, -1, token)``: the current stream reached this point (``token`` is an
#: engine-wide int; each is waited for by exactly one ``WAIT``).
SIGNAL = 13
#: ``(WAIT, -1, token)``: the current stream waits until ``SIGNAL token`` ran (on
#: another stream; on CUDA the wait is an event wait on the device).
WAIT = 14
#: ``(ALIAS, seq, out, src)``: ``out`` is the value of ``src`` itself (a borrow: the
#: current stream sees the origin stream's tensor; issued after a ``WAIT`` for it).
ALIAS = 15
#: ``(ACTOR, seq, payload, outs)``: tensors to and from actor endpoints (see
#: ``monarch._src.tensor_engine.interop``).
ACTOR = 16


def outputs(cmd: tuple[Any, ...]) -> list[int]:
    """The refs a command writes (what a failure of it marks failed)."""
    op = cmd[0]
    if op == OP:
        return [*cmd[5], *cmd[6]]
    if op == CALL:
        return [*cmd[5], *([cmd[6]] if cmd[6] is not None else [])]
    if op in (RANK, REDUCE, RECV):
        return [cmd[2]]
    if op == UNPACK:
        return list(cmd[3])
    if op == FAIL:
        return list(cmd[2])
    if op == ALIAS:
        return [cmd[2]]
    if op == ACTOR:
        return list(cmd[3])
    return []


class Ref:
    """A tensor (or other value) held by the workers, by id."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class GroupRef:
    """A process group over ``dims`` of view ``vid``, resolved by each worker to the
    real torch process group of the ranks that share its other coordinates."""

    __slots__ = ("dims", "vid")

    def __init__(self, vid: int, dims: tuple[str, ...]) -> None:
        self.vid = vid
        self.dims = dims

    def __reduce__(self) -> tuple[Any, ...]:
        return (GroupRef, (self.vid, self.dims))


class TensorMeta:
    """A tensor's metadata where the tensor itself does not travel (the answer of a
    remote function's propagation)."""

    __slots__ = ("device", "dtype", "size", "stride")

    def __init__(self, size: Any, stride: Any, dtype: Any, device: Any) -> None:
        self.size = size
        self.stride = stride
        self.dtype = dtype
        self.device = device

    def __reduce__(self) -> tuple[Any, ...]:
        return (TensorMeta, (self.size, self.stride, self.dtype, self.device))


#: Fetched tensors below this size travel as :class:`TensorData`.
SMALL_TENSOR_BYTES = 64 << 10


class TensorData:
    """A small CPU tensor as its dtype's name, shape and raw bytes (cheaper to pickle
    and rebuild than a tensor); :meth:`tensor` rebuilds it."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: bytes) -> None:
        self.dtype = dtype
        self.shape = shape
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return (TensorData, (self.dtype, self.shape, self.data))

    def tensor(self) -> Any:
        import torch

        dtype = getattr(torch, self.dtype.removeprefix("torch."))
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(dtype).reshape(self.shape)


class Failure:
    """Why a worker holds no value for a ref: the command ``seq`` failed on global
    ``rank`` with ``error`` (its traceback text); ``frames`` are the worker's frames
    as ``(file, line, function)``."""

    __slots__ = ("error", "frames", "kind", "rank", "seq")

    def __init__(
        self,
        seq: int,
        rank: int,
        error: str,
        frames: list[tuple[str, int, str]],
        kind: str = "error",
    ) -> None:
        self.seq = seq
        self.rank = rank
        self.error = error
        self.frames = frames
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (Failure, (self.seq, self.rank, self.error, self.frames, self.kind))

    def __repr__(self) -> str:
        return f"Failure(seq={self.seq}, rank={self.rank}, {self.error.strip().splitlines()[-1:]})"


class InputFailed:
    """A worker's reply in place of the actor's: a tensor argument holds no value on
    its rank (the work producing it failed)."""

    __slots__ = ("failure", "index")

    def __init__(self, failure: Failure, index: int) -> None:
        self.failure = failure
        #: The index of the actor it stands for in the call's view.
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (InputFailed, (self.failure, self.index))
