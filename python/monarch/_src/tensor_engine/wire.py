"""What the client sends tensor workers: commands, and the references inside them.

A batch is one pickle of a list of commands. Each command is a record of its own type
(a ``NamedTuple``: named, typed fields, pickled as compactly as a tuple). Tensors travel
as :class:`Ref` (an engine-wide integer id), process groups as :class:`GroupRef`.
Functions (aten operators and remote functions) are defined once per worker with
:class:`DefineFn` and referred to by id after; views (the mesh view a command runs on)
likewise with :class:`DefineView`. A command that produces values carries the ``seq``
the client gave it (the client keeps the frames that issued it under that number);
:func:`outputs` lists the refs it writes, which a failure of it marks failed.

The worker, the client's engine and the simulator all read these records. This module
imports nothing heavy: both sides use it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "ActorCall",
    "ActorWork",
    "Alias",
    "Call",
    "Command",
    "DefineFn",
    "DefineView",
    "Delete",
    "Fail",
    "Failure",
    "GroupRef",
    "InputFailed",
    "Op",
    "Peers",
    "Rank",
    "Recv",
    "Reduce",
    "Ref",
    "Send",
    "SetStream",
    "Signal",
    "SpawnArgs",
    "TensorData",
    "TensorMeta",
    "Unpack",
    "Wait",
    "outputs",
    "seq_of",
]


class DefineFn(NamedTuple):
    """Define function ``fid`` on the worker. ``spec`` is ``("op", namespace, name,
    overload)`` for a torch operator, ``("path", "module.qualname")`` (optionally with
    the source file) or ``("pickle", bytes)`` otherwise. Global: takes effect at once,
    whatever stream is current."""

    fid: int
    spec: tuple[Any, ...]


class DefineView(NamedTuple):
    """Define view ``vid``: its :class:`~monarch._src.actor.shape.Shape` over the global
    ranks of the engine's proc mesh. Global, as :class:`DefineFn`."""

    vid: int
    shape: Any


class Op(NamedTuple):
    """Run torch operator ``fid``; ``outs[i]`` is the ref of its i-th tensor output.
    ``writes`` are the refs of the inputs it writes in place (failed with it)."""

    seq: int
    fid: int
    args: Any
    kwargs: Any
    outs: list[int]
    writes: tuple[int, ...]


class Call(NamedTuple):
    """Run remote function ``fid``: the tensor leaves of its result are stored under
    ``outs`` (in pytree order); with ``whole`` the whole result is also kept under that
    ref (``propagate="inspect"``)."""

    seq: int
    fid: int
    args: Any
    kwargs: Any
    outs: list[int]
    whole: int | None


class Delete(NamedTuple):
    """Forget the values of these refs."""

    refs: list[int]


class Rank(NamedTuple):
    """``out`` = this rank's coordinate in view ``vid`` along ``dims`` (row-major over
    several), an int64 scalar."""

    seq: int
    out: int
    vid: int
    dims: tuple[str, ...]


class Reduce(NamedTuple):
    """A collective of ``inp`` over ``dims`` of view ``vid`` into ``out``: ``reduction``
    (``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"product"`` or ``"stack"``), scattered
    or not, in place or not. ``meta`` is the input's ``(size, dtype, device)``: a rank
    whose input failed takes part with zeros of it."""

    seq: int
    out: int
    inp: int
    vid: int
    dims: tuple[str, ...]
    reduction: str
    scatter: bool
    inplace: bool
    meta: tuple[Any, ...]


class Send(NamedTuple):
    """Send the value of ``ref`` from each source rank to its destinations:
    ``routes`` is ``{src_rank: [dst_rank, ...]}``."""

    seq: int
    ref: int
    routes: dict[int, list[int]]


class Recv(NamedTuple):
    """Receive ``out`` from a source rank: ``sources`` is ``{dst_rank: src_rank}``."""

    seq: int
    out: int
    sources: dict[int, int]


class Peers(NamedTuple):
    """Where each worker receives point-to-point data: its port, by global rank. Global,
    as :class:`DefineFn`."""

    ports: list[Any]


class Unpack(NamedTuple):
    """Store the tensor leaves of the value under ``whole`` under ``outs``."""

    seq: int
    whole: int
    outs: list[int]


class Fail(NamedTuple):
    """A command that could not be sent (its arguments do not pickle): its outputs
    ``outs`` are failed with ``error``."""

    seq: int
    outs: list[int]
    error: str


class SetStream(NamedTuple):
    """The commands after this one in the batch run on stream ``sid`` (named ``name``;
    created on first sight), until the next ``SetStream``. Every batch starts on stream
    0, ``"main"``."""

    sid: int
    name: str


class Signal(NamedTuple):
    """The current stream reached this point (``token`` is an engine-wide int; each is
    waited for by exactly one :class:`Wait`)."""

    token: int


class Wait(NamedTuple):
    """The current stream waits until ``Signal(token)`` ran (on another stream; on CUDA
    the wait is an event wait on the device)."""

    token: int


class Alias(NamedTuple):
    """``out`` is the value of ``src`` itself (a borrow: the current stream sees the
    origin stream's tensor; issued after a :class:`Wait` for it)."""

    seq: int
    out: int
    src: int


class ActorCall(NamedTuple):
    """An endpoint call with tensors in its arguments (see
    ``monarch._src.tensor_engine.client.interop``): ``kind`` is ``"call"`` or ``"rref"``,
    ``args``/``kwargs`` hold :class:`Ref` for monarch tensors, ``port`` is where replies
    go (``None``: nowhere, a broadcast; an rref's go to the worker), ``targets`` maps a
    global rank to the index, in the actor mesh view, of the actor to call there,
    ``size`` is the size of that view, and ``metas`` the ``(size, dtype)`` of each
    output of an rref (``None``: run for its effect)."""

    kind: str
    mesh: Any
    method: str
    args: Any
    kwargs: Any
    port: Any
    targets: dict[int, int]
    size: int
    metas: list[tuple[Any, Any]] | None


class SpawnArgs(NamedTuple):
    """The workers of ``ranks`` publish copies of their shards of ``refs`` under
    ``token``, for the actors a spawn gave those tensors to."""

    token: int
    refs: list[Ref]
    ranks: list[int]


class ActorWork(NamedTuple):
    """Tensors to and from actor endpoints: ``payload`` is an :class:`ActorCall` or a
    :class:`SpawnArgs`; ``outs`` the refs an rref writes."""

    seq: int
    payload: ActorCall | SpawnArgs
    outs: list[int]


#: Any command.
Command = (
    DefineFn
    | DefineView
    | Op
    | Call
    | Delete
    | Rank
    | Reduce
    | Send
    | Recv
    | Peers
    | Unpack
    | Fail
    | SetStream
    | Signal
    | Wait
    | Alias
    | ActorWork
)

#: The commands that take effect at once, whatever stream is current.
GLOBAL = (DefineFn, DefineView, Peers)


def outputs(cmd: Command) -> list[int]:
    """The refs a command writes (what a failure of it marks failed)."""
    if isinstance(cmd, Op):
        return [*cmd.outs, *cmd.writes]
    if isinstance(cmd, Call):
        return [*cmd.outs, *([cmd.whole] if cmd.whole is not None else [])]
    if isinstance(cmd, (Rank, Reduce, Recv, Alias)):
        return [cmd.out]
    if isinstance(cmd, (Unpack, Fail, ActorWork)):
        return list(cmd.outs)
    return []


def seq_of(cmd: Command) -> int:
    """The seq of a command that produces values; -1 for the others."""
    seq: int = getattr(cmd, "seq", -1)
    return seq


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
