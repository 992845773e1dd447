"""``shell``: an interactive shell on one host of a mesh (see :mod:`.exec`, whose
procs, child processes and flow control it shares).

The client's stdin is relayed to the shell and its output back, through a
pseudo-terminal on the remote side when the client's stdin is a terminal (sized like
it, resized with it, raw keys), plain pipes otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import threading
import tty
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from monarch._src.actor.actor import Actor
from monarch._src.actor.channel import Channel, Port, PortReceiver
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import concurrent_endpoint
from monarch._src.actor.future import Future, background_loop
from monarch._src.actor.proc_mesh import HostMesh
from monarch._src.job.exec import (
    _CHUNK,
    _DEFAULT_SHELL,
    _DRAIN_GRACE,
    _LATE_MESSAGES,
    _STOP_TIMEOUT,
    _WINDOW,
    _await,
    _check_env,
    _check_workdir,
    _Child,
    _child_setup,
    _drain,
    _rank_env,
    _stopped,
    _unwrap,
    _working_directory,
)
from monarch._src.job.port_forward import _Window

__all__ = ["shell"]

R = TypeVar("R")

#: Seconds the shell gets, after the client's stdin ended, to finish what it read (a
#: script's last commands, ``exit``) before its session is hung up.
_EOF_GRACE = 2.0


# --- messages ---------------------------------------------------------------------------


class _ShellReady(NamedTuple):
    """The shell runs; its input goes to ``input``."""

    input: Port[_ShellInput]


class _ShellOutput(NamedTuple):
    stream: int
    data: bytes


class _ShellAck(NamedTuple):
    size: int


class _ShellExited(NamedTuple):
    status: int


_ShellEvent = _ShellReady | _ShellOutput | _ShellAck | _ShellExited


class _ShellData(NamedTuple):
    data: bytes


class _ShellEof(NamedTuple):
    pass


class _ShellResize(NamedTuple):
    rows: int
    columns: int


_ShellInput = _ShellData | _ShellEof | _ShellResize | _ShellAck


# --- the remote side --------------------------------------------------------------------


class _TerminalSettings(NamedTuple):
    term: str
    rows: int
    columns: int


def _set_window_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


async def _pipe_writer(fd: int) -> asyncio.StreamWriter:
    """An asyncio writer on a duplicate of ``fd`` (a pty master)."""
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(os.dup(fd), "wb", buffering=0)
    try:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), pipe
        )
    except BaseException:
        pipe.close()
        raise
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """An asyncio reader on a duplicate of ``fd`` (a pty master)."""
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(os.dup(fd), "rb", buffering=0)
    reader = asyncio.StreamReader(limit=_CHUNK)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
    except BaseException:
        pipe.close()
        raise
    return reader, transport


async def _read_some(reader: asyncio.StreamReader, size: int) -> bytes:
    """``reader.read(size)``, with the EIO of a pty whose terminal closed as the end."""
    try:
        return await reader.read(size)
    except OSError as e:
        if e.errno == errno.EIO:
            return b""
        raise


class _ShellSession(Actor):
    """Runs the interactive shell of ``shell`` on its proc."""

    def __init__(self) -> None:
        self._child: _Child | None = None

    @concurrent_endpoint
    async def run(
        self,
        output: Port[_ShellEvent],
        env: dict[str, str],
        workdir: str | None,
        client_cwd: str,
        terminal: _TerminalSettings | None,
    ) -> int:
        point = context().actor_instance.rank
        cwd = _working_directory("shell", workdir, client_cwd, point)
        child_env = {**os.environ, **_rank_env(point), **env}
        program = child_env.get("SHELL") or _DEFAULT_SHELL
        closers: list[Callable[[], object]] = []
        try:
            master = -1
            if terminal is not None:
                child_env["TERM"] = terminal.term
                master, slave = os.openpty()
                closers.append(lambda: os.close(master))
                try:
                    _set_window_size(master, terminal.rows, terminal.columns)
                    child = await _Child.start(
                        [program, "-i"],
                        stdin=slave,
                        stdout=slave,
                        stderr=slave,
                        cwd=cwd,
                        env=child_env,
                        preexec_fn=_child_setup(True),
                    )
                finally:
                    os.close(slave)
                closers.append(child.close)
                writer = await _pipe_writer(master)
                closers.append(writer.close)
                reader, transport = await _pipe_reader(master)
                closers.append(transport.close)
                streams = [(reader, 1)]
            else:
                child = await _Child.start(
                    [program],
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=cwd,
                    env=child_env,
                    start_new_session=True,
                    preexec_fn=_child_setup(False),
                )
                closers.append(child.close)
                process = child.process
                assert process.stdin and process.stdout and process.stderr
                writer = process.stdin
                streams = [(process.stdout, 1), (process.stderr, 2)]
            self._child = child
            try:
                await self._relay(child, output, writer, streams, master)
            except asyncio.CancelledError:
                return _stopped()
            finally:
                self._child = None
        finally:
            for close in reversed(closers):
                with contextlib.suppress(OSError):
                    close()
        output.send(_ShellExited(child.status))
        return child.status

    @staticmethod
    async def _relay(
        child: _Child,
        output: Port[_ShellEvent],
        writer: asyncio.StreamWriter,
        streams: list[tuple[asyncio.StreamReader, int]],
        master: int,
    ) -> None:
        """Relay the shell's input and output until it exits (``master``: its pty, or
        -1 for pipes)."""
        window = _Window(_WINDOW)
        input_port, inbox = Channel[_ShellInput].open()
        output.send(_ShellReady(input_port))

        async def pump(reader: asyncio.StreamReader, number: int) -> None:
            while True:
                free = await window.wait_free()
                data = await _read_some(reader, min(_CHUNK, free))
                if not data:
                    return
                window.spend(len(data))
                output.send(_ShellOutput(number, data))

        # The client's messages are taken at once, the input written to the shell
        # meanwhile (at most a window of it): an ack held up behind a write the shell
        # does not read, while the shell waits for that ack to write its output, would
        # deadlock.
        typed: asyncio.Queue[bytes | None] = asyncio.Queue()
        #: Set when the client's stdin ended.
        input_ended = asyncio.Event()

        async def from_client() -> None:
            while True:
                message = await inbox.recv()
                if isinstance(message, _ShellData):
                    typed.put_nowait(message.data)
                elif isinstance(message, _ShellAck):
                    window.refund(message.size)
                elif isinstance(message, _ShellResize):
                    if master >= 0:
                        _set_window_size(master, message.rows, message.columns)
                else:
                    typed.put_nowait(None)
                    input_ended.set()

        async def hang_up_after_input() -> None:
            # The end of the client's input ends the session, as a terminal closing
            # does: what the shell still runs :data:`_EOF_GRACE` seconds later (a
            # foreground command, the shell itself) is hung up, then killed.
            await input_ended.wait()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(child.exited.wait(), _EOF_GRACE)
            if not child.exited.is_set():
                await child.end()

        async def to_shell() -> None:
            while (data := await typed.get()) is not None:
                try:
                    writer.write(data)
                    await writer.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the shell is gone: its exit says the rest
                output.send(_ShellAck(len(data)))
            if master < 0:  # the end of the input (a terminal has none of its own)
                with contextlib.suppress(OSError):
                    writer.close()

        pumps = [asyncio.ensure_future(pump(r, n)) for r, n in streams]
        feeding = [
            asyncio.ensure_future(from_client()),
            asyncio.ensure_future(to_shell()),
            asyncio.ensure_future(hang_up_after_input()),
        ]
        try:
            await child.exited.wait()
            await asyncio.wait(pumps, timeout=_DRAIN_GRACE)
        finally:
            # Done or cancelled (the actor stops): what is left of the shell ends.
            await child.end()
            await _drain(pumps, _DRAIN_GRACE)
            await _drain(feeding, 0)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self._child is not None:
            await self._child.end()


# --- shell ------------------------------------------------------------------------------


def _fileno(stream: Any, default: int) -> int | None:
    """The descriptor of a standard stream (``None`` when it has none, e.g. under a
    notebook)."""
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return default if stream is None else None


def _write_all(fd: int | None, stream: Any, data: bytes) -> None:
    if fd is None:
        stream.write(data.decode(errors="replace"))
        stream.flush()
        return
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[written:]


def _window_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


class _InputPump:
    """Sends the client's stdin to the shell from a thread of its own, keeping at most
    :data:`_WINDOW` bytes unacknowledged."""

    def __init__(self, fd: int | None, port: Port[_ShellInput]) -> None:
        self._fd = fd
        self._port = port
        self._credit = _WINDOW
        self._cond = threading.Condition()
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="monarch-shell-input", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def acknowledged(self, count: int) -> None:
        with self._cond:
            self._credit += count
            self._cond.notify_all()

    def _run(self) -> None:
        fd = self._fd
        if fd is None:
            self._send(_ShellEof())
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            with self._cond:
                while self._credit <= 0 and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                credit = self._credit
            ready = {f for f, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                data = os.read(fd, min(_CHUNK, credit))
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._send(_ShellEof())
                return
            with self._cond:
                self._credit -= len(data)
            self._send(_ShellData(data))

    def _send(self, message: _ShellInput) -> None:
        with contextlib.suppress(Exception):  # the session may be over already
            self._port.send(message)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def _raw_terminal(fd: int | None, interactive: bool) -> Any:
    """The local terminal in raw mode (keys go to the remote shell as typed), restored
    after."""
    if fd is None or not interactive:
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _on_resize(notify: Callable[[], None], interactive: bool) -> Any:
    """Call ``notify`` when the local terminal's size changes (main thread only)."""
    if not interactive or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGWINCH, lambda *_: notify())
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


def _queue_events(
    events: PortReceiver[_ShellEvent], done: Future[int], into: Any
) -> concurrent.futures.Future[None]:
    """Put each message of ``events``, then the end of ``done``, into the queue
    ``into``, from the background loop: the caller's thread then waits on one queue."""

    async def forward() -> None:
        done_task = asyncio.ensure_future(_await(done))
        receiving: asyncio.Future[Any] = asyncio.ensure_future(_await(events.recv()))
        try:
            while True:
                finished, _ = await asyncio.wait(
                    {receiving, done_task}, return_when=asyncio.FIRST_COMPLETED
                )
                if receiving in finished:
                    into.put(("event", receiving.result()))
                    receiving = asyncio.ensure_future(_await(events.recv()))
                elif done_task in finished:
                    error = done_task.exception()
                    into.put(("done", error if error is not None else done_task.result()))
                    # Messages sent before the reply may still arrive: keep relaying.
                    done_task = asyncio.ensure_future(asyncio.Event().wait())
        finally:
            for task in (receiving, done_task):
                task.cancel()
            await asyncio.gather(receiving, done_task, return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(forward(), background_loop())


def shell(
    host_mesh: HostMesh,
    *,
    env: Mapping[str, str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> int:
    """Run an interactive shell on the one host of ``host_mesh``; its exit status.

    The shell is ``$SHELL`` of the remote environment (``/bin/sh`` when unset), run by a
    proc spawned for it, with ``env`` added (and the ``MONARCH_RANK_*`` variables of
    :func:`exec_command`), in ``workdir`` (``FileNotFoundError`` naming the host if it
    does not exist there; by default the client's working directory when the host has
    it). The client's stdin goes to the shell and its output comes back: when stdin is
    a terminal, the shell runs interactively on a remote pseudo-terminal (``TERM`` and
    the window size follow the local terminal, which is in raw mode meanwhile, so keys
    such as Ctrl-C go to the remote shell); otherwise through plain pipes, the shell
    reading its commands from stdin and its stderr going to the client's stderr. The
    end of stdin ends the session: what the shell still runs :data:`_EOF_GRACE` seconds
    later, a foreground command included, is hung up. The shell's status once it exits
    (128 + the signal that killed it).

    Raises ``ValueError`` unless ``host_mesh`` has exactly one host (slice it first:
    ``hosts.slice(hosts=0)``).
    """
    import queue

    count = len(host_mesh)
    if count != 1:
        raise ValueError(
            f"shell needs a host mesh of exactly one host, got {count} ({host_mesh!r}); "
            "slice it first, e.g. hosts.slice(hosts=0)"
        )
    extra_env = _check_env("shell", env)
    directory = _check_workdir("shell", workdir)
    stdin_fd = _fileno(sys.stdin, 0)
    stdout_fd = _fileno(sys.stdout, 1)
    stderr_fd = _fileno(sys.stderr, 2)
    interactive = stdin_fd is not None and os.isatty(stdin_fd)
    terminal = None
    if interactive:
        assert stdin_fd is not None
        rows, columns = _window_size(stdin_fd)
        terminal = _TerminalSettings(os.environ.get("TERM", "xterm-256color"), rows, columns)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()

    procs = host_mesh.spawn_procs(name="shell")
    session: _ShellSession | None = None
    relay: concurrent.futures.Future[None] | None = None
    pump: _InputPump | None = None
    try:
        session = procs.spawn("shell", _ShellSession)
        events_port, events = Channel[_ShellEvent].open()
        done = session.run.call_one(events_port, extra_env, directory, os.getcwd(), terminal)
        inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        relay = _queue_events(events, done, inbox)
        input_port: Port[_ShellInput] | None = None

        def resize() -> None:
            if input_port is not None and stdin_fd is not None:
                with contextlib.suppress(Exception):
                    input_port.send(_ShellResize(*_window_size(stdin_fd)))

        with _raw_terminal(stdin_fd, interactive), _on_resize(resize, interactive):
            status: int | None = None  # the call's value, once it returned
            while True:
                try:
                    kind, item = inbox.get(timeout=None if status is None else _LATE_MESSAGES)
                except queue.Empty:
                    assert status is not None  # only then is there a timeout
                    return status
                if kind == "done":
                    if isinstance(item, BaseException):
                        raise _unwrap(item) from item
                    # The shell ended; its last messages are on their way.
                    status = int(item)
                elif isinstance(item, _ShellOutput):
                    if item.stream == 1:
                        _write_all(stdout_fd, sys.stdout, item.data)
                    else:
                        _write_all(stderr_fd, sys.stderr, item.data)
                    if input_port is not None:
                        with contextlib.suppress(Exception):
                            input_port.send(_ShellAck(len(item.data)))
                elif isinstance(item, _ShellAck):
                    if pump is not None:
                        pump.acknowledged(item.size)
                elif isinstance(item, _ShellReady):
                    input_port = item.input
                    pump = _InputPump(stdin_fd, input_port)
                    pump.start()
                elif isinstance(item, _ShellExited):
                    return item.status
    finally:
        if pump is not None:
            pump.stop()
        if relay is not None:
            relay.cancel()
        for mesh in (session, procs):
            if mesh is not None:
                try:
                    mesh.stop("shell ended").get(timeout=_STOP_TIMEOUT)
                except Exception as e:
                    print(f"monarch: shell: stopping {mesh!r} failed: {e!r}", file=sys.stderr)
