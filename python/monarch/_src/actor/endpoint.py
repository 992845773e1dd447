"""Endpoints: ``@endpoint``, ``@concurrent_endpoint`` and the adverbs of ``mesh.method``.

``@endpoint`` turns an actor method into an :class:`EndpointProperty`. On an actor
instance it is the plain method; on an actor mesh, ``mesh.method`` is an
:class:`Endpoint` whose adverbs (``call``, ``call_one``, ``choose``, ``stream``,
``broadcast``) check the arguments against the method's signature, pickle them once and
cast one message to the mesh's actors.

Typing: an endpoint is generic in the method's parameters ``P`` (without ``self``, and
without the port of an ``explicit_response_port`` endpoint) and its result ``R`` (for an
``async def`` method, what its coroutine returns), so a type checker checks every call.
A mesh is typed as its actor class (what ``ProcMesh.spawn`` is annotated to return), and
the descriptor's ``__get__`` on an instance is typed as the :class:`Endpoint`, which is
what a mesh's attribute is: with ``counter = procs.spawn("counter", Counter)``,
``counter.incr.call(1)`` is a ``Future[ValueMesh[int]]`` for the class below, and
``counter.incr.call("1")`` a type error. At run time an actor instance gets its plain
method:

>>> import asyncio
>>> from monarch._src.actor.actor import Actor
>>> class Counter(Actor):
...     def __init__(self) -> None:
...         self.value = 0
...     @endpoint
...     async def incr(self, by: int = 1) -> int:
...         self.value += by
...         return self.value
>>> counter = Counter()
>>> asyncio.run(counter.incr(2))  # the actor calling its own endpoint
2
>>> list(Counter.incr._signature.parameters)  # what callers pass, checked at call time
['by']

This module needs the actor mesh only for typing: a mesh is duck-typed here (its
``_send`` and ``_stream`` do the sending), so ``actor_mesh`` imports this module and
never the other way round.
"""

from __future__ import annotations

import functools
import inspect
import pickle
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from monarch._rust_bindings import CastMode
from monarch._src.actor import extensions
from monarch._src.actor.future import Future
from monarch._src.actor.pickling import dumps, dumps_call
from monarch._src.actor.value_mesh import ValueMesh

#: ``route(endpoint, adverb, args, kwargs)``: how a call without monarch tensors goes
#: to a mesh that received calls through the tensor engine (which sets it on the mesh,
#: see ``monarch._src.tensor_engine.client.interop``): what the adverb returns, or
#: :data:`SEND_DIRECTLY` when the call is to go the usual way.
TensorRoute = Callable[["Endpoint[..., Any]", str, tuple[Any, ...], dict[str, Any]], Any]
#: What a :data:`TensorRoute` returns for a call it leaves to the usual path.
SEND_DIRECTLY: Any = object()

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh
    from monarch._src.actor.channel import Port

__all__ = [
    "Endpoint",
    "EndpointKind",
    "EndpointProperty",
    "as_endpoint",
    "concurrent_actor",
    "concurrent_endpoint",
    "endpoint",
]

#: The parameters of an endpoint as its callers pass them.
P = ParamSpec("P")
#: What an endpoint's call gives back (an async method: what its coroutine returns).
R = TypeVar("R")


# --- the descriptor -----------------------------------------------------------------------


class EndpointProperty(Generic[P, R]):
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

    # A type checker sees a mesh as its actor class, so on an instance the descriptor is
    # typed as what a mesh's attribute is: the Endpoint. At run time an actor instance
    # gets its bound method (an actor calling its own endpoint directly), and ActorMesh
    # builds the Endpoint itself.
    @overload
    def __get__(self, instance: None, owner: type | None = None) -> EndpointProperty[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Endpoint[P, R]: ...
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


def _endpoints(cls: type) -> dict[str, EndpointProperty[..., Any]]:
    """The endpoints of an actor class, base classes' included, by name."""
    found: dict[str, EndpointProperty[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            elif name in found:
                del found[name]  # overridden by a plain attribute
    return found


# --- the decorators -----------------------------------------------------------------------
#
# The overloads only tell a type checker what the decorated method becomes: an async
# method's R is what its coroutine returns (so the coroutine overload comes first), and an
# explicit-response-port method's R is the port's type, its first parameter after self
# being no argument of the callers'.


class _Decorator(Protocol):
    """``@endpoint(...)`` without an explicit response port."""

    @overload
    def __call__(
        self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
    ) -> EndpointProperty[P, R]: ...
    @overload
    def __call__(self, method: Callable[Concatenate[Any, P], R], /) -> EndpointProperty[P, R]: ...


class _PortDecorator(Protocol):
    """``@endpoint(explicit_response_port=True, ...)``: ``def m(self, port, ...)``."""

    def __call__(
        self, method: Callable[Concatenate[Any, Port[R], P], object], /
    ) -> EndpointProperty[P, R]: ...


class _AsyncDecorator(Protocol):
    """``@concurrent_endpoint(...)`` without an explicit response port."""

    def __call__(
        self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
    ) -> EndpointProperty[P, R]: ...


class _AsyncPortDecorator(Protocol):
    """``@concurrent_endpoint(explicit_response_port=True, ...)``."""

    def __call__(
        self, method: Callable[Concatenate[Any, Port[R], P], Coroutine[Any, Any, object]], /
    ) -> EndpointProperty[P, R]: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...
@overload
def endpoint(
    method: Callable[Concatenate[Any, P], R],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...
@overload
def endpoint(
    method: Callable[Concatenate[Any, Port[R], P], object],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...
@overload
def endpoint(
    method: None = None,
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _Decorator: ...
@overload
def endpoint(
    method: None = None,
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _PortDecorator: ...
def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as remotely callable; bare (``@endpoint``) or with options.

    With ``explicit_response_port=True`` the method's first parameter after ``self`` is a
    :class:`Port` it replies through (``port.send(value)``), at any time; callers do not
    pass it.
    """

    def wrap(m: Callable[..., Any]) -> EndpointProperty[..., Any]:
        if isinstance(m, EndpointProperty):
            raise ValueError(f"{m.__name__} is already an endpoint")
        return EndpointProperty(
            m,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    return wrap(method) if method is not None else wrap


@overload
def concurrent_endpoint(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...
@overload
def concurrent_endpoint(
    method: Callable[Concatenate[Any, Port[R], P], Coroutine[Any, Any, object]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> EndpointProperty[P, R]: ...
@overload
def concurrent_endpoint(
    method: None = None,
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _AsyncDecorator: ...
@overload
def concurrent_endpoint(
    method: None = None,
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _AsyncPortDecorator: ...
def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose body runs as a background task of the actor's loop: the
    actor takes the next message at once (only start order is guaranteed)."""

    def wrap(m: Callable[..., Any]) -> EndpointProperty[..., Any]:
        if isinstance(m, EndpointProperty):
            raise ValueError(
                f"@concurrent_endpoint does not wrap @endpoint ({m.__name__}): use one of "
                "them, not both"
            )
        if not inspect.iscoroutinefunction(m):
            raise ValueError(
                f"@concurrent_endpoint can only wrap async endpoints; {m.__name__} is sync "
                "(define it with `async def`)"
            )
        return EndpointProperty(
            m,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    return wrap(method) if method is not None else wrap


#: Set on a class by :func:`concurrent_actor`: a stop lets its running endpoint tasks
#: finish before ``__cleanup__`` instead of cancelling them.
CONCURRENT_ACTOR_FLAG = "_monarch_concurrent_actor"

_A = TypeVar("_A", bound=type)


def concurrent_actor(cls: _A) -> _A:
    """Class decorator: every endpoint of the actor class (base classes' included) is
    concurrent, as if each were a :func:`concurrent_endpoint`: its body runs as a task of
    the actor's loop and the actor takes the next message at once.

    A stop (``mesh.stop()``, the proc mesh's stop) lets the endpoint tasks that are
    running finish first, for up to the ``cleanup_timeout`` config key (those still
    running then are cancelled), then runs ``__cleanup__``, which therefore sees what
    they did.

    ``ValueError`` if an endpoint is sync or ``__cleanup__`` is sync: every endpoint and
    ``__cleanup__`` must be ``async def``.
    """
    if not isinstance(cls, type):
        raise TypeError(f"@concurrent_actor decorates an actor class, not {cls!r}")
    endpoints = _endpoints(cls)
    sync = sorted(name for name, ep in endpoints.items() if not ep._is_async)
    if sync:
        raise ValueError(
            f"@concurrent_actor can only wrap async endpoints; {cls.__qualname__} has sync "
            f"endpoint(s) {sync} (define them with `async def`)"
        )
    cleanup = getattr(cls, "__cleanup__", None)
    if cleanup is not None and not inspect.iscoroutinefunction(cleanup):
        raise ValueError(
            f"@concurrent_actor requires async __cleanup__; {cls.__qualname__}.__cleanup__ "
            "is sync (define it with `async def`)"
        )
    for name, ep in endpoints.items():
        if not ep._concurrent:  # a copy: a base class's endpoint stays as it is there
            setattr(
                cls,
                name,
                EndpointProperty(
                    ep._method,
                    propagate=ep._propagate,
                    explicit_response_port=ep._explicit_response_port,
                    instrument=ep._instrument,
                    concurrent=True,
                ),
            )
    setattr(cls, CONCURRENT_ACTOR_FLAG, True)
    return cls


# --- caller side: the adverbs ---------------------------------------------------------------


@dataclass(frozen=True)
class EndpointKind:
    """How the endpoints of a spawned mesh are called: whether the method is a
    coroutine function, and whether it answers through an explicit response port. A
    mesh reference carries one per endpoint name."""

    is_async: bool
    explicit_response_port: bool


class Endpoint(Generic[P, R]):
    """``mesh.method``: the adverbs ``call``, ``call_one``, ``choose``, ``stream`` and
    ``broadcast``. Arguments are checked against the method's signature and pickled once,
    at call time."""

    def __init__(
        self, mesh: ActorMesh[Any], name: str, explicit: bool = False, propagate: Any = None
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._explicit = explicit
        #: ``as_endpoint(..., propagate=)``'s (an ``@endpoint``'s own is on its property).
        self._propagate = propagate
        info = mesh._info
        #: The method's ``@endpoint`` property, when this process knows the class (a
        #: mesh's class never changes: looked up once, not per call).
        self._prop: EndpointProperty[..., Any] | None = (
            info.endpoints.get(name) if info is not None else None
        )

    def _qualname(self) -> str:
        return f"{self._mesh._class_name}.{self._name}"

    def _property(self) -> EndpointProperty[..., Any] | None:
        return self._prop

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` if the arguments do not fit the endpoint's signature."""
        ep = self._prop
        if ep is not None:
            try:
                ep._check_args(args, kwargs)
            except TypeError as e:
                raise TypeError(
                    f"wrong arguments for endpoint {self._qualname()}{ep._signature}: {e}"
                ) from None

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes | bytearray]:
        """The pickled call; raises :class:`_TensorArguments` when the arguments hold
        distributed tensors (monarch tensors never pickle, so this costs nothing
        otherwise)."""
        self._check(args, kwargs)
        try:
            return dumps_call(args, kwargs)
        except Exception as e:
            if _carries_tensors(args, kwargs):
                raise _TensorArguments(self._qualname()) from None
            culprit = _find_unpicklable(args, kwargs)
            what = f"cannot send a call to endpoint {self._qualname()}: argument {culprit}"
            if isinstance(e, (TypeError, pickle.PicklingError)):
                raise TypeError(f"{what} cannot be pickled ({type(e).__name__}: {e})") from e
            # The argument's own code raised while it was pickled (a __reduce__ or
            # __getstate__): its exception goes to the caller as it is, told where.
            add_note = getattr(e, "add_note", None)  # Python 3.11 and later
            if add_note is not None:
                add_note(f"(raised while pickling it: {what} cannot be sent)")
            raise

    def _routed(self, adverb: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What the tensor engine's route of this mesh does with the call, if the mesh
        has one (it received calls with monarch tensors: later calls go the same way,
        in order), else :data:`SEND_DIRECTLY`."""
        route = self._mesh._shared.tensor_route
        if route is None:
            return SEND_DIRECTLY
        return route(self, adverb, args, kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every actor of the view; a future of a ValueMesh of their replies."""
        routed = self._routed("call", args, kwargs)
        if routed is not SEND_DIRECTLY:
            return routed  # type: ignore[no-any-return]
        try:
            payload = self._payload(args, kwargs)
        except _TensorArguments:
            return _with_tensors(self, "call", args, kwargs)  # type: ignore[no-any-return]
        fut: Future[ValueMesh[R]] = self._mesh._send(self._name, payload, CastMode.CALL)
        return fut

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the only actor of the view (ValueError if there are several)."""
        n = self._mesh._count
        if n != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly 1 actor, but {self._mesh._describe()} "
                f"has {n}; use call(), or slice the mesh down to one actor first"
            )
        routed = self._routed("call_one", args, kwargs)
        if routed is not SEND_DIRECTLY:
            return routed  # type: ignore[no-any-return]
        try:
            payload = self._payload(args, kwargs)
        except _TensorArguments:
            return _with_tensors(self, "call_one", args, kwargs)  # type: ignore[no-any-return]
        one: Future[R] = self._mesh._send(self._name, payload, CastMode.ONE)
        return one

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor of the view, picked by the runtime."""
        if len(self._mesh) == 0:
            raise ValueError(f"choose() on {self._mesh._describe()}, which has no actors")
        routed = self._routed("choose", args, kwargs)
        if routed is not SEND_DIRECTLY:
            return routed  # type: ignore[no-any-return]
        try:
            payload = self._payload(args, kwargs)
        except _TensorArguments:
            return _with_tensors(self, "choose", args, kwargs)  # type: ignore[no-any-return]
        chosen: Future[R] = self._mesh._send(self._name, payload, CastMode.CHOOSE)
        return chosen

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Call every actor; yields one future per actor, in reply arrival order."""
        routed = self._routed("stream", args, kwargs)
        if routed is not SEND_DIRECTLY:
            return routed  # type: ignore[no-any-return]
        try:
            payload = self._payload(args, kwargs)
        except _TensorArguments:
            return _with_tensors(self, "stream", args, kwargs)  # type: ignore[no-any-return]
        return self._mesh._stream(self._name, payload)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor without waiting for replies (exceptions fail the actor)."""
        if self._routed("broadcast", args, kwargs) is not SEND_DIRECTLY:
            return
        try:
            payload = self._payload(args, kwargs)
        except _TensorArguments:
            _with_tensors(self, "broadcast", args, kwargs)
            return
        self._mesh._send(self._name, payload, CastMode.BROADCAST)

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the endpoint on every actor of the view, which must be the procs of the
        active mesh, as a step of the distributed-tensor program: the tensors it
        returns become distributed tensors (monarch tensors, one shard per actor),
        without waiting. Their shapes come from the endpoint's ``propagate`` function
        (``@endpoint(propagate=fn)``), called with the arguments (fake tensors for
        monarch tensors)."""
        return extensions.tensor_engine().rref(self, args, kwargs)  # type: ignore[no-any-return]

    # Hidden from type checkers, so that calling an endpoint of a mesh directly is a type
    # error, as it is an error at run time.
    if not TYPE_CHECKING:

        def __call__(self, *args, **kwargs):
            raise TypeError(
                f"an endpoint of a mesh is not called directly; use "
                f"{self._name}.call(...), .call_one(...), .choose(...), .stream(...) or "
                ".broadcast(...)"
            )


class _TensorArguments(TypeError):
    """The arguments of an endpoint call hold distributed tensors (monarch tensors): the
    adverbs hand such calls to the tensor engine."""

    def __init__(self, qualname: str) -> None:
        super().__init__(
            f"the arguments of {qualname} hold monarch tensors: pass them with the endpoint's "
            "call, call_one, choose, stream, broadcast or rref, which deliver each actor "
            "its local shard"
        )


def _carries_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments hold monarch tensors (only possible once the tensor engine
    was imported; the check imports nothing otherwise)."""
    engine = extensions.tensor_engine_if_tensors()
    return engine is not None and engine.has_tensors(args, kwargs)


def _with_tensors(
    endpoint: Endpoint[..., Any], adverb: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return extensions.tensor_engine().call(endpoint, adverb, args, kwargs)


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


# --- methods that are not endpoints ------------------------------------------------------------


class _NotAnEndpoint:
    """``mesh.method`` for a method of the actor class that is not an endpoint: calling
    it explains; :func:`as_endpoint` turns it into an :class:`Endpoint`."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} is not an endpoint of {self._mesh._class_name}: mark it with "
            f"@endpoint, or call it as as_endpoint(mesh.{self._name}).call(...)"
        )


def _declared(endpoint: Endpoint[..., Any]) -> bool:
    """Whether ``endpoint`` is an ``@endpoint`` of its actor class (not a plain method
    that :func:`as_endpoint` made one)."""
    info = endpoint._mesh._info
    return info is None or endpoint._name in info.endpoints


@overload
def as_endpoint(
    not_an_endpoint: Callable[P, Coroutine[Any, Any, R]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...
@overload
def as_endpoint(
    not_an_endpoint: Callable[P, R],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...
@overload
def as_endpoint(
    not_an_endpoint: Callable[Concatenate[Port[R], P], object],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
) -> Endpoint[P, R]: ...
def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[..., Any]:
    """Treat a non-``@endpoint`` method of a spawned mesh as an endpoint."""
    if isinstance(not_an_endpoint, Endpoint) and not _declared(not_an_endpoint):
        # A plain method made an endpoint before (the mesh now lists it): as upstream,
        # as_endpoint(mesh.method) may be asked again, with another ``propagate``.
        return Endpoint(
            not_an_endpoint._mesh,
            not_an_endpoint._name,
            explicit_response_port or not_an_endpoint._explicit,
            propagate if propagate is not None else not_an_endpoint._propagate,
        )
    if not isinstance(not_an_endpoint, _NotAnEndpoint):
        raise ValueError(
            "as_endpoint() takes a method of a spawned actor mesh that is not an endpoint, "
            f"e.g. as_endpoint(mesh.method); got {not_an_endpoint!r}"
        )
    mesh = not_an_endpoint._mesh
    name = not_an_endpoint._name
    endpoints = mesh._endpoints
    if name not in endpoints:
        info = mesh._info
        method = getattr(info.cls, name) if info is not None else None
        endpoints[name] = EndpointKind(inspect.iscoroutinefunction(method), explicit_response_port)
    return Endpoint(mesh, name, explicit_response_port, propagate)
