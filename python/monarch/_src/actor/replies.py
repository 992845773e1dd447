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
from monarch._src.actor.runtime import ERROR, OK, decode_replies


class _Watcher:
    """What a call watches for: the ranks it cast to, and the subtree of the cast tree
    each heads. If a rank's proc dies, every rank whose message was relayed through it
    is answered with ``FAILED`` (a reply that arrived first wins)."""

    def __init__(self, reply_key: int) -> None:
        self.reply_key = reply_key
        self._live: list[tuple[int, int]] = []
        self._ends: list[int] = []

    def track(self, live: list[tuple[int, int]], ends: list[int]) -> None:
        """``live[pos] = (index, rank)`` were cast to; ``ends`` from ``Inbox.cast``."""
        self._live, self._ends = live, ends

    def rank_failed(self, g: int, reason: str) -> None:
        """Proc group rank ``g`` is dead (called for every pending call of the group, so
        the lookup is a scan: only a death pays for it)."""
        if not self._open():
            return
        live = self._live
        pos = next((pos for pos, (_, rank) in enumerate(live) if rank == g), None)
        if pos is None:
            return
        end = self._ends[pos]
        i = live[pos][0]
        ctx = runtime.process_context()
        ctx.fail_replies(ctx.port_id, self.reply_key, [i], reason)
        if end > pos + 1:
            relayed = f"{reason} (the message to this rank was relayed through rank {i}'s proc)"
            ctx.fail_replies(
                ctx.port_id, self.reply_key, [j for j, _ in live[pos + 1 : end]], relayed
            )

    def _open(self) -> bool:
        return True


class _Replies(_Watcher):
    """Collects ``expected`` replies from a reply queue (a Future implementation).
    Partial progress survives a timeout. A ``FAILED`` reply ends the wait at once."""

    def __init__(
        self,
        queue: Any,
        expected: int,
        endpoint: str,
        finish: Callable[[list[Any]], Any],
    ) -> None:
        super().__init__(queue.key)
        self._queue = queue
        self._expected = expected
        self._endpoint = endpoint
        self._finish = finish
        self._values: list[Any] = [None] * expected
        self._got = 0
        #: Reply messages taken (a reduced call gets one per top-level subtree).
        self.messages = 0
        self._seen: set[int] = set()
        self._error: BaseException | None = None
        self._failed = False

    def _open(self) -> bool:
        return self._queue is not None

    def _take(self, parts: list[bytes]) -> None:
        self.messages += 1
        for index, status, value in decode_replies(parts):
            if index in self._seen:
                continue
            self._seen.add(index)
            self._got += 1
            if status == OK:
                self._values[index] = value
            elif status == ERROR:
                if self._error is None:
                    self._error = ActorError._from_wire(value)
            else:
                if not self._failed:
                    self._error = SupervisionError(value, self._endpoint)
                self._failed = True

    def _pending(self) -> bool:
        return self._got < self._expected and not self._failed

    def _result(self) -> Any:
        self._queue = None  # frees the reply key
        if self._error is not None:
            raise self._error
        return self._finish(self._values)

    def wait(self, timeout: float | None) -> Any:
        if timeout is None:
            while self._pending():
                self._take(self._queue.get())
            return self._result()
        import time

        deadline = time.monotonic() + timeout
        while self._pending():
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
        while self._pending():
            parts = self._queue.try_get()
            if parts is None:
                parts = await self._queue.recv()
            self._take(parts)
        return self._result()


def _item_of(parts: list[bytes], index: int) -> list[bytes]:
    """The reply item of ``parts`` for view index ``index`` (the first if absent)."""
    items = runtime.reply_items(parts)
    start, end = next(((a, b) for i, a, b in items if i == index), items[0][1:])
    return parts[start:end]


class _Reindex:
    """A reply queue whose single expected reply is moved to index 0."""

    def __init__(self, queue: Any, index: int) -> None:
        self._queue = queue
        self.key = queue.key
        self._index = index

    def _fix(self, parts: list[bytes]) -> list[bytes]:
        return runtime.reindexed(_item_of(parts, self._index), 0)

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


class _StreamShared(_Watcher):
    def __init__(self, queue: Any, endpoint: str) -> None:
        super().__init__(queue.key)
        self.queue = queue
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.seen: set[int] = set()

    def fresh(self, parts: list[bytes]) -> tuple[int, Any] | None:
        """The first new reply's (status, value), or None if all are duplicates of
        ranks seen. Further new replies of the message are put back in the queue,
        one message each, for the next waiter."""
        first = None
        again = []
        with self.lock:
            for index, start, end in runtime.reply_items(parts):
                if index in self.seen:
                    continue
                if first is None:
                    self.seen.add(index)
                    first = decode_replies(parts[start:end])[0]
                else:
                    again.append(parts[start:end])
        if again:
            ctx = runtime.process_context()
            port = ctx.port_ref(ctx.port_id)
            for pair in again:
                ctx.send(port, [self.queue.key_part, *pair])
        return None if first is None else (first[1], first[2])


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
