"""Ports and channels (API.md §1.8): ``Channel.open``, ``PortReceiver``, ``send`` and
``Accumulator``.

A channel is a reply queue of this process's inbox (see ``hyperactor_mesh::inbox``):
``Channel.open()`` returns a :class:`~monarch._src.actor.actor_mesh.Port` naming it, which
pickles as a reference and can be handed to any actor, and a :class:`PortReceiver`
reading it. Messages from one sender arrive in the order sent.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

from monarch._src.actor import runtime
from monarch._src.actor.actor_mesh import ActorError, Port, SupervisionError
from monarch._src.actor.endpoint import DIRECT, Endpoint, _header
from monarch._src.actor.future import Future
from monarch._src.actor.runtime import ERROR, OK, decode_replies

R = TypeVar("R")
A = TypeVar("A")


class _Receive:
    """One message of a receiver's queue (a Future implementation)."""

    def __init__(self, receiver: PortReceiver[Any]) -> None:
        self._receiver = receiver

    def wait(self, timeout: float | None) -> Any:
        self._receiver._check_open()
        if self._receiver._extra:
            return self._receiver._take(self._receiver._extra.pop(0))
        queue = self._receiver._queue
        try:
            parts = queue.get(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"nothing received on {self._receiver} within {timeout} s; recv() again or "
                "await it later"
            ) from None
        return self._receiver._decode(parts)

    async def wait_async(self) -> Any:
        self._receiver._check_open()
        if self._receiver._extra:
            return self._receiver._take(self._receiver._extra.pop(0))
        queue = self._receiver._queue
        parts = queue.try_get()
        if parts is None:
            parts = await queue.recv()
        return self._receiver._decode(parts)


class PortReceiver(Generic[R]):
    """The receiving end of a channel. ``recv()`` returns a lazy future of the next
    message; a message sent with ``Port.exception`` raises there."""

    def __init__(self, queue: Any, *, ranked: bool = False, once: bool = False) -> None:
        self._queue = queue
        self._ranked = ranked
        self._once = once
        self._received = 0
        #: Replies that came in one message with the one returned (e.g. failures of
        #: several ranks reported at once), returned next.
        self._extra: list[tuple[int, int, Any]] = []

    def _check_open(self) -> None:
        if self._once and self._received >= 1:
            raise RuntimeError(
                f"{self} is closed: it was opened with once=True and already received its "
                "message; open a new channel to receive more"
            )

    def _decode(self, parts: list[bytes]) -> Any:
        first, *self._extra = decode_replies(parts)
        return self._take(first)

    def _take(self, reply: tuple[int, int, Any]) -> Any:
        index, status, value = reply
        self._received += 1
        if self._once and self._received == 1:
            self._queue.close()
        if status == OK:
            return (index, value) if self._ranked else value
        if status == ERROR:
            raise ActorError._from_wire(value)
        raise SupervisionError(value)

    def recv(self) -> Future[R]:
        """The next message, as a future (``get()`` or ``await`` it)."""
        return Future(impl=_Receive(self))

    def __repr__(self) -> str:
        return f"PortReceiver({self._queue.port}#{self._queue.key:#x})"


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """A new port and its receiver (``once``: the port takes one message)."""
        ctx = runtime.process_context()
        queue = ctx.inbox.reply_queue()
        return Port(ctx.port_id, queue.key, 0), PortReceiver(queue, once=once)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        """Like :meth:`open`, but the receiver yields ``(rank, value)``: the rank of the
        sender in the mesh view a ``send(..., port=port)`` was addressed to."""
        ctx = runtime.process_context()
        queue = ctx.inbox.reply_queue()
        return Port(ctx.port_id, queue.key, 0), PortReceiver(queue, ranked=True, once=once)


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
    if not isinstance(endpoint, Endpoint):
        raise TypeError(f"send() takes a mesh endpoint (mesh.method), got {endpoint!r}")
    if selection not in ("all", "choose"):
        raise ValueError(f"send(): selection must be 'all' or 'choose', got {selection!r}")
    if port is not None and not isinstance(port, Port):
        raise TypeError(f"send(): port must be a Port from Channel.open(), got {port!r}")
    mesh = endpoint._mesh
    payload = endpoint._payload(tuple(args), dict(kwargs))
    ref = mesh._ref
    ranks = mesh._targets
    if selection == "choose":
        if not ranks:
            raise ValueError(f"send(selection='choose') to {mesh._describe()}, which is empty")
        ranks = [random.choice(ranks)]
    reply = (port._port_id, port._reply_key) if port is not None else None
    parts = [_header(mesh, endpoint._name), *payload]
    ref.group.cast(ref.key, ranks, parts, reply, None, DIRECT)


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
