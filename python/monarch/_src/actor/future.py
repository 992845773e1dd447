"""``monarch.actor.Future``: one result, waited for by blocking (``get``) or by ``await``.

A future is backed by an *implementation* with two methods, ``wait(timeout)`` (blocking;
raises ``TimeoutError`` without cancelling anything) and ``async wait_async()``. The
future caches the first outcome, so every later ``get``/``await`` returns the same value
or re-raises the same exception object.

Implementations in this package: replies gathered from a reply queue
(:mod:`monarch._src.actor.actor_mesh`), and :class:`CoroutineWork`, which runs a
coroutine on the process's background loop the first time somebody waits (lazy work,
e.g. ``ProcMesh.stop()``).
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

R = TypeVar("R")
_R_co = TypeVar("_R_co", covariant=True)

_UNSET: Any = object()


class _Impl(Protocol[_R_co]):
    def wait(self, timeout: float | None) -> _R_co: ...

    async def wait_async(self) -> _R_co: ...


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout != timeout or timeout in (float("inf"), float("-inf")) or timeout < 0:
        raise ValueError(
            f"timeout must be a finite number of seconds >= 0, or None to wait forever; "
            f"got {timeout}"
        )


class Future(Generic[R]):
    """The result of work started by Monarch (an endpoint call, a stop, ...).

    Not constructed by users. ``get(timeout)`` blocks and does not cancel on timeout;
    ``await fut`` works on any running asyncio loop; both may be repeated and give the
    same outcome.
    """

    __slots__ = ("_error", "_impl", "_lock", "_value")

    def __init__(self, *, impl: _Impl[R]) -> None:
        self._impl = impl
        self._lock = threading.Lock()
        self._value: Any = _UNSET
        self._error: BaseException | None = None

    def _settled(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    def _outcome(self) -> R:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def _record(self, value: Any, error: BaseException | None) -> None:
        if not self._settled():
            if error is not None:
                self._error = error
            else:
                self._value = value

    def get(self, timeout: float | None = None) -> R:
        """Block until the result is ready and return it, or raise its exception.

        Raises:
            TimeoutError: not ready within ``timeout`` seconds; the work goes on and a
                later ``get``/``await`` still sees its result.
            ValueError: ``timeout`` is negative or not finite.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if self._value is not _UNSET:
            return self._value  # type: ignore[no-any-return]
        if self._error is not None:
            raise self._error
        # asyncio is imported lazily (it is slow to import): not imported, no loop runs.
        running = getattr(sys.modules.get("asyncio"), "_get_running_loop", None)
        if running is not None and running() is not None:
            warnings.warn(
                "Future.get() called on a thread running an asyncio loop: it blocks the "
                "loop until the result is ready. Use `await fut` in async code instead.",
                UserWarning,
                stacklevel=2,
            )
        with self._lock:
            if not self._settled():
                try:
                    value = self._impl.wait(timeout)
                except TimeoutError:
                    raise
                except BaseException as e:  # the work's own failure: cached
                    self._record(None, e)
                else:
                    self._record(value, None)
        return self._outcome()

    def result(self, timeout: float | None = None) -> R:
        """Same as :meth:`get`."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like :meth:`get`; return the work's exception, or ``None``."""
        try:
            self.get(timeout)
        except TimeoutError:
            if self._error is None:
                raise
        except BaseException:
            pass
        return self._error

    async def _wait_async(self) -> R:
        if not self._settled():
            try:
                value = await self._impl.wait_async()
            except BaseException as e:  # cached, as for get()
                self._record(None, e)
            else:
                self._record(value, None)
        return self._outcome()

    def __await__(self) -> Generator[Any, None, R]:
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ValueError(
                "cannot await a monarch Future outside a running asyncio loop; use "
                "get() in synchronous code"
            ) from None
        return self._wait_async().__await__()

    def as_asyncio(self) -> asyncio.Future[R]:
        """An ``asyncio.Future`` on the running loop that completes with this future."""
        import asyncio

        loop = asyncio.get_running_loop()
        return loop.create_task(self._wait_async())

    @staticmethod
    def gather(*futures: Future[Any], return_exceptions: bool = False) -> Future[list[Any]]:
        """One future of the results of ``futures``, in the order given.

        Waiting for it (``get`` or ``await``) waits for each in turn. The first
        exception among them is raised, unless ``return_exceptions``: then exceptions
        take their future's place in the list. A ``get(timeout)`` bounds the whole wait.
        The futures given stay usable on their own.

        Raises:
            TypeError: an argument is not a ``monarch.actor.Future``.
        """
        for i, f in enumerate(futures):
            if not isinstance(f, Future):
                raise TypeError(
                    f"Future.gather takes monarch.actor.Future objects (such as the result "
                    f"of call_one()); argument #{i} is {type(f).__name__}"
                )
        return Future(impl=_Gathered(futures, return_exceptions))

    def __repr__(self) -> str:
        state = "done" if self._settled() else "pending"
        return f"<monarch.actor.Future ({state})>"


class _Gathered:
    """The outcomes of several futures, in order (``Future.gather``)."""

    def __init__(self, futures: tuple[Future[Any], ...], return_exceptions: bool) -> None:
        self._futures = futures
        self._return_exceptions = return_exceptions

    def _take(self, future: Future[Any], out: list[Any]) -> None:
        """Append the settled ``future``'s outcome to ``out`` (or raise its error)."""
        if future._error is not None:
            if not self._return_exceptions:
                raise future._error
            out.append(future._error)
        else:
            out.append(future._value)

    def wait(self, timeout: float | None) -> list[Any]:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Any] = []
        for i, f in enumerate(self._futures):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                f.get(left)
            except TimeoutError:
                if not f._settled():  # our wait timed out; the work goes on
                    raise TimeoutError(
                        f"Future.gather: future #{i} of {len(self._futures)} did not finish "
                        f"within {timeout} s; they keep running: call get() again or await"
                    ) from None
            except BaseException:
                if not f._settled():  # not the future's outcome (a KeyboardInterrupt)
                    raise
            self._take(f, out)
        return out

    async def wait_async(self) -> list[Any]:
        out: list[Any] = []
        for f in self._futures:
            try:
                await f._wait_async()
            except BaseException:
                if not f._settled():  # cancelled while waiting
                    raise
            self._take(f, out)
        return out


# --- lazy coroutine work ------------------------------------------------------------

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's background asyncio loop (a daemon thread), started on first use."""
    import asyncio

    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="monarch-background-loop", daemon=True
            ).start()
            _loop = loop
        return _loop


class CoroutineWork(Generic[R]):
    """Runs ``make()``'s coroutine on the background loop the first time it is waited
    for; timeouts do not cancel it."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, R]]) -> None:
        self._make = make
        self._started: concurrent.futures.Future[R] | None = None
        self._lock = threading.Lock()

    def _start(self) -> concurrent.futures.Future[R]:
        import asyncio

        with self._lock:
            if self._started is None:
                self._started = asyncio.run_coroutine_threadsafe(self._make(), background_loop())
            return self._started

    def wait(self, timeout: float | None) -> R:
        import concurrent.futures

        try:
            return self._start().result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"not finished within {timeout} s; it keeps running: call get() again or "
                "await the future"
            ) from None

    async def wait_async(self) -> R:
        import asyncio

        return await asyncio.wrap_future(self._start())


class Done(Generic[R]):
    """Already finished work."""

    def __init__(self, value: R) -> None:
        self._value = value

    def wait(self, timeout: float | None) -> R:
        return self._value

    async def wait_async(self) -> R:
        return self._value


def coroutine_future(make: Callable[[], Coroutine[Any, Any, R]]) -> Future[R]:
    """A lazy future over a coroutine factory."""
    return Future(impl=CoroutineWork(make))
