"""Actor meshes: the handle ``spawn`` returns, and spawning.

An :class:`ActorMesh` is a view (a :class:`Shape`) over the actors of one spawn, over
the runtime's ``ActorMeshHandle``. ``mesh.endpoint`` is an
:class:`~monarch._src.actor.endpoint.Endpoint` whose adverbs pickle the arguments once
and hand them to the runtime, which casts them over the mesh's tree of procs and
collects the replies (see :mod:`monarch._src.actor.replies`). Views made with ``slice``,
``split``, ``rename`` and ``flatten`` share the actors. A mesh pickles as a reference.
"""

from __future__ import annotations

import functools
import random
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from monarch._rust_bindings import (
    ActorMeshHandle,
    CallReplies,
    CastMode,
    MessageTooLarge,
    PortHandle,
    ReplyQueue,
)
from monarch._src import config
from monarch._src.actor import extensions, process
from monarch._src.actor.actor import Actor, _class_info, _ClassInfo
from monarch._src.actor.context import ROOT_PATH, context, sender
from monarch._src.actor.endpoint import Endpoint, EndpointKind, TensorRoute, _NotAnEndpoint

# Re-exported: the errors of actor calls are imported from here too.
from monarch._src.actor.errors import ActorError as ActorError
from monarch._src.actor.errors import MessageTooLargeError
from monarch._src.actor.errors import SupervisionError as SupervisionError
from monarch._src.actor.future import Done, Future
from monarch._src.actor.pickling import dumps
from monarch._src.actor.replies import CallFuture, Failed, MeshInfo, RustWork, StreamOne
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.value_mesh import ValueMesh

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh

__all__ = ["ActorMesh", "abandon_actor_meshes", "get_or_spawn_controller", "spawn_actor_mesh"]

A = TypeVar("A", bound=Actor)

#: What ``await procs.spawn(...)`` warns (the spelling of earlier releases).
DEPRECATED_AWAIT_SPAWN = (
    "awaiting the actor mesh spawn returns is deprecated: spawn does not block and "
    "returns a usable mesh, e.g. `actors = procs.spawn('name', MyActor)`; to wait until "
    "every actor ran __init__, `await actors.initialized`"
)


_fanout: list[int] = []


def _sync_fanout() -> None:
    """Gives the agent the configured cast fan-out when it changed (``configure``)."""
    fanout = config.cached("cast_fanout")
    if not _fanout or _fanout[0] != fanout:
        process.get().agent.fanout = fanout
        _fanout[:] = [fanout]


def _only(values: list[Any]) -> Any:
    """The result of a call to one actor: its value."""
    return values[0]


class _Shared:
    """What every view of one actor mesh shares."""

    def __init__(
        self,
        handle: ActorMeshHandle,
        *,
        info: _ClassInfo | None,
        endpoints: dict[str, EndpointKind],
        client_owned: bool,
    ) -> None:
        self.handle = handle
        self.name = handle.name
        self.class_name = handle.class_name
        self.info = info
        #: How each endpoint is called, by name.
        self.endpoints = endpoints
        self.mesh = MeshInfo(self.name, self.class_name, handle.mesh_id, client_owned)
        #: Why the mesh was stopped from this process, once it was.
        self.stopped: str | None = None
        #: Why the mesh could not be spawned (raised by every use), if it could not.
        self.broken: BaseException | None = None
        #: The root proc mesh it was spawned on, when spawned by this process (the
        #: tensor engine checks that tensors passed to its endpoints live there).
        self.procs: weakref.ref[ProcMesh] | None = None
        #: Set by the tensor engine once it sent the mesh a call: how this process's
        #: calls without tensors go from then on, so that they reach the actors in the
        #: order issued (see :data:`TensorRoute`).
        self.tensor_route: TensorRoute | None = None


class ActorMesh(MeshTrait, Generic[A]):
    """The handle ``spawn`` returns: one actor per rank of a proc mesh view. Endpoints
    are attributes; views share the actors; it pickles as a reference."""

    def __init__(self, shared: _Shared, shape: Shape, handle: ActorMeshHandle) -> None:
        self._shared = shared
        self._mesh_shape = shape
        self._handle = handle

    @property
    def _shape(self) -> Shape:
        return self._mesh_shape

    @property
    def _class_name(self) -> str:
        return self._shared.class_name

    @property
    def _info(self) -> _ClassInfo | None:
        return self._shared.info

    @property
    def _endpoints(self) -> dict[str, EndpointKind]:
        return self._shared.endpoints

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh(self._shared, shape, self._shared.handle.view(shape))

    def _describe(self) -> str:
        return f"actor mesh {self._shared.name!r} ({self._class_name}) with extent {self.sizes}"

    @functools.cached_property
    def _count(self) -> int:
        return len(self._mesh_shape)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        shared = self.__dict__.get("_shared")
        if shared is None:
            raise AttributeError(name)
        kind = shared.endpoints.get(name)
        if kind is not None:
            ep: Endpoint[..., Any] = Endpoint(self, name, kind.explicit_response_port)
            self.__dict__[name] = ep  # later lookups skip __getattr__
            return ep
        if shared.info is not None and callable(getattr(shared.info.cls, name, None)):
            return _NotAnEndpoint(self, name)
        raise AttributeError(
            f"{self._describe()} has no endpoint {name!r}; its endpoints are "
            f"{sorted(shared.endpoints)}"
        )

    # --- sending (the adverbs of Endpoint call these) -------------------------------------

    def _stopped_error(self, method: str) -> BaseException | None:
        if self._shared.broken is not None:
            return self._shared.broken
        reason = self._shared.stopped
        if reason is None:
            return None
        endpoint = f"{self._class_name}.{method}"
        return SupervisionError(
            f"actor mesh {self._shared.name!r} ({self._class_name}) was stopped ({reason}); "
            f"calling {endpoint} on it is an error",
            endpoint,
        )

    def _send(
        self,
        method: str,
        payload: list[bytes | bytearray],
        mode: CastMode,
        collect: Callable[[ValueMesh[Any]], Any] | None = None,
        port: PortHandle | None = None,
        index: int | None = None,
    ) -> Any:
        """Cast ``method(payload)`` to the view: the future of its replies (``CALL``,
        ``ONE``, ``CHOOSE``), or ``None`` (``BROADCAST``, ``PORT``)."""
        shared = self._shared
        if shared.broken is not None or shared.stopped is not None:
            error = self._stopped_error(method)
            assert error is not None
            if mode is CastMode.BROADCAST or mode is CastMode.PORT:
                raise error
            return Future(impl=Failed(error))
        endpoint = f"{shared.class_name}.{method}"
        _sync_fanout()
        n = self._count
        if mode is CastMode.CHOOSE:
            index = random.randrange(n)
        try:
            out = self._handle.cast(sender(), method, payload, mode, port, index, n)
        except MessageTooLarge as e:
            raise MessageTooLargeError(str(e), endpoint) from None
        if out is None:
            return None
        assert isinstance(out, CallReplies)
        finish: Callable[[list[Any]], Any]
        if mode is CastMode.CALL:
            shape = self._mesh_shape

            def finish(values: list[Any]) -> Any:
                vm = ValueMesh(shape, values)
                return collect(vm) if collect is not None else vm

        else:
            finish = _only

        return Future(impl=CallFuture(out, self._view_info(), endpoint, finish))

    def _view_info(self) -> MeshInfo:
        """What this view's call errors name (ranks translated to the mesh's)."""
        info: MeshInfo | None = self.__dict__.get("_info_cache")
        if info is None:
            info = self._shared.mesh.for_view(self._mesh_shape.ndslice)
            self.__dict__["_info_cache"] = info
        return info

    def _stream(self, method: str, payload: list[bytes | bytearray]) -> Iterator[Future[Any]]:
        error = self._stopped_error(method)
        if error is not None:
            return iter([Future(impl=Failed(error)) for _ in range(self._count)])
        _sync_fanout()
        endpoint = f"{self._class_name}.{method}"
        try:
            queue = self._handle.cast(sender(), method, payload, CastMode.STREAM)
        except MessageTooLarge as e:
            raise MessageTooLargeError(str(e), endpoint) from None
        assert isinstance(queue, ReplyQueue)
        return iter(
            [Future(impl=StreamOne(queue, self._view_info(), endpoint)) for _ in range(self._count)]
        )

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def initialized(self) -> Future[None]:
        """Completes once the procs exist and every actor ran ``__init__``."""
        if self._shared.broken is not None:
            return Future(impl=Failed(self._shared.broken))
        replies = self._handle.probe(sender(), self._count)
        return Future(
            impl=CallFuture(replies, self._shared.mesh, "initialized", lambda _: None, raw=True)
        )

    def __await__(self) -> Generator[Any, None, ActorMesh[A]]:
        """``await mesh`` (the old, blocking ``await procs.spawn(...)``): waits until
        every actor ran ``__init__``, then gives the mesh itself. Deprecated: ``spawn``
        returns a usable mesh at once; ``await mesh.initialized`` waits for ``__init__``.
        """
        warnings.warn(DEPRECATED_AWAIT_SPAWN, DeprecationWarning, stacklevel=2)
        return self._ready().__await__()

    async def _ready(self) -> ActorMesh[A]:
        await self.initialized
        return self

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor of this view after the messages already sent to it; later
        calls raise ``SupervisionError``."""
        replies = self._handle.stop(sender(), reason, self._count)
        self._shared.stopped = reason
        state = process.peek()
        if state is not None:
            state.stopped.add(self._shared.handle.mesh_id)
        return Future(impl=CallFuture(replies, self._shared.mesh, "stop", lambda _: None, raw=True))

    def __reduce__(self) -> tuple[Any, ...]:
        shared = self._shared
        return (
            _rebuild_actor_mesh,
            (shared.handle, shared.endpoints, self._mesh_shape),
        )

    def __repr__(self) -> str:
        return f"ActorMesh<{self._class_name}>({self._shared.name!r}, {self.sizes})"


def _rebuild_actor_mesh(
    handle: ActorMeshHandle, endpoints: dict[str, EndpointKind], shape: Shape
) -> ActorMesh[Any]:
    shared = _Shared(handle, info=None, endpoints=endpoints, client_owned=False)
    return ActorMesh(shared, shape, handle.view(shape))


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


def _spawn_parts(
    name: str, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any], creator: str
) -> list[bytes]:
    """The spawn's parts: the pickled class, the pickled arguments, and the spawner's
    path (``str(context().actor_instance)``), which prefixes the new actors' paths."""
    try:
        return [dumps(cls), dumps((args, kwargs)), creator.encode()]
    except Exception as e:
        raise TypeError(
            f"spawn({name!r}, {cls.__qualname__}, ...): the class or its arguments cannot "
            f"be pickled: {e}"
        ) from e


def _endpoint_kinds(info: _ClassInfo) -> dict[str, EndpointKind]:
    return {
        n: EndpointKind(e._is_async, e._explicit_response_port) for n, e in info.endpoints.items()
    }


def spawn_actor_mesh(
    proc_mesh: ProcMesh, name: str, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[Any]:
    """Spawn one ``cls`` actor per proc of ``proc_mesh`` (see ``ProcMesh.spawn``)."""
    info = _check_spawn(name, cls, args, kwargs)
    engine = extensions.tensor_engine_if_tensors()
    if engine is not None:  # monarch tensors become each actor's local shard
        args, kwargs = engine.spawn_args(proc_mesh, name, info.name, args, kwargs)
    spawner = context().actor_instance
    parts = _spawn_parts(name, cls, args, kwargs, str(spawner))
    who = sender()
    state = process.get()
    client_owned = state.is_root and spawner._hosted is None
    broken = proc_mesh._stopped_error()
    if broken is not None:
        # Nothing is spawned on stopped procs; every use of the handle says why.
        parts = []
    handle = proc_mesh._handle.spawn(who, name, info.name, parts)
    shared = _Shared(handle, info=info, endpoints=_endpoint_kinds(info), client_owned=client_owned)
    shared.broken = broken
    shared.procs = weakref.ref(proc_mesh._root)
    mesh: ActorMesh[Any] = ActorMesh(shared, proc_mesh._shape, handle)
    state.owned[handle.mesh_id] = mesh
    return mesh


def abandon_actor_meshes(procs: Any, reason: str | None) -> None:
    """Count the actor meshes this process spawned on the proc mesh ``procs`` (a mesh
    ``spawn_procs`` returned) as stopped, without stopping them (their procs are being
    stopped, or end with their hosts): their failures are not judged. With a
    ``reason``, later calls to them raise ``SupervisionError`` at once saying why;
    without, calls go on to the procs, which answer that they stopped."""
    state = process.peek()
    if state is None:
        return
    for mesh in list(state.owned.values()):
        shared = mesh._shared
        if shared.procs is not None and shared.procs() is procs:
            state.stopped.add(shared.handle.mesh_id)
            if reason is not None and shared.stopped is None:
                shared.stopped = reason


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The process-wide singleton actor ``name``, spawned on the root client's proc the
    first time it is asked for (from any actor)."""
    info = _check_spawn(name, cls, args, kwargs)
    parts = _spawn_parts(name, cls, args, kwargs, ROOT_PATH)  # a child of the root client
    state = process.get()
    with state.controllers_lock:
        known = state.controllers.get(name)
    if known is not None:
        return Future(impl=Failed(known)) if isinstance(known, BaseException) else _done(known)
    fut = state.agent.singleton(sender(), state.root_proc, name, info.name, parts)

    def wrap(handle: ActorMeshHandle) -> Any:
        shared = _Shared(
            handle, info=info, endpoints=_endpoint_kinds(info), client_owned=state.is_root
        )
        mesh: ActorMesh[Any] = ActorMesh(shared, Shape.unity(), handle)
        with state.controllers_lock:
            state.controllers.setdefault(name, mesh)
            return state.controllers[name]

    def convert(handle: Any) -> Any:
        try:
            return wrap(handle)
        except Exception as e:
            raise ActorError(ValueError(f"Failure on {name}: {e}")) from e

    return Future(impl=RustWork(fut, convert))


def _done(value: Any) -> Future[Any]:
    return Future(impl=Done(value))
