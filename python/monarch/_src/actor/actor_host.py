"""The actor side of ``monarch.actor``: the agent's requests (spawn, controller,
bootstrap, death notices) and :class:`HostedActor`, the thread that runs one actor.

A hosted actor runs ``__init__`` and then handles its queue one message at a time
(ACT-1): directly for a sync actor (so a sync endpoint may block), on the actor's own
asyncio loop for an async one (``@concurrent_endpoint`` bodies run as tasks). Failures
and stops are reported through :mod:`monarch._src.actor.supervision`; a stopped or
failed actor hands its key to the process's undertaker and its thread ends.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

from monarch._src.actor import runtime, supervision
from monarch._src.actor.actor_mesh import (
    ActorError,
    Context,
    Instance,
    Port,
    _class_info,
    _ClassInfo,
    _current,
    _root_controller,
)
from monarch._src.actor.extent import Extent
from monarch._src.actor.point import Point
from monarch._src.actor.runtime import ERROR, FAILED, OK, ROUTE, ProcessContext, loads


def handle_agent_request(proc: ProcessContext, request: tuple[Any, ...], rest: list[bytes]) -> None:
    kind = request[0]
    if kind == "spawn":
        _, key, name, index, labels, sizes, creator, owner = request
        hosted = HostedActor(
            proc, key, name, index, labels, sizes, creator, tuple(owner), rest[0], rest[1]
        )
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
    elif kind == "unreachable":
        _, proc_id, reason = request
        supervision.undeliverable(proc, proc_id, reason)
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

#: Methods the runtime itself sends to actors.
_SPECIAL = frozenset({"__supervise__", "__stop__", "__initialized__"})

#: At most this many decoded message headers are cached per actor (see ``_begin``).
_HEADER_CACHE = 64

_unpack_route = ROUTE.unpack_from
_ROUTE_SIZE = ROUTE.size

_Work = tuple[Any, ...]


class HostedActor:
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
        #: Endpoints that take an explicit response port (from the class info).
        self._explicit_methods: frozenset[str] = frozenset()
        #: Decoded ``(method, labels, sizes)`` by the header part's bytes: a mesh's
        #: casts of one endpoint repeat the same header.
        self._headers: dict[bytes, tuple[str, tuple[str, ...], tuple[int, ...]]] = {}

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
            self._explicit_methods = frozenset(
                name for name, ep in info.endpoints.items() if ep._explicit_response_port
            )
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

    def _stop_owned(self, reason: str) -> list[Any]:
        """Ask the meshes this actor spawned to stop (each does the same for its own);
        returns the futures of those stops."""
        return [
            owned.mesh.stop(f"its owner {self.name!r} stopped: {reason}")
            for owned in list(self.proc.owned.values())
            if owned.owner_key == self.key and not owned.stopped
        ]

    def _stop_sync(self, reason: str) -> None:
        """Stop gracefully: owned meshes first (waited for, each bounded by
        ``CLEANUP_TIMEOUT``), then ``__cleanup__``."""
        for fut in self._stop_owned(reason):
            try:
                fut.get(timeout=CLEANUP_TIMEOUT)
            except Exception:  # gone or slow: this actor stops anyway
                pass
        self._run_sync_cleanup()
        self.stopped = reason

    async def _stop_async(self, reason: str) -> None:
        """As :meth:`_stop_sync`, on the actor's loop."""
        import asyncio

        for fut in self._stop_owned(reason):
            try:
                await asyncio.wait_for(fut.as_asyncio(), CLEANUP_TIMEOUT)
            except Exception:  # gone or slow: this actor stops anyway
                pass
        await self._run_async_cleanup()
        self.stopped = reason

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
        answered already. Every message of every actor passes here: the common case (a
        call to a running actor) is kept short."""
        route = parts[0]
        index, hops, reply_key = _unpack_route(route)
        reply_port = route[_ROUTE_SIZE:].decode() or None
        head = self._headers.get(parts[1])
        if head is None:
            head = loads(parts[1])
            if len(self._headers) >= _HEADER_CACHE:
                self._headers.clear()
            self._headers[parts[1]] = head
        method, labels, sizes = head
        header = (method, reply_port, reply_key, index, labels, sizes, hops)
        if method in _SPECIAL or self.failed is not None or self.stopped is not None:
            return self._begin_special(header, parts)
        try:
            args, kwargs = loads(parts[2], parts[3:])
            fn = getattr(self.obj, method)
        except Exception as e:  # cannot unpickle, or no such method: the caller hears
            self._reply(header, ERROR, ActorError._from_local(e, f"before {method} ran")._to_wire())
            return None
        return ("call", header, fn, args, kwargs)

    def _begin_special(self, header: tuple[Any, ...], parts: list[bytes]) -> _Work | None:
        """:meth:`_begin` for the runtime's own methods and for a dead actor."""
        method = header[0]
        if method == "__supervise__":
            failure = loads(parts[2])[0][0]
            # A failed or stopped owner already told its own owner; nothing to add.
            return None if (self.failed or self.stopped) else ("supervise", failure)
        if self._dead_reply(header):
            return None
        if method == "__stop__":
            stop_args, _ = loads(parts[2])
            return ("stop", header, str(stop_args[0]) if stop_args else "stopped")
        # __initialized__
        self._reply(header, OK, None)
        return None

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
        return method in self._explicit_methods

    def _context(self, header: tuple[Any, ...]) -> Context:
        assert self.instance is not None
        return Context(self.instance, (header[3], header[4], header[5]), header[6])

    def _args(self, header: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        if self._explicit(header[0]):
            return (Port(header[1], header[2], header[3]), *args)
        return args

    def _stop_requested(self) -> str | None:
        """After a message: the reason given to ``instance.stop()``, if it was called
        and the actor is still running."""
        if self.stopped is not None or self.failed is not None:
            return None
        return self.stop_after_current

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
                self._stop_sync(reason)
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
            if (reason := self._stop_requested()) is not None:
                self._stop_sync(reason)

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
                await self._stop_async(reason)
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
            if (reason := self._stop_requested()) is not None:
                await self._stop_async(reason)

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
