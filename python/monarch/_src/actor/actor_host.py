"""Hosting Python actors: the thread that runs one actor for the runtime.

The runtime creates each actor this process is asked to spawn as a ``DrivenActor``
(its mailbox exists at once, so messages queue in order) and hands it over
(:func:`run_spawner`). A :class:`HostedActor` thread then runs ``__init__`` and takes
the actor's deliveries one at a time (ACT-1): directly for a sync actor (so a sync
endpoint may block), on the actor's own asyncio loop for an async one
(``@concurrent_endpoint`` bodies run as tasks; while another endpoint awaits,
``__supervise__`` runs and the calls taken meanwhile wait for it). The runtime keeps the
actor's status, returns the messages it cannot handle, and reports its failure to the
mesh's owner.

Deliveries:

- a call: ``method(*args)``; the value (or the ``ActorError`` of an exception) goes
  back to the caller. An exception escaping ``broadcast`` (nobody waits) or an
  explicit-port endpoint, or any ``BaseException``, fails the actor;
- a failure of a mesh this actor owns: ``__supervise__(failure)`` handles it (truthy),
  or the actor fails, with the failure as its cause;
- a stop: the running concurrent endpoint tasks are cancelled (their
  ``CancelledError`` is the stop's, not a failure; an ``@concurrent_actor``'s are let
  finish first, up to the cleanup timeout), the meshes the actor owns are stopped, then
  ``__cleanup__`` runs, then the actor ends.
"""

from __future__ import annotations

import collections
import gc
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from monarch._rust_bindings import (
    DELIVERY_CALL,
    DELIVERY_SKIP,
    DELIVERY_STOP,
    DELIVERY_SUPERVISE,
    Delivery,
    DrivenActor,
    max_message_len,
)
from monarch._src.actor import process
from monarch._src.actor.actor import _class_info, _ClassInfo
from monarch._src.actor.channel import Port
from monarch._src.actor.context import ROOT_PATH, Context, Creator, Instance, _current
from monarch._src.actor.errors import ActorError
from monarch._src.actor.pickling import dumps, dumps_value, format_exception, loads, loads_parts
from monarch._src.actor.point import Point
from monarch._src.actor.replies import ERROR, FAILED, OK, STOPPED
from monarch._src.actor.supervision import MeshFailure, located, stopped_on_purpose

__all__ = ["HostedActor", "after_call_hook", "cleanup_timeout", "run_spawner", "stop_all"]

#: Called on the actor's thread right after each endpoint call, with what the call
#: raised (or ``None``), before the reply is sent. Procs set it to the remote
#: debugger's ``end_of_call`` (post-mortem; see ``monarch._src.actor.debugger``).
after_call_hook: Callable[[BaseException | None], None] | None = None


def cleanup_timeout() -> float:
    """How long ``__cleanup__`` may run when an actor stops, in seconds (the
    ``cleanup_timeout`` config key, 3 s by default)."""
    from monarch._src import config

    return float(config.get("cleanup_timeout"))


#: How many deliveries an async actor holds, taken off its queue while an endpoint awaits
#: (to run ``__supervise__`` meanwhile; see ``HostedActor._await_endpoint``).
HOLD_MAX = 16

#: The actors this process hosts that have not ended yet (see :func:`stop_all`).
_live: set[HostedActor] = set()
_live_lock = threading.Lock()


def stop_all(reason: str, timeout: float) -> list[str]:
    """Stop every actor this process hosts, gracefully and all at once: each takes a
    stop after the messages queued before it, cancels its running concurrent endpoint
    tasks, stops the meshes it owns, runs ``__cleanup__``, and is released (so its
    finalizers run). Bounded by ``timeout`` seconds in all; the actors still running
    then are named on stderr (the proc ends without them) and returned."""
    with _live_lock:
        actors = list(_live)
    for actor in actors:
        actor.stop_reason = reason
        try:
            actor.driven.request_stop()
        except Exception:
            pass  # ended meanwhile
    deadline = time.monotonic() + timeout
    for actor in actors:
        actor.done.wait(max(0.0, deadline - time.monotonic()))
    stuck = [a for a in actors if not a.done.is_set()]
    for actor in stuck:
        print(
            f"monarch: actor {actor.name!r} rank {actor.driven.rank} ({actor.class_name}) "
            f"did not stop within {timeout} s ({reason}); it is killed with its proc",
            file=sys.stderr,
            flush=True,
        )
    gc.collect()
    return [a.name for a in stuck]


def run_spawner(state: process.ProcessState) -> None:
    """Start the thread that hosts every actor the runtime spawns in this process."""

    def run() -> None:
        while True:
            try:
                driven = state.agent.next_spawn(None)
            except BaseException:  # the runtime is going away
                return
            if driven is None:
                return
            HostedActor(driven).start()

    threading.Thread(target=run, name="monarch-spawner", daemon=True).start()


def _run_awaitable(awaitable: Any) -> Any:
    """Run ``awaitable`` to completion on a loop of its own (this thread runs none)."""
    import asyncio

    async def wait() -> Any:
        return await awaitable

    return asyncio.run(wait())


class HostedActor:
    """One actor hosted by this process: see the module docs."""

    def __init__(self, driven: DrivenActor) -> None:
        self.driven = driven
        self.name = driven.mesh_name
        self.obj: Any = None
        self.info: _ClassInfo | None = None
        self.instance: Instance | None = None
        self.class_name = driven.class_name
        self.ended = False
        #: Set by ``Instance.stop()``: stop after the message being handled.
        self.stop_after_current: str | None = None
        #: Why a stop delivery came, when this process asked for it (``stop_all``).
        self.stop_reason = "stopped by its owner"
        #: Set when the actor's thread is done (the actor ended and was released).
        self.done = threading.Event()
        self._explicit: frozenset[str] = frozenset()
        #: Why the actor is stopping, from the start of its stop procedure (async).
        self._stopping: str | None = None
        #: How calls cut short by the actor's end are answered: the status and reason.
        self._end: tuple[Any, str] | None = None
        #: Endpoint tasks the runtime cancelled (the actor's stop or failure): their
        #: ``CancelledError`` is the expected end of the call, not a failure.
        self._cancelled: set[Any] = set()
        #: Async actors: deliveries taken off the queue while an endpoint awaited, to
        #: be handled in order after it (see :meth:`_await_endpoint`).
        self._held: collections.deque[Delivery] = collections.deque()
        #: Async actors: the pending wait for the next delivery, if one is running.
        self._fetch: Any = None

    def start(self) -> None:
        with _live_lock:
            _live.add(self)
        threading.Thread(
            target=self._hosted, name=f"monarch-actor-{self.name}-{self.driven.rank}", daemon=True
        ).start()

    def _hosted(self) -> None:
        try:
            self._run()
        finally:
            # Released: nothing of the runtime keeps the actor object, so its
            # finalizers run once the program holds no reference either.
            self.obj = None
            with _live_lock:
                _live.discard(self)
            self.done.set()

    # --- the Hosted protocol of Instance ----------------------------------------------------

    def request_stop(self, reason: str) -> None:
        self.stop_after_current = reason

    def kill(self, reason: str | None) -> None:
        self.fail(f"killed: {reason or 'kill() called'}")

    # --- failure ----------------------------------------------------------------------------

    def fail(self, reason: str, cause: Any = None) -> None:
        """Fail this actor: the runtime tells the owner (with ``cause``, a failure it did
        not handle), and answers later calls. Only the first end counts."""
        if self.ended:
            return
        self.ended = True
        self._end = (FAILED, reason)
        print(
            f"monarch: actor {self.name!r} rank {self.driven.rank} ({self.class_name}) on "
            f"proc {self.driven.proc_id} failed: {reason.rstrip()}",
            file=sys.stderr,
            flush=True,
        )
        self.driven.fail(reason, cause)
        self._answer_held()

    def _answer_held(self) -> None:
        """The actor ended: answer the calls it took off its queue but did not run (as
        the runtime answers those still queued)."""
        if self._end is None:
            return
        status, reason = self._end
        while self._held:
            d = self._held.popleft()
            if d.kind is DELIVERY_CALL and d.has_reply and d.method not in self._explicit:
                d.reply(status, [reason.encode()])

    def _stopped_reason(self, reason: str) -> str:
        """What a call cut short by this actor's stop is answered (as the runtime words
        it for calls that reach a stopped actor)."""
        return (
            f"actor {self.name!r} ({self.class_name}) rank {self.driven.rank} on proc "
            f"{self.driven.proc_id} (pid {os.getpid()}) was stopped ({reason})"
        )

    # --- construction -------------------------------------------------------------------------

    def _init(self) -> bool:
        driven = self.driven
        try:
            cls_blob, args_blob, *rest = driven.spawn_parts()
            creator_path = rest[0].decode() if rest else ROOT_PATH
            cls = loads(cls_blob)
            args, kwargs = loads(args_blob)
            self.info = info = _class_info(cls)
            self.class_name = info.name
            self._explicit = frozenset(
                n for n, ep in info.endpoints.items() if ep._explicit_response_port
            )
            self.instance = Instance(
                name=self.name,
                class_name=info.name,
                actor_id=driven.actor_id,
                proc_id=driven.proc_id,
                rank=Point(driven.rank, driven.extent()),
                creator=Creator(
                    "root" if driven.creator_name == "client" else driven.creator_name,
                    driven.creator,
                    creator_path,
                ),
                hosted=self,
            )
            token = _current.set(Context(self.instance))
            try:
                obj = cls.__new__(cls)
                obj.__init__(*args, **kwargs)
            finally:
                _current.reset(token)
            self.obj = obj
        except BaseException as e:  # the actor fails; calls get SupervisionError
            self.fail(f"__init__ raised:\n{format_exception(e)}")
            return False
        driven.started()
        return True

    def _run(self) -> None:
        if not self._init():
            return
        assert self.info is not None
        try:
            if self.info.is_async:
                import asyncio

                asyncio.run(self._run_async())
            else:
                self._run_sync()
        except BaseException as e:
            # A bug of the host itself, not of an endpoint (those are handled where they
            # run): the actor fails, so that its owner hears of it and calls to it are
            # answered, rather than its thread ending in silence.
            self.fail(f"its host loop raised:\n{format_exception(e)}")

    # --- calls ------------------------------------------------------------------------------------

    def _begin(self, d: Delivery) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
        """The bound method and arguments of a call, or None if it was answered already."""
        method = d.method
        try:
            malformed = d.malformed
            if malformed is not None:
                raise ValueError(f"actor {self.name!r} received a malformed message: {malformed}")
            fn = self._endpoint(method)
            parts = d.args
            args, kwargs = loads_parts(parts)
        except Exception as e:  # cannot unpickle, or no such method: the caller hears
            err = ActorError._of_call(e, self.name, method, " before it ran")
            d.reply(ERROR, [dumps(err._to_wire())])
            return None
        if method in self._explicit:
            args = (Port(d.port()), *args)
        return fn, args, kwargs

    def _endpoint(self, method: str) -> Any:
        """The bound method a call names: an endpoint, or a public method (called with
        ``as_endpoint``); never a private attribute that is not an endpoint."""
        assert self.info is not None
        if method in self.info.endpoints or not method.startswith("_"):
            fn = getattr(self.obj, method, None)
            if callable(fn):
                return fn
        raise AttributeError(f"{self.class_name} has no endpoint or method named {method!r}")

    def _answer(self, d: Delivery, result: Any) -> None:
        if d.method in self._explicit:
            return
        problem: Exception | None = None
        try:
            parts = dumps_value(result)
        except Exception as e:
            problem = TypeError(f"the endpoint's return value cannot be pickled: {e}")
        else:
            size = sum(map(len, parts))
            if size > max_message_len():
                problem = ValueError(
                    f"the endpoint's return value is {size} bytes pickled, over the largest "
                    f"message size, {max_message_len()} bytes: return less, or raise the "
                    "codec_max_frame_length config key in every process"
                )
        if problem is not None:  # tell the caller why
            err = ActorError._of_call(problem, self.name, d.method, " while sending the reply")
            d.reply(ERROR, [dumps(err._to_wire())])
            return
        d.reply(OK, parts)

    def _failure(self, d: Delivery, e: BaseException) -> None:
        """An exception escaped endpoint ``d.method``."""
        method = d.method
        explicit = method in self._explicit
        if not d.has_reply or not isinstance(e, Exception) or explicit:
            # broadcast, explicit-port and BaseException: the actor fails.
            how = "broadcast to" if not d.has_reply else "in"
            reason = f"{type(e).__name__} escaped {how} endpoint {method}:\n{format_exception(e)}"
            if d.has_reply and not explicit:
                d.reply(FAILED, [reason.encode()])
            self.fail(reason)
            return
        d.reply(ERROR, [dumps(ActorError._of_call(e, self.name, method)._to_wire())])

    # --- supervision ---------------------------------------------------------------------------

    def _supervise_result(
        self, failure: MeshFailure, handled: Any, error: BaseException | None, raw: Any
    ) -> None:
        if error is not None:
            self.fail(
                f"__supervise__ raised while handling {failure}:\n{format_exception(error)}",
                raw,
            )
        elif not handled:
            self.fail(
                f"__supervise__ on {self.instance} did not handle a supervision event, "
                f"propagating to next owner. Original event: {failure.headline()}",
                raw,
            )

    # --- stopping -----------------------------------------------------------------------------

    def _cleanup_sync(self) -> None:
        """Run a sync ``__cleanup__(None)`` on a helper thread, bounded by
        :func:`cleanup_timeout` (a daemon, left behind if it overruns)."""
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is None:
            return

        assert self.instance is not None
        ctx = Context(self.instance)

        def run() -> None:
            token = _current.set(ctx)
            try:
                cleanup(None)
            except Exception as e:
                print(f"monarch: __cleanup__ of {self.name!r} raised: {e!r}", file=sys.stderr)
            finally:
                _current.reset(token)

        thread = threading.Thread(target=run, name=f"monarch-cleanup-{self.name}", daemon=True)
        thread.start()
        limit = cleanup_timeout()
        thread.join(limit)
        if thread.is_alive():
            print(
                f"monarch: __cleanup__ of {self.name!r} did not finish within "
                f"{limit} s; the actor stops without waiting for it",
                file=sys.stderr,
            )

    def _stop_sync(self, reason: str) -> None:
        """Stop gracefully: owned meshes first, then ``__cleanup__``, then end."""
        self.driven.stop_owned(reason)
        self._cleanup_sync()
        self.ended = True
        self.driven.stopped(reason)

    async def _stop_async(self, reason: str, tasks: set[Any]) -> None:
        import asyncio

        self._stopping = reason
        self._end = (STOPPED, self._stopped_reason(reason))
        if tasks and self.info is not None and self.info.drains_on_stop:
            # @concurrent_actor: the running endpoint tasks finish first (bounded by the
            # cleanup timeout; what still runs then is cancelled below).
            await asyncio.wait(set(tasks), timeout=cleanup_timeout())
            tasks = {t for t in tasks if not t.done()}
        # The stop cancels the running concurrent endpoint tasks: for them the
        # CancelledError is the expected end, whatever they do with it (see _invoke).
        for task in tasks:
            self._cancelled.add(task)
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # On this thread (the loop has nothing left to run): an executor would refuse
        # the work while the interpreter exits, which is when the program's end stops us.
        self.driven.stop_owned(reason)
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is not None:
            assert self.instance is not None
            token = _current.set(Context(self.instance))
            try:
                await asyncio.wait_for(cleanup(None), cleanup_timeout())
            except Exception as e:  # TimeoutError included
                print(f"monarch: __cleanup__ of {self.name!r} failed: {e!r}", file=sys.stderr)
            finally:
                _current.reset(token)
        self.ended = True
        self.driven.stopped(reason)
        self._answer_held()

    # --- the loops -------------------------------------------------------------------------------

    def _context(self, d: Delivery) -> Context:
        assert self.instance is not None
        return Context(self.instance, d)

    def _run_sync(self) -> None:
        driven = self.driven
        while not self.ended:
            d = driven.next(None)
            if d is None:
                continue
            kind = d.kind
            if kind is DELIVERY_CALL:
                self._call_sync(d)
            elif kind is DELIVERY_SUPERVISE:
                raw = d.failure
                if raw is None or self.ended or stopped_on_purpose(raw.mesh_id):
                    continue
                raw = located(raw, str(self.instance))
                failure = MeshFailure(raw)
                token = _current.set(self._context(d))
                try:
                    handled, error = self._supervise(failure), None
                    if inspect.isawaitable(handled):
                        # ``async def __supervise__`` on an actor whose endpoints are
                        # sync: its verdict is what the coroutine returns.
                        handled = _run_awaitable(handled)
                except BaseException as e:
                    handled, error = False, e
                finally:
                    _current.reset(token)
                self._supervise_result(failure, handled, error, raw)
            elif kind is DELIVERY_STOP:
                self._stop_sync(self.stop_reason)
            elif kind is DELIVERY_SKIP:
                continue
            else:  # ENDED
                return
            if self.stop_after_current is not None and not self.ended:
                self._stop_sync(self.stop_after_current)

    def _supervise(self, failure: MeshFailure) -> Any:
        handler = getattr(self.obj, "__supervise__", None)
        if handler is None:
            return None
        # LOG-2: the failed procs' last lines, which arrived first, are written first.
        from monarch._src.actor import logs

        logs.flush()
        return handler(failure)

    def _call_sync(self, d: Delivery) -> None:
        begun = self._begin(d)
        if begun is None:
            return
        fn, args, kwargs = begun
        token = _current.set(self._context(d))
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            if after_call_hook is not None:
                after_call_hook(e)
            self._failure(d, e)
        else:
            if after_call_hook is not None:
                after_call_hook(None)
            self._answer(d, result)
        finally:
            _current.reset(token)

    async def _run_async(self) -> None:
        import asyncio

        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self.ended:
                d = await self._take()
                kind = d.kind
                if kind is DELIVERY_CALL:
                    begun = self._begin(d)
                    if begun is None:
                        continue
                    fn, args, kwargs = begun
                    assert self.info is not None
                    ep = self.info.endpoints.get(d.method)
                    token = _current.set(self._context(d))
                    try:
                        task = asyncio.get_running_loop().create_task(
                            self._invoke(d, fn, args, kwargs)
                        )
                    finally:
                        _current.reset(token)
                    if ep is not None and ep._concurrent:
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        continue
                    await self._await_endpoint(task)
                elif kind is DELIVERY_SUPERVISE:
                    await self._supervise_async(d)
                elif kind is DELIVERY_STOP:
                    await self._stop_async(self.stop_reason, tasks)
                elif kind is DELIVERY_SKIP:
                    continue
                else:  # ENDED
                    return
                if self.stop_after_current is not None and not self.ended:
                    await self._stop_async(self.stop_after_current, tasks)
        finally:
            await self._end_async(tasks)

    async def _take(self) -> Delivery:
        """The next delivery: one held while an endpoint awaited, else the queue's."""
        if self._held:
            return self._held.popleft()
        fetch, self._fetch = self._fetch, None
        if fetch is not None:
            d: Delivery = await fetch
            return d
        d_now = self.driven.try_next()
        if d_now is not None:
            return d_now
        return await self.driven.next_async()

    async def _next_async(self) -> Delivery:
        return await self.driven.next_async()

    async def _await_endpoint(self, task: Any) -> None:
        """Wait for the endpoint ``task`` (ACT-1: the next call runs after it), running
        ``__supervise__`` meanwhile, whenever the endpoint awaits: a failure of a mesh
        this actor owns is handled at once, not after the endpoint returned (which may be
        waiting for ``__supervise__`` itself). The other deliveries taken off the queue
        to find it are held, in order, for after the endpoint: at most
        :data:`HOLD_MAX`, and none after a stop."""
        import asyncio

        while not task.done():
            if self.ended:
                # __supervise__ failed the actor: what the endpoint was doing ends too.
                self._cancelled.add(task)
                task.cancel()
                break
            if self._fetch is None:
                closed = bool(self._held) and self._held[-1].kind is not DELIVERY_CALL
                if closed or len(self._held) >= HOLD_MAX:
                    await asyncio.wait({task})
                    break
                d = self.driven.try_next()
                if d is None:
                    self._fetch = asyncio.ensure_future(self._next_async())
                    continue
            else:
                await asyncio.wait({task, self._fetch}, return_when=asyncio.FIRST_COMPLETED)
                if not self._fetch.done():
                    continue
                d = self._fetch.result()
                self._fetch = None
            if d.kind is DELIVERY_SUPERVISE:
                await self._supervise_async(d)
            elif d.kind is not DELIVERY_SKIP:
                self._held.append(d)
        await asyncio.gather(task, return_exceptions=True)

    async def _supervise_async(self, d: Delivery) -> None:
        raw = d.failure
        if raw is None or self.ended or stopped_on_purpose(raw.mesh_id):
            return
        raw = located(raw, str(self.instance))
        failure = MeshFailure(raw)
        token = _current.set(self._context(d))
        try:
            handled, error = self._supervise(failure), None
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as e:
            handled, error = False, e
        finally:
            _current.reset(token)
        self._supervise_result(failure, handled, error, raw)

    async def _end_async(self, tasks: set[Any]) -> None:
        """The actor's loop is done (it ended, or its host loop broke): the concurrent
        endpoint tasks still running end with it (their callers get the actor's end),
        and a pending wait for a delivery is let finish (the queue is closed by now), so
        nothing of the actor's is left running."""
        import asyncio

        for task in list(tasks):
            self._cancelled.add(task)
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        fetch, self._fetch = self._fetch, None
        if fetch is not None:
            if not self.ended:
                fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        if self._end is None:  # ended behind the loop's back (aborted by the runtime)
            self._end = (FAILED, f"The actor {self.name!r} ended ({self.driven.status})")
        self._answer_held()

    async def _invoke(
        self, d: Delivery, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        import asyncio

        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task in self._cancelled and self._end is not None:
                # The actor's stop (or failure) cancelled the call: the expected end
                # of this task, not a failure of the actor, whether the endpoint let
                # the CancelledError through or raised it again after cleaning up.
                self._cancelled.discard(task)
                if d.has_reply and d.method not in self._explicit:
                    status, reason = self._end
                    d.reply(status, [reason.encode()])
                return
            if after_call_hook is not None:
                after_call_hook(e)
            self._failure(d, e)
        except BaseException as e:
            if after_call_hook is not None:
                after_call_hook(e)
            self._failure(d, e)
        else:
            if after_call_hook is not None:
                after_call_hook(None)
            self._answer(d, result)
