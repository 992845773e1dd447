"""Collecting replies: the Future implementations behind the adverbs.

Each call has a reply queue of this process's inbox. ``_Replies`` gathers one reply per
target (``call``, ``call_one``, ``choose``), ``_StreamOne`` takes the next one
(``stream``). Replies are de-duplicated by rank: a proc's death notice answers for the
ranks still owed, and a real reply that arrived first wins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from monarch._src.actor import runtime
from monarch._src.actor.errors import ActorError, SupervisionError
from monarch._src.actor.runtime import ERROR, FAILED, OK, dumps, loads


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
