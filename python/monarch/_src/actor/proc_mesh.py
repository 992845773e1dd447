"""Host meshes and proc meshes (API.md §1.6).

``this_host()`` is the client's machine: the client process is its host agent
(:class:`monarch._rust_bindings.Host`), which starts procs as OS processes running
:mod:`monarch._src.actor.bootstrap`. ``spawn_procs`` returns at once; the procs boot in
the background. Messages sent to them before they are ready wait, in order, in their
:class:`_ProcGroup` and are flushed the moment the procs report ready (or answered
with the spawn's error if it failed).
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from monarch._rust_bindings import PortRef
from monarch._src import config
from monarch._src.actor import runtime
from monarch._src.actor.future import Future
from monarch._src.actor.runtime import FAILED, dumps
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.slice import Slice

A = TypeVar("A")

#: How long a stopping proc gets before it is killed.
STOP_TIMEOUT = 5.0


class _ProcGroup:
    """The procs of one spawn: their inbox ports once ready, and messages waiting for
    them until then."""

    def __init__(self, name: str, count: int, *, owned: bool) -> None:
        self.name = name
        self.count = count
        self.owned = owned
        self.proc_ids: list[str] | None = None
        self._ports: list[PortRef] | None = None
        self._error: str | None = None
        self._stopped: str | None = None
        self._lock = threading.Lock()
        #: Sends and casts waiting for the procs to be ready, in order.
        self._pending: list[tuple[Any, ...]] = []
        self._ready = threading.Event()
        #: Ranks whose proc is dead, with the reason.
        self._dead: dict[int, str] = {}
        #: The calls that may still wait for replies from these procs (one entry per
        #: call, not per rank: a death is rare, a call is not).
        self._calls: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def ready_now(cls, name: str, proc_ids: list[str], *, owned: bool) -> _ProcGroup:
        group = cls(name, len(proc_ids), owned=owned)
        group._set_ready(proc_ids)
        return group

    def _set_ready(self, proc_ids: list[str], first: list[bytes] | None = None) -> None:
        ctx = runtime.process_context()
        ports = [ctx.port_ref(runtime.inbox_port_of(p)) for p in proc_ids]
        for g, p in enumerate(proc_ids):
            ctx.groups_by_proc.setdefault(p, weakref.WeakSet()).add(self)
            if p in ctx.dead:
                self._dead[g] = ctx.dead[p]
        if self.owned:
            ctx.spawned_procs.update(proc_ids)
        with self._lock:
            self.proc_ids = proc_ids
            if first is not None:
                for port in ports:
                    ctx.send(port, first)
            # Flushed before `_ports` is set: a send racing with this one waits on the
            # lock, so nothing overtakes what was queued (ORD-1).
            for op in self._pending:
                if op[0] == "send":
                    ctx.send(ports[op[1]], op[2])
                else:
                    self._cast_now(ports, *op[1:])
            self._pending.clear()
            self._ports = ports
        self._ready.set()

    def _set_failed(self, error: str) -> None:
        with self._lock:
            self._error = error
            pending, self._pending = self._pending, []
        self._ready.set()
        reason = f"the procs of {self.name!r} failed to start: {error}"
        for op in pending:
            if op[0] == "send":
                self._fail(op[3], reason)
            else:
                _, _, ranks, _, reply, _ = op
                self._fail_all(reply, [i for i, _ in ranks], reason)

    def _fail(self, reply: tuple[str, int, int] | None, reason: str) -> None:
        if reply is not None:
            port, key, index = reply
            runtime.process_context().reply(port, key, index, FAILED, reason)

    def _fail_all(self, reply: tuple[str, int] | None, indices: list[int], reason: str) -> None:
        if reply is not None:
            runtime.process_context().fail_replies(reply[0], reply[1], indices, reason)

    def _pend(self, op: tuple[Any, ...]) -> bool:
        """Queue ``op`` (a send or a cast) if the procs are still starting; true if it
        was queued (``_set_ready`` runs it, in order, or ``_set_failed`` answers it)."""
        if self._ports is not None:
            return False
        with self._lock:
            if self._ports is None and self._error is None:
                self._pending.append(op)
                return True
        return False

    def send(self, rank: int, parts: list[bytes], reply: tuple[str, int, int] | None) -> None:
        """Send ``parts`` (key part first) to the inbox of ``rank``'s proc."""
        if self._pend(("send", rank, parts, reply)):
            return
        ports = self._ports
        if self._stopped is not None:
            self._fail(reply, f"`ProcMesh` has already been stopped ({self._stopped})")
            return
        if self._dead and rank in self._dead:
            self._fail(reply, self._dead[rank])
            return
        if self._error is not None or ports is None:
            self._fail(reply, f"the procs of {self.name!r} failed to start: {self._error}")
            return
        runtime.process_context().send(ports[rank], parts)

    def cast(
        self,
        key: int,
        ranks: list[tuple[int, int]],
        parts: list[bytes],
        reply: tuple[str, int] | None,
        watcher: Any,
        mode: int,
    ) -> None:
        """Cast ``parts`` to actor ``key`` on ``ranks`` (``(index in the view, rank)``)
        over a tree (``Inbox.cast``). ``reply``: ``(port id, key)`` replies go to
        (``mode`` 1: one per rank; 2: reduced); ``watcher`` hears of dead ranks."""
        if not self._pend(("cast", key, ranks, parts, reply, watcher, mode)):
            self._cast_now(self._ports, key, ranks, parts, reply, watcher, mode)

    def _cast_now(
        self,
        ports: list[PortRef] | None,
        key: int,
        ranks: list[tuple[int, int]],
        parts: list[bytes],
        reply: tuple[str, int] | None,
        watcher: Any,
        mode: int,
    ) -> None:
        if self._stopped is not None:
            reason = f"`ProcMesh` has already been stopped ({self._stopped})"
            self._fail_all(reply, [i for i, _ in ranks], reason)
            return
        if self._error is not None or ports is None:
            reason = f"the procs of {self.name!r} failed to start: {self._error}"
            self._fail_all(reply, [i for i, _ in ranks], reason)
            return
        live = ranks
        dead = self._dead
        if dead:
            live = [(i, g) for i, g in ranks if g not in dead]
            for i, g in ranks:
                if g in dead:
                    self._fail_all(reply, [i], dead[g])
            if not live:
                return
        ctx = runtime.process_context()
        if reply is None:
            port, reply_key = None, 0
        else:
            port, reply_key = ctx.port_ref(reply[0]), reply[1]
        ends = ctx.inbox.cast(
            key,
            [(i, ports[g]) for i, g in live],
            config.cached("cast_fanout"),
            mode if reply is not None else 0,
            port,
            reply_key,
            parts,
        )
        if watcher is not None:
            watcher.track(live, ends)
            self._calls.add(watcher)

    def mark_dead(self, proc_id: str, reason: str) -> None:
        """The proc ``proc_id`` is gone: fail the calls waiting on it and later sends."""
        if self.proc_ids is None:
            return
        for g, p in enumerate(self.proc_ids):
            if p == proc_id and g not in self._dead:
                self._dead[g] = reason
                for call in list(self._calls):
                    call.rank_failed(g, reason)

    def wait_ready(self, timeout: float | None) -> None:
        if not self._ready.wait(timeout):
            raise TimeoutError(f"procs {self.name!r} not ready within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the procs of {self.name!r} failed to start: {self._error}")

    def __reduce__(self) -> tuple[Any, ...]:
        self._ready.wait()
        return (_remote_group, (self.name, self.proc_ids, self._error))


def _remote_group(name: str, proc_ids: list[str] | None, error: str | None) -> _ProcGroup:
    if proc_ids is not None:
        return _ProcGroup.ready_now(name, proc_ids, owned=False)
    group = _ProcGroup(name, 0, owned=False)
    group._set_failed(error or "unknown error")
    return group


class _GroupReady:
    def __init__(self, group: _ProcGroup) -> None:
        self._group = group

    def wait(self, timeout: float | None) -> bool:
        self._group.wait_ready(timeout)
        return True

    async def wait_async(self) -> bool:
        import asyncio

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.wait, None)


class ProcMesh(MeshTrait):
    """A mesh of procs (OS processes). ``spawn`` puts one actor on each."""

    def __init__(self, group: _ProcGroup, shape: Shape, host_mesh: HostMesh | None = None) -> None:
        self._group = group
        self._pm_shape = shape
        self._host_mesh = host_mesh

    @property
    def _shape(self) -> Shape:
        return self._pm_shape

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._group, shape, self._host_mesh)

    def _describe(self) -> str:
        return f"proc mesh {self._group.name!r} with extent {self.sizes}"

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> A:
        """Spawn one ``Class`` actor per proc; returns at once (``__init__`` runs
        remotely, before any message sent afterwards)."""
        from monarch._src.actor.actor_mesh import spawn_actor_mesh

        return spawn_actor_mesh(self, name, Class, args, kwargs)  # type: ignore[arg-type,return-value]

    @property
    def initialized(self) -> Future[bool]:
        """Completes (with True) once every proc is running."""
        return Future(impl=_GroupReady(self._group))

    @property
    def host_mesh(self) -> HostMesh:
        if self._host_mesh is None or len(self) != 1:
            raise NotImplementedError("host_mesh is available on singleton proc meshes only")
        return self._host_mesh

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of this mesh (lazy: runs when waited for)."""
        group = self._group

        async def stop() -> None:
            if not group.owned:
                raise RuntimeError(
                    f"{self._describe()} is a reference (received, or this process's own "
                    "proc); only the process that spawned the procs can stop them"
                )
            if group._stopped is not None:
                return
            import asyncio

            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, group.wait_ready, None)
            group._stopped = reason
            ctx = runtime.process_context()
            assert ctx.host is not None and group.proc_ids is not None
            ctx.stopping.update(group.proc_ids)
            fut = ctx.host.stop_procs(group.proc_ids, STOP_TIMEOUT)
            await fut

        from monarch._src.actor.future import coroutine_future

        return coroutine_future(stop)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcMesh, (self._group, self._pm_shape))

    def __repr__(self) -> str:
        return f"ProcMesh({self._group.name!r}, {self.sizes})"


class HostMesh(MeshTrait):
    """A mesh of hosts; ``this_host()`` is the client's machine (0-dimensional)."""

    def __init__(self, shape: Shape, *, owned: bool = False) -> None:
        self._hm_shape = shape
        self._owned = owned
        self._shut_down = False
        self._groups: list[_ProcGroup] = []

    @property
    def _shape(self) -> Shape:
        return self._hm_shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape)  # a view: not the owner

    def _stop_procs(self, why: str, shut_down: bool) -> Future[None]:
        if not self._owned:
            raise RuntimeError(
                f"{why}() is only for the HostMesh that owns its hosts (this_host()); this "
                "one is a slice or a received reference"
            )

        async def stop() -> None:
            if shut_down:
                self._shut_down = True
            for group in list(self._groups):
                await ProcMesh(group, Shape.unity()).stop(f"host mesh {why}")
            self._groups.clear()

        from monarch._src.actor.future import coroutine_future

        return coroutine_future(stop)

    def shutdown(self) -> Future[None]:
        """Stop every proc spawned on these hosts; later spawns raise ``RuntimeError``.
        Lazy: runs when waited for."""
        return self._stop_procs("shutdown", True)

    def stop(self) -> Future[None]:
        """Stop every proc spawned on these hosts; the hosts stay usable. Lazy."""
        return self._stop_procs("stop", False)

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        bootstrap_command: Any = None,
    ) -> ProcMesh:
        """Start ``prod(per_host)`` procs on each host; returns at once."""
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if (
                not isinstance(label, str)
                or not isinstance(size, int)
                or isinstance(size, bool)
                or size < 1
            ):
                raise ValueError(
                    f"spawn_procs(per_host={per_host!r}): expected dimension names mapped to "
                    "positive ints, e.g. {'gpus': 8}"
                )
            if label in self._hm_shape.labels:
                raise ValueError(
                    f"spawn_procs: per_host dimension {label!r} clashes with a host dimension "
                    f"({self._hm_shape.labels})"
                )
        count = math.prod(per_host.values()) if per_host else 1
        if proc_bind is not None and len(proc_bind) != count:
            raise ValueError(
                f"spawn_procs: proc_bind has {len(proc_bind)} entries for {count} procs; give "
                "one per proc"
            )
        name = "anon" if name is None else name
        if not isinstance(name, str) or not name or any(c in name for c in "@/[]: \t\n"):
            raise ValueError(
                f"spawn_procs: name {name!r} is not a valid proc name (non-empty, without "
                "whitespace or any of @ / [ ] :)"
            )
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"spawn_procs: bootstrap must be callable, got {bootstrap!r}")
        first: list[bytes] | None = None
        if bootstrap is not None:
            try:
                first = [runtime.AGENT_KEY_PART, dumps(("bootstrap",)), dumps(bootstrap)]
            except Exception as e:
                raise TypeError(
                    f"spawn_procs: the bootstrap function cannot be pickled: {e}"
                ) from e
        ctx = runtime.process_context()
        if ctx.host is None:
            raise NotImplementedError(
                "spawning procs from inside an actor is not supported yet; spawn them from "
                "the client and pass the mesh to the actor"
            )
        labels = list(self._hm_shape.labels) + list(per_host)
        sizes = list(self._hm_shape.ndslice.sizes) + list(per_host.values())
        shape = Shape(labels, Slice.new_row_major(sizes))
        group = _ProcGroup(name, count, owned=True)
        program = [sys.executable, "-m", "monarch._src.actor.bootstrap"]
        env = list(runtime.child_environment().items())
        spawning = ctx.host.spawn_procs(name, count, program[0], program[1:], env)

        def wait() -> None:
            try:
                procs = spawning.get()
            except BaseException as e:
                group._set_failed(str(e))
            else:
                group._set_ready([p for p, _ in procs], first)

        threading.Thread(target=wait, name=f"monarch-spawn-{name}", daemon=True).start()
        self._groups.append(group)
        return ProcMesh(group, shape, self)

    @property
    def initialized(self) -> Future[bool]:
        from monarch._src.actor.future import Done

        return Future(impl=Done(True))

    def __repr__(self) -> str:
        return f"HostMesh({self.sizes})"


_this_host: HostMesh | None = None
_this_proc: ProcMesh | None = None


def this_host() -> HostMesh:
    """The caller's machine, as a 0-dimensional host mesh."""
    global _this_host
    runtime.process_context()
    if _this_host is None:
        _this_host = HostMesh(Shape.unity(), owned=True)
    return _this_host


def _own_proc_mesh() -> ProcMesh:
    global _this_proc
    if _this_proc is None:
        ctx = runtime.process_context()
        group = _ProcGroup.ready_now("this_proc", [ctx.proc_id], owned=False)
        _this_proc = ProcMesh(group, Shape.unity())
    return _this_proc


def this_proc() -> ProcMesh:
    """The caller's own process, as a 0-dimensional proc mesh (actors spawned on it run
    in this process)."""
    return _own_proc_mesh()
