"""Commands on the hosts of a mesh: :func:`exec_command` here, and
:func:`~monarch._src.job.shell.shell`, which shares its procs and flow control.

Both spawn procs on the hosts they run on (``host_mesh.spawn_procs``), put an actor on
each that starts the command as a child process of its proc, and stop the actors and
the procs when the command ends, whatever the outcome.

``exec_command`` streams each run's stdout and stderr back over a channel, as
``_Output`` chunks, ending with ``_Exited`` and the run's status; the client writes the
chunks to its own stdout and stderr, line by line with a ``[rank N]`` prefix, or to
``<output_dir>/rank_<N>.log``. ``shell`` runs one interactive shell and relays the
client's stdin to it and its output back, through a pseudo-terminal on the remote side
when the client's stdin is a terminal, plain pipes otherwise.

Flow control: a remote sender keeps at most :data:`_WINDOW` bytes of output that the
client has not acknowledged (``_Ack`` once written), and the client keeps at most as
much input unacknowledged for the shell: a slow reader slows the writer, and nothing
buffers more than the window.

Invariants (tests cite them):

- EXEC-1: a run of ``exec_command`` sees ``MONARCH_RANK_<DIM>`` and
  ``MONARCH_SIZE_<DIM>`` for every dimension of its proc mesh, then ``env``; it runs in
  ``workdir``, which must exist on its host.
- EXEC-2: the future's value is the largest exit status of the runs (a run killed by
  a signal counts as 128 + the signal).
- EXEC-3: the procs ``exec_command`` and ``shell`` spawn are stopped once the command
  ended or failed; what the command left running in its session is ended with it, and
  (Linux) the command is killed if its proc dies first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import functools
import math
import os
import signal
import socket
import sys
import termios
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Generic, NamedTuple, TypeVar

from monarch._src.actor.actor import Actor
from monarch._src.actor.channel import Channel, Port, PortReceiver
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import concurrent_endpoint
from monarch._src.actor.errors import ActorError
from monarch._src.actor.future import Future, background_loop
from monarch._src.actor.point import Point
from monarch._src.actor.proc_mesh import HostMesh, ProcMesh
from monarch._src.job.port_forward import _Window

__all__ = ["exec_command"]

R = TypeVar("R")

#: Most bytes one output or input message carries.
_CHUNK = 64 * 1024
#: Most bytes a sender keeps unacknowledged (see the module docs).
_WINDOW = 1024 * 1024
#: Seconds the output of a command that exited may take to end, before the processes it
#: left behind are ended.
_DRAIN_GRACE = 1.0
#: Seconds processes get between SIGTERM and SIGKILL.
_KILL_GRACE = 1.0
#: Seconds the client waits for the last messages of runs whose calls returned.
_LATE_MESSAGES = 30.0
#: Seconds the client waits for its actors, then its procs, to stop.
_STOP_TIMEOUT = 60.0
#: Shell used when the remote environment names none.
_DEFAULT_SHELL = "/bin/sh"


# --- messages ---------------------------------------------------------------------------


class _Started(NamedTuple):
    """A run began; its acknowledgements go to ``acks``."""

    rank: int
    acks: Port[int]


class _Output(NamedTuple):
    rank: int
    #: 1: stdout, 2: stderr.
    stream: int
    data: bytes


class _Exited(NamedTuple):
    rank: int
    status: int


_CommandEvent = _Started | _Output | _Exited


# --- the remote side --------------------------------------------------------------------


def _exit_status(returncode: int) -> int:
    """A process's status as a shell reports it: 128 + the signal that killed it."""
    return returncode if returncode >= 0 else 128 - returncode


def _rank_env(point: Point) -> dict[str, str]:
    """``MONARCH_RANK_<DIM>`` and ``MONARCH_SIZE_<DIM>`` for each dimension of ``point``:
    the name upper-cased, and also as written when that differs (as upstream sets it)."""
    sizes = dict(point.extent)
    env: dict[str, str] = {}
    for label, coordinate in dict(point).items():
        for name in dict.fromkeys((label.upper(), label)):
            env[f"MONARCH_RANK_{name}"] = str(coordinate)
            env[f"MONARCH_SIZE_{name}"] = str(sizes[label])
    return env


def _where(point: Point) -> str:
    coordinates = ", ".join(f"{k}={v}" for k, v in dict(point).items())
    return f"host {socket.gethostname()}" + (f" (proc {coordinates})" if coordinates else "")


def _working_directory(what: str, workdir: str | None, client_cwd: str, point: Point) -> str | None:
    """Where a command runs: ``workdir`` (relative: to the client's working directory),
    which must exist here; else the client's working directory when it exists here too;
    else the proc's own."""
    client_here = os.path.isdir(client_cwd)
    if workdir is not None:
        if client_here:
            workdir = os.path.join(client_cwd, workdir)
        if not os.path.isdir(workdir):
            raise FileNotFoundError(
                errno.ENOENT,
                f"{what}: the working directory does not exist on {_where(point)}",
                workdir,
            )
        return workdir
    return client_cwd if client_here else None


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` (Linux), or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _child_setup(controlling_tty: bool) -> Callable[[], None]:
    """What a command's child process runs between fork and exec: on Linux it asks for
    SIGKILL when the thread that started it (its actor's) ends, so that a command does
    not outlive its proc (EXEC-3); with ``controlling_tty``, it starts a session whose
    controlling terminal is its stdin (a pty), as a login on a terminal has. Only
    calls prepared here run in the child."""
    prctl = _prctl()
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)
    ioctl, setsid, tiocsctty = fcntl.ioctl, os.setsid, termios.TIOCSCTTY

    def setup() -> None:
        if prctl is not None:
            prctl(pr_set_pdeathsig, sigkill)
        if controlling_tty:
            setsid()
            ioctl(0, tiocsctty, 0)

    return setup


def _session_members(sid: int) -> list[int]:
    """The live processes of session ``sid``, from ``/proc``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, session, ...
        fields = data[data.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _signal_session(sid: int, signals: Sequence[int]) -> bool:
    """Send ``signals`` to every live process of the session ``sid`` leads (without
    ``/proc``: to its process group); whether there was any. No signals: a probe."""
    if os.path.isdir("/proc"):
        pids = _session_members(sid)
        for pid in pids:
            for sig in signals:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        return bool(pids)
    try:
        for sig in signals or (0,):
            os.killpg(sid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class _Child:
    """A child process running a command, started as ``asyncio.create_subprocess_exec``
    starts one, plus an event set once it exited: ``Process.wait()`` also waits until
    its pipes close, which processes it left running may hold open for ever."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Event,
    ) -> None:
        self.process = process
        self.exited = exited
        self._transport = transport

    @classmethod
    async def start(cls, argv: Sequence[str], **popen: Any) -> _Child:
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()

        class Protocol(asyncio.subprocess.SubprocessStreamProtocol):
            def process_exited(self) -> None:
                super().process_exited()
                exited.set()

        transport, protocol = await loop.subprocess_exec(
            lambda: Protocol(limit=_CHUNK, loop=loop), *argv, **popen
        )
        return cls(asyncio.subprocess.Process(transport, protocol, loop), transport, exited)

    @property
    def status(self) -> int:
        """Its exit status as a shell reports it (128 + the signal that killed it)."""
        returncode = self.process.returncode
        return _exit_status(-signal.SIGKILL if returncode is None else returncode)

    async def end(self) -> None:
        """End what is left of the session it leads (the command, or the shell, and
        whatever it started): SIGHUP and SIGTERM, then SIGKILL after
        :data:`_KILL_GRACE`. Waits (as long) for the child itself to have exited."""
        sid = self.process.pid
        loop = asyncio.get_running_loop()
        if _signal_session(sid, (signal.SIGHUP, signal.SIGTERM)):
            deadline = loop.time() + _KILL_GRACE
            delay = 0.005
            # Members that are not our children give nothing to wait on: poll.
            while _signal_session(sid, ()) and loop.time() < deadline:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
            _signal_session(sid, (signal.SIGKILL,))
        if not self.exited.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), _KILL_GRACE)

    def close(self) -> None:
        """Release its pipes (whoever still holds their other ends)."""
        self._transport.close()


async def _drain(tasks: Sequence[asyncio.Future[Any]], timeout: float) -> None:
    """Wait up to ``timeout`` for ``tasks``; cancel those still running."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _stopped() -> int:
    """What a run answers when its actor stops under it (its caller gave up; the command
    was ended): a status, not the ``CancelledError``, which would fail the actor."""
    return _exit_status(-signal.SIGKILL)


async def _read_acks(acks: PortReceiver[int], window: _Window) -> None:
    """Refund ``window`` with each acknowledgement (a number of bytes)."""
    while True:
        window.refund(await acks.recv())


class _CommandRunner(Actor):
    """Runs one command of ``exec_command`` on its proc."""

    def __init__(self) -> None:
        self._child: _Child | None = None

    @concurrent_endpoint
    async def run(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: str | None,
        client_cwd: str,
        output: Port[_CommandEvent],
    ) -> int:
        point = context().actor_instance.rank
        rank = point.rank
        cwd = _working_directory("exec_command", workdir, client_cwd, point)
        if argv[0] == "-m" or argv[0].endswith(".py"):
            argv = [sys.executable, *argv]  # a Python script or module: this proc's Python
        child_env = {**os.environ, **_rank_env(point), **env}
        window = _Window(_WINDOW)
        ack_port, acks = Channel[int].open()
        output.send(_Started(rank, ack_port))
        reading_acks = asyncio.ensure_future(_read_acks(acks, window))
        try:
            status = await self._run(argv, cwd, child_env, rank, output, window)
        except asyncio.CancelledError:
            return _stopped()
        finally:
            await _drain([reading_acks], 0)
        output.send(_Exited(rank, status))
        return status

    async def _run(
        self,
        argv: list[str],
        cwd: str | None,
        env: dict[str, str],
        rank: int,
        output: Port[_CommandEvent],
        window: _Window,
    ) -> int:
        try:
            child = await _Child.start(
                argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup(False),
            )
        except OSError as e:
            # As a shell reports a command it cannot run: 127 not found, 126 not
            # executable.
            output.send(_Output(rank, 2, f"exec_command: {argv[0]}: {e.strerror or e}\n".encode()))
            return 127 if isinstance(e, FileNotFoundError) else 126
        self._child = child
        stdout, stderr = child.process.stdout, child.process.stderr
        assert stdout is not None and stderr is not None
        pumps = [
            asyncio.ensure_future(self._pump(stdout, rank, 1, output, window)),
            asyncio.ensure_future(self._pump(stderr, rank, 2, output, window)),
        ]
        try:
            await child.exited.wait()
            # Its output may still be in the pipes, or held open by processes it left
            # running: they get a moment.
            await asyncio.wait(pumps, timeout=_DRAIN_GRACE)
        finally:
            # Done or cancelled (the actor stops): what is left of the command ends.
            await child.end()
            await _drain(pumps, _DRAIN_GRACE)
            child.close()
            self._child = None
        return child.status

    @staticmethod
    async def _pump(
        stream: asyncio.StreamReader,
        rank: int,
        number: int,
        output: Port[_CommandEvent],
        window: _Window,
    ) -> None:
        while True:
            free = await window.wait_free()
            data = await stream.read(min(_CHUNK, free))
            if not data:
                return
            window.spend(len(data))
            output.send(_Output(rank, number, data))

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self._child is not None:
            await self._child.end()


# --- the client side --------------------------------------------------------------------


class _Running(Generic[R]):
    """A future's implementation over work already running on the background loop.

    ``finished`` completes once the work's coroutine returned, cleanup included: a
    wait interrupted by ``KeyboardInterrupt`` (Ctrl-C) or ``SystemExit`` cancels the
    work and waits for that (at most :data:`_STOP_TIMEOUT`), so that the runs are
    ended (EXEC-3) before the interruption goes on."""

    def __init__(
        self, work: concurrent.futures.Future[R], finished: concurrent.futures.Future[None]
    ) -> None:
        self._work = work
        self._finished = finished

    def wait(self, timeout: float | None) -> R:
        try:
            return self._work.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the command did not finish within {timeout} s; it keeps running: call "
                "get() again or await the future"
            ) from None
        except (KeyboardInterrupt, SystemExit):
            self._work.cancel()
            with contextlib.suppress(Exception):
                self._finished.result(_STOP_TIMEOUT)
            raise

    async def wait_async(self) -> R:
        return await asyncio.wrap_future(self._work)


def _command_argv(cmd: object) -> list[str]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("exec_command: the command is empty")
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, (bytes, bytearray)) or not isinstance(cmd, Sequence):
        raise TypeError(
            f"exec_command: expected a command line (str) or an argument list, got {cmd!r}"
        )
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError(
            f"exec_command: an argument list must be non-empty strings, e.g. ['ls', '-l']; "
            f"got {cmd!r}"
        )
    return argv


def _check_env(what: str, env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError(f"{what}: env must map variable names to strings, got {env!r}")
    return dict(env)


def _check_workdir(what: str, workdir: str | os.PathLike[str] | None) -> str | None:
    if workdir is None:
        return None
    path = os.fspath(workdir)
    if not isinstance(path, str) or not path:
        raise TypeError(f"{what}: workdir must be a path, got {workdir!r}")
    return path


def _select_hosts(
    host_mesh: HostMesh, rank: int | None, point: Mapping[str, Any] | None
) -> tuple[HostMesh, list[int]]:
    """The hosts to run on, and the row-major rank of each in ``host_mesh``."""
    if rank is not None and point is not None:
        raise ValueError("exec_command: give rank or point, not both")
    count = len(host_mesh)
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < count:
            raise ValueError(
                f"exec_command: rank {rank!r} is not a host rank of {host_mesh!r} "
                f"(0 to {count - 1})"
            )
        coordinates: dict[str, int] = {}
        rest = rank
        for label, size in reversed(list(host_mesh.sizes.items())):
            coordinates[label] = rest % size
            rest //= size
        selected = host_mesh.slice(**coordinates) if coordinates else host_mesh
        return selected, [rank]
    if point is not None:
        if not isinstance(point, Mapping):
            raise TypeError(f"exec_command: point must be a dict of coordinates, got {point!r}")
        selected = host_mesh.slice(**dict(point)) if point else host_mesh
        # The same selection on the shape keeps the ranks of the full mesh.
        shape = host_mesh._shape
        for label, index in point.items():
            shape = shape.select(label, index)
        position = {r: i for i, r in enumerate(host_mesh._shape.ranks())}
        return selected, [position[r] for r in shape.ranks()]
    return host_mesh, list(range(count))


class _OutputSink:
    """Where ``exec_command`` writes each run's output: files in ``output_dir``, or the
    client's stdout and stderr, line by line, prefixed with the run's rank."""

    def __init__(self, output_dir: str | None, ranks: Sequence[int]) -> None:
        self._files: dict[int, IO[bytes]] = {}
        self._partial: dict[tuple[int, int], bytes] = {}
        if output_dir is None:
            return
        os.makedirs(output_dir, exist_ok=True)
        try:
            for n in ranks:
                self._files[n] = open(os.path.join(output_dir, f"rank_{n}.log"), "wb")
        except BaseException:
            self.close()
            raise

    def write(self, n: int, stream: int, data: bytes) -> None:
        file = self._files.get(n)
        if file is not None:
            file.write(data)
            return
        lines = (self._partial.pop((n, stream), b"") + data).split(b"\n")
        last = lines.pop()
        if len(last) > _CHUNK:  # a line that does not end soon is written in parts
            lines.append(last)
        elif last:
            self._partial[(n, stream)] = last
        if lines:
            self._print(n, stream, lines)

    def _print(self, n: int, stream: int, lines: list[bytes]) -> None:
        target = sys.stdout if stream == 1 else sys.stderr
        prefix = f"[rank {n}] "
        text = "".join(f"{prefix}{line.decode(errors='replace')}\n" for line in lines)
        target.write(text)
        target.flush()

    def finish(self, n: int) -> None:
        """The run ``n`` ended: its unterminated lines are written, its file closed."""
        for stream in (1, 2):
            last = self._partial.pop((n, stream), None)
            if last is not None:
                self._print(n, stream, [last])
        file = self._files.pop(n, None)
        if file is not None:
            file.close()

    def close(self) -> None:
        for n in list(self._files):
            self.finish(n)
        for n, _ in list(self._partial):
            self.finish(n)


def _unwrap(error: BaseException) -> BaseException:
    """What a run's failure raises in the client: the remote exception of a failed
    start (a missing working directory), else the error itself."""
    if isinstance(error, ActorError) and isinstance(error.exception, OSError):
        return error.exception
    return error


async def _stop(what: str, mesh: Any) -> None:
    """Stop ``mesh`` (actors or procs), bounded by :data:`_STOP_TIMEOUT`; a failure to
    stop is reported, not raised (the command's own outcome is what counts)."""
    try:
        await asyncio.wait_for(_await(mesh.stop(f"{what} ended")), _STOP_TIMEOUT)
    except Exception as e:
        print(f"monarch: {what}: stopping {mesh!r} failed: {e!r}", file=sys.stderr)


async def _await(future: Future[R]) -> R:
    return await future


async def _follow_command(
    runners: _CommandRunner,
    procs: ProcMesh,
    calls: Future[Any],
    events: PortReceiver[_CommandEvent],
    sink: _OutputSink,
    numbers: list[int],
) -> int:
    """Write the runs' output as it comes; their largest status once all exited. Stops
    the actors and procs in any case (EXEC-3)."""
    statuses: dict[int, int] = {}
    acks: dict[int, Port[int]] = {}
    call_task: asyncio.Future[Any] = asyncio.ensure_future(_await(calls))
    receiving: asyncio.Future[Any] | None = None
    try:
        while len(statuses) < len(numbers):
            if receiving is None:
                receiving = asyncio.ensure_future(_await(events.recv()))
            waiting: set[asyncio.Future[Any]] = {receiving}
            if not call_task.done():
                waiting.add(call_task)
            # Once every call returned, the runs' last messages are on their way.
            done, _ = await asyncio.wait(
                waiting,
                timeout=None if not call_task.done() else _LATE_MESSAGES,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if receiving in done:
                event = receiving.result()
                receiving = None
                if isinstance(event, _Output):
                    sink.write(numbers[event.rank], event.stream, event.data)
                    with contextlib.suppress(Exception):  # a run that ended needs none
                        acks[event.rank].send(len(event.data))
                elif isinstance(event, _Started):
                    acks[event.rank] = event.acks
                else:
                    statuses[event.rank] = event.status
                    sink.finish(numbers[event.rank])
            elif call_task in done:
                error = call_task.exception()
                if error is not None:
                    raise _unwrap(error) from error
            elif not done:
                missing = sorted(numbers[r] for r in range(len(numbers)) if r not in statuses)
                raise RuntimeError(
                    f"exec_command: the runs of ranks {missing} returned, but their last "
                    f"output did not arrive within {_LATE_MESSAGES:g} s"
                )
        return max(statuses.values(), default=0)
    finally:
        for task in (receiving, call_task):
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in (receiving, call_task) if t is not None), return_exceptions=True
        )
        sink.close()
        await _stop("exec_command", runners)
        await _stop("exec_command", procs)


def exec_command(
    host_mesh: HostMesh,
    cmd: str | Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    point: Mapping[str, Any] | None = None,
    per_host: Mapping[str, int] | None = None,
) -> Future[int]:
    """Run a command on hosts of ``host_mesh``; a future of the largest exit status.

    ``cmd`` is a command line, run with ``/bin/sh -c``, or an argument list, run as is
    (a program that cannot be found gives status 127, one that cannot be run 126), except
    that a list starting with a ``.py`` file or ``-m`` runs with the Python interpreter
    of the procs (``["train.py", "--lr", "0.1"]``, ``["-m", "pkg.main"]``). It
    runs on every host, or on the host of row-major ``rank``, or on those at ``point``
    (``{"hosts": 1}``; what ``host_mesh.slice`` takes), ``prod(per_host)`` times on each
    (``per_host={"gpus": 8}``). Each run is a child of a proc spawned for it, which
    stops when the command ends, and sees:

    - ``MONARCH_RANK_<DIM>`` and ``MONARCH_SIZE_<DIM>``: its coordinate and the size of
      each dimension of those procs (the name upper-cased; also as written, when that
      differs), then ``env``;
    - the working directory ``workdir`` (relative: to the client's working directory;
      ``FileNotFoundError`` naming the host if it does not exist there), else the
      client's working directory when the host has it.

    Each run has a number ``N``: its row-major rank among all the hosts of
    ``host_mesh`` times the ``per_host`` copies (the same whatever is selected). Its
    stdout and stderr go to the client's, each line prefixed with ``[rank N]``, or,
    with ``output_dir`` (a directory of the client, created if needed), both to
    ``<output_dir>/rank_N.log``.

    The command starts at once; the future completes once every run ended, with the
    largest status (a run killed by a signal counts as 128 + the signal), or fails with
    the first error of a run that could not start.
    """
    argv = _command_argv(cmd)
    extra_env = _check_env("exec_command", env)
    directory = _check_workdir("exec_command", workdir)
    out_dir = None if output_dir is None else os.fspath(output_dir)
    copies_of = dict(per_host or {})
    hosts, positions = _select_hosts(host_mesh, rank, point)
    copies = math.prod(copies_of.values()) if copies_of else 1
    numbers = [positions[i // copies] * copies + i % copies for i in range(len(hosts) * copies)]
    sink = _OutputSink(out_dir, numbers)
    procs: ProcMesh | None = None
    try:
        procs = hosts.spawn_procs(per_host=copies_of, name="exec")
        runners = procs.spawn("exec", _CommandRunner)
        events_port, events = Channel[_CommandEvent].open()
        calls = runners.run.call(argv, extra_env, directory, os.getcwd(), events_port)
    except BaseException:
        sink.close()
        if procs is not None:
            with contextlib.suppress(Exception):
                procs.stop("exec_command failed to start").get(timeout=_STOP_TIMEOUT)
        raise
    finished: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def follow() -> int:
        try:
            return await _follow_command(runners, procs, calls, events, sink, numbers)
        finally:
            finished.set_result(None)

    work = asyncio.run_coroutine_threadsafe(follow(), background_loop())
    return Future(impl=_Running(work, finished))
