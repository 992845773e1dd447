"""Host meshes and proc meshes.

``this_host()`` is the caller's machine: in the client, the client process itself is
its host agent; inside a proc, the host agent that spawned the proc. ``spawn_procs``
asks the host agents for procs running :mod:`monarch._src.actor.bootstrap` and returns
at once: the procs start in the background, and spawns and messages issued meanwhile
wait, in order, in the runtime until they are ready (or fail with the reason they could
not start). The procs belong to the caller (the client, or the actor that spawned them):
they stop when it stops, and die with it.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from monarch._rust_bindings import Extent as _Extent
from monarch._rust_bindings import HostMeshHandle, ProcMeshHandle
from monarch._src import config
from monarch._src.actor import context as _context
from monarch._src.actor import cpu_threads, cuda_devices, extensions, logs, process
from monarch._src.actor import proc_bind as proc_binding
from monarch._src.actor.actor import Actor
from monarch._src.actor.actor_mesh import abandon_actor_meshes, spawn_actor_mesh
from monarch._src.actor.bootstrap_command import BootstrapCommand
from monarch._src.actor.context import sender
from monarch._src.actor.errors import ActorError
from monarch._src.actor.future import Done, Future
from monarch._src.actor.pickling import dumps, format_exception
from monarch._src.actor.point import Point
from monarch._src.actor.replies import RustWork
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.workspace import Workspace

# How a host starts a proc by default, and how it starts that entry point's fork
# server (a template interpreter every proc is forked from).
_BOOTSTRAP_ARGS = ["-m", "monarch._src.actor.bootstrap"]
_FORK_SERVER_ARGS = ["-m", "monarch._src.actor.forkserver"]

__all__ = [
    "BOOTSTRAP_FN_ENV",
    "PYTHON_EXECUTABLE_ENV",
    "ROOT_PROC_ENV",
    "HostMesh",
    "ProcMesh",
    "this_host",
    "this_proc",
]

A = TypeVar("A", bound=Actor)

#: The variable giving a spawned proc the root process's proc id (for controllers).
ROOT_PROC_ENV = "MONARCH_ROOT_PROC"
#: The variable giving a spawned proc the function to run before any actor.
BOOTSTRAP_FN_ENV = "MONARCH_BOOTSTRAP_FN"

#: What ``await proc_mesh`` warns (the spelling of earlier releases).
DEPRECATED_AWAIT_PROCS = (
    "awaiting a ProcMesh is deprecated: spawn_procs returns a usable mesh at once, e.g. "
    "`procs = this_host().spawn_procs(per_host={'gpus': N})`; to wait until the procs "
    "run, `await procs.initialized`"
)


def exit_timeout() -> float | None:
    """How long stopping procs waits for each one's process to exit, in seconds:
    ``process_exit_timeout`` when it is set, else ``None`` (the agent's stop timeout,
    ``stop_actor_timeout``)."""
    if not config.is_set("process_exit_timeout"):
        return None
    return float(config.get("process_exit_timeout"))


class ProcMesh(MeshTrait):
    """A mesh of procs (OS processes). ``spawn`` puts one actor on each."""

    def __init__(
        self, handle: ProcMeshHandle, shape: Shape, host_mesh: HostMesh | None = None
    ) -> None:
        self._handle = handle
        self._pm_shape = shape
        self._host_mesh = host_mesh
        #: Why the procs were stopped, once they were (shared by views of the mesh).
        self._stopped: list[str] = []
        #: The mesh ``spawn_procs`` returned (views share its procs and tensor engine).
        self._root: ProcMesh = self
        #: The tensor engine of the root, once started (see ``monarch._src.tensor_engine``).
        self._tensor_engine: list[Any] = []

    @property
    def _shape(self) -> Shape:
        return self._pm_shape

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        view = ProcMesh(self._handle.view(shape), shape, self._host_mesh)
        view._stopped = self._stopped
        view._root = self._root
        view._tensor_engine = self._tensor_engine
        return view

    def _describe(self) -> str:
        return f"proc mesh {self._handle.name!r} with extent {self.sizes}"

    def _stopped_error(self) -> RuntimeError | None:
        if self._stopped:
            return RuntimeError(f"`ProcMesh` has already been stopped ({self._stopped[0]})")
        return None

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> A:
        """Spawn one ``Class`` actor per proc; returns at once (``__init__`` runs
        remotely, before any message sent afterwards)."""
        # A type checker sees an actor mesh as its actor class (see ``Actor``).
        mesh: Any = spawn_actor_mesh(self, name, Class, args, kwargs)
        return mesh  # type: ignore[no-any-return]

    @property
    def initialized(self) -> Future[bool]:
        """Completes (with True) once every proc is running. Raises ``ActorError`` (the
        function's traceback in it) if the ``bootstrap`` function given to
        ``spawn_procs`` raised on a proc, ``RuntimeError`` if the procs could not
        start for another reason."""
        return Future(impl=RustWork(self._handle.initialized(), bool, _start_error))

    def __await__(self) -> Generator[Any, None, ProcMesh]:
        """``await mesh`` (the old, blocking ``await proc_mesh(...)``): waits until every
        proc runs, then gives the mesh itself. Deprecated: the mesh is usable at once;
        ``await mesh.initialized`` waits for the procs."""
        warnings.warn(DEPRECATED_AWAIT_PROCS, DeprecationWarning, stacklevel=2)
        return self._ready().__await__()

    async def _ready(self) -> ProcMesh:
        await self.initialized
        return self

    @property
    def host_mesh(self) -> HostMesh:
        """The host mesh whose ``spawn_procs`` created this proc, for a mesh of a single
        proc (slice the mesh down to one first: ``procs.slice(gpus=0).host_mesh``).

        Raises:
            NotImplementedError: The mesh has more than one proc, or it was not spawned
                from a host mesh (``this_proc()``).
        """
        if self._host_mesh is None or len(self) != 1:
            raise NotImplementedError("host_mesh is available on singleton proc meshes only")
        return self._host_mesh

    def _abandon(self, reason: str) -> None:
        """Count this mesh (every view of it) and the actor meshes on it as stopped for
        ``reason``, without stopping anything: its procs are about to end with their
        hosts (a job being killed), and their ends, or the failures they cause in actors
        still running, are no failures of the program. Later calls and spawns raise."""
        if self._stopped:
            return
        self._stopped.append(reason)
        self._handle.abandon()
        abandon_actor_meshes(self._root, reason)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of this mesh (lazy: runs when waited for). Only the process
        that spawned the procs can stop them. Each proc gets ``process_exit_timeout``
        (when set; else ``stop_actor_timeout``) to exit, then its host kills it."""
        handle = self._handle
        stopped = self._stopped
        engines = self._tensor_engine
        root = self._root

        async def stop() -> None:
            if stopped:
                return
            for engine in engines:
                engine.close()
            state = process.peek()
            if state is not None:
                state.agent.exit_timeout = exit_timeout()
            # The actor meshes on these procs are stopped with them: an actor that fails
            # because a peer's proc stopped first is no failure of the program.
            abandon_actor_meshes(root, None)
            await handle.stop(sender(), reason)
            stopped.append(reason)
            # The procs' last lines arrived before the stop's answer: written first.
            logs.flush()

        from monarch._src.actor.future import coroutine_future

        return coroutine_future(stop)

    # --- distributed tensors (``monarch._src.tensor_engine``; they import torch) ----------

    def activate(self) -> Any:
        """Make this mesh the active mesh, now: torch operations then run on every proc
        of it (see [Distributed tensors](../tensors.md)). Use as
        ``with mesh.activate():`` or end it with ``deactivate()``. The first use starts a
        tensor worker on each proc."""
        return extensions.tensor_engine().activate(self)

    def deactivate(self) -> None:
        """End this mesh's activation (the innermost one)."""
        extensions.tensor_engine().deactivate(self)

    def rank_tensor(self, dim: str | Sequence[str]) -> Any:
        """A distributed tensor holding each proc's coordinate along ``dim`` (or,
        row-major, along several dims)."""
        return extensions.tensor_engine().rank_tensor(self, dim)

    def rank_tensors(self) -> dict[str, Any]:
        """``rank_tensor(dim)`` for every dimension."""
        return {label: self.rank_tensor(label) for label in self._labels}

    def rank(self, dims: str | Sequence[str]) -> Any:
        """Same as :meth:`rank_tensor`."""
        return self.rank_tensor(dims)

    def process_group(self, dims: str | Sequence[str]) -> Any:
        """A ``RemoteProcessGroup`` over ``dims``, for remote functions."""
        return extensions.tensor_engine().process_group(self, dims)

    def to_table(self) -> str:
        """A text table of this mesh: each rank's coordinates."""
        return extensions.tensor_engine().to_table(self)

    async def sync_workspace(
        self, workspace: Workspace, conda: bool = False, auto_reload: bool = False
    ) -> None:
        """Not for proc meshes (as upstream): use the host mesh's,
        ``await hosts.sync_workspace(workspace)`` (see :meth:`HostMesh.sync_workspace`).

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError(
            "sync_workspace is not implemented for ProcMesh. Use HostMesh.sync_workspace instead."
        )

    async def logging_option(
        self,
        stream_to_client: bool = False,
        aggregate_window_sec: float | None = None,
        level: int = logging.INFO,
    ) -> None:
        """How this mesh's procs' output is shown in the client (guide:
        [Logging](../logging.md)). Must be awaited.

        ``stream_to_client``: show their stdout and stderr here (the default before any
        call is True; with False the lines only go to the per-proc log files).
        ``aggregate_window_sec``: print lines that are similar once numbers are masked
        once per window of this many seconds, as ``[N similar log lines] ...`` (needs
        ``stream_to_client``). ``level`` (0 to 255): the level of the ``logging`` root
        logger in the procs (a handler writing to stderr is added where there is none).
        Raises ``ValueError`` for a bad level or window; warns and only sets the level
        when log forwarding is disabled (``enable_log_forwarding``)."""
        await logs.logging_option(self, stream_to_client, aggregate_window_sec, level)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcMesh, (self._handle, self._pm_shape))

    def __repr__(self) -> str:
        return f"ProcMesh({self._handle.name!r}, {self.sizes})"


def _validate_spawn(
    per_host: dict[str, int],
    host_labels: list[str],
    name: Any,
    proc_bind: list[dict[str, str]] | None,
    bootstrap: Any,
) -> int:
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
        if label in host_labels:
            raise ValueError(
                f"spawn_procs: per_host dimension {label!r} clashes with a host dimension "
                f"({host_labels})"
            )
    count = math.prod(per_host.values()) if per_host else 1
    if proc_bind is not None:
        proc_binding.check(proc_bind)
        if len(proc_bind) != count:
            raise ValueError(
                f"spawn_procs: proc_bind has {len(proc_bind)} entries for {count} procs; "
                "give one per proc"
            )
    if not isinstance(name, str) or not name or any(c in name for c in "@/[]: \t\n"):
        raise ValueError(
            f"spawn_procs: name {name!r} is not a valid proc name (non-empty, without "
            "whitespace or any of @ / [ ] :)"
        )
    if bootstrap is not None and not callable(bootstrap):
        raise TypeError(f"spawn_procs: bootstrap must be callable, got {bootstrap!r}")
    return count


#: Variables of a spawned proc that only monarch sets (``spawn_procs(env=)`` refuses them).
#: The variable giving a spawned proc the Python interpreter its host mesh starts procs
#: with (``with_python_executable``), so that the procs its actors spawn use it too.
PYTHON_EXECUTABLE_ENV = "MONARCH_PYTHON_EXECUTABLE"

_RESERVED_ENV = frozenset(
    {
        ROOT_PROC_ENV,
        BOOTSTRAP_FN_ENV,
        PYTHON_EXECUTABLE_ENV,
        cuda_devices.PIN_ENV,
        proc_binding.ENV,
        cpu_threads.SHARE_ENV,
    }
)


def _check_env(env: Any) -> dict[str, str]:
    """``spawn_procs(env=...)``: a dict of variable names to values, both strings."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(
            f"spawn_procs(env=...): expected a dict of str to str, got {type(env).__name__}"
        )
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"spawn_procs(env=...): the entry {key!r}: {value!r} is not str to str "
                f"({type(key).__name__} to {type(value).__name__}); environment variables "
                "and their values are strings (write str(value))"
            )
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(
                f"spawn_procs(env=...): {key!r} is not a valid environment variable "
                "(names are non-empty, without '=' or NUL; values without NUL)"
            )
        if key in _RESERVED_ENV:
            raise ValueError(f"spawn_procs(env=...): {key} is set by monarch itself")
    return dict(env)


#: The last line a proc writes to stderr when its bootstrap function raised (after the
#: traceback): what tells the client's ``initialized`` to raise ``ActorError``.
BOOTSTRAP_FAILED = "monarch: the bootstrap function of this proc raised (traceback above)"
#: How the runtime's start error words the end of a proc, and where its stderr begins.
_PROC_ENDED = re.compile(r"proc (?P<name>\S+) rank (?P<rank>\d+) \(pid (?P<pid>\d+)\)")
_STDERR_TAIL = "; last lines of its stderr:\n"


def _start_error(error: RuntimeError) -> BaseException:
    """What ``initialized`` raises for the runtime's start ``error``: an ``ActorError``
    holding the bootstrap function's exception and traceback when that function raised
    (upstream's error), else ``error`` itself."""
    text = str(error)
    head, sep, tail = text.partition(_STDERR_TAIL)
    lines = tail.splitlines()
    if not sep or BOOTSTRAP_FAILED not in lines:
        return error
    formatted = "\n".join(lines[: lines.index(BOOTSTRAP_FAILED)]).strip("\n") + "\n"
    ended = _PROC_ENDED.search(head)
    where = (
        f"on rank {ended['rank']} of proc mesh {ended['name']!r} (pid {ended['pid']})"
        if ended is not None
        else "on a proc"
    )
    message = (
        f"The bootstrap function given to spawn_procs raised {where}, so its procs did "
        "not start: fix the function (its traceback is below), then spawn the procs again."
    )
    return ActorError(_exception_of(formatted), message, formatted)


def _exception_of(formatted: str) -> BaseException:
    """The exception whose traceback is ``formatted``: a built-in exception type with
    the same message, or a ``RuntimeError`` of its last line."""
    import builtins

    last = formatted.strip().splitlines()[-1] if formatted.strip() else "unknown error"
    name, colon, message = last.partition(":")
    cls = getattr(builtins, name.strip(), None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message.strip()) if colon else cls()
        except Exception:
            pass
    return RuntimeError(last)


def run_bootstrap(fn: Callable[[], Any]) -> None:
    """Run a spawn's ``bootstrap`` function in this proc (awaiting what it returns, if
    awaitable). If it raises an ``Exception``, its traceback, then
    :data:`BOOTSTRAP_FAILED`, go to stderr, and the proc exits with status 1: the
    client's ``initialized`` raises ``ActorError`` from those lines."""
    try:
        result = fn()
        if hasattr(result, "__await__"):
            import asyncio

            async def awaited() -> object:
                return await result

            asyncio.run(awaited())
    except Exception as e:
        sys.stderr.write(format_exception(e).rstrip("\n") + "\n" + BOOTSTRAP_FAILED + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


def child_environment(bootstrap: Callable[[], Any] | None) -> dict[str, str]:
    """The environment additions of a spawned proc: this process's import path (so the
    child imports what the parent does), the root's proc id, the client's config, and
    the bootstrap function."""
    path = [p for p in sys.path if p]
    cwd = os.getcwd()
    if cwd not in path:
        path.insert(0, cwd)
    existing = os.environ.get("PYTHONPATH")
    if existing:
        path.append(existing)
    env = {"PYTHONPATH": os.pathsep.join(path)}
    state = process.get()
    env[ROOT_PROC_ENV] = state.root_proc or state.proc_id
    env.update(config.snapshot_for_children())
    # A proc's runtime only moves messages between its sockets and its actors' threads:
    # one worker thread saves the wake-ups and work stealing of a second one. An
    # explicit setting is kept.
    if "MONARCH_TOKIO_WORKER_THREADS" not in os.environ:
        env["MONARCH_TOKIO_WORKER_THREADS"] = "1"
    if bootstrap is not None:
        try:
            blob = dumps(bootstrap)
        except Exception as e:
            raise TypeError(f"spawn_procs: the bootstrap function cannot be pickled: {e}") from e
        env[BOOTSTRAP_FN_ENV] = base64.b64encode(blob).decode()
    return env


#: A proc's command as the bindings take it: ``(program, args, env)``.
_Command = tuple[str, list[str], list[tuple[str, str]]]


def _command_fields(command: Any, point: Point | None) -> tuple[str, list[str], dict[str, str]]:
    """``(program, args, env)`` of ``command``, a ``BootstrapCommand`` given to
    ``spawn_procs`` (for ``point``, when a per-point function returned it)."""
    where = "" if point is None else f" for point {dict(point)} (rank {point.rank})"
    if not isinstance(command, BootstrapCommand):
        given = "the function returned" if point is not None else "got"
        raise TypeError(
            f"spawn_procs(bootstrap_command=...){where}: expected a BootstrapCommand, "
            f"{given} {type(command).__name__} ({command!r}); give a BootstrapCommand, or "
            "a function of a Point returning one, e.g. "
            "`lambda point: default_bootstrap_cmd().with_env({'RANK': str(point.rank)})`"
        )
    return str(command.program), [str(a) for a in command.args], dict(command.env)


def _command_at(function: Callable[[Point], Any], point: Point) -> Any:
    """What the per-point ``bootstrap_command`` function returns for ``point``; its
    exception, if it raises, notes the point."""
    try:
        return function(point)
    except Exception as e:
        add_note = getattr(e, "add_note", None)  # Python 3.11 and later
        if add_note is not None:
            add_note(f"in spawn_procs: bootstrap_command({dict(point)}) (rank {point.rank})")
        raise


def _fork_server_args() -> list[str]:
    """The fork server's arguments, with the modules its template preloads (the
    ``spawn_fork_server_preload`` config key): by default, a program that has imported
    torch gets procs forked from a template that imported it too, so each proc does not
    import it again (seconds of CPU each); other programs get a template without it."""
    args = list(_FORK_SERVER_ARGS)
    setting = str(config.get("spawn_fork_server_preload")).strip()
    if setting == "auto":
        modules = ["torch"] if "torch" in sys.modules else []
    elif setting in ("", "none"):
        modules = []
    else:
        modules = [m.strip() for m in setting.split(",") if m.strip()]
    for module in modules:
        args += ["--preload", module]
    return args


class HostMesh(MeshTrait):
    """A mesh of hosts: ``this_host()`` is the caller's machine (0-dimensional);
    ``attach_to_workers`` gives workers on other machines (``{"hosts": N}``)."""

    def __init__(
        self,
        handle: HostMeshHandle,
        shape: Shape,
        *,
        owned: bool = False,
        attached: bool = False,
        python_executable: str | None = None,
    ) -> None:
        self._handle = handle
        self._hm_shape = shape
        self._owned = owned
        self._attached = attached
        self._python = python_executable
        self._name: str | None = None
        self._shut_down = False
        self._workers_ended = False
        self._spawned: list[ProcMesh] = []

    @property
    def _shape(self) -> Shape:
        return self._hm_shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        # A view: not the owner; it spawns on the hosts of its ranks only.
        view = HostMesh(
            self._handle.view(shape),
            shape.extent.region,
            attached=self._attached,
            python_executable=self._python,
        )
        view._name = self._name
        view._spawned = self._spawned  # procs spawned on a slice are on these hosts too
        return view

    def with_python_executable(self, path: str) -> HostMesh:
        """The same hosts, starting procs with the Python interpreter at ``path`` (on
        the hosts) instead of this one."""
        if not isinstance(path, str) or not path:
            raise ValueError(f"with_python_executable: expected a path, got {path!r}")
        mesh = HostMesh(
            self._handle,
            self._hm_shape,
            owned=self._owned,
            attached=self._attached,
            python_executable=path,
        )
        mesh._name = self._name
        mesh._spawned = self._spawned
        return mesh

    def _stop_procs(self, why: str, shut_down: bool) -> Future[None]:
        if not self._owned:
            raise RuntimeError(
                f"{why}() is only for the HostMesh that owns its hosts (this_host(), or "
                "the mesh attach_to_workers returned); this one is a slice or a received "
                "reference"
            )
        spawned = self._spawned
        end_workers = shut_down and self._attached and not self._workers_ended
        handle = self._handle

        async def stop() -> None:
            if shut_down:
                self._shut_down = True
            for procs in list(spawned):
                await procs.stop(f"host mesh {why}")
            spawned.clear()
            if end_workers:
                self._workers_ended = True
                timeout = config.get("mesh_terminate_timeout")
                failures: list[str] = await handle.end_workers(
                    sender(), "the client shut its host mesh down", timeout
                )
                for failure in failures:
                    print(
                        f"monarch: HostMesh.shutdown: a worker did not confirm its end "
                        f"({failure}); it may have been gone already",
                        file=sys.stderr,
                    )

        from monarch._src.actor.future import coroutine_future

        return coroutine_future(stop)

    def _abandon(self, reason: str) -> None:
        """The hosts are about to end (their job is being killed): every proc mesh
        spawned on them counts as stopped for ``reason`` (see ``ProcMesh._abandon``), and
        the mesh as shut down."""
        self._shut_down = True
        self._workers_ended = True
        self._handle.abandon()  # their loss is expected: no warning
        for procs in list(self._spawned):
            procs._abandon(reason)
        self._spawned.clear()

    def shutdown(self) -> Future[None]:
        """Stop every proc spawned on these hosts, and end the workers of a mesh from
        ``attach_to_workers`` (each stops its procs and exits). A host known lost is not
        waited on, and one that stops answering at most ``host_heartbeat_timeout``.
        Later spawns raise ``RuntimeError``. Lazy: runs when waited for."""
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
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
        env: dict[str, str] | None = None,
    ) -> ProcMesh:
        """Start ``prod(per_host)`` procs on each host; returns at once.

        ``proc_bind`` (one dict per proc of a host) binds each proc to CPUs (``cpus``,
        ``physcpubind``, ``cpunodebind``) and memory nodes (``membind``), in numactl's
        list syntax: see [Many hosts](../hosts.md#attach-a-client).

        ``bootstrap_command`` replaces how each proc starts: one ``BootstrapCommand``
        for every proc, or a function called once per proc with its ``Point`` in the
        proc mesh (host dimensions, then ``per_host``'s) that returns the proc's own
        (for example a per-point environment).

        ``env`` adds environment variables to every proc, set before any of its code
        runs. The procs of a ``"gpus"`` dimension get ``CUDA_VISIBLE_DEVICES`` (one GPU
        each) when their host has exactly that many GPUs: see
        [One GPU per proc](../spmd.md#one-gpu-per-proc). Several procs on a host share
        its cores: each runs ``max(1, cores // procs)`` torch threads unless
        ``OMP_NUM_THREADS`` is set ([CPU threads per proc](../spmd.md#cpu-threads-per-proc)).
        """
        return self._spawn_procs(
            per_host, bootstrap, name, proc_bind, bootstrap_command, env, pin_gpus=True
        )

    def _spawn_procs(
        self,
        per_host: dict[str, int] | None,
        bootstrap: Callable[[], Any] | None,
        name: str | None,
        proc_bind: list[dict[str, str]] | None,
        bootstrap_command: Any,
        user_env: dict[str, str] | None,
        *,
        pin_gpus: bool,
    ) -> ProcMesh:
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        per_host = dict(per_host or {})
        name = "anon" if name is None else name
        _validate_spawn(per_host, list(self._hm_shape.labels), name, proc_bind, bootstrap)
        extra = _check_env(user_env)
        env = child_environment(bootstrap)
        # Imported here, not at the top: it brings asyncio, ssl and hashlib, which a
        # proc that never spawns or syncs should not pay for.
        from monarch._src.actor import code_sync

        env.update(code_sync.spawn_variables(self))
        python = self._python or sys.executable
        if self._python is not None:
            env[PYTHON_EXECUTABLE_ENV] = self._python
        labels = list(self._hm_shape.labels) + list(per_host)
        sizes = list(self._hm_shape.ndslice.sizes) + list(per_host.values())
        extent = _Extent(labels, sizes)

        def finish(program: str, args: list[str], command_env: dict[str, str]) -> _Command:
            proc_env = {**env, **command_env, **extra}
            if pin_gpus:
                proc_env.update(cuda_devices.spawn_variables(per_host, proc_env))
            proc_env.update(cpu_threads.spawn_variables(per_host, bool(proc_bind), proc_env))
            proc_env.update(proc_binding.spawn_variables(proc_bind))
            return (program, args, list(proc_env.items()))

        if bootstrap_command is None:
            commands = [finish(python, list(_BOOTSTRAP_ARGS), {})]
        elif callable(bootstrap_command):
            commands = [
                finish(*_command_fields(_command_at(bootstrap_command, point), point))
                for point in (Point(rank, extent) for rank in range(extent.nelements))
            ]
            if all(c == commands[0] for c in commands):
                commands = commands[:1]
        else:
            commands = [finish(*_command_fields(bootstrap_command, None))]
        # The default entry point, shared by every proc, can be forked from a template
        # interpreter.
        fork_server = (
            _fork_server_args()
            if len(commands) == 1
            and commands[0][1] == _BOOTSTRAP_ARGS
            and config.cached("spawn_fork_server")
            else None
        )
        handle = self._handle.spawn_procs(
            sender(),
            name,
            _Extent(list(per_host), list(per_host.values())),
            commands,
            fork_server,
            forward_output=bool(config.get("enable_log_forwarding")),
            log_files=bool(config.get("enable_file_capture")),
            tail_lines=int(config.get("tail_log_lines")),
        )
        procs = ProcMesh(handle, extent.region, self)
        self._spawned.append(procs)
        return procs

    async def sync_workspace(
        self, workspace: Workspace, conda: bool = False, auto_reload: bool = False
    ) -> None:
        """Mirror ``workspace``'s local directories to every host, under its
        ``$WORKSPACE_DIR`` (guide: [Code on the hosts](../workspace.md)). Only changed
        files are sent, once, down a tree of the hosts; deletions and permissions are
        carried; each file is replaced whole. Procs spawned afterwards have the
        directories at the front of ``sys.path``. ``conda``: mirror the environment's
        ``site-packages`` too (``workspace.env``, else the active one). ``auto_reload``:
        running procs of this mesh take the directories onto ``sys.path`` and reload the
        modules whose files changed. Must be awaited.

        Raises:
            WorkspacePathError: A path would leave the workspace (a link pointing
                outside its directory, a remote name with ``..``); nothing was sent.
            HostOutOfSpaceError: A host lacks the space the sync needs (named, with
                the bytes needed and free).
            RuntimeError: The mesh is a slice or a received reference (sync with the
                mesh that owns the hosts).
        """
        from monarch._src.actor import code_sync  # on first use (see spawn_procs)

        await code_sync.sync_workspace(self, workspace, conda, auto_reload)

    @property
    def initialized(self) -> Future[bool]:
        """Completes (with True) once every host answered; for workers attached by
        address, fails naming the worker that cannot be reached and why."""
        if not self._attached:
            return Future(impl=Done(True))
        return Future(impl=RustWork(self._handle.probe(), bool))

    @property
    def is_fake_in_process(self) -> bool:
        """Whether this host mesh only simulates hosts inside this process (upstream's
        ``fake_in_process_host()``); the host meshes of this implementation are real
        hosts, so False."""
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostMesh, (self._handle, self._hm_shape))

    def __repr__(self) -> str:
        return f"HostMesh({self.sizes})"


_this_host: HostMesh | None = None
_this_proc: ProcMesh | None = None


def this_host() -> HostMesh:
    """The caller's machine, as a 0-dimensional host mesh."""
    global _this_host
    if _this_host is None:
        state = process.get()
        # In a proc spawned with ``with_python_executable``, nested spawns use it too.
        _this_host = HostMesh(
            state.agent.this_host(),
            Shape.unity(),
            owned=True,
            python_executable=os.environ.get(PYTHON_EXECUTABLE_ENV) or None,
        )
    return _this_host


def this_proc() -> ProcMesh:
    """The caller's own process, as a 0-dimensional proc mesh (actors spawned on it run
    in this process)."""
    global _this_proc
    if _this_proc is None:
        state = process.get()
        _this_proc = ProcMesh(state.agent.this_proc(), Shape.unity())
    return _this_proc


_context.set_this_proc(this_proc)
