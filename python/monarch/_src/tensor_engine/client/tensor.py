"""``monarch.Tensor``, recording of torch operations, and mesh activation.

A :class:`Tensor` is a torch tensor subclass with metadata (shape, strides, dtype,
device) and no data: its values live on the workers of the mesh it is bound to, under
its ref. Every torch operation on monarch tensors (and, under ``mesh.activate()``,
every torch operation at all, factories included) goes through :func:`record`:

1. the arguments are checked (no local tensors, one mesh, nothing dropped) and encoded
   with tensors replaced by refs;
2. the outputs' metadata come from a cache keyed by the operator and, per argument, the
   tensor metadata or the value; a miss runs the operator on fake tensors
   (``FakeTensorMode``) once;
3. the command is buffered on the engine, with the client line that issued it (for
   errors), and the output tensors are returned.

Autograd runs on the client, above this: a backward pass records its operations the
same way.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from monarch._src.actor import extensions as _extensions
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client import _torch
from monarch._src.tensor_engine.client import stream as _stream_module
from monarch._src.tensor_engine.client.stream import Borrow
from monarch._src.tensor_engine.client.stream import _stack as _streams
from monarch._src.tensor_engine.errors import (
    BORROWED,
    DROPPED,
    LOCAL_TENSOR,
    MUTATING_BORROW,
    WRONG_MESH,
    WRONG_STREAM,
    bad_arguments,
)

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh
    from monarch._src.tensor_engine.client.engine import Engine, View
    from monarch._src.tensor_engine.client.stream import Stream

__all__ = [
    "Tensor",
    "TensorCollectives",
    "activate",
    "borrow",
    "current_view",
    "deactivate",
    "end_borrow",
    "get_active_mesh",
    "no_mesh",
    "record",
    "register_collectives",
]

_aten = torch.ops.aten

#: Operators whose result depends on the data: they cannot run on the client.
_DATA_DEPENDENT = {
    _aten._local_scalar_dense.default,
    _aten.item.default,
    _aten.equal.default,
    _aten.is_nonzero.default,
}

#: Operators that turn a local tensor into a tensor of the active mesh (``torch.tensor``
#: under ``activate()``): the data is sent with the command.
_LIFT = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default}


class _Handle:
    """The ref of one tensor and its lifetime: when the last client tensor with it is
    gone, the workers free the value (on the tensor's stream ``sid``)."""

    __slots__ = ("__weakref__", "dropped", "engine", "ref", "sid", "slot")

    def __init__(self, engine: Engine, ref: wire.Ref, slot: int, sid: int) -> None:
        self.engine = engine
        self.ref = ref
        self.slot = slot
        self.sid = sid
        self.dropped = False

    def drop(self) -> None:
        if not self.dropped:
            self.dropped = True
            self.engine.dropped(self.slot, self.ref.id, self.sid)

    def __del__(self) -> None:
        if not self.dropped:
            try:
                self.engine.dropped(self.slot, self.ref.id, self.sid)
            except Exception:
                pass  # interpreter exit


#: Access bits of a tensor's storage (``_Aliases.access``).
READ = 1
WRITE = 2
READ_WRITE = READ | WRITE


class _Aliases:
    """What the tensors sharing one storage (a tensor and its views) may do while
    borrows of them live: ``access`` (:data:`READ` / :data:`WRITE` bits), the live
    borrows of this storage, and, for a borrowed tensor, the borrow it came from."""

    __slots__ = ("access", "borrows", "source")

    def __init__(self, access: int = READ_WRITE, source: Borrow | None = None) -> None:
        self.access = access
        #: Weak: a borrow nobody holds is collected, and its ``__del__`` drops it.
        self.borrows: weakref.WeakSet[Borrow] = weakref.WeakSet()
        self.source = source

    def recompute(self) -> None:
        base = READ if self.source is not None and not self.source.mutable else READ_WRITE
        if any(b.mutable for b in self.borrows):
            self.access = 0
        elif self.borrows:
            self.access = base & READ
        else:
            self.access = base


@dataclass(frozen=True)
class TensorCollectives:
    """What the methods ``reduce``, ``reduce_``, ``to_mesh`` and ``slice_mesh`` of a
    :class:`Tensor` run: the module of the public functions
    (:mod:`monarch._src.tensor_engine.client.api`) registers them when it is imported, which is
    before any tensor exists (activating a mesh imports it)."""

    #: ``reduce_one(t, dims, reduction, scatter, mesh, out)``.
    reduce_one: Callable[..., Tensor]
    #: ``to_mesh_one(t, view, mesh, stream)``.
    to_mesh_one: Callable[..., Tensor]
    #: ``slice_mesh(t, **coords)``.
    slice_mesh: Callable[..., Any]


_collectives: TensorCollectives | None = None


def register_collectives(collectives: TensorCollectives) -> None:
    """Register what the collective methods of a :class:`Tensor` run."""
    global _collectives
    _collectives = collectives


def _the_collectives() -> TensorCollectives:
    if _collectives is None:
        raise RuntimeError(
            "the collectives of monarch tensors are not loaded: activate a mesh with "
            "ProcMesh.activate() (which loads them) before using a tensor's reduce, "
            "to_mesh or slice_mesh"
        )
    return _collectives


class Tensor(torch.Tensor):
    """A distributed tensor: one shard per proc of the mesh it lives on (``mesh``).

    Torch operations on it run on every proc of its mesh; its values come back only
    through ``monarch.fetch_shard`` / ``monarch.inspect``. ``drop()`` frees it on every
    worker now (garbage collection does the same later).
    """

    _h: _Handle
    _view: View
    _meta: _torch.Meta
    _stream: Stream
    #: ``None`` until a borrow or a view needs it (most tensors never do): read and
    #: write, no borrows.
    _aliases: _Aliases | None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def _new(
        meta: _torch.Meta,
        view: View,
        ref: wire.Ref,
        stream: Stream | None = None,
        aliases: _Aliases | None = None,
    ) -> Tensor:
        """A tensor on ``stream`` (default: the active one), sharing the storage
        permissions ``aliases`` (default: its own)."""
        t: Tensor = _torch.make_wrapper(Tensor, meta)
        if stream is None:
            stream = _streams[-1]
        t._meta = meta
        t._view = view
        t._stream = stream
        t._aliases = aliases
        engine = view.engine
        t._h = _Handle(engine, ref, view.slot, stream.sid)
        if engine.tracks_meta:
            engine.tensor_made(ref.id, meta)
        return t

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        return record(func, args, kwargs or {}, None)

    @property
    def mesh(self) -> ProcMesh:
        """The mesh (a proc mesh view) this tensor lives on."""
        return self._view.mesh

    @property
    def ref(self) -> int:
        """The id of this tensor's value on the workers."""
        return self._h.ref.id

    @property
    def stream(self) -> Stream:
        """The stream this tensor belongs to (where operations on it run)."""
        return self._stream

    @property
    def dropped(self) -> bool:
        """Whether :meth:`drop` has freed this tensor on the workers (using it again
        raises ``TypeError``)."""
        return self._h.dropped

    def drop(self) -> None:
        """Free this tensor on every worker now; using it afterwards raises
        ``TypeError`` (DROPPED)."""
        self._h.drop()

    def reduce(
        self,
        dims: str | Sequence[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
        out: Tensor | None = None,
    ) -> Tensor:
        """A collective over the mesh dimensions ``dims`` (see ``monarch.reduce``)."""
        return _the_collectives().reduce_one(self, dims, reduction, scatter, mesh, out)

    def reduce_(
        self,
        dims: str | Sequence[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> Tensor:
        """``reduce`` into this tensor."""
        return _the_collectives().reduce_one(self, dims, reduction, scatter, mesh, self)

    def to_mesh(self, mesh: ProcMesh, stream: Stream | None = None) -> Tensor:
        """This tensor on ``mesh``: each rank of ``mesh`` gets the shard of the rank at
        the same position (or, from a one-rank source, the only shard). The result
        belongs to ``stream`` (default: this tensor's stream), which receives it while
        this tensor's stream sends it."""
        return _the_collectives().to_mesh_one(self, self._view, mesh, stream)

    def slice_mesh(self, **coords: int | slice) -> Any:
        """The shards of part of this tensor's mesh, to move with ``.to_mesh(...)``."""
        return _the_collectives().slice_mesh(self, **coords)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        state = "dropped, " if self._h.dropped else ""
        on = "" if self._stream.sid == 0 else f", stream={self._stream.name!r}"
        return (
            f"monarch.Tensor({state}shape={tuple(self._meta[0])}, dtype={self.dtype}, "
            f"device={self.device}, mesh={dict(self._view.shape.extent)}{on}, "
            f"ref={self._h.ref.id})"
        )

    __str__ = __repr__

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "a monarch.Tensor cannot be pickled: its data lives on the workers. Pass it to "
            "a remote function (monarch.remote), or fetch a shard first "
            "(monarch.fetch_shard(t).get())"
        )

    def __deepcopy__(self, memo: Any) -> Any:
        return self.clone()


def _keep_argument_errors(name: str) -> Any:
    """Torch's Python operators turn a ``TypeError`` into ``NotImplemented`` (Python
    then reports only "unsupported operand type(s)"); re-raise the engine's own
    bad-argument error instead, which names each bad argument."""
    base: Any = getattr(torch.Tensor, name)

    def operator(self: Any, other: Any) -> Any:
        _local.argument_error = None
        result = base(self, other)
        if result is NotImplemented:
            error = _take_argument_error()
            if error is not None:
                raise error
        return result

    operator.__name__ = name
    return operator


def _take_argument_error() -> TypeError | None:
    error = _local.argument_error
    _local.argument_error = None
    return error


for _name in (
    *(f"__{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
    *(f"__{op}__" for op in ("matmul", "and", "or", "xor", "lshift", "rshift")),
    *(f"__r{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
    *(f"__r{op}__" for op in ("matmul", "and", "or", "xor", "lshift", "rshift")),
    *(f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
    *(f"__i{op}__" for op in ("and", "or", "xor", "lshift", "rshift")),
    *(f"__{op}__" for op in ("eq", "ne", "lt", "le", "gt", "ge")),
):
    if hasattr(torch.Tensor, _name):
        setattr(Tensor, _name, _keep_argument_errors(_name))


# --- activation -------------------------------------------------------------------------


class _Local(threading.local):
    def __init__(self) -> None:
        #: (mesh or None for no_mesh, its view, the dispatch mode pushed)
        self.stack: list[tuple[Any, Any, Any]] = []
        #: The last bad-argument error raised (see ``_keep_argument_errors``).
        self.argument_error: TypeError | None = None


_local = _Local()


class _RecordingMode(_torch.TorchDispatchMode):  # type: ignore[misc]
    """Under an active mesh: every torch operation is recorded on it."""

    def __init__(self, view: View) -> None:
        super().__init__()
        self.view = view

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        return record(func, args, kwargs or {}, self.view)


class _LocalMode(_torch.TorchDispatchMode):  # type: ignore[misc]
    """Under ``no_mesh.activate()``: torch runs locally (monarch tensors still go to
    their mesh)."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        with _torch.disable_modes():
            return func(*args, **(kwargs or {}))


class Activation:
    """What ``mesh.activate()`` returns: already active; ``with`` (or
    :meth:`deactivate`) ends it."""

    def __init__(self, mesh: Any, mode: Any) -> None:
        self.mesh = mesh
        self._mode = mode
        self._active = True

    def __enter__(self) -> Any:
        return self.mesh

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def deactivate(self) -> None:
        if not self._active:
            return
        stack = _local.stack
        if not stack or stack[-1][2] is not self._mode:
            raise RuntimeError(
                "deactivate(): this activation is not the innermost one; end the "
                "activations made after it first (activations nest like `with` blocks)"
            )
        self._active = False
        stack.pop()
        self._mode.__exit__(None, None, None)


def activate(mesh: ProcMesh | None) -> Activation:
    """Make ``mesh`` the active mesh (``None``: no mesh, local torch) until the
    returned activation ends."""
    from monarch._src.tensor_engine.client.engine import engine_of

    if mesh is None:
        mode: Any = _LocalMode()
        view = None
    else:
        engine = engine_of(mesh)
        engine.check()
        view = engine.view(mesh)
        mode = _RecordingMode(view)
    mode.__enter__()
    _local.stack.append((mesh, view, mode))
    return Activation(mesh, mode)


def deactivate(mesh: ProcMesh) -> None:
    """End the innermost activation, which must be of ``mesh``."""
    stack = _local.stack
    if not stack or stack[-1][0] is None or stack[-1][1].shape != mesh._shape:
        raise RuntimeError(
            f"deactivate(): {mesh!r} is not the innermost active mesh; deactivate "
            "activations in the reverse order of activating them"
        )
    _, _, mode = stack.pop()
    mode.__exit__(None, None, None)


def current_view() -> View | None:
    """The active mesh's view, or ``None`` (no mesh, or ``no_mesh``)."""
    stack = _local.stack
    return stack[-1][1] if stack else None


def get_active_mesh() -> ProcMesh:
    """The mesh activated innermost (``ValueError`` if none)."""
    stack = _local.stack
    if not stack or stack[-1][0] is None:
        raise ValueError(
            "no mesh is active: activate one with `with proc_mesh.activate():` (or call "
            "`proc_mesh.activate()`)"
        )
    return stack[-1][0]  # type: ignore[no-any-return]


class _NoMesh:
    """``monarch.no_mesh``: ``with no_mesh.activate():`` runs local torch inside an
    active mesh's block."""

    def activate(self) -> Activation:
        return activate(None)

    def __repr__(self) -> str:
        return "monarch.no_mesh"


no_mesh = _NoMesh()


# --- recording --------------------------------------------------------------------------

#: (operator, argument key) -> how to build the outputs (see ``_infer``).
_cache: dict[Any, Any] = {}

_SKIP_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(__file__) + os.sep,
    os.path.dirname(os.path.abspath(threading.__file__)) + os.sep + "contextlib.py",
)
_skip_code: dict[Any, bool] = {}


def _client_frames() -> list[tuple[str, int, str]]:
    """Where user code issued the current operation: up to 3 frames outside torch and
    the engine, innermost first reversed to the usual order."""
    f: Any = sys._getframe(2)
    out: list[tuple[str, int, str]] = []
    skip = _skip_code
    while f is not None and len(out) < 3:
        code = f.f_code
        s = skip.get(code)
        if s is None:
            s = code.co_filename.startswith(_SKIP_DIRS)
            skip[code] = s
        if not s:
            out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    out.reverse()
    return out


class _Args:
    """What encoding the arguments of one operation found."""

    __slots__ = ("bad", "key", "limited", "stream", "tensors")

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.key: list[Any] = []
        self.bad = False
        #: Some tensor's storage is borrowed (reads or writes may be forbidden).
        self.limited = False
        self.stream = _streams[-1]


def _enc(x: Any, a: _Args) -> Any:
    if isinstance(x, Tensor):
        h = x._h
        if h.dropped or x._stream is not a.stream:
            a.bad = True
        al = x._aliases
        if al is not None and al.access != READ_WRITE:
            a.limited = True
        a.tensors.append(x)
        a.key.append(x._meta)
        return h.ref
    tx = type(x)
    if tx is list or tx is tuple:
        a.key.append((tx, len(x)))
        return tx([_enc(v, a) for v in x])
    if isinstance(x, torch.Tensor):
        a.bad = True
        a.key.append(x)
        return x
    a.key.append((tx, x))
    return x


def _problems(
    args: Sequence[Any], kwargs: dict[str, Any], view: View, stream: Stream
) -> list[tuple[str, str]]:
    """Every bad argument, named (the slow path, once something is wrong)."""
    out: list[tuple[str, str]] = []

    def walk(x: Any, where: str) -> None:
        if isinstance(x, Tensor):
            if x._h.dropped:
                out.append((where, DROPPED))
            elif x._view.engine is not view.engine or x._view.slot != view.slot:
                out.append((where, WRONG_MESH))
            elif x._stream is not stream:
                out.append((f"{where} (on {x._stream}, active: {stream})", WRONG_STREAM))
            elif not access_of(x) & READ:
                out.append((_borrowed_where(where, x), BORROWED))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
        elif isinstance(x, torch.Tensor):
            out.append((where, LOCAL_TENSOR))

    for i, v in enumerate(args):
        walk(v, f"argument {i}")
    for k, v in kwargs.items():
        walk(v, f"argument {k!r}")
    return out


def record(func: Any, args: Sequence[Any], kwargs: dict[str, Any], view: View | None) -> Any:
    """Record ``func(*args, **kwargs)`` on ``view`` (or the view of its tensors) and
    return its outputs as monarch tensors."""
    a = _Args()
    eargs = [_enc(x, a) for x in args]
    ekwargs = {}
    for k, v in kwargs.items():
        a.key.append(k)
        ekwargs[k] = _enc(v, a)
    tensors = a.tensors
    if not tensors and a.bad:
        # Only local tensors (values fetched back, say): local torch, except for
        # ``torch.tensor(data)``, which makes a tensor of the active mesh.
        if func in _LIFT and view is not None:
            return _lift(func, args, view)
        with _torch.disable_modes():
            return func(*args, **kwargs)
    if func in _DATA_DEPENDENT:
        raise RuntimeError(
            f"{func} needs the value of a monarch tensor, which lives on the workers; "
            "fetch it first: `monarch.inspect(t)` (or `monarch.fetch_shard(t).get()`)"
        )
    if view is None:
        view = tensors[0]._view
    engine = view.engine
    if (
        a.bad
        or a.limited
        or any(t._view.slot != view.slot or t._view.engine is not engine for t in tensors)
    ):
        problems = _problems(args, kwargs, view, a.stream)
        if problems:
            error = bad_arguments(str(func), problems)
            _local.argument_error = error
            raise error
    engine.check()
    key: Any = (func, *a.key)
    try:
        spec = _cache.get(key)
    except TypeError:  # an unhashable argument: infer every time
        key = None
        spec = None
    if spec is None:
        spec = _infer(func, args, kwargs, tensors)
        if key is not None:
            _cache[key] = spec
    if a.limited:
        _check_writes(func, spec, tensors)
    outs: list[int] = []
    new_ref = engine.new_ref
    stream = a.stream
    shared = aliases_of(tensors[0]) if tensors and _is_view_op(func) else None

    def build(s: tuple[Any, ...]) -> Any:
        kind = s[0]
        if kind == "new":
            ref = new_ref()
            outs.append(ref.id)
            return Tensor._new(s[1], view, ref, stream, shared)
        if kind == "in":
            t = tensors[s[1]]
            outs.append(t._h.ref.id)
            return t
        return s[1]

    shape = spec[0]
    if shape == "local":
        with _torch.disable_modes():
            return func(*args, **kwargs)
    if shape == "one":
        result: Any = build(spec[1])
    elif shape == "seq":
        result = spec[1](build(s) for s in spec[2])
    else:
        result = spec[1]
    writes = tuple(tensors[i]._h.ref.id for i in spec[3]) if spec[3] else ()
    fid = engine.fn_id(func, _op_spec(func))
    with engine.lock:
        seq = engine.next_seq()
        engine.issue(view, wire.Op(seq, fid, eargs, ekwargs, outs, writes), fid, _client_frames())
    return result


def _op_spec(func: Any) -> tuple[Any, ...]:
    return ("op", func.namespace, func._opname, func._overloadname)


#: operator -> whether its outputs are views of its first input.
_view_ops: dict[Any, bool] = {}


def _is_view_op(func: Any) -> bool:
    known = _view_ops.get(func)
    if known is None:
        try:
            returns = func._schema.returns
            known = any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        except Exception:
            known = False
        _view_ops[func] = known
    return known


def _written(spec: Any, tensors: list[Tensor]) -> list[Tensor]:
    """The input tensors an operator writes (in place, ``out=``, or without outputs)."""
    entries: list[Any] = []
    if spec[0] == "one":
        entries = [spec[1]]
    elif spec[0] == "seq":
        entries = list(spec[2])
    out = [tensors[e[1]] for e in entries if e[0] == "in"]
    out += [tensors[i] for i in spec[3]]
    return out


def _check_writes(func: Any, spec: Any, tensors: list[Tensor]) -> None:
    problems = [
        (_borrowed_where(f"argument {tensors.index(t)}", t), MUTATING_BORROW)
        for t in _written(spec, tensors)
        if not access_of(t) & WRITE
    ]
    if problems:
        error = bad_arguments(str(func), problems)
        _local.argument_error = error
        raise error


def check_use(tensors: Sequence[Tensor], what: str, written: Sequence[Tensor] = ()) -> None:
    """Raise ``TypeError`` if ``tensors`` cannot be used on the active stream (another
    stream's, or borrowed away) or ``written`` cannot be written (borrowed read-only)."""
    stream = _streams[-1]
    problems: list[tuple[str, str]] = []
    for i, t in enumerate(tensors):
        problem = use_problem(t, i, stream, "active")
        if problem is not None:
            problems.append(problem)
    for t in written:
        if not access_of(t) & WRITE:
            problems.append((_borrowed_where("the output", t), MUTATING_BORROW))
    if problems:
        raise bad_arguments(what, problems)


def use_problem(t: Tensor, i: int, stream: Any, whose: str) -> tuple[str, str] | None:
    """Why tensor ``i`` cannot be read by a command on ``stream`` (``whose`` names that
    stream in the message: "active", "the call's"), or ``None``."""
    if t._stream is not stream:
        return (f"tensor {i} (on {t._stream}, {whose}: {stream})", WRONG_STREAM)
    if not access_of(t) & READ:
        return (_borrowed_where(f"tensor {i}", t), BORROWED)
    return None


def access_of(t: Tensor) -> int:
    """What ``t`` may be used for now (:data:`READ` / :data:`WRITE` bits)."""
    aliases = t._aliases
    return READ_WRITE if aliases is None else aliases.access


def aliases_of(t: Tensor) -> _Aliases:
    """``t``'s storage permissions, made on first need."""
    aliases = t._aliases
    if aliases is None:
        aliases = t._aliases = _Aliases()
    return aliases


def _borrowed_where(where: str, t: Tensor) -> str:
    """``where``, with where the borrows of ``t``'s storage were made."""
    aliases = t._aliases
    if aliases is None:
        return where
    if aliases.source is not None and aliases.source.dropped:
        return f"{where} (a view of a borrowed tensor whose borrow was dropped)"
    borrows = list(aliases.borrows)
    if aliases.source is not None:
        borrows.append(aliases.source)
    if not borrows:
        return where
    made = "; ".join(
        f"{'mutable' if b.mutable else 'read-only'} borrow to {b.stream} made at "
        + (f"{b._frames[-1][0]}:{b._frames[-1][1]}" if b._frames else "?")
        for b in borrows
    )
    return f"{where} ({made})"


# --- borrows ----------------------------------------------------------------------------


def borrow(to: Stream, t: Tensor, mutable: bool) -> tuple[Tensor, Borrow]:
    """``to.borrow(t, mutable)`` (see ``Stream.borrow``)."""
    what = f"{to}.borrow(t, mutable={mutable})"
    if not isinstance(t, Tensor):
        raise bad_arguments(what, [("t", LOCAL_TENSOR)])
    if t._h.dropped:
        raise bad_arguments(what, [("t", DROPPED)])
    if t._stream is to:
        raise ValueError(
            f"{what}: the tensor is already on {to}; borrow a tensor of another stream"
        )
    access = access_of(t)
    if not access & READ:
        raise bad_arguments(what, [(_borrowed_where("t", t), BORROWED)])
    if mutable and not access & WRITE:
        raise bad_arguments(what, [(_borrowed_where("t", t), MUTATING_BORROW)])
    view = t._view
    engine = view.engine
    engine.check()
    frames = _client_frames()
    ref = engine.new_ref()
    b = Borrow(t, None, mutable, to, frames)  # type: ignore[arg-type]
    mine = _Aliases(READ_WRITE if mutable else READ, b)
    borrowed = Tensor._new(t._meta, view, ref, to, mine)
    b.borrowed = borrowed
    with engine.lock:
        token = engine.new_token()
        engine.issue(view, wire.Signal(token), 0, None, t._stream)
        engine.issue(view, wire.Wait(token), 0, None, to)
        seq = engine.next_seq()
        engine.issue(view, wire.Alias(seq, ref.id, t._h.ref.id), 0, frames, to)
    origin = aliases_of(t)
    origin.borrows.add(b)
    origin.recompute()
    return borrowed, b


def end_borrow(b: Borrow) -> None:
    """``b.drop()``: drop the borrowed tensor on the borrowing stream and make the
    origin stream wait for that stream's use of it."""
    origin = b.origin
    view = origin._view
    engine = view.engine
    borrowed = b.borrowed
    try:
        if engine.failure is None and not engine.closed:
            with engine.lock:
                token = engine.new_token()
                engine.issue(view, wire.Signal(token), 0, None, b.stream)
                borrowed._h.drop()
                engine.issue(view, wire.Wait(token), 0, None, origin._stream)
        else:
            borrowed._h.drop()
    finally:
        aliases_of(borrowed).access = 0
        aliases = aliases_of(origin)
        aliases.borrows.discard(b)
        aliases.recompute()


def _lift(func: Any, args: Sequence[Any], view: View) -> Any:
    """``torch.tensor(data)`` under an active mesh: the data goes with the command."""
    local = args[0]
    engine = view.engine
    engine.check()
    ref = engine.new_ref()
    fid = engine.fn_id(_aten.clone.default, _op_spec(_aten.clone.default))
    out = Tensor._new(_torch.meta_of(local), view, ref, _streams[-1])
    with engine.lock:
        seq = engine.next_seq()
        engine.issue(
            view, wire.Op(seq, fid, [local.detach()], {}, [ref.id], ()), fid, _client_frames()
        )
    return out


def _infer(func: Any, args: Sequence[Any], kwargs: dict[str, Any], tensors: list[Tensor]) -> Any:
    """How to build ``func``'s outputs, from a run on fake tensors: ``(shape, ...)``
    where each output is ``("new", meta)``, ``("in", i)`` (the i-th input tensor,
    written in place) or ``("const", value)``; the last item lists the inputs an
    operator without outputs writes."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.utils._pytree import tree_map

    if func.namespace == "profiler" and not tensors:
        # The profiler's bookkeeping (record_function) stays in this process.
        return ("local", None, None, ())
    quick = _infer_on_meta(func, args, kwargs, tensors)
    if quick is not None:
        return quick
    mode = _torch.fake_mode()
    fakes: dict[int, torch.Tensor] = {}
    with mode:

        def to_fake(x: Any) -> Any:
            if isinstance(x, Tensor):
                f = fakes.get(id(x))
                if f is None:
                    f = _torch.fake_of(x._meta)
                    fakes[id(x)] = f
                return f
            return x

        fargs, fkwargs = tree_map(to_fake, (list(args), kwargs))
        # A bad call (shapes that do not match...) raises here, at the caller's line;
        # torch would also log it at ERROR level.
        log = logging.getLogger("torch._subclasses.fake_tensor")
        was_disabled = log.disabled
        log.disabled = True
        try:
            out = func(*fargs, **fkwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise RuntimeError(
                f"{func} has outputs whose shape or value depends on the data, which lives "
                "on the workers; it cannot be recorded. Compute it in a remote function "
                f"(monarch.remote) or fetch the inputs first ({type(e).__name__})"
            ) from None
        finally:
            log.disabled = was_disabled
    index = {id(fakes[id(t)]): i for i, t in enumerate(tensors)}

    def spec_of(o: Any) -> tuple[Any, ...]:
        if isinstance(o, torch.Tensor):
            i = index.get(id(o))
            if i is not None:
                if _torch.meta_of(o) != tensors[i]._meta:
                    raise RuntimeError(
                        f"{func} changes the shape or strides of a monarch tensor in place, "
                        "which is not supported; use the out-of-place form"
                    )
                return ("in", i)
            return ("new", _torch.meta_of(o))
        return ("const", o)

    return _spec(func, args, out, tensors, spec_of)


def _spec(func: Any, args: Sequence[Any], out: Any, tensors: list[Tensor], spec_of: Any) -> Any:
    """The cache entry of an operator's outputs ``out`` (see ``_infer``)."""
    writes: tuple[int, ...] = ()
    if isinstance(out, torch.Tensor):
        return ("one", spec_of(out), None, writes)
    if isinstance(out, (tuple, list)):
        return ("seq", type(out), [spec_of(o) for o in out], writes)
    if out is None and args:
        # In-place operators without outputs (``_foreach_add_``) write their first
        # argument: a failure marks those tensors failed.
        first = args[0]
        items = first if isinstance(first, (list, tuple)) else [first]
        writes = tuple(i for i, t in enumerate(tensors) if any(t is item for item in items))
    return ("const", out, None, writes)


_META = torch.device("meta")


def _infer_on_meta(
    func: Any, args: Sequence[Any], kwargs: dict[str, Any], tensors: list[Tensor]
) -> Any:
    """``_infer`` on meta tensors, which is much cheaper than fake tensors (and needs
    no compiler import): for the operators whose outputs are on the device of their
    inputs, or on the ``device`` they are given. ``None`` when that does not apply or
    the operator has no meta kernel: fake tensors then decide."""
    from torch.utils._pytree import tree_map

    devices = {t._meta[4] for t in tensors}
    given = kwargs.get("device")
    if len(devices) > 1 or kwargs.get("pin_memory"):
        return None
    if given is not None:
        device = torch.device(given)
    elif devices:
        device = next(iter(devices))
    else:
        device = torch.device("cpu")
    metas: dict[int, torch.Tensor] = {}

    def to_meta(x: Any) -> Any:
        if isinstance(x, Tensor):
            m = metas.get(id(x))
            if m is None:
                size, stride, offset, dtype, _ = x._meta
                m = _torch.fake_of((size, stride, offset, dtype, _META))
                metas[id(x)] = m
            return m
        return x

    try:
        with _torch.disable_modes():
            margs, mkwargs = tree_map(to_meta, (list(args), kwargs))
            if given is not None:
                mkwargs["device"] = _META
            out = func(*margs, **mkwargs)
    except Exception:
        return None
    outs = out if isinstance(out, (tuple, list)) else [out]
    if any(isinstance(o, torch.Tensor) and o.device != _META for o in outs):
        return None
    index = {id(metas[id(t)]): i for i, t in enumerate(tensors)}

    def spec_of(o: Any) -> tuple[Any, ...]:
        if isinstance(o, torch.Tensor):
            size, stride, offset, dtype, _ = _torch.meta_of(o)
            i = index.get(id(o))
            if i is not None:
                if (size, stride, offset, dtype) != tensors[i]._meta[:4]:
                    raise RuntimeError(
                        f"{func} changes the shape or strides of a monarch tensor in place, "
                        "which is not supported; use the out-of-place form"
                    )
                return ("in", i)
            return ("new", (size, stride, offset, dtype, device))
        return ("const", o)

    return _spec(func, args, out, tensors, spec_of)


def _check_dims(view: View, dims: str | Sequence[str], what: str) -> tuple[str, ...]:
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    labels = view.shape.labels
    unknown = [d for d in names if d not in labels]
    if unknown or not names:
        raise ValueError(
            f"{what}: dims {list(names)} are not dimensions of the mesh {dict(view.shape.extent)}; "
            f"expected one or more of {labels}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: dims {list(names)} repeat a dimension")
    return names


# Monarch tensors exist from now on: the arguments of an endpoint call or a spawn may hold
# them (see ``monarch._src.actor.extensions``).
_extensions.enable_tensor_arguments()
_stream_module.register_tensor_borrows(
    _stream_module.TensorBorrows(borrow=borrow, end_borrow=end_borrow)
)
