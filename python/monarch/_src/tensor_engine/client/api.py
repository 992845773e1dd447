"""The public functions of distributed tensors (re-exported by ``monarch``).

Fetching (``fetch_shard``, ``inspect``, ``show``, ``call_on_shard_and_fetch``),
collectives (``reduce``, ``reduce_``), moving tensors between meshes (``to_mesh``,
``slice_mesh``), remote functions (``remote``), process groups
(``RemoteProcessGroup``), and the tensor side of proc meshes (``rank_tensor``,
``to_table``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch._src.actor.future import Done
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client import _torch
from monarch._src.tensor_engine.client.coalescing import no_coalescing
from monarch._src.tensor_engine.client.engine import View, engine_of
from monarch._src.tensor_engine.client.future import Future, then
from monarch._src.tensor_engine.client.resolvers import spec_of
from monarch._src.tensor_engine.client.stream import Stream, get_active_stream
from monarch._src.tensor_engine.client.tensor import (
    READ,
    Tensor,
    TensorCollectives,
    _Args,
    _borrowed_where,
    _check_dims,
    _client_frames,
    _enc,
    _op_spec,
    access_of,
    aliases_of,
    check_use,
    current_view,
    register_collectives,
)
from monarch._src.tensor_engine.errors import (
    BORROWED,
    CROSS_DEVICE_REQUIRES_CUDA,
    DROPPED,
    LOCAL_TENSOR,
    REQUIRES_GRAD,
    WRONG_MESH,
    WRONG_STREAM,
    RemoteException,
    bad_arguments,
)

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh

__all__ = [
    "REDUCTIONS",
    "Remote",
    "RemoteProcessGroup",
    "call_on_shard_and_fetch",
    "fetch_shard",
    "inspect",
    "rank_tensor",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
    "to_table",
]

#: The reductions of ``reduce``: ``stack`` gathers, the others combine elementwise.
REDUCTIONS = ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_BITWISE = ("band", "bor", "bxor")


# --- views ----------------------------------------------------------------------------------


def _view_for(tensors: list[Tensor], what: str) -> View:
    """The view ``tensors`` are used on: the active mesh when it has their ranks (so
    its dimension names apply), else the first tensor's own."""
    first = tensors[0]._view
    problems = []
    for i, t in enumerate(tensors):
        if t._h.dropped:
            problems.append((f"tensor {i}", DROPPED))
        elif t._view.engine is not first.engine or t._view.slot != first.slot:
            problems.append((f"tensor {i}", WRONG_MESH))
    if problems:
        raise bad_arguments(what, problems)
    active = current_view()
    if active is not None and active.engine is first.engine and active.slot == first.slot:
        return active
    return first


def _rank_at(view: View, coords: dict[str, Any], what: str) -> int:
    """The global rank at ``coords`` of ``view`` (missing dimensions: 0)."""
    labels = view.shape.labels
    unknown = [k for k in coords if k not in labels]
    if unknown:
        raise ValueError(
            f"{what}: {unknown} are not dimensions of the mesh {dict(view.shape.extent)}; "
            f"expected coordinates among {labels}"
        )
    full = {label: coords.get(label, 0) for label in labels}
    for label, value in full.items():
        size = view.shape.extent[label]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{what}: the coordinate {label}={value!r} is not an int")
        if not 0 <= value < size:
            raise IndexError(f"{what}: the coordinate {label}={value} is outside [0, {size})")
    shape = view.shape
    for label, value in full.items():
        shape = shape.select(label, value)
    rank: int = shape.ranks()[0]
    return rank


def _remote_error(view: View, failure: wire.Failure) -> RemoteException:
    engine = view.engine
    try:
        coords: dict[str, int] | None = view.coords(failure.rank)
    except ValueError:
        coords = None
    return RemoteException(
        failure.rank,
        coords,
        failure.error,
        failure.frames,
        engine.frames_of(failure.seq) if failure.seq >= 0 else None,
        failure.seq,
    )


# --- fetching -------------------------------------------------------------------------------


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Future[Any]:
    """The shard at ``coords`` (missing dimensions: 0) of every monarch tensor in the
    pytree ``obj``, as local CPU tensors in the same structure, when the returned
    future (a ``monarch.Future``: ``result``, ``done``, ``exception``, ``add_callback``,
    and ``get``/``await`` as any ``monarch.actor.Future``) completes. Raises
    ``RemoteException`` (on ``result``/``get``/``await``) if the work producing one of
    them failed."""
    if shard is not None:
        coords = {**shard, **coords}
    leaves, spec = tree_flatten(obj)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    if not positions:
        return Future(impl=Done(obj))
    tensors = [leaves[i] for i in positions]
    no_coalescing("fetch_shard")
    view = _view_for(tensors, "fetch_shard")
    rank = _rank_at(view, coords, "fetch_shard")
    engine = view.engine
    engine.check()
    engine.flush()
    fut = engine.fetch(view, rank, [t._h.ref.id for t in tensors], [t._stream.sid for t in tensors])
    # The tensors stay alive (and their refs valid) until the answer is built.
    keep = tensors

    def convert(values: list[Any]) -> Any:
        del keep[:]
        out = list(leaves)
        for i, value in zip(positions, values, strict=False):
            if isinstance(value, wire.Failure):
                raise _remote_error(view, value)
            if isinstance(value, wire.TensorData):
                with _torch.disable_modes():  # a local tensor, even in an active block
                    value = value.tensor()
            out[i] = value
        return tree_unflatten(out, spec)

    return then(fut, convert)


def inspect(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """``fetch_shard(obj, shard, **coords).get()``: the values, now."""
    return fetch_shard(obj, shard, **coords).get()


def show(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """Display the shard at ``coords`` with ``torchshow`` (an optional dependency)."""
    try:
        import torchshow  # type: ignore[import-not-found]
    except ImportError:
        raise ImportError(
            "monarch.show needs the optional package 'torchshow', which is not installed: "
            "`pip install torchshow` (or use monarch.inspect(...) to get the values)"
        ) from None
    return torchshow.show(inspect(obj, shard, **coords))


def call_on_shard_and_fetch(
    remote_fn: Remote | Callable[..., Any],
    *args: Any,
    shard: dict[str, int] | None = None,
    **kwargs: Any,
) -> Future[Any]:
    """Run ``remote_fn`` on the one rank at ``shard`` of the active mesh (or of its
    tensor arguments' mesh) and fetch what it returns, as a ``monarch.Future``."""
    fn = remote_fn if isinstance(remote_fn, Remote) else Remote(remote_fn)
    no_coalescing("call_on_shard_and_fetch")
    view, eargs, ekwargs, _ = fn._encode(args, kwargs, "call_on_shard_and_fetch")
    rank = _rank_at(view, shard or {}, "call_on_shard_and_fetch")
    engine = view.engine
    engine.flush()
    worker = engine.workers_at(view, rank)
    return then(worker.call_function.call_one(fn._spec, eargs, ekwargs, [get_active_stream().sid]))


# --- collectives ----------------------------------------------------------------------------


def _reduce_one(
    t: Tensor,
    dims: str | Sequence[str],
    reduction: str,
    scatter: bool,
    mesh: Any,
    out: Tensor | None,
) -> Tensor:
    what = f"reduce({dims!r}, {reduction!r})"
    if not isinstance(t, Tensor):
        raise bad_arguments(what, [("the tensor", LOCAL_TENSOR)])
    if mesh is not None:
        raise NotImplementedError(
            "reduce(mesh=...) is not supported: a reduction runs over dimensions of the "
            "tensor's own mesh; move the result with `.to_mesh(mesh)` afterwards"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"{what}: unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    tensors = [t] if out is None or out is t else [t, out]
    view = _view_for(tensors, what)
    check_use(tensors, what, [out] if out is not None else [])
    names = _check_dims(view, dims, "reduce")
    engine = view.engine
    engine.check()
    size, _, _, dtype, device = t._meta
    if out is not None and out.device != t.device:
        raise bad_arguments(what, [("out", CROSS_DEVICE_REQUIRES_CUDA)])
    if reduction in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"{what}: bitwise reductions need an integer or bool tensor, got {dtype}")
    extent = view.shape.extent
    n = math.prod(extent[d] for d in names)
    if scatter:
        if not size or size[0] != n:
            raise ValueError(
                f"{what} with scatter=True: the tensor's first dimension must be the "
                f"number of ranks reduced over ({n}), got shape {tuple(size)}"
            )
        out_size = tuple(size) if reduction == "stack" else tuple(size[1:])
    else:
        out_size = (n, *size) if reduction == "stack" else tuple(size)
    inplace = out is not None
    if inplace:
        assert out is not None
        if tuple(out._meta[0]) != out_size or out.dtype != dtype:
            raise ValueError(
                f"{what}: the result has shape {out_size} and dtype {dtype}, but the output "
                f"tensor has shape {tuple(out._meta[0])} and dtype {out.dtype}"
                + ("; reduce_ cannot change the shape: use reduce()" if out is t else "")
            )
        result = out
    else:
        meta = (out_size, _contiguous_strides(out_size), 0, dtype, device)
        result = Tensor._new(meta, view, engine.new_ref())
    with engine.lock:
        engine.define_view(view, view)
        seq = engine.next_seq()
        engine.issue(
            view,
            wire.Reduce(
                seq=seq,
                out=result._h.ref.id,
                inp=t._h.ref.id,
                vid=view.vid,
                dims=names,
                reduction=reduction,
                scatter=bool(scatter),
                inplace=inplace,
                meta=(tuple(size), dtype, device),
            ),
            0,
            _client_frames(),
        )
    return result


def _contiguous_strides(size: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def reduce(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
    out: Any = None,
) -> Any:
    """Reduce every monarch tensor of the pytree ``tensors`` over the mesh dimensions
    ``dims``: ``reduction`` is one of :data:`REDUCTIONS`; ``stack`` gathers the shards
    into a new first dimension (all-gather), the others combine them elementwise
    (all-reduce). With ``scatter=True`` each rank keeps its part: reduce-scatter (the
    first dimension must be the number of ranks), or all-to-all for ``stack``."""
    if out is None:
        return tree_map(
            lambda t: (
                _reduce_one(t, dims, reduction, scatter, mesh, None) if isinstance(t, Tensor) else t
            ),
            tensors,
        )
    leaves, spec = tree_flatten(tensors)
    outs, _ = tree_flatten(out)
    if len(outs) != len(leaves):
        raise ValueError(
            f"reduce(out=...): {len(outs)} output tensors for {len(leaves)} inputs; give "
            "`out` the same structure as the tensors"
        )
    return tree_unflatten(
        [
            _reduce_one(t, dims, reduction, scatter, mesh, o)
            for t, o in zip(leaves, outs, strict=False)
        ],
        spec,
    )


def reduce_(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
) -> Any:
    """``reduce`` in place: every tensor of ``tensors`` receives its result."""
    return tree_map(
        lambda t: _reduce_one(t, dims, reduction, scatter, mesh, t) if isinstance(t, Tensor) else t,
        tensors,
    )


# --- moving between meshes --------------------------------------------------------------------


def _to_mesh_one(t: Tensor, src: View, mesh: ProcMesh, to: Stream | None = None) -> Tensor:
    """``t`` (its shards on ``src``) on ``mesh``, as a tensor of stream ``to`` (default:
    ``t``'s own): sent on ``t``'s stream, received on ``to``."""
    if not isinstance(t, Tensor):
        raise bad_arguments("to_mesh", [("the tensor", LOCAL_TENSOR)])
    if t._h.dropped:
        raise bad_arguments("to_mesh", [("the tensor", DROPPED)])
    if not access_of(t) & READ:
        raise bad_arguments("to_mesh", [(_borrowed_where("the tensor", t), BORROWED)])
    stream = t._stream
    if to is None:
        to = stream
    elif not isinstance(to, Stream):
        raise TypeError(f"to_mesh(stream=...): expected a monarch.Stream, got {to!r}")
    engine = src.engine
    if engine_of(mesh) is not engine:
        raise ValueError(
            f"to_mesh: {mesh!r} is not a view of the proc mesh the tensor lives on "
            f"({engine.root!r}); tensors move between views of one `spawn_procs` only"
        )
    dest = engine.view(mesh)
    src_ranks = src.shape.ranks()
    dst_ranks = dest.shape.ranks()
    if len(src_ranks) == len(dst_ranks):
        pairs = list(zip(src_ranks, dst_ranks, strict=False))
    elif len(src_ranks) == 1:
        pairs = [(src_ranks[0], d) for d in dst_ranks]
    else:
        raise ValueError(
            f"to_mesh: the source has {len(src_ranks)} ranks {dict(src.shape.extent)} and "
            f"the destination {len(dst_ranks)} {dict(dest.shape.extent)}; they must have "
            "the same number of ranks (matched in order), or the source one rank (copied "
            "to every destination rank). Use slice_mesh(t, ...) to pick the source ranks"
        )
    engine.check()
    if all(s == d for s, d in pairs) and dest.slot == t._view.slot and to is stream:
        # Same ranks in the same order: the same shards, bound to the new view.
        with engine.lock:
            alias = torch.ops.aten.alias.default
            fid = engine.fn_id(alias, _op_spec(alias))
            out = Tensor._new(t._meta, dest, engine.new_ref(), stream, aliases_of(t))
            seq = engine.next_seq()
            engine.issue(
                dest,
                wire.Op(seq, fid, [t._h.ref], {}, [out._h.ref.id], ()),
                fid,
                _client_frames(),
                stream,
            )
        return out
    engine.ensure_peers()
    routes: dict[int, list[int]] = {}
    for s, d in pairs:
        routes.setdefault(s, []).append(d)
    sources = {d: s for s, d in pairs}
    out = Tensor._new(t._meta, dest, engine.new_ref(), to)
    with engine.lock:
        seq = engine.next_seq()
        frames = _client_frames()
        engine.issue(src, wire.Send(seq, t._h.ref.id, routes), 0, frames, stream)
        engine.issue(dest, wire.Recv(seq, out._h.ref.id, sources), 0, frames, to)
    return out


def to_mesh(tensors: Any, mesh: ProcMesh, stream: Stream | None = None) -> Any:
    """Every monarch tensor of the pytree ``tensors``, on ``mesh`` (see
    ``Tensor.to_mesh``), received on ``stream`` (default: each tensor's own)."""
    return tree_map(
        lambda t: t.to_mesh(mesh, stream) if isinstance(t, (Tensor, MeshSlice)) else t, tensors
    )


class MeshSlice:
    """The shards of part of a mesh (``slice_mesh``), to move with :meth:`to_mesh`."""

    def __init__(self, tensors: Any, coords: dict[str, int | slice]) -> None:
        self.tensors = tensors
        self.coords = coords

    def to_mesh(self, mesh: ProcMesh, stream: Stream | None = None) -> Any:
        def move(t: Any) -> Any:
            if not isinstance(t, Tensor):
                return t
            view = _view_for([t], "slice_mesh")
            try:
                part = view.mesh.slice(**self.coords)
            except (TypeError, ValueError, IndexError) as e:
                raise type(e)(f"slice_mesh: {e}") from None
            return _to_mesh_one(t, view.engine.view(part), mesh, stream)

        return tree_map(move, self.tensors)


def slice_mesh(tensors: Any, **coords: int | slice) -> MeshSlice:
    """The shards of ``tensors`` on part of their mesh (``slice(**coords)``); move them
    with ``.to_mesh(mesh)``."""
    return MeshSlice(tensors, coords)


# --- remote functions -----------------------------------------------------------------------

_PROPAGATE_KINDS = (None, "cached", "inspect")


class RemoteProcessGroup:
    """A torch process group over ``dims`` of ``mesh``, for remote functions: a remote
    function receives the real ``torch.distributed`` process group of its rank's group
    (the ranks that share its coordinates on the other dimensions) and may call
    ``torch.distributed`` collectives with ``group=``."""

    def __init__(self, dims: Sequence[str], mesh: ProcMesh) -> None:
        self.mesh = mesh
        self.dims = (dims,) if isinstance(dims, str) else tuple(dims)

    def size(self) -> int:
        """The number of ranks in each group: the product of the sizes of ``dims`` in
        ``mesh``.

        Returns:
            The group size, what ``torch.distributed.get_world_size(group)`` gives in a
            remote function.
        """
        return math.prod(self.mesh.size(d) for d in self.dims)

    def __repr__(self) -> str:
        return f"RemoteProcessGroup(dims={self.dims}, mesh={self.mesh!r})"


class Remote:
    """A function that runs on the workers of the active mesh (see ``remote``)."""

    def __init__(self, fn: Callable[..., Any] | str, propagate: Any = None) -> None:
        if not (propagate in _PROPAGATE_KINDS or callable(propagate)):
            raise ValueError(
                f"remote(propagate={propagate!r}): expected None, 'cached', 'inspect' or a "
                "function that computes the outputs' shapes from the inputs"
            )
        if not (isinstance(fn, str) or callable(fn)):
            raise TypeError(f"remote(): expected a function or 'module.function', got {fn!r}")
        self._fn = fn
        self._propagate = propagate
        self._spec = spec_of(fn)
        self._name = fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))
        self._cache: dict[Any, Any] = {}
        if callable(fn):
            functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"monarch.remote({self._name})"

    # --- arguments --------------------------------------------------------------------------

    def _encode(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
    ) -> tuple[View, Any, Any, _Args]:
        """The view the call runs on, the encoded arguments, and what encoding found
        (the key of the shapes cache)."""
        a = _Args()
        groups: list[tuple[int, RemoteProcessGroup]] = []

        def enc(x: Any) -> Any:
            if isinstance(x, RemoteProcessGroup):
                groups.append((len(a.key), x))
                a.key.append(("pg", x.dims))
                return x
            if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
                a.key.append((type(x), len(x)))
                return type(x)(enc(v) for v in x)
            if isinstance(x, dict):
                a.key.append((dict, tuple(x)))
                return {k: enc(v) for k, v in x.items()}
            return _enc(x, a)

        eargs = [enc(x) for x in args]
        ekwargs = {k: enc(v) for k, v in kwargs.items()}
        view = current_view()
        if view is None:
            if a.tensors:
                view = a.tensors[0]._view
            elif groups:
                view = engine_of(groups[0][1].mesh).view(groups[0][1].mesh)
            else:
                raise ValueError(
                    f"{self._name}: no mesh is active to run the remote function on; call it "
                    "inside `with proc_mesh.activate():` (or pass it monarch tensors)"
                )
        problems: list[tuple[str, str]] = []
        for i, t in enumerate(a.tensors):
            if t._h.dropped:
                problems.append((f"tensor argument {i}", DROPPED))
            elif t._view.engine is not view.engine or t._view.slot != view.slot:
                problems.append((f"tensor argument {i}", WRONG_MESH))
            elif t._stream is not a.stream:
                problems.append(
                    (f"tensor argument {i} (on {t._stream}, active: {a.stream})", WRONG_STREAM)
                )
            elif not access_of(t) & READ:
                problems.append((_borrowed_where(f"tensor argument {i}", t), BORROWED))
            elif t.requires_grad and torch.is_grad_enabled():
                problems.append((f"tensor argument {i}", REQUIRES_GRAD))
        if a.bad and not problems:
            problems.append(("an argument", LOCAL_TENSOR))
        if problems:
            raise bad_arguments(f"the remote function {self._name}", problems)
        engine = view.engine
        engine.check()
        if groups:
            with engine.lock:
                for _, g in groups:
                    gview = engine.view(g.mesh)
                    engine.define_view(view, gview)

            def to_ref(x: Any) -> Any:
                if isinstance(x, RemoteProcessGroup):
                    return wire.GroupRef(engine.view(x.mesh).vid, x.dims)
                if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
                    return type(x)(to_ref(v) for v in x)
                if isinstance(x, dict):
                    return {k: to_ref(v) for k, v in x.items()}
                return x

            eargs = to_ref(eargs)
            ekwargs = to_ref(ekwargs)
        return view, eargs, ekwargs, a

    # --- calling as tensors ---------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.rref(*args, **kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every rank of the active mesh; the result's tensors are monarch
        tensors (their shapes come from ``propagate``)."""
        view, eargs, ekwargs, a = self._encode(args, kwargs, "call")
        engine = view.engine
        fid = engine.fn_id(("remote", self._spec), self._spec)
        propagate = self._propagate
        if propagate == "inspect":
            return self._run_inspect(view, fid, eargs, ekwargs)
        if callable(propagate):
            described = _propagate_fake(propagate, args, kwargs)
        else:
            key: Any = tuple(_hashable(k) for k in a.key)
            try:
                described = self._cache.get(key)
            except TypeError:
                key, described = None, None
            if described is None:
                described = self._propagate_remote(view, args, kwargs)
                if key is not None:
                    self._cache[key] = described
        result, outs = _tensors_of(described, view)
        with engine.lock:
            seq = engine.next_seq()
            engine.issue(
                view, wire.Call(seq, fid, eargs, ekwargs, outs, None), fid, _client_frames()
            )
        return result

    def _propagate_remote(self, view: View, args: Any, kwargs: Any) -> Any:
        """Run the function once on rank 0 with placeholder tensors to learn the
        shapes of its outputs."""

        def meta(x: Any) -> Any:
            if isinstance(x, Tensor):
                size, stride, _, dtype, device = x._meta
                return wire.TensorMeta(size, stride, dtype, str(device))
            return x

        margs, mkwargs = tree_map(meta, (list(args), kwargs))
        return _ask_first_rank(view, "propagate", self._spec, margs, mkwargs)

    def _run_inspect(self, view: View, fid: int, eargs: Any, ekwargs: Any) -> Any:
        no_coalescing(f"the remote function {self._name} with propagate='inspect'")
        engine = view.engine
        whole = engine.new_ref()
        with engine.lock:
            seq = engine.next_seq()
            engine.issue(
                view, wire.Call(seq, fid, eargs, ekwargs, [], whole.id), fid, _client_frames()
            )
        engine.flush()
        described = _ask_first_rank(view, "describe", whole.id, [get_active_stream().sid])
        if isinstance(described, wire.Failure):
            engine.dropped(view.slot, whole.id)
            raise _remote_error(view, described)
        result, outs = _tensors_of(described, view)
        with engine.lock:
            seq = engine.next_seq()
            engine.issue(view, wire.Unpack(seq, whole.id, outs), 0, None)
        engine.dropped(view.slot, whole.id)
        return result

    # --- calling for values (the endpoint adverbs) -----------------------------------------

    def _values(self, adverb: str, args: Any, kwargs: Any) -> Any:
        no_coalescing(f"{self._name}.{adverb}(...)")
        view, eargs, ekwargs, _ = self._encode(args, kwargs, adverb)
        view.engine.flush()
        assert view.workers is not None
        endpoint = view.workers.call_function
        return getattr(endpoint, adverb)(self._spec, eargs, ekwargs, [get_active_stream().sid])

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every rank of the active mesh; a future of the ``ValueMesh`` of the
        values returned."""
        return self._values("call", args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the one rank of the active mesh; a future of its value."""
        return self._values("call_one", args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        """Run on one rank of the active mesh, chosen for you; a future of its value."""
        return self._values("choose", args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every rank; an iterator of futures, in order of arrival."""
        return self._values("stream", args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every rank, not waiting for anything back."""
        self._values("broadcast", args, kwargs)

    def _send_to_port(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], port: Any, selection: str
    ) -> None:
        """``monarch.actor.send(remote_fn, args, kwargs, port=...)``: run on the active
        mesh (every rank, or one with ``selection="choose"``), each value to ``port``."""
        from monarch._src.actor.channel import send

        view, eargs, ekwargs, _ = self._encode(args, kwargs, "send")
        view.engine.flush()
        assert view.workers is not None
        sids = [get_active_stream().sid]
        send(view.workers.call_function, (self._spec, eargs, ekwargs, sids), {}, port, selection)  # type: ignore[arg-type]


def _tensors_of(described: Any, view: View) -> tuple[Any, list[int]]:
    """A propagation's answer with each ``TensorMeta`` replaced by a new monarch tensor
    on ``view``, and the refs of those tensors (in pytree order)."""
    engine = view.engine
    outs: list[int] = []

    def build(x: Any) -> Any:
        if isinstance(x, wire.TensorMeta):
            ref = engine.new_ref()
            outs.append(ref.id)
            meta = (tuple(x.size), tuple(x.stride), 0, x.dtype, torch.device(x.device))
            return Tensor._new(meta, view, ref)
        return x

    return tree_map(build, described), outs


def _ask_first_rank(view: View, endpoint: str, *args: Any) -> Any:
    """Call a worker endpoint on the first rank of ``view`` and wait for its answer
    (bounded by ``tensor_collective_timeout``)."""
    from monarch._src import config

    timeout = float(config.get("tensor_collective_timeout"))
    worker = view.engine.workers_at(view, view.shape.ranks()[0])
    return getattr(worker, endpoint).call_one(*args).get(timeout=timeout)


def _hashable(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return id(x)
    return x


def _propagate_fake(propagate: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run ``propagate`` on fake tensors; its tensors become metadata. (Its own
    operations are not recorded on the active mesh.)"""
    mode = _torch.fake_mode()
    with _torch.disable_modes(), mode:

        def to_fake(x: Any) -> Any:
            if isinstance(x, Tensor):
                return _torch.fake_of(x._meta)
            return x

        fargs, fkwargs = tree_map(to_fake, (list(args), kwargs))
        out = propagate(*fargs, **fkwargs)

    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return wire.TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
        return x

    return tree_map(meta, out)


@overload
def remote(fn: Callable[..., Any] | str, *, propagate: Any = None) -> Remote: ...
@overload
def remote(fn: None = None, *, propagate: Any = None) -> Callable[[Callable[..., Any]], Remote]: ...
def remote(fn: Any = None, *, propagate: Any = None) -> Any:
    """A remote function: ``remote(fn)``, ``remote("module.fn")``, ``@remote`` or
    ``@remote(propagate=...)``. Called under an active mesh it runs on every rank and
    returns monarch tensors; ``.call``/``.call_one``/``.broadcast``/``.choose``/``.stream``
    return its values as endpoints do.

    ``propagate`` says how the shapes of its outputs are learned: ``None``/``"cached"``
    runs it once on rank 0 with zero tensors of the inputs' shapes (cached per input
    shapes); ``"inspect"`` runs it and reads the real outputs' shapes from rank 0 (a
    round trip per call); a function computes them from (fake) inputs on the client.

    A function goes to the workers by the name ``monarch.function_resolvers`` gives it
    (by default: its module and qualified name, when they lead back to it), else by
    value (pickled); ``"module.function"`` / ``"module:qualified.name"`` name it directly.
    """
    if fn is None:
        return lambda f: Remote(f, propagate)
    return Remote(fn, propagate)


# --- the tensor side of proc meshes ---------------------------------------------------------


def rank_tensor(mesh: ProcMesh, dims: str | Sequence[str]) -> Tensor:
    """A monarch tensor on ``mesh`` holding each rank's coordinate along ``dims``
    (row-major over several), an int64 scalar."""
    engine = engine_of(mesh)
    view = engine.view(mesh)
    names = _check_dims(view, dims, "rank_tensor")
    engine.check()
    meta = ((), (), 0, torch.int64, torch.device("cpu"))
    out = Tensor._new(meta, view, engine.new_ref())
    with engine.lock:
        engine.define_view(view, view)
        seq = engine.next_seq()
        engine.issue(view, wire.Rank(seq, out._h.ref.id, view.vid, names), 0, _client_frames())
    return out


def to_table(mesh: ProcMesh) -> str:
    """A text table of ``mesh``: one row per rank, its coordinates and global rank."""
    shape = mesh._shape
    labels = shape.labels
    header = [*labels, "rank"]
    rows = []
    for rank in shape.ranks():
        point = shape.coordinates(rank)
        rows.append([str(point[label]) for label in labels] + [str(rank)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=False))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) for r in rows]
    return "\n".join(out)


# The collective methods of a monarch tensor run these (no tensor exists before this
# module is imported: activating a mesh imports it).
register_collectives(
    TensorCollectives(reduce_one=_reduce_one, to_mesh_one=_to_mesh_one, slice_mesh=slice_mesh)
)
