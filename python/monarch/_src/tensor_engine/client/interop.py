"""Distributed tensors and actor endpoints.

Passing monarch tensors to an endpoint of an actor mesh that lives on the same procs
(``actors.method.call(t)``, and ``call_one``, ``choose``, ``stream``, ``broadcast``)
delivers each actor its own shard: the call becomes a command of the tensor engine,
:class:`~monarch._src.tensor_engine.wire.ActorWork`, so each worker runs it after the
commands that produced the tensors. The worker replaces the tensors by its local shards
and sends the call to the actor of the same proc, with the reply port of the client's
call (the client's future gets the replies as for any call). The actor gets a copy of
its shard as it was at that point of the program.

``actors.method.rref(...)`` runs an endpoint as a step of the program: each worker
sends the call to its proc's actor and waits for the result (at most
``tensor_collective_timeout``); the tensors in it become the shards of new monarch
tensors, whose shapes the endpoint's ``propagate`` function gave the client. If the
endpoint raises, those tensors are failed: fetching them raises ``RemoteException``
naming the rank.

Once an actor mesh received such a call (or an rref), this process's later calls to it
without tensors take the same way, on the stream of its last tensor call (see
:func:`_route`): each worker sends them to its proc's actor after the earlier ones, so
the actors see the calls in the order the client issued them, as upstream Monarch.
(While the engine cannot take work, its procs stopped or dead, they go directly.)

Monarch tensors passed to ``ProcMesh.spawn`` as constructor arguments reach each actor
as its local shard too: the spawn's pickled arguments hold a :class:`_SpawnShard` per
tensor, and a ``SpawnArgs`` command has each worker of those
ranks publish copies of its shards under ``token`` in its process, where the actor's
unpickling of its arguments waits for them (at most ``tensor_collective_timeout``).

The payload of the command is a :class:`~monarch._src.tensor_engine.wire.ActorCall` (a
call or an rref) or a :class:`~monarch._src.tensor_engine.wire.SpawnArgs`.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch._src.actor.future import Future
from monarch._src.actor.pickling import loads_parts
from monarch._src.actor.replies import OK, Failed, MeshInfo, decode
from monarch._src.actor.value_mesh import ValueMesh
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client.engine import View
from monarch._src.tensor_engine.client.stream import Stream, get_active_stream
from monarch._src.tensor_engine.client.tensor import (
    Tensor,
    _client_frames,
    current_view,
    use_problem,
)
from monarch._src.tensor_engine.errors import (
    DROPPED,
    WRONG_MESH,
    bad_arguments,
)
from monarch._src.tensor_engine.worker.interop import spawn_shard

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh
    from monarch._src.actor.endpoint import Endpoint

__all__ = ["call", "has_tensors", "rref", "spawn_args"]

_ADVERBS = ("call", "call_one", "choose", "stream", "broadcast")


def has_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the pytree ``(args, kwargs)`` holds a monarch tensor."""
    leaves, _ = tree_flatten((list(args), kwargs))
    return any(isinstance(leaf, Tensor) for leaf in leaves)


# --- the client ---------------------------------------------------------------------------


def _encode(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any], list[Tensor]]:
    """The arguments with each monarch tensor replaced by its ref, and the tensors."""
    leaves, spec = tree_flatten((list(args), kwargs))
    tensors: list[Tensor] = []
    out = []
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            tensors.append(leaf)
            out.append(leaf._h.ref)
        else:
            out.append(leaf)
    eargs, ekwargs = tree_unflatten(out, spec)
    return eargs, ekwargs, tensors


def _view_of(tensors: list[Tensor], qualname: str, active: View | None, stream: Stream) -> View:
    """The view the command runs on: the active mesh's when there is one (every tensor
    must live there), else the tensors' own. Every tensor must be on ``stream`` and
    readable (not lent out by a mutable borrow)."""
    view = active if active is not None else tensors[0]._view
    problems = []
    for i, t in enumerate(tensors):
        if t._h.dropped:
            problems.append((f"tensor {i}", DROPPED))
        elif t._view.engine is not view.engine or t._view.slot != view.slot:
            problems.append((f"tensor {i}", WRONG_MESH))
        else:
            problem = use_problem(t, i, stream, "the call's")
            if problem is not None:
                problems.append(problem)
    if problems:
        raise bad_arguments(f"endpoint {qualname}", problems)
    return view


def _targets(mesh: ActorMesh[Any], view: View, qualname: str, exact: bool) -> dict[int, int]:
    """Global rank -> index in ``mesh`` of each of its actors, after checking that they
    live on the procs of ``view`` (all of them, when ``exact``)."""
    ref = mesh._shared.procs
    root = ref() if ref is not None else None
    if root is not view.engine.root:
        where = "procs this process did not spawn it on" if root is None else repr(root)
        raise ValueError(
            f"endpoint {qualname}: the monarch tensors passed to it live on "
            f"{view.engine.root!r}, but {mesh._describe()} lives on {where}; an actor "
            "receives the shards of tensors on its own proc only: spawn the actors on the "
            "tensors' procs (`procs.spawn(...)`), or move the tensors there first "
            "(`monarch.to_mesh(t, procs)`)"
        )
    ranks = list(mesh._shape.ranks())
    mine = set(view.shape.ranks())
    extra = [r for r in ranks if r not in mine]
    if extra or (exact and len(mine) != len(ranks)):
        need = "the same procs as" if exact else "procs among those of"
        raise ValueError(
            f"endpoint {qualname}: {mesh._describe()} (global ranks {ranks}) must be on "
            f"{need} the mesh the tensors are used on (global ranks {sorted(mine)}); slice "
            "the actor mesh, or activate the mesh of its procs (`with procs.activate():`)"
        )
    return {r: i for i, r in enumerate(ranks)}


def _issue(
    view: View, payload: wire.ActorCall | wire.SpawnArgs, outs: list[int], stream: Stream
) -> None:
    engine = view.engine
    engine.check()
    with engine.lock:
        seq = engine.next_seq()
        engine.issue(view, wire.ActorWork(seq, payload, outs), 0, _client_frames(), stream)


class _Route:
    """How calls without tensors go to an actor mesh that received tensor calls: on the
    view and stream of the last of those (see the module docs)."""

    def __init__(self, view: View, stream: Stream) -> None:
        self.view = view
        self.stream = stream

    def __call__(
        self, endpoint: Endpoint[..., Any], adverb: str, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        from monarch._src.actor.endpoint import SEND_DIRECTLY

        engine = self.view.engine
        if engine.failure is not None or engine.closed or adverb not in _ADVERBS:
            return SEND_DIRECTLY
        endpoint._check(args, kwargs)
        if has_tensors(args, kwargs):
            return call(endpoint, adverb, args, kwargs)
        return call(endpoint, adverb, args, kwargs, route=self)


def _routed_from_now(mesh: ActorMesh[Any], view: View, stream: Stream) -> None:
    """``mesh`` received a call through the engine: its calls without tensors follow."""
    route = mesh._shared.tensor_route
    if isinstance(route, _Route) and route.view.engine is view.engine:
        route.view, route.stream = view, stream
    else:
        mesh._shared.tensor_route = _Route(view, stream)


def call(
    endpoint: Endpoint[..., Any],
    adverb: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    route: _Route | None = None,
) -> Any:
    """An endpoint adverb whose arguments hold monarch tensors, or that goes the way of
    earlier ones (``route``; see the module docs): what the adverb gives for a plain
    call."""
    assert adverb in _ADVERBS, adverb
    mesh = endpoint._mesh
    name = endpoint._name
    qualname = endpoint._qualname()
    eargs, ekwargs, tensors = _encode(args, kwargs)
    if tensors:
        active = current_view()
        if active is not None and tensors[0]._view.engine is not active.engine:
            active = None  # the tensors say where it runs
        # On its tensors' stream, as upstream (the first tensor's; the others must agree).
        stream = tensors[0]._stream
        view = _view_of(tensors, qualname, active, stream)
    else:
        assert route is not None
        view, stream = route.view, route.stream
    targets = _targets(mesh, view, qualname, exact=False)
    n = len(targets)
    if adverb == "call_one" and n != 1:
        raise ValueError(
            f"call_one() needs a mesh of exactly 1 actor, but {mesh._describe()} has {n}; "
            "use call(), or slice the mesh down to one actor first"
        )
    if adverb == "choose":
        if n == 0:
            raise ValueError(f"choose() on {mesh._describe()}, which has no actors")
        pick = random.randrange(n)
        targets = {r: i for r, i in targets.items() if i == pick}
    error = mesh._stopped_error(name)
    if error is not None:
        if adverb == "broadcast":
            raise error
        if adverb == "stream":
            return iter([Future(impl=Failed(error)) for _ in range(n)])
        return Future(impl=Failed(error))
    from monarch._src.actor import process
    from monarch._src.actor.pickling import dumps

    try:
        dumps((eargs, ekwargs))
    except Exception as e:
        raise TypeError(
            f"cannot send a call to endpoint {qualname}: an argument cannot be pickled "
            f"({type(e).__name__}: {e})"
        ) from e
    queue = None if adverb == "broadcast" else process.get().agent.reply_queue()
    port = queue.port() if queue is not None else None
    payload = wire.ActorCall("call", mesh, name, eargs, ekwargs, port, targets, n, None)
    _issue(view, payload, [], stream)
    _routed_from_now(mesh, view, stream)
    view.engine.flush()
    if queue is None:
        return None
    info = mesh._view_info()
    if adverb == "stream":
        return iter([Future(impl=_Replies(queue, 1, view, info, qualname, None)) for _ in range(n)])
    if adverb == "call":
        shape = mesh._shape
        return Future(
            impl=_Replies(queue, n, view, info, qualname, lambda values: ValueMesh(shape, values))
        )
    return Future(impl=_Replies(queue, 1, view, info, qualname, None))


class _Replies:
    """The replies of a call sent by the workers (a Future implementation): ``count``
    of them from ``queue``, in the view's order; ``finish`` builds the result (the one
    value when ``None``)."""

    def __init__(
        self, queue: Any, count: int, view: View, info: MeshInfo, qualname: str, finish: Any
    ) -> None:
        self._queue = queue
        self._count = count
        self._view = view
        self._info = info
        self._qualname = qualname
        self._finish = finish
        self._items: dict[int, Any] = {}

    def wait(self, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._items) < self._count:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(left)
            except TimeoutError:
                raise TimeoutError(
                    f"{self._qualname}: not all replies arrived within {timeout} s (the call "
                    "waits for the tensor work before it); get() again or await to collect it"
                ) from None
            self._take(item)
        return self._result()

    async def wait_async(self) -> Any:
        while len(self._items) < self._count:
            item = self._queue.try_get()
            if item is None:
                item = await self._queue.recv()
            self._take(item)
        return self._result()

    def _take(self, item: Any) -> None:
        """Keep a reply by the index of the actor it stands for (a worker's own reply,
        ``wire.InputFailed``, names it)."""
        if item.status is OK:
            value = loads_parts(item.parts)
            index = value.index if isinstance(value, wire.InputFailed) else item.index
            self._items[index] = (item, value)
        else:
            self._items[item.index] = (item, None)

    def _result(self) -> Any:
        from monarch._src.tensor_engine.client.api import _remote_error

        pairs = [self._items[i] for i in sorted(self._items)]
        # The actors' errors first, as for any call; then a failed input.
        decode([item for item, _ in pairs if item.status is not OK], self._info, self._qualname)
        values = [value for _, value in pairs]
        for v in values:
            if isinstance(v, wire.InputFailed):
                raise _remote_error(self._view, v.failure)
        if self._finish is None:
            return values[0]
        return self._finish(values)


def rref(endpoint: Endpoint[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``actors.method.rref(...)`` (see the module docs): the endpoint's result with
    its tensors as monarch tensors on the active mesh."""
    from monarch._src.tensor_engine.client.api import _propagate_fake, _tensors_of

    mesh = endpoint._mesh
    qualname = endpoint._qualname()
    endpoint._check(args, kwargs)
    prop = endpoint._property()
    propagate = endpoint._propagate
    if propagate is None and prop is not None:
        propagate = prop._propagate
    if not callable(propagate) and propagate != "inspect":
        raise ValueError(
            f"{qualname}.rref(...) needs to know the shapes of the endpoint's tensors "
            f"without running it, but its propagate is {propagate!r}: declare it with "
            "`@endpoint(propagate=fn)`, where fn takes the endpoint's arguments (fake "
            "tensors for monarch tensors) and returns a result of the same structure, or "
            "`@endpoint(propagate='inspect')` for an endpoint run for its effect (rref "
            "then returns None)"
        )
    eargs, ekwargs, tensors = _encode(args, kwargs)
    active = current_view()
    if active is None:
        if not tensors:
            raise ValueError(
                f"{qualname}.rref(...): no mesh is active to make the result's tensors on; "
                "call it inside `with procs.activate():` (procs: the actors' proc mesh)"
            )
        active = tensors[0]._view
    stream = get_active_stream()
    view = _view_of(tensors, qualname, active, stream) if tensors else active
    targets = _targets(mesh, view, qualname, exact=True)
    error = mesh._stopped_error(endpoint._name)
    if error is not None:
        raise error
    if propagate == "inspect":
        # Run for its effect, in program order, as upstream: no result is kept.
        result: Any = None
        outs: list[int] = []
        metas: list[tuple[tuple[int, ...], torch.dtype]] | None = None
    else:
        described = _propagate_fake(propagate, args, kwargs)
        result, outs = _tensors_of(described, view)
        leaves, _ = tree_flatten(result)
        metas = [(tuple(t.shape), t.dtype) for t in leaves if isinstance(t, Tensor)]
    payload = wire.ActorCall(
        "rref", mesh, endpoint._name, eargs, ekwargs, None, targets, len(targets), metas
    )
    _issue(view, payload, outs, stream)
    _routed_from_now(mesh, view, stream)
    return result


# --- the worker ---------------------------------------------------------------------------


# --- monarch tensors as spawn arguments ------------------------------------------------------


class _SpawnShard:
    """A monarch tensor among the arguments of a spawn: unpickled in an actor's proc,
    it becomes that proc's shard (``index`` of the tensors published under ``token``)."""

    __slots__ = ("index", "token")

    def __init__(self, token: int, index: int) -> None:
        self.token = token
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (spawn_shard, (self.token, self.index))


def spawn_args(
    proc_mesh: Any, name: str, class_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of ``proc_mesh.spawn(name, cls, *args, **kwargs)`` with each monarch
    tensor replaced by a :class:`_SpawnShard`, after asking the workers of its procs to
    publish their shards (see the module docs). Arguments without monarch tensors are
    returned as they are."""
    leaves, spec = tree_flatten((list(args), kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
    if not tensors:
        return args, kwargs
    what = f"spawn({name!r}, {class_name}, ...)"
    active = current_view()
    if active is not None and tensors[0]._view.engine is not active.engine:
        active = None
    stream = tensors[0]._stream
    view = _view_of(tensors, what, active, stream)
    if proc_mesh._root is not view.engine.root:
        raise ValueError(
            f"{what}: the monarch tensors passed to it live on {view.engine.root!r}, but "
            f"the actors are spawned on {proc_mesh!r}; an actor receives the shards of "
            "tensors on its own proc only: spawn the actors on the tensors' procs, or move "
            "the tensors there first (`monarch.to_mesh(t, procs)`)"
        )
    ranks = list(proc_mesh._shape.ranks())
    mine = set(view.shape.ranks())
    extra = [r for r in ranks if r not in mine]
    if extra:
        raise ValueError(
            f"{what}: the actors' procs (global ranks {ranks}) must be among those of the "
            f"mesh the tensors are used on (global ranks {sorted(mine)}); spawn on a slice "
            "of it, or activate the mesh of the procs (`with procs.activate():`)"
        )
    engine = view.engine
    engine.check()
    with engine.lock:
        token = engine.new_token()
    _issue(view, wire.SpawnArgs(token, [t._h.ref for t in tensors], ranks), [], stream)
    engine.flush()
    out = []
    index = 0
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            out.append(_SpawnShard(token, index))
            index += 1
        else:
            out.append(leaf)
    sargs, skwargs = tree_unflatten(out, spec)
    return tuple(sargs), skwargs
