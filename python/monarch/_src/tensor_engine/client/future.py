"""``monarch.Future``: what ``fetch_shard`` and ``call_on_shard_and_fetch`` return.

Upstream Monarch's distributed tensors had a future of their own (``result``, ``done``,
``exception``, ``add_callback``), separate from the actors' ``monarch.actor.Future``.
Here it is that actors' future, with ``done()`` and ``add_callback(fn)`` added: so it
is a ``monarch.actor.Future`` too (``get``, ``await``, ``Future.gather`` work on it),
and code written for either keeps working.

``done()`` looks without waiting. A callback runs once, with the future, as soon as the
outcome is known: on the thread whose ``result``/``get``/``exception``/``done``/``await``
learnt it, or, when nobody asks, on a monarch thread that waits for it in the background
(callbacks run one at a time there: keep them short). A callback added once the reply is
in runs at once, on the calling thread. An exception a callback raises is logged
(logger ``monarch._src.tensor_engine.client.future``), never raised to whoever learnt the
outcome.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from monarch._src.actor.future import Future as _ActorFuture
from monarch._src.actor.future import _Impl, background_loop

__all__ = ["Future", "then"]

R = TypeVar("R")

logger = logging.getLogger(__name__)


class Future(_ActorFuture[R]):
    """The result of a fetch (``monarch.fetch_shard``, ``monarch.call_on_shard_and_fetch``):
    a ``monarch.actor.Future`` with upstream Monarch's tensor-future methods ``done()`` and
    ``add_callback(fn)`` besides ``result(timeout)``, ``exception(timeout)``, ``get`` and
    ``await``.

    Not constructed by users.
    """

    __slots__ = ("_async_waiters", "_callbacks", "_callbacks_lock", "_collecting")

    # How the outcome is collected: by whoever waits (``get``, ``await``, ``done``), from
    # the implementation directly, as for any monarch.actor.Future. A callback added while
    # nobody waits starts a *collector* on the background loop, which then replaces the
    # implementation: every later wait waits for the collector, so the reply is never
    # taken by two waiters at once. The collector starts only while no waiter is at the
    # implementation (``_lock`` free, no ``await`` in progress); a waiter that stops
    # without the outcome (a timeout) starts it if callbacks are pending.

    def __init__(self, *, impl: _Impl[R]) -> None:
        super().__init__(impl=impl)
        #: Callbacks not run yet; ``None`` once they ran (the outcome is known).
        self._callbacks: list[Callable[[Future[R]], object]] | None = []
        self._callbacks_lock = threading.Lock()
        self._collecting = False
        self._async_waiters = 0

    # --- the outcome ------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> R:
        """Block until the result is ready and return it, or raise its exception (see
        ``monarch.actor.Future.get``); runs the callbacks not run yet once it is known.

        Raises:
            TimeoutError: not ready within ``timeout`` seconds; the work goes on.
        """
        try:
            return super().get(timeout)
        finally:
            self._after_wait()

    def done(self) -> bool:
        """Whether the value (or the error) is known, without waiting: ``True`` once the
        reply arrived (then ``result()`` returns, or raises, at once), ``False`` while the
        work goes on, or while another thread is collecting the reply."""
        if not self._settled():
            if not self._lock.acquire(blocking=False):
                return False  # another thread is collecting the outcome
            try:
                if not self._settled():
                    try:
                        value = self._impl.wait(0)
                    except TimeoutError:
                        pass
                    except BaseException as e:  # the work's own failure: cached
                        self._record(None, e)
                    else:
                        self._record(value, None)
            finally:
                self._lock.release()
        self._after_wait()
        return self._settled()

    async def _wait_async(self) -> R:
        with self._callbacks_lock:
            self._async_waiters += 1
        try:
            return await super()._wait_async()
        finally:
            with self._callbacks_lock:
                self._async_waiters -= 1
            self._after_wait()

    # --- callbacks ----------------------------------------------------------------------------

    def add_callback(self, callback: Callable[[Future[R]], object]) -> None:
        """Call ``callback(future)`` once the outcome is known, whether it is a value or
        an error (read it with ``future.result()`` / ``future.exception()``, which then
        return at once).

        The callback runs once: on the thread that learns the outcome, or, when no one
        waits, on a monarch thread that waits for it in the background; at once on this
        thread if the reply is already in. What it raises is logged, not raised.

        Raises:
            TypeError: ``callback`` is not callable.
        """
        if not callable(callback):
            raise TypeError(
                f"Future.add_callback: expected a function of the future, got {callback!r}"
            )
        with self._callbacks_lock:
            pending = self._callbacks
            if pending is not None:
                pending.append(callback)
        if pending is None:  # the callbacks ran already: this one runs now
            _call(callback, self)
        else:
            self.done()  # runs it now if the reply is in, else has the reply collected

    def _after_wait(self) -> None:
        """After a wait: run the callbacks if the outcome is known, else make sure
        someone collects it if callbacks are pending."""
        if self._settled():
            self._run_callbacks()
            return
        with self._callbacks_lock:
            if not self._callbacks or self._collecting or self._async_waiters:
                return
            if not self._lock.acquire(blocking=False):
                return  # a waiter is at the implementation; it comes back here
            try:
                if self._settled():
                    return
                import asyncio

                collected = asyncio.run_coroutine_threadsafe(
                    _collect(self._impl), background_loop()
                )
                self._impl = _Collected(collected)
                self._collecting = True
            finally:
                self._lock.release()
        # Record the outcome and run the callbacks on the callback thread, never on the
        # loop (a callback may block).
        collected.add_done_callback(lambda _: _callback_queue().put(self))

    def _run_callbacks(self) -> None:
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _call(callback, self)

    def __repr__(self) -> str:
        state = "done" if self._settled() else "pending"
        return f"<monarch.Future ({state})>"


async def _collect(impl: _Impl[Any]) -> Any:
    return await impl.wait_async()


class _Collected:
    """The outcome a collector (a ``concurrent.futures.Future`` of the background loop)
    gets: a Future implementation."""

    def __init__(self, collected: concurrent.futures.Future[Any]) -> None:
        self.collected = collected

    def wait(self, timeout: float | None) -> Any:
        try:
            return self.collected.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the reply did not arrive within {timeout} s; the work goes on: call "
                "result() again or await the future"
            ) from None

    async def wait_async(self) -> Any:
        import asyncio

        return await asyncio.wrap_future(self.collected)


def _call(callback: Callable[[Future[Any]], object], future: Future[Any]) -> None:
    try:
        callback(future)
    except Exception:
        logger.exception("a callback of %r (%r) raised", future, callback)


_queue_lock = threading.Lock()
_queue: queue.SimpleQueue[Future[Any]] | None = None


def _callback_queue() -> queue.SimpleQueue[Future[Any]]:
    """The queue of the thread that runs the callbacks of futures nobody waited for
    (started on first use; a daemon)."""
    global _queue
    with _queue_lock:
        if _queue is None:
            q: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
            threading.Thread(
                target=_callback_thread, args=(q,), name="monarch-future-callbacks", daemon=True
            ).start()
            _queue = q
        return _queue


def _callback_thread(q: queue.SimpleQueue[Future[Any]]) -> None:
    while True:
        q.get().done()  # records the collected outcome and runs the callbacks


class _Then:
    """``fn(value of inner)``: a Future implementation."""

    def __init__(self, inner: _ActorFuture[Any], fn: Callable[[Any], Any] | None) -> None:
        self.inner = inner
        self.fn = fn

    def wait(self, timeout: float | None) -> Any:
        value = self.inner.get(timeout)
        return value if self.fn is None else self.fn(value)

    async def wait_async(self) -> Any:
        value = await self.inner
        return value if self.fn is None else self.fn(value)


def then(inner: _ActorFuture[Any], fn: Callable[[Any], Any] | None = None) -> Future[Any]:
    """A ``monarch.Future`` of ``fn(value of inner)`` (of ``inner``'s value without
    ``fn``); ``inner``'s error is its error."""
    return Future(impl=_Then(inner, fn))
