"""Actors, endpoints and actor meshes (API.md §1.2, §1.3, §1.7, §1.9).

Caller side: :class:`ActorMesh` is a view (a :class:`Shape`) over the actors of one spawn;
``mesh.endpoint`` is an :class:`Endpoint` whose adverbs pickle the arguments once, send
one message per rank at call time, and return a :class:`Future` that gathers the
replies from a reply queue of this process's inbox.

Actor side: each hosted actor has a thread (:class:`_HostedActor`) that runs
``__init__`` and then handles its queue's messages one at a time (ACT-1): directly for a
sync actor, on the actor's own asyncio loop for an async one.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import pickle
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from monarch._src.actor import runtime, supervision
from monarch._src.actor.extent import Extent
from monarch._src.actor.future import Done, Future
from monarch._src.actor.point import Point
from monarch._src.actor.runtime import ERROR, FAILED, OK, ProcessContext, dumps, loads
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.value_mesh import ValueMesh

if TYPE_CHECKING:
    import logging

R = TypeVar("R")
A = TypeVar("A", bound="Actor")

#: Attributes of an actor mesh handle; endpoints may not take these names.
MESH_ATTRIBUTES = frozenset(
    {"slice", "split", "flatten", "rename", "size", "sizes", "extent", "stop", "initialized"}
)


# --- errors -----------------------------------------------------------------------------


class ActorError(Exception):
    """An exception raised inside a remote endpoint; the actor lives on.

    ``exception`` is the original exception object (or a ``RuntimeError`` describing it
    when it could not be pickled), ``exception_formatted`` its remote traceback.
    """

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        exception_formatted: str | None = None,
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = (
            exception_formatted
            if exception_formatted is not None
            else runtime.format_exception(exception)
        )
        super().__init__(message)

    def __str__(self) -> str:
        return (
            f"{self.message}\n Traceback of where the remote call failed (most recent call "
            f"last):\n{self.exception_formatted}"
        )

    @classmethod
    def _from_local(cls, exception: BaseException, where: str) -> ActorError:
        return cls(exception, f"A remote actor call has failed {where}.")

    def _to_wire(self) -> tuple[Any, str, str, str]:
        try:
            exc_blob: Any = dumps(self.exception)
            loads(exc_blob)
        except Exception:
            exc_blob = None
        return (exc_blob, repr(self.exception), self.exception_formatted, self.message)

    @classmethod
    def _from_wire(cls, wire: tuple[Any, str, str, str]) -> ActorError:
        exc_blob, exc_repr, formatted, message = wire
        exception: BaseException
        try:
            exception = loads(exc_blob) if exc_blob is not None else RuntimeError(exc_repr)
        except Exception:
            exception = RuntimeError(exc_repr)
        return cls(exception, message, formatted)


class SupervisionError(RuntimeError):
    """A call reached an actor that has failed or was stopped (or could not be
    reached). ``endpoint`` names the endpoint called, when known."""

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint


# --- endpoints ----------------------------------------------------------------------------


class EndpointProperty(Generic[R]):
    """What ``@endpoint`` turns a method into. On an actor instance it is the plain
    method; on a mesh, ``mesh.name`` is an :class:`Endpoint` with the adverbs."""

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        propagate: Any = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        self._method = method
        self._propagate = propagate
        self._explicit_response_port = explicit_response_port
        self._instrument = instrument
        self._concurrent = concurrent
        self._is_async = inspect.iscoroutinefunction(method)
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> EndpointProperty[R]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Callable[..., Any]: ...
    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)

    @functools.cached_property
    def _signature(self) -> inspect.Signature:
        sig = inspect.signature(self._method)
        params = list(sig.parameters.values())[1:]  # self
        if self._explicit_response_port:
            params = params[1:]  # the port is not the caller's to pass
        return sig.replace(parameters=params)

    @functools.cached_property
    def _positional_arity(self) -> tuple[int, int] | None:
        """``(required, maximum)`` positional arguments when the signature is plain
        positional-or-keyword parameters (no ``*args``, keyword-only or positional-only
        ones): then a call with only positional arguments is checked by counting."""
        required = 0
        params = list(self._signature.parameters.values())
        for p in params:
            if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
                return None
            if p.default is inspect.Parameter.empty:
                required += 1
        return required, len(params)

    def _check_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` if the arguments do not bind to the signature."""
        arity = self._positional_arity
        if not kwargs and arity is not None and arity[0] <= len(args) <= arity[1]:
            return
        self._signature.bind(*args, **kwargs)


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as remotely callable; bare (``@endpoint``) or with options."""

    def wrap(m: Callable[..., Any]) -> EndpointProperty[Any]:
        if isinstance(m, EndpointProperty):
            raise ValueError(f"{m.__name__} is already an endpoint")
        return EndpointProperty(
            m,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    return wrap(method) if method is not None else wrap


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose body runs as a background task of the actor's loop: the
    actor takes the next message at once (only start order is guaranteed)."""

    def wrap(m: Callable[..., Any]) -> EndpointProperty[Any]:
        if isinstance(m, EndpointProperty):
            raise ValueError(
                f"@concurrent_endpoint cannot be stacked on @endpoint ({m.__name__}); use "
                "one of them"
            )
        if not inspect.iscoroutinefunction(m):
            raise ValueError(f"@concurrent_endpoint needs an async method; {m.__name__} is sync")
        return EndpointProperty(
            m,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    return wrap(method) if method is not None else wrap


def _endpoints(cls: type) -> dict[str, EndpointProperty[Any]]:
    found: dict[str, EndpointProperty[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            elif name in found:
                del found[name]  # overridden by a plain attribute
    return found


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
            self.init_signature: inspect.Signature | None = inspect.signature(cls.__init__)
        except (TypeError, ValueError):
            self.init_signature = None


# --- the actor base class -----------------------------------------------------------------


class Actor:
    """Base class of user actors. Endpoints are methods marked with ``@endpoint``;
    constructor arguments come from ``ProcMesh.spawn(name, Class, *args, **kwargs)``."""

    @functools.cached_property
    def logger(self) -> logging.Logger:
        import logging

        logger = logging.getLogger(type(self).__qualname__)
        logger.setLevel(logging.DEBUG)
        return logger

    def _mesh_only(self, what: str) -> Any:
        raise NotImplementedError(
            f"{what} is an operation of actor mesh handles (what spawn() returns), not of "
            "an actor instance"
        )

    def slice(self, **kwargs: Any) -> Any:
        return self._mesh_only("slice()")

    def flatten(self, name: str) -> Any:
        return self._mesh_only("flatten()")

    def split(self, **kwargs: Any) -> Any:
        return self._mesh_only("split()")

    def rename(self, **kwargs: Any) -> Any:
        return self._mesh_only("rename()")

    def stop(self, reason: str = "stopped by client") -> Any:
        return self._mesh_only("stop()")

    @property
    def initialized(self) -> Any:
        return self._mesh_only("initialized")


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
        hosted: _HostedActor | None = None,
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
        self, instance: Instance, rank_info: tuple[int, tuple[str, ...], tuple[int, ...]] | None
    ) -> None:
        self.actor_instance = instance
        self._rank_info = rank_info

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
        self._sent = False

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
            ep = Endpoint(self, name, kinds[1])
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
        return _cast(self, method, dumps((args, kwargs)), "call", collect=collect)

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


class _NotAnEndpoint:
    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} is not an endpoint of {self._mesh._ref.class_name}: mark it with "
            f"@endpoint, or call it as as_endpoint(mesh.{self._name}).call(...)"
        )


class Endpoint(Generic[R]):
    """``mesh.method``: the adverbs ``call``, ``call_one``, ``choose``, ``stream`` and
    ``broadcast``. Arguments are checked against the method's signature and pickled once,
    at call time."""

    def __init__(self, mesh: ActorMesh[Any], name: str, explicit: bool = False) -> None:
        self._mesh = mesh
        self._name = name
        self._explicit = explicit

    def _qualname(self) -> str:
        return f"{self._mesh._ref.class_name}.{self._name}"

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        info = self._mesh._ref.info
        ep = info.endpoints.get(self._name) if info is not None else None
        if ep is not None:
            try:
                ep._check_args(args, kwargs)
            except TypeError as e:
                raise TypeError(
                    f"wrong arguments for endpoint {self._qualname()}{ep._signature}: {e}"
                ) from None
        try:
            return dumps((args, kwargs))
        except Exception as e:
            culprit = _find_unpicklable(args, kwargs)
            raise TypeError(
                f"cannot send a call to endpoint {self._qualname()}: argument {culprit} "
                f"cannot be pickled ({type(e).__name__}: {e})"
            ) from e

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the view; a future of a ValueMesh of their replies."""
        return _cast(self._mesh, self._name, self._payload(args, kwargs), "call")

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the only actor of the view (ValueError if there are several)."""
        n = len(self._mesh._targets)
        if n != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly 1 actor, but {self._mesh._describe()} "
                f"has {n}; use call(), or slice the mesh down to one actor first"
            )
        return _cast(self._mesh, self._name, self._payload(args, kwargs), "one")

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the view, picked by the runtime."""
        if len(self._mesh) == 0:
            raise ValueError(f"choose() on {self._mesh._describe()}, which has no actors")
        return _cast(self._mesh, self._name, self._payload(args, kwargs), "choose")

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Call every actor; yields one future per actor, in reply arrival order."""
        payload = self._payload(args, kwargs)
        return _stream(self._mesh, self._name, payload)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting for replies (exceptions fail the actor)."""
        _cast(self._mesh, self._name, self._payload(args, kwargs), "broadcast")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"an endpoint of a mesh is not called directly; use "
            f"{self._name}.call(...), .call_one(...), .choose(...), .stream(...) or "
            ".broadcast(...)"
        )


def _find_unpicklable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for i, a in enumerate(args):
        try:
            dumps(a)
        except Exception:
            return f"#{i} ({type(a).__name__})"
    for k, v in kwargs.items():
        try:
            dumps(v)
        except Exception:
            return f"{k!r} ({type(v).__name__})"
    return "?"


class _Replies:
    """Collects ``expected`` replies from a reply queue (a Future implementation).
    Partial progress survives a timeout."""

    def __init__(
        self,
        queue: Any,
        expected: int,
        endpoint: str,
        finish: Callable[[list[Any]], Any],
    ) -> None:
        self._queue = queue
        self._expected = expected
        self._endpoint = endpoint
        self._finish = finish
        self._values: list[Any] = [None] * expected
        self._got = 0
        self._seen: set[int] = set()
        self._error: BaseException | None = None
        #: Proc group rank -> index in the view, of the ranks this call waits for.
        self.targets: dict[int, int] = {}

    def rank_failed(self, g: int, reason: str) -> None:
        """The proc of group rank ``g`` died: answer for it, unless done already (a
        real reply that arrived first wins; the duplicate is ignored)."""
        queue = self._queue
        index = self.targets.get(g)
        if queue is None or index is None:
            return
        ctx = runtime.process_context()
        ctx.reply(ctx.port_id, queue.key, index, FAILED, reason)

    def _take(self, parts: list[bytes]) -> None:
        index, status, value = loads(parts[0])
        if index in self._seen:
            return
        self._seen.add(index)
        self._got += 1
        if status == OK:
            self._values[index] = value
        elif self._error is None:
            if status == ERROR:
                self._error = ActorError._from_wire(value)
            else:
                self._error = SupervisionError(value, self._endpoint)

    def _result(self) -> Any:
        self._queue = None  # frees the reply key
        if self._error is not None:
            raise self._error
        return self._finish(self._values)

    def wait(self, timeout: float | None) -> Any:
        if timeout is None:
            while self._got < self._expected:
                self._take(self._queue.get())
            return self._result()
        import time

        deadline = time.monotonic() + timeout
        while self._got < self._expected:
            left = deadline - time.monotonic()
            try:
                parts = self._queue.get(max(0.0, left))
            except TimeoutError:
                raise TimeoutError(
                    f"{self._endpoint}: {self._got} of {self._expected} replies within "
                    f"{timeout} s; the call goes on: get() again or await to collect it"
                ) from None
            self._take(parts)
        return self._result()

    async def wait_async(self) -> Any:
        while self._got < self._expected:
            parts = self._queue.try_get()
            if parts is None:
                parts = await self._queue.recv()
            self._take(parts)
        return self._result()


def _headers(
    mesh: ActorMesh[Any],
    method: str,
    reply_port: str | None,
    reply_key: int,
    ranks: list[tuple[int, int]],
) -> list[tuple[int, int, bytes]]:
    """``(index in the view, rank in the proc group, header)`` for each target."""
    shape = mesh._mesh_shape
    labels = tuple(shape.labels)
    sizes = tuple(shape.ndslice.sizes)
    return [
        (i, g, pickle.dumps((method, reply_port, reply_key, i, labels, sizes), protocol=5))
        for i, g in ranks
    ]


def _cast(
    mesh: ActorMesh[Any],
    method: str,
    payload: bytes,
    mode: str,
    collect: Callable[[ValueMesh[Any]], Any] | None = None,
) -> Any:
    ref = mesh._ref
    endpoint = f"{ref.class_name}.{method}"
    proc = runtime.process_context()
    shape = mesh._mesh_shape
    ranks = mesh._targets
    if mode == "choose":
        ranks = [random.choice(ranks)]
    if ref.stopped is not None and not method.startswith("__"):
        err = SupervisionError(
            f"actor mesh {ref.name!r} ({ref.class_name}) was stopped ({ref.stopped}); "
            f"calling {endpoint} on it is an error",
            endpoint,
        )
        if mode == "broadcast":
            raise err
        return Future(impl=_Failed(err))
    if mode == "broadcast":
        for _, g, header in _headers(mesh, method, None, 0, ranks):
            ref.group.send(g, [ref.key_part, header, payload], None)
        return None
    queue = proc.inbox.reply_queue()
    reply_port = proc.port_id
    replies: _Replies
    if mode == "call":

        def finish(values: list[Any]) -> Any:
            vm = ValueMesh(shape, values)
            return collect(vm) if collect is not None else vm

        replies = _Replies(queue, len(ranks), endpoint, finish)
    elif mode == "choose":
        # The one reply carries the chosen rank's index: remap it to slot 0.
        replies = _Replies(_Reindex(queue, ranks[0][0]), 1, endpoint, lambda v: v[0])
    else:
        replies = _Replies(queue, 1, endpoint, lambda v: v[0])
    group = ref.group
    for i, g, header in _headers(mesh, method, reply_port, queue.key, ranks):
        replies.targets[g] = i
        group.watch(g, replies)
        group.send(g, [ref.key_part, header, payload], (reply_port, queue.key, i))
    return Future(impl=replies)


class _Reindex:
    """A reply queue whose single expected reply is moved to index 0."""

    def __init__(self, queue: Any, index: int) -> None:
        self._queue = queue
        self.key = queue.key
        self._index = index

    def _fix(self, parts: list[bytes]) -> list[bytes]:
        _, status, value = loads(parts[0])
        return [dumps((0, status, value))]

    def get(self, timeout: float | None = None) -> list[bytes]:
        return self._fix(self._queue.get(timeout))

    def try_get(self) -> list[bytes] | None:
        parts = self._queue.try_get()
        return None if parts is None else self._fix(parts)

    async def recv(self) -> list[bytes]:
        return self._fix(await self._queue.recv())


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self._error = error

    def wait(self, timeout: float | None) -> Any:
        raise self._error

    async def wait_async(self) -> Any:
        raise self._error


class _StreamShared:
    def __init__(self, queue: Any, endpoint: str) -> None:
        self.queue = queue
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.seen: set[int] = set()
        self.targets: dict[int, int] = {}

    def rank_failed(self, g: int, reason: str) -> None:
        index = self.targets.get(g)
        if index is not None:
            ctx = runtime.process_context()
            ctx.reply(ctx.port_id, self.queue.key, index, FAILED, reason)

    def fresh(self, parts: list[bytes]) -> tuple[int, Any] | None:
        """The reply's (status, value), or None for a duplicate of a rank seen."""
        index, status, value = loads(parts[0])
        with self.lock:
            if index in self.seen:
                return None
            self.seen.add(index)
        return status, value


class _StreamOne:
    """The next reply of a stream, whichever rank it comes from."""

    def __init__(self, shared: _StreamShared) -> None:
        self._shared = shared

    def _value(self, status: int, value: Any) -> Any:
        if status == OK:
            return value
        if status == ERROR:
            raise ActorError._from_wire(value)
        raise SupervisionError(value, self._shared.endpoint)

    def wait(self, timeout: float | None) -> Any:
        while True:
            try:
                parts = self._shared.queue.get(timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"{self._shared.endpoint}: no reply within {timeout} s; get() again later"
                ) from None
            fresh = self._shared.fresh(parts)
            if fresh is not None:
                return self._value(*fresh)

    async def wait_async(self) -> Any:
        while True:
            parts = self._shared.queue.try_get()
            if parts is None:
                parts = await self._shared.queue.recv()
            fresh = self._shared.fresh(parts)
            if fresh is not None:
                return self._value(*fresh)


def _stream(mesh: ActorMesh[Any], method: str, payload: bytes) -> Iterator[Future[Any]]:
    ref = mesh._ref
    endpoint = f"{ref.class_name}.{method}"
    proc = runtime.process_context()
    ranks = mesh._targets
    queue = proc.inbox.reply_queue()
    shared = _StreamShared(queue, endpoint)
    for i, g, header in _headers(mesh, method, proc.port_id, queue.key, ranks):
        shared.targets[g] = i
        ref.group.watch(g, shared)
        ref.group.send(g, [ref.key_part, header, payload], (proc.port_id, queue.key, i))
    futures = [Future(impl=_StreamOne(shared)) for _ in ranks]
    return iter(futures)


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """Treat a non-``@endpoint`` method of a spawned mesh as an endpoint."""
    if not isinstance(not_an_endpoint, _NotAnEndpoint):
        raise ValueError(
            "as_endpoint() takes a method of a spawned actor mesh that is not an endpoint, "
            f"e.g. as_endpoint(mesh.method); got {not_an_endpoint!r}"
        )
    mesh = not_an_endpoint._mesh
    name = not_an_endpoint._name
    ref = mesh._ref
    if name not in ref.endpoints:
        method = getattr(ref.info.cls, name) if ref.info is not None else None
        ref.endpoints[name] = (inspect.iscoroutinefunction(method), explicit_response_port)
    return Endpoint(mesh, name, explicit_response_port)


# --- spawning --------------------------------------------------------------------------------


def _check_spawn(name: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _ClassInfo:
    if not isinstance(name, str) or not name:
        raise ValueError(f"spawn(): the mesh name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(
            f"spawn({name!r}, ...): {cls!r} is not a subclass of monarch.actor.Actor; "
            "actor classes must derive from Actor"
        )
    info = _class_info(cls)
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
    proc_mesh: Any, name: str, cls: type[A], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[A]:
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
    mesh: ActorMesh[A] = ActorMesh(ref, shape)
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
        return Future(impl=Done(_root_controller(proc, name, cls, args, kwargs)))
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


# --- actor side --------------------------------------------------------------------------------


def _handle_agent_request(
    proc: ProcessContext, request: tuple[Any, ...], rest: list[bytes]
) -> None:
    kind = request[0]
    if kind == "spawn":
        _, key, name, index, labels, sizes, creator, owner = request
        hosted = _HostedActor(
            proc, key, name, index, labels, sizes, creator, tuple(owner), rest[0], rest[1]
        )
        proc.actors[key] = hosted
        hosted.start()
    elif kind == "controller":
        _, name, reply_port, reply_key = request
        try:
            cls = loads(rest[0])
            args, kwargs = loads(rest[1])
            mesh = _root_controller(proc, name, cls, args, kwargs)
        except Exception as e:
            err = ActorError(ValueError(f"Failure on {name}: {e}"))
            proc.reply(reply_port, reply_key, 0, ERROR, err._to_wire())
        else:
            proc.reply(reply_port, reply_key, 0, OK, mesh)
    elif kind == "proc_died":
        _, proc_id, reason, expected = request
        supervision.proc_died(proc, proc_id, reason, expected)
    elif kind == "bootstrap":
        fn = loads(rest[0])
        result = fn()
        if inspect.isawaitable(result):
            import asyncio

            asyncio.run(_awaited(result))
    else:
        raise ValueError(f"unknown agent request {kind!r}")


async def _awaited(aw: Any) -> Any:
    return await aw


#: How long ``__cleanup__`` may run when an actor stops.
CLEANUP_TIMEOUT = 3.0

_Work = tuple[Any, ...]


class _HostedActor:
    """One actor of a mesh, hosted by this process: see the module docs."""

    def __init__(
        self,
        proc: ProcessContext,
        key: int,
        name: str,
        index: int,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        creator: str,
        owner: tuple[str, int],
        cls_blob: bytes,
        args_blob: bytes,
    ) -> None:
        self.proc = proc
        self.key = key
        self.name = name
        self.queue = proc.inbox.queue(key)
        self.rank = Point(index, Extent(labels, sizes))
        self.creator = creator
        self.owner = owner
        self._cls_blob = cls_blob
        self._args_blob = args_blob
        self.failed: str | None = None
        self.stopped: str | None = None
        self.stop_after_current: str | None = None
        self.obj: Any = None
        self.info: _ClassInfo | None = None
        self.instance: Instance | None = None
        self.class_name = "?"

    def start(self) -> None:
        threading.Thread(
            target=self._run, name=f"monarch-actor-{self.name}-{self.rank.rank}", daemon=True
        ).start()

    # --- failure and supervision -------------------------------------------------------

    def fail(self, reason: str, cause: supervision.MeshFailure | None = None) -> None:
        """Fail this actor: later calls get ``SupervisionError`` and the owner gets a
        ``MeshFailure``. Only the first failure counts."""
        if self.failed is not None or self.stopped is not None:
            return
        self.failed = reason
        print(
            f"monarch: actor {self.name!r} rank {self.rank.rank} ({self.class_name}) on "
            f"proc {self.proc.proc_id} failed: {reason}",
            file=sys.stderr,
            flush=True,
        )
        failure = supervision.MeshFailure(
            mesh_name=self.name,
            mesh_key=self.key,
            class_name=self.class_name,
            rank=self.rank.rank,
            proc_id=self.proc.proc_id,
            reason=reason,
            cause=cause,
        )
        supervision.route(self.proc, self.owner, failure)

    def _supervise(self, failure: supervision.MeshFailure) -> Any:
        """Offer ``failure`` (of a mesh this actor owns) to ``__supervise__``; returns
        its result, which may be awaitable (async actors)."""
        handler = getattr(self.obj, "__supervise__", None)
        if handler is None:
            return None
        return handler(failure)

    def _supervised(
        self, failure: supervision.MeshFailure, handled: Any, error: BaseException | None
    ) -> None:
        if error is not None:
            self.fail(
                f"__supervise__ raised while handling {failure}:\n"
                f"{runtime.format_exception(error)}",
                cause=failure,
            )
        elif not handled:
            self.fail(
                f"it owns actor mesh {failure.mesh_name!r}, which failed, and "
                "__supervise__ did not handle it",
                cause=failure,
            )

    def kill(self, reason: str | None) -> None:
        self.fail(f"killed: {reason or 'kill() called'}")

    # --- lifecycle ------------------------------------------------------------------------

    def _init(self) -> None:
        try:
            cls = loads(self._cls_blob)
            args, kwargs = loads(self._args_blob)
            self.info = info = _class_info(cls)
            self.class_name = info.name
            self.instance = Instance(
                name=self.name,
                class_name=info.name,
                actor_id=f"{self.proc.proc_id}/{self.name}[{self.rank.rank}]",
                proc_id=self.proc.proc_id,
                rank=self.rank,
                creator=self.creator,
                hosted=self,
            )
            token = _current.set(Context(self.instance, None))
            try:
                obj = cls.__new__(cls)
                obj.__init__(*args, **kwargs)
            finally:
                _current.reset(token)
            self.obj = obj
        except BaseException as e:  # the actor fails; calls get SupervisionError
            self.fail(f"__init__ raised:\n{runtime.format_exception(e)}")
        finally:
            self._cls_blob = self._args_blob = b""

    def _run(self) -> None:
        self._init()
        if self.info is not None and self.info.is_async and self.failed is None:
            import asyncio

            asyncio.run(self._run_async())
        else:
            self._run_sync()

    def _stop_owned(self, reason: str) -> None:
        """Stop, recursively, the meshes this actor spawned."""
        for owned in list(self.proc.owned.values()):
            if owned.owner_key == self.key and not owned.stopped:
                owned.mesh.stop(f"its owner {self.name!r} stopped: {reason}")

    def _run_sync_cleanup(self) -> None:
        """Run a sync ``__cleanup__(None)``, bounded by ``CLEANUP_TIMEOUT``: it runs on a
        helper thread, which is left behind (a daemon) if it overruns."""
        cleanup = self._cleanup_fn()
        if cleanup is None:
            return

        def run() -> None:
            try:
                cleanup(None)
            except Exception as e:
                print(f"monarch: __cleanup__ of {self.name!r} raised: {e!r}", file=sys.stderr)

        thread = threading.Thread(target=run, name=f"monarch-cleanup-{self.name}", daemon=True)
        thread.start()
        thread.join(CLEANUP_TIMEOUT)
        if thread.is_alive():
            print(
                f"monarch: __cleanup__ of {self.name!r} did not finish within "
                f"{CLEANUP_TIMEOUT} s; the actor stops without waiting for it",
                file=sys.stderr,
            )

    async def _run_async_cleanup(self) -> None:
        """Await an async ``__cleanup__(None)``, cancelled after ``CLEANUP_TIMEOUT``."""
        import asyncio

        cleanup = self._cleanup_fn()
        if cleanup is None:
            return
        try:
            await asyncio.wait_for(cleanup(None), CLEANUP_TIMEOUT)
        except Exception as e:  # TimeoutError included
            print(f"monarch: __cleanup__ of {self.name!r} failed: {e!r}", file=sys.stderr)

    def _cleanup_fn(self) -> Any:
        return getattr(self.obj, "__cleanup__", None) if self.obj is not None else None

    # --- messages ---------------------------------------------------------------------------

    def _dead_answer(self) -> str:
        what = "failed" if self.failed else "was stopped"
        return (
            f"The actor {self.name!r} (rank {self.rank.rank}) and all its descendants "
            f"{what}; it cannot handle calls: {self.failed or self.stopped}"
        )

    def _retire_if_dead(self) -> bool:
        """Hand a failed or stopped actor's key to the process's undertaker, so that
        this thread can end; true if it did."""
        if self.failed is None and self.stopped is None:
            return False
        self.proc.retire(self.key, self._dead_answer())
        self.proc.actors.pop(self.key, None)
        return True

    def _dead_reply(self, header: tuple[Any, ...]) -> bool:
        """Answer a message to a failed or stopped actor; true if it was one."""
        method, reply_port, reply_key, index = header[:4]
        reason = self.failed or self.stopped
        if reason is None:
            return False
        if method == "__stop__":
            if reply_port is not None:
                self.proc.reply(reply_port, reply_key, index, OK, None)
            return True
        if reply_port is not None:
            what = "failed" if self.failed else "was stopped"
            self.proc.reply(
                reply_port,
                reply_key,
                index,
                FAILED,
                f"The actor {self.name!r} (rank {self.rank.rank}) and all its descendants "
                f"{what}; it cannot handle {method}: {reason}",
            )
        return True

    def _begin(self, parts: list[bytes]) -> _Work | None:
        """Decode a message: ``("call", header, fn, args, kwargs)``,
        ``("supervise", failure)``, ``("stop", header, reason)``, or None when it was
        answered already."""
        header = loads(parts[0])
        method = header[0]
        if method == "__supervise__":
            failure = loads(parts[1])[0][0]
            # A failed or stopped owner already told its own owner; nothing to add.
            return None if (self.failed or self.stopped) else ("supervise", failure)
        if self._dead_reply(header):
            return None
        if method == "__stop__":
            stop_args, _ = loads(parts[1])
            return ("stop", header, str(stop_args[0]) if stop_args else "stopped")
        if method == "__initialized__":
            self._reply(header, OK, None)
            return None
        try:
            args, kwargs = loads(parts[1])
            fn = getattr(self.obj, method)
        except Exception as e:  # cannot unpickle, or no such method: the caller hears
            self._reply(header, ERROR, ActorError._from_local(e, f"before {method} ran")._to_wire())
            return None
        return ("call", header, fn, args, kwargs)

    def _reply(self, header: tuple[Any, ...], status: int, value: Any) -> None:
        reply_port, reply_key, index = header[1], header[2], header[3]
        if reply_port is not None:
            self.proc.reply(reply_port, reply_key, index, status, value)

    def _failure(self, header: tuple[Any, ...], e: BaseException) -> None:
        method, reply_port = header[0], header[1]
        if reply_port is None or not isinstance(e, Exception) or self._explicit(method):
            # broadcast, explicit-port and BaseException: the actor fails.
            how = "broadcast to" if reply_port is None else "in"
            self.fail(
                f"{type(e).__name__} escaped {how} endpoint {method}:\n"
                f"{runtime.format_exception(e)}"
            )
            if reply_port is not None and not self._explicit(method):
                self._reply(header, FAILED, f"The actor {self.name!r} failed: {self.failed}")
            return
        self._reply(header, ERROR, ActorError(e)._to_wire())

    def _explicit(self, method: str) -> bool:
        ep = self.info.endpoints.get(method) if self.info is not None else None
        return bool(ep is not None and ep._explicit_response_port)

    def _context(self, header: tuple[Any, ...]) -> Context:
        assert self.instance is not None
        return Context(self.instance, (header[3], header[4], header[5]))

    def _args(self, header: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        if self._explicit(header[0]):
            return (Port(header[1], header[2], header[3]), *args)
        return args

    def _after(self) -> bool:
        """After a message: stop if ``instance.stop()`` asked to; true if it did (the
        caller then runs ``__cleanup__``)."""
        if self.stop_after_current is None or self.stopped is not None or self.failed:
            return False
        self._stop_owned(self.stop_after_current)
        return True

    def _run_sync(self) -> None:
        while not self._retire_if_dead():
            try:
                parts = self.queue.get()
            except RuntimeError:
                return
            work = self._begin(parts)
            if work is None:
                continue
            kind = work[0]
            if kind == "supervise":
                failure = work[1]
                try:
                    handled, error = self._supervise(failure), None
                except BaseException as e:
                    handled, error = False, e
                self._supervised(failure, handled, error)
                continue
            if kind == "stop":
                _, header, reason = work
                self._stop_owned(reason)
                self._run_sync_cleanup()
                self.stopped = reason
                self._reply(header, OK, None)
                continue
            _, header, fn, args, kwargs = work
            token = _current.set(self._context(header))
            try:
                result = fn(*self._args(header, args), **kwargs)
            except BaseException as e:
                self._failure(header, e)
            else:
                if not self._explicit(header[0]):
                    self._reply(header, OK, result)
            finally:
                _current.reset(token)
            if self._after():
                self._run_sync_cleanup()
                self.stopped = self.stop_after_current

    async def _run_async(self) -> None:
        import asyncio

        queue = self.queue
        tasks: set[asyncio.Task[None]] = set()
        while not self._retire_if_dead():
            try:
                parts = queue.try_get()
                if parts is None:
                    parts = await queue.recv()
            except RuntimeError:
                return
            work = self._begin(parts)
            if work is None:
                continue
            kind = work[0]
            if kind == "supervise":
                failure = work[1]
                try:
                    handled, error = self._supervise(failure), None
                    if inspect.isawaitable(handled):
                        handled = await handled
                except BaseException as e:
                    handled, error = False, e
                self._supervised(failure, handled, error)
                continue
            if kind == "stop":
                _, header, reason = work
                for task in tasks:
                    task.cancel()
                self._stop_owned(reason)
                await self._run_async_cleanup()
                self.stopped = reason
                self._reply(header, OK, None)
                continue
            _, header, fn, args, kwargs = work
            assert self.info is not None
            ep = self.info.endpoints.get(header[0])
            token = _current.set(self._context(header))
            try:
                if ep is not None and ep._concurrent:
                    task = asyncio.get_running_loop().create_task(
                        self._invoke(header, fn, args, kwargs)
                    )
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    continue
                await self._invoke(header, fn, args, kwargs)
            finally:
                _current.reset(token)
            if self._after():
                await self._run_async_cleanup()
                self.stopped = self.stop_after_current

    async def _invoke(
        self, header: tuple[Any, ...], fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            result = fn(*self._args(header, args), **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as e:
            self._failure(header, e)
        else:
            if not self._explicit(header[0]):
                self._reply(header, OK, result)
