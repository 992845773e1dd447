"""Ports and channels: ``Channel.open``, ``Port``, ``PortReceiver``, ``send`` and
``Accumulator``.

A channel is a queue of replies of this process's agent: ``Channel.open()`` returns a
:class:`Port` naming it, which pickles as a reference and can be handed to any actor,
and a :class:`PortReceiver` reading it. Messages from one sender arrive in the order
sent. An endpoint declared with ``explicit_response_port=True`` receives the
:class:`Port` its caller waits on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

from monarch._rust_bindings import CastMode, PortHandle, ReplyItem, ReplyQueue
from monarch._src.actor import process
from monarch._src.actor.context import sender
from monarch._src.actor.endpoint import Endpoint
from monarch._src.actor.errors import ActorError
from monarch._src.actor.future import Future
from monarch._src.actor.pickling import dumps, dumps_value
from monarch._src.actor.replies import ERROR, OK, MeshInfo, decode

__all__ = ["Accumulator", "Channel", "Port", "PortReceiver", "send"]

R = TypeVar("R")
A = TypeVar("A")


class Port(Generic[R]):
    """Where an explicit-response endpoint sends its reply (``send``/``exception``),
    any time later and from any thread; also one end of a ``Channel``. Pickles as a
    reference."""

    #: Whether a message that cannot be delivered goes back to its sender.
    return_undeliverable = True

    def __init__(self, handle: PortHandle | None) -> None:
        #: ``None``: nobody receives (an explicit-port endpoint reached by ``broadcast``).
        self._handle = handle

    def send(self, obj: R) -> None:
        """Send ``obj`` to the port's receiver."""
        if self._handle is not None:
            self._handle.send(sender(), OK, dumps_value(obj))

    def exception(self, exc: BaseException) -> None:
        """Make the receiver raise ``exc`` (as an ``ActorError``)."""
        if self._handle is not None:
            err = exc if isinstance(exc, ActorError) else ActorError(exc)
            self._handle.send(sender(), ERROR, [dumps(err._to_wire())])

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._handle,))

    def __repr__(self) -> str:
        return repr(self._handle)


_CHANNEL = MeshInfo("channel", "Channel", None, False)


class _Receive:
    """One message of a receiver's queue (a Future implementation)."""

    def __init__(self, receiver: PortReceiver[Any]) -> None:
        self._receiver = receiver

    def wait(self, timeout: float | None) -> Any:
        self._receiver._check_open()
        try:
            item = self._receiver._queue.get(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"nothing received on {self._receiver} within {timeout} s; recv() again or "
                "await it later"
            ) from None
        return self._receiver._take(item)

    async def wait_async(self) -> Any:
        self._receiver._check_open()
        queue = self._receiver._queue
        item = queue.try_get()
        if item is None:
            item = await queue.recv()
        return self._receiver._take(item)


class PortReceiver(Generic[R]):
    """The receiving end of a channel. ``recv()`` returns a lazy future of the next
    message; a message sent with ``Port.exception`` raises there."""

    def __init__(self, queue: ReplyQueue, *, ranked: bool = False, once: bool = False) -> None:
        self._queue = queue
        self._ranked = ranked
        self._once = once
        self._received = 0

    def _check_open(self) -> None:
        if self._once and self._received >= 1:
            raise RuntimeError(
                f"{self} is closed: it was opened with once=True and already received its "
                "message; open a new channel to receive more"
            )

    def _take(self, item: ReplyItem) -> Any:
        self._received += 1
        value = decode([item], _CHANNEL, "a message")[0]
        return (item.index, value) if self._ranked else value

    def recv(self) -> Future[R]:
        """The next message, as a future (``get()`` or ``await`` it)."""
        return Future(impl=_Receive(self))

    def __repr__(self) -> str:
        return f"PortReceiver({self._queue.port()!r})"


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """A new port and its receiver (``once``: the port takes one message)."""
        queue = process.get().agent.reply_queue()
        return Port(queue.port()), PortReceiver(queue, once=once)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        """Like :meth:`open`, but the receiver yields ``(rank, value)``: the rank of the
        sender in the mesh view a ``send(..., port=port)`` was addressed to."""
        queue = process.get().agent.reply_queue()
        return Port(queue.port()), PortReceiver(queue, ranked=True, once=once)


def send(
    endpoint: Endpoint[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Send a call to the actors of ``endpoint``'s mesh (``"all"``) or one of them
    (``"choose"``), with each reply sent to ``port``; with ``port=None`` replies are
    dropped and an exception fails the actor (like ``broadcast``)."""
    if selection not in ("all", "choose"):
        raise ValueError(f"send(): selection must be 'all' or 'choose', got {selection!r}")
    if port is not None and not isinstance(port, Port):
        raise TypeError(f"send(): port must be a Port from Channel.open(), got {port!r}")
    # A remote function of distributed tensors (``monarch.remote``) sends itself to the
    # workers of the active mesh.
    remote_send = getattr(type(endpoint), "_send_to_port", None)
    if remote_send is not None:
        remote_send(endpoint, tuple(args), dict(kwargs), port, selection)
        return
    if not isinstance(endpoint, Endpoint):
        raise TypeError(
            f"send() takes a mesh endpoint (mesh.method) or a monarch.remote function, got "
            f"{endpoint!r}"
        )
    mesh = endpoint._mesh
    payload = endpoint._payload(tuple(args), dict(kwargs))
    index = None
    if selection == "choose":
        if len(mesh) == 0:
            raise ValueError(f"send(selection='choose') to {mesh._describe()}, which is empty")
        index = random.randrange(len(mesh))
    if port is None:
        mesh._send(endpoint._name, payload, CastMode.BROADCAST, index=index)
    else:
        mesh._send(endpoint._name, payload, CastMode.PORT, port=port._handle, index=index)


class Accumulator(Generic[R, A]):
    """Folds the replies of an endpoint: ``Accumulator(mesh.method, identity,
    combine).accumulate(*args)`` is a future of ``combine(...combine(identity, r1)...,
    rn)`` over the replies in arrival order."""

    def __init__(
        self, endpoint: Endpoint[..., R], identity: A, combine: Callable[[A, R], A]
    ) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call the endpoint on every actor of its mesh and fold the replies.

        The message is sent when the future is first waited on (``get()`` or
        ``await``), with ``stream`` semantics: replies are combined in the order they
        arrive, starting from ``identity``.

        Args:
            *args: The endpoint's positional arguments.
            **kwargs: The endpoint's keyword arguments.

        Returns:
            A future of the folded value.
        """
        endpoint, identity, combine = self._endpoint, self._identity, self._combine

        class _Fold:
            def __init__(self) -> None:
                self._futures: list[Future[R]] | None = None
                self._acc = identity
                self._done = 0

            def _stream(self) -> list[Future[R]]:
                if self._futures is None:
                    self._futures = list(endpoint.stream(*args, **kwargs))
                return self._futures

            def wait(self, timeout: float | None) -> A:
                futures = self._stream()
                while self._done < len(futures):
                    self._acc = combine(self._acc, futures[self._done].get(timeout))
                    self._done += 1
                return self._acc

            async def wait_async(self) -> A:
                futures = self._stream()
                while self._done < len(futures):
                    self._acc = combine(self._acc, await futures[self._done])
                    self._done += 1
                return self._acc

        return Future(impl=_Fold())
