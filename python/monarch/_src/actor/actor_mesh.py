"""Actors, actor meshes and the context of the running actor.

Caller side: :class:`ActorMesh` is a view (a :class:`Shape`) over the actors of one spawn;
``mesh.endpoint`` is an :class:`~monarch._src.actor.endpoint.Endpoint` whose adverbs
pickle the arguments once, send one message per rank at call time, and return a
:class:`Future` that gathers the replies from a reply queue of this process's inbox (see
:mod:`monarch._src.actor.endpoint`).

Actor side (:mod:`monarch._src.actor.actor_host`): each hosted actor has a thread that runs
``__init__`` and then handles its queue's messages one at a time (ACT-1): directly for a
sync actor, on the actor's own asyncio loop for an async one.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import inspect
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from monarch._src.actor import runtime, supervision
from monarch._src.actor.endpoint import Endpoint, _cast, _endpoints, _NotAnEndpoint

# Re-exported: the errors of actor calls are imported from here too.
from monarch._src.actor.errors import ActorError as ActorError
from monarch._src.actor.errors import SupervisionError as SupervisionError
from monarch._src.actor.extent import Extent
from monarch._src.actor.future import Done, Future
from monarch._src.actor.point import Point
from monarch._src.actor.replies import _Replies
from monarch._src.actor.runtime import ERROR, OK, ProcessContext, dumps
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.value_mesh import ValueMesh

if TYPE_CHECKING:
    import logging

    from monarch._src.actor import actor_host

R = TypeVar("R")
A = TypeVar("A", bound="Actor")
_Self = TypeVar("_Self", bound="Actor")

#: Attributes of an actor mesh handle; endpoints may not take these names.
MESH_ATTRIBUTES = frozenset(
    {"slice", "split", "flatten", "rename", "size", "sizes", "extent", "stop", "initialized"}
)


@functools.cache
def _class_info(cls: type) -> _ClassInfo:
    return _ClassInfo(cls)


class _ClassInfo:
    """What a caller and a host need to know about an actor class, checked once."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = f"{cls.__module__}.{cls.__qualname__}"
        self.endpoints = _endpoints(cls)
        kinds = {ep._is_async for ep in self.endpoints.values()}
        self.is_async = kinds == {True}
        self.problem: str | None = None
        if len(kinds) > 1:
            sync = sorted(n for n, e in self.endpoints.items() if not e._is_async)
            asyn = sorted(n for n, e in self.endpoints.items() if e._is_async)
            self.problem = (
                f"actor class {self.name} mixes sync endpoints {sync} and async endpoints "
                f"{asyn}; make them all `def` or all `async def`"
            )
        clash = sorted(MESH_ATTRIBUTES & self.endpoints.keys())
        if clash and self.problem is None:
            self.problem = (
                f"actor class {self.name} has endpoint(s) {clash} named like actor mesh "
                f"attributes ({sorted(MESH_ATTRIBUTES)}); rename them"
            )
        cleanup = getattr(cls, "__cleanup__", None)
        if cleanup is not None and self.problem is None and self.endpoints:
            if inspect.iscoroutinefunction(cleanup) != self.is_async:
                self.problem = (
                    f"actor class {self.name}: __cleanup__ must be "
                    f"{'async' if self.is_async else 'sync'} like its endpoints"
                )
        try:
            self.init_signature: inspect.Signature | None = inspect.signature(
                cls.__init__  # type: ignore[misc]  # the class's own, not an instance's
            )
        except (TypeError, ValueError):
            self.init_signature = None


# --- the actor base class -----------------------------------------------------------------


class Actor:
    """Base class of user actors. Endpoints are methods marked with ``@endpoint``;
    constructor arguments come from ``ProcMesh.spawn(name, Class, *args, **kwargs)``.

    For a type checker, an actor mesh handle is typed as its actor class (``spawn``
    returns ``Class``), so this class also declares the operations of a handle; on an
    actor instance they raise ``NotImplementedError``.
    """

    @functools.cached_property
    def logger(self) -> logging.Logger:
        import logging

        logger = logging.getLogger(type(self).__qualname__)
        logger.setLevel(logging.DEBUG)
        return logger

    def _mesh_only(self, what: str) -> NoReturn:
        raise NotImplementedError(
            f"{what} is an operation of actor mesh handles (what spawn() returns), not of "
            "an actor instance"
        )

    def slice(self: _Self, **kwargs: int | builtins.slice) -> _Self:
        return self._mesh_only("slice()")

    def flatten(self: _Self, name: str) -> _Self:
        return self._mesh_only("flatten()")

    def split(self: _Self, **kwargs: Sequence[str] | int) -> _Self:
        return self._mesh_only("split()")

    def rename(self: _Self, **kwargs: str) -> _Self:
        return self._mesh_only("rename()")

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        return self._mesh_only("stop()")

    @property
    def initialized(self) -> Future[None]:
        return self._mesh_only("initialized")

    if TYPE_CHECKING:
        # The rest of a handle's operations, for type checkers only: at run time an
        # actor may use these names for attributes of its own.

        def size(self, dim: str | Sequence[str] | None = None) -> int: ...

        @property
        def sizes(self) -> dict[str, int]: ...

        @property
        def extent(self) -> Extent: ...

        def __len__(self) -> int: ...


# --- context --------------------------------------------------------------------------------


class Instance:
    """The running actor (or the client): ``context().actor_instance``."""

    def __init__(
        self,
        *,
        name: str,
        class_name: str,
        actor_id: str,
        proc_id: str,
        rank: Point,
        creator: str | None,
        hosted: actor_host.HostedActor | None = None,
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.actor_id = actor_id
        self.proc_id = proc_id
        self.rank = rank
        self.creator = creator
        self._hosted = hosted

    @property
    def proc(self) -> Any:
        """This actor's proc, as a 0-dimensional ProcMesh."""
        from monarch._src.actor.proc_mesh import _own_proc_mesh

        return _own_proc_mesh()

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor after the message being handled (graceful)."""
        if self._hosted is None:
            raise RuntimeError("the client is not a hosted actor; use shutdown_context()")
        self._hosted.stop_after_current = reason or "stopped itself"

    def kill(self, reason: str | None = None) -> None:
        """Fail this actor now: its owner gets a ``MeshFailure``, later calls raise
        ``SupervisionError``."""
        if self._hosted is None:
            raise RuntimeError("the client is not a hosted actor; it cannot be killed")
        self._hosted.kill(reason)

    def abort(self, reason: str | None = None) -> None:
        """Same as :meth:`kill`."""
        self.kill(reason)

    def __str__(self) -> str:
        return f"<root>.<{self.class_name} {self.name}{self.rank!r}>"

    def __repr__(self) -> str:
        return f"Instance({self})"


class Context:
    """Where the current code runs: ``actor_instance`` and ``message_rank``."""

    def __init__(
        self,
        instance: Instance,
        rank_info: tuple[int, tuple[str, ...], tuple[int, ...]] | None,
        hops: int = 0,
    ) -> None:
        self.actor_instance = instance
        self._rank_info = rank_info
        #: How many procs the current message passed through to get here (1: sent
        #: directly; more when a cast was relayed down its tree). For tests and tools.
        self._hops = hops

    @functools.cached_property
    def message_rank(self) -> Point:
        """This message's position in the mesh view it was sent to."""
        if self._rank_info is None:
            return self.actor_instance.rank
        index, labels, sizes = self._rank_info
        return Point(index, Extent(labels, sizes))


_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_context", default=None
)
_root_context: Context | None = None


def context() -> Context:
    """The current actor's context; outside any actor, the root client's."""
    ctx = _current.get()
    if ctx is not None:
        return ctx
    global _root_context
    if _root_context is None:
        proc = runtime.process_context()
        name = "client" if proc.is_root else "agent"
        _root_context = Context(
            Instance(
                name=name,
                class_name=name,
                actor_id=f"{proc.proc_id}/{runtime.AGENT_NAME}[0]",
                proc_id=proc.proc_id,
                rank=Point(0, Extent([], [])),
                creator=None,
            ),
            None,
        )
    return _root_context


def current_rank() -> Point:
    return context().message_rank


def current_size() -> dict[str, int]:
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    return str(context().actor_instance.actor_id)


# --- ports (explicit response) ---------------------------------------------------------------


class Port(Generic[R]):
    """Where an explicit-response endpoint sends its reply (``send``/``exception``),
    any time later and from any thread; also one end of a ``Channel``. Pickles as a
    reference."""

    #: Whether a message that cannot be delivered goes back to its sender.
    return_undeliverable = True

    def __init__(self, port_id: str, reply_key: int, index: int) -> None:
        self._port_id = port_id
        self._reply_key = reply_key
        self._index = index

    def send(self, obj: R) -> None:
        runtime.process_context().reply(self._port_id, self._reply_key, self._index, OK, obj)

    def exception(self, exc: BaseException) -> None:
        err = exc if isinstance(exc, ActorError) else ActorError(exc)
        runtime.process_context().reply(
            self._port_id, self._reply_key, self._index, ERROR, err._to_wire()
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._port_id, self._reply_key, self._index))

    def __repr__(self) -> str:
        return f"Port({self._port_id}#{self._reply_key:#x})"


# --- caller side: actor meshes and endpoints --------------------------------------------------


class _MeshRef:
    """What every view of one spawned actor mesh shares."""

    def __init__(
        self,
        *,
        name: str,
        key: int,
        info: _ClassInfo | None,
        class_name: str,
        endpoints: dict[str, tuple[bool, bool]],
        group: Any,
        base: Shape,
    ) -> None:
        self.name = name
        self.key = key
        self.key_part = runtime.key_part(key)
        self.info = info
        self.class_name = class_name
        #: endpoint name -> (is_async, explicit_response_port)
        self.endpoints = endpoints
        self.group = group
        self.base = base
        self.stopped: str | None = None


class ActorMesh(MeshTrait, Generic[A]):
    """The handle ``spawn`` returns: one actor per rank of a proc mesh view. Endpoints
    are attributes; views share the actors; it pickles as a reference."""

    def __init__(self, ref: _MeshRef, shape: Shape) -> None:
        self._ref = ref
        self._mesh_shape = shape

    @property
    def _shape(self) -> Shape:
        return self._mesh_shape

    @functools.cached_property
    def _targets(self) -> list[tuple[int, int]]:
        """``(index in this view, rank in the proc group)`` of every actor of the view."""
        return list(enumerate(self._mesh_shape.ndslice))

    @functools.cached_property
    def _method_headers(self) -> dict[str, bytes]:
        return {}

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh(self._ref, shape)

    def _describe(self) -> str:
        return f"actor mesh {self._ref.name!r} ({self._ref.class_name}) with extent {self.sizes}"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        ref = self.__dict__.get("_ref")
        if ref is None:
            raise AttributeError(name)
        kinds = ref.endpoints.get(name)
        if kinds is not None:
            ep: Endpoint[..., Any] = Endpoint(self, name, kinds[1])
            self.__dict__[name] = ep  # later lookups skip __getattr__
            return ep
        if ref.info is not None and callable(getattr(ref.info.cls, name, None)):
            return _NotAnEndpoint(self, name)
        raise AttributeError(
            f"{self._describe()} has no endpoint {name!r}; its endpoints are "
            f"{sorted(ref.endpoints)}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        ref = self._ref
        return (
            _rebuild_actor_mesh,
            (
                ref.name,
                ref.key,
                ref.class_name,
                ref.endpoints,
                ref.group,
                ref.base,
                self._mesh_shape,
            ),
        )

    @property
    def initialized(self) -> Future[None]:
        """Completes once the procs exist and every actor ran ``__init__``."""
        return self._send_all("__initialized__", (), {}, collect=lambda vm: None)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor of this view after the messages already sent to it."""
        fut = self._send_all("__stop__", (reason,), {}, collect=lambda vm: None)
        self._ref.stopped = reason
        return fut

    def _send_all(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        collect: Callable[[ValueMesh[Any]], Any],
    ) -> Future[Any]:
        return _cast(self, method, [dumps((args, kwargs))], "call", collect=collect)

    def __repr__(self) -> str:
        return f"ActorMesh<{self._ref.class_name}>({self._ref.name!r}, {self.sizes})"


def _rebuild_actor_mesh(
    name: str,
    key: int,
    class_name: str,
    endpoints: dict[str, tuple[bool, bool]],
    group: Any,
    base: Shape,
    shape: Shape,
) -> ActorMesh[Any]:
    ref = _MeshRef(
        name=name,
        key=key,
        info=None,
        class_name=class_name,
        endpoints=endpoints,
        group=group,
        base=base,
    )
    return ActorMesh(ref, shape)


# --- spawning --------------------------------------------------------------------------------


def _check_spawn(name: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _ClassInfo:
    if not isinstance(name, str) or not name:
        raise ValueError(f"spawn(): the mesh name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(
            f"spawn({name!r}, ...): {cls!r} is not a subclass of monarch.actor.Actor; "
            "actor classes must derive from Actor"
        )
    info = _class_info(cls)  # type: ignore[arg-type]  # classes are hashable
    if info.problem is not None:
        raise ValueError(info.problem)
    if info.init_signature is not None:
        try:
            info.init_signature.bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(
                f"spawn({name!r}, {cls.__qualname__}, ...): the arguments do not match "
                f"{cls.__qualname__}.__init__{info.init_signature}: {e}"
            ) from None
    return info


def spawn_actor_mesh(
    proc_mesh: Any, name: str, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[Any]:
    info = _check_spawn(name, cls, args, kwargs)
    try:
        cls_blob = dumps(cls)
        args_blob = dumps((args, kwargs))
    except Exception as e:
        raise TypeError(
            f"spawn({name!r}, {cls.__qualname__}, ...): the class or its arguments cannot "
            f"be pickled: {e}"
        ) from e
    key = random.getrandbits(63) or 1
    group = proc_mesh._group
    shape: Shape = proc_mesh._shape
    labels = tuple(shape.labels)
    sizes = tuple(shape.ndslice.sizes)
    cx = context()
    creator = str(cx.actor_instance.actor_id)
    ctx = runtime.process_context()
    hosted = cx.actor_instance._hosted
    owner = (ctx.port_id, hosted.key) if hosted is not None else supervision.default_owner(ctx)
    ref = _MeshRef(
        name=name,
        key=key,
        info=info,
        class_name=info.name,
        endpoints={n: (e._is_async, e._explicit_response_port) for n, e in info.endpoints.items()},
        group=group,
        base=shape,
    )
    for index, g in enumerate(shape.ndslice):
        request = dumps(("spawn", key, name, index, labels, sizes, creator, owner))
        group.send(g, [runtime.AGENT_KEY_PART, request, cls_blob, args_blob], None)
    mesh: ActorMesh[Any] = ActorMesh(ref, shape)
    ctx.owned[key] = _Owned(mesh, owner, hosted.key if hosted is not None else None)
    return mesh


class _Owned:
    """An actor mesh spawned from this process, for supervision: who owns it, and
    whether it was stopped (a stopped mesh's procs may exit without a failure)."""

    def __init__(self, mesh: ActorMesh[Any], owner: tuple[str, int], owner_key: int | None) -> None:
        ref = mesh._ref
        self.mesh = mesh
        self.name = ref.name
        self.key = ref.key
        self.class_name = ref.class_name
        self.group = ref.group
        self.shape = mesh._mesh_shape
        self.owner = owner
        #: The actor key of the owning actor in this process (None: not an actor).
        self.owner_key = owner_key

    @property
    def stopped(self) -> bool:
        return self.mesh._ref.stopped is not None


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The process-wide singleton actor ``name``, spawned on the root client's proc the
    first time it is asked for (from any actor)."""
    _check_spawn(name, cls, args, kwargs)
    proc = runtime.process_context()
    if proc.is_root:
        # A type checker sees an actor mesh as its actor class (see ``Actor``).
        mesh: Any = _root_controller(proc, name, cls, args, kwargs)
        return Future(impl=Done(mesh))
    queue = proc.inbox.reply_queue()
    request = dumps(("controller", name, proc.port_id, queue.key))
    proc.send(
        proc.port_ref(proc.root_port),
        [runtime.AGENT_KEY_PART, request, dumps(cls), dumps((args, kwargs))],
    )
    return Future(impl=_Replies(queue, 1, f"get_or_spawn_controller({name!r})", lambda v: v[0]))


def _root_controller(
    proc: ProcessContext, name: str, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[Any]:
    from monarch._src.actor.proc_mesh import _own_proc_mesh

    with proc.controllers_lock:
        mesh = proc.controllers.get(name)
        if mesh is None:
            mesh = proc.controllers[name] = spawn_actor_mesh(
                _own_proc_mesh(), name, cls, args, kwargs
            )
        return mesh
