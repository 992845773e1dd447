"""Turning replies into results: the Future implementations behind the adverbs.

The runtime collects a call's replies (one per rank, reduced over the cast tree) and
hands them over as ``ReplyItem`` records (``index``, ``status``, ``parts``); this module
unpickles them:

- status ``OK``: the value (its pickle, then its out-of-band buffers);
- ``ERROR``: an ``ActorError`` the endpoint raised (the actor lives on);
- ``FAILED`` / ``STOPPED``: the rank cannot answer (its actor failed or was stopped,
  its proc is gone): ``SupervisionError`` with the runtime's reason. A failed rank of a
  mesh the client owns first waits for the root hook's verdict on that mesh (see
  :func:`monarch._src.actor.supervision.await_verdict`).

A call's future raises ``SupervisionError`` if a rank cannot answer, else the first
``ActorError``, else gives the values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from monarch._rust_bindings import CallReplies, ReplyItem, ReplyQueue, ReplyStatus
from monarch._rust_bindings import Future as RustFuture
from monarch._src.actor.errors import ActorError, SupervisionError
from monarch._src.actor.pickling import loads_parts
from monarch._src.actor.supervision import await_verdict

__all__ = ["ERROR", "FAILED", "OK", "STOPPED", "CallFuture", "Failed", "RustWork", "StreamOne"]

R = TypeVar("R")

#: Reply statuses (the runtime's). An item's status is one of these objects itself.
OK, ERROR, FAILED, STOPPED = (
    ReplyStatus.OK,
    ReplyStatus.ERROR,
    ReplyStatus.FAILED,
    ReplyStatus.STOPPED,
)


class MeshInfo:
    """What a call's errors name: the mesh, its class, and whether the client owns it
    (then a failed rank waits for the hook's verdict)."""

    __slots__ = ("class_name", "client_owned", "mesh_id", "name", "ranks")

    def __init__(
        self,
        name: str,
        class_name: str,
        mesh_id: int | None,
        client_owned: bool,
        ranks: Any = None,
    ):
        self.name = name
        self.class_name = class_name
        self.mesh_id = mesh_id
        self.client_owned = client_owned
        #: The view's slice: a reply's index in the view to the actor's rank in the mesh
        #: (the rank a ``MeshFailure`` names); ``None``: the index is the rank.
        self.ranks = ranks

    def for_view(self, ranks: Any) -> MeshInfo:
        """This mesh, seen through a view whose slice is ``ranks``."""
        return MeshInfo(self.name, self.class_name, self.mesh_id, self.client_owned, ranks)

    def rank(self, index: int) -> int:
        """The mesh rank of the receiver at ``index`` in the view."""
        try:
            return int(self.ranks[index]) if self.ranks is not None else index
        except (IndexError, TypeError, ValueError):
            return index


def _unanswered(item: ReplyItem, mesh: MeshInfo, endpoint: str) -> SupervisionError:
    index, parts = item.index, item.parts
    reason = parts[0].decode(errors="replace") if parts else "no reason given"
    rank = mesh.rank(index)
    head = f"actor mesh {mesh.name!r} ({mesh.class_name}) rank {rank} cannot handle {endpoint}"
    if item.status == FAILED:
        actor = f"{mesh.name}[{rank}]"
        return SupervisionError(
            f"{head}: The actor {actor} and all its descendants have failed. Actor {actor} "
            f"exited because of the following reason: {reason}",
            endpoint,
        )
    return SupervisionError(f"{head}: {reason}", endpoint)


def _value(item: ReplyItem) -> Any:
    return loads_parts(item.parts)


def decode(items: list[ReplyItem], mesh: MeshInfo, endpoint: str, raw: bool = False) -> list[Any]:
    """The values of ``items`` in index order (their parts, when ``raw``), or raise the
    call's error."""
    error: ActorError | None = None
    for item in items:
        status = item.status
        if status is OK:  # the common case first; the others compare by value
            continue
        if status == FAILED or status == STOPPED:
            if status == FAILED and mesh.client_owned and mesh.mesh_id is not None:
                await_verdict(mesh.mesh_id)
            raise _unanswered(item, mesh, endpoint)
        if status == ERROR and error is None:
            error = ActorError._from_wire(_value(item))
    if error is not None:
        raise error
    if raw:
        return [item.parts for item in items]
    return [loads_parts(item.parts) for item in items]


class CallFuture(Generic[R]):
    """A call's replies (a Future implementation): ``finish`` builds the result from the
    values in index order."""

    def __init__(
        self,
        replies: CallReplies,
        mesh: MeshInfo,
        endpoint: str,
        finish: Callable[[list[Any]], R],
        raw: bool = False,
    ) -> None:
        self._replies = replies
        self._mesh = mesh
        self._endpoint = endpoint
        self._finish = finish
        self._raw = raw

    @property
    def messages(self) -> int:
        """How many reply messages arrived (one per top-level subtree of a reduced call)."""
        return self._replies.messages

    def wait(self, timeout: float | None) -> R:
        try:
            items = self._replies.get(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self._endpoint}: not all replies arrived within {timeout} s; the call "
                "goes on: get() again or await to collect it"
            ) from None
        return self._finish(decode(items, self._mesh, self._endpoint, self._raw))

    async def wait_async(self) -> R:
        items = await self._replies.wait()
        if any(item.status == FAILED for item in items) and self._mesh.client_owned:
            import asyncio

            # The verdict wait blocks: keep it off the loop.
            await asyncio.to_thread(decode, items, self._mesh, self._endpoint, True)
        return self._finish(decode(items, self._mesh, self._endpoint, self._raw))


class StreamOne:
    """The next reply of a stream, whichever rank it comes from."""

    def __init__(self, queue: ReplyQueue, mesh: MeshInfo, endpoint: str) -> None:
        self._queue = queue
        self._mesh = mesh
        self._endpoint = endpoint

    def wait(self, timeout: float | None) -> Any:
        try:
            item = self._queue.get(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{self._endpoint}: no reply within {timeout} s; get() again later"
            ) from None
        return decode([item], self._mesh, self._endpoint)[0]

    async def wait_async(self) -> Any:
        item = self._queue.try_get()
        if item is None:
            item = await self._queue.recv()
        return decode([item], self._mesh, self._endpoint)[0]


class Failed:
    """Work that failed before it started."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def wait(self, timeout: float | None) -> Any:
        raise self._error

    async def wait_async(self) -> Any:
        raise self._error


class RustWork(Generic[R]):
    """Work running in the runtime (a stop, a spawn's readiness), converted by
    ``convert``; ``error``, if given, says what its ``RuntimeError`` raises instead."""

    def __init__(
        self,
        fut: RustFuture[Any],
        convert: Callable[[Any], R],
        error: Callable[[RuntimeError], BaseException] | None = None,
    ) -> None:
        self._fut = fut
        self._convert = convert
        self._error = error

    def _failed(self, e: RuntimeError) -> BaseException:
        if self._error is None:
            return e
        return self._error(e)

    def wait(self, timeout: float | None) -> R:
        try:
            value = self._fut.get(timeout)
        except RuntimeError as e:
            error = self._failed(e)
            if error is e:
                raise
            raise error from None
        return self._convert(value)

    async def wait_async(self) -> R:
        try:
            value = await self._fut
        except RuntimeError as e:
            error = self._failed(e)
            if error is e:
                raise
            raise error from None
        return self._convert(value)
