"""Proc output and Python logging (guide: ``docs/logging.md``).

- **Client output.** The root client installs an ``OutputReceiver`` on its agent
  (:func:`start_client_output`): the stdout and stderr lines of the procs it spawned
  arrive as messages from their hosts (``hyperactor_mesh::output``), already
  prefixed ``[mesh rank]`` and aggregated as :func:`logging_option` asked, and one
  daemon thread (``monarch-logs``) writes them through ``sys.stdout`` /
  ``sys.stderr`` — looked up at each write, so a notebook shows them in its cell and
  ``contextlib.redirect_stdout`` catches them. The thread waits without the GIL.
  A :class:`LineGate` over the client's standard streams keeps those lines out of
  the middle of a line the client is printing.
- **Order with failures.** :func:`flush` waits until everything that arrived was
  written. The root supervision calls it before it reports a failure, so a proc's
  last lines (which its host sends before the report of its death) come first;
  ``ProcMesh.stop()`` calls it before it returns.
- **Log records inside actors** get the prefix ``[actor=<qualified name>] ``
  (:func:`install_actor_log_prefix`; toggle
  ``monarch.actor.config.prefix_python_logs_with_actor``).
- **Spawned procs** write stdout line by line (:func:`configure_proc_streams`), so
  that a line printed just before a crash is not lost in a buffer.
"""

from __future__ import annotations

import atexit
import io
import itertools
import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch._rust_bindings import OutputReceiver
from monarch._src import config
from monarch._src.actor.actor import Actor
from monarch._src.actor.context import _current
from monarch._src.actor.endpoint import endpoint

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh

__all__ = [
    "LineGate",
    "configure_proc_streams",
    "flush",
    "install_actor_log_prefix",
    "logging_option",
    "proc_log_dir",
    "start_client_output",
]

#: The client's receiver, once :func:`start_client_output` ran.
_receiver: OutputReceiver | None = None
_start_lock = threading.Lock()

#: How long a flush waits for the writer thread by default, in seconds.
FLUSH_TIMEOUT = 1.0


def start_client_output() -> None:
    """In the root client, once its agent serves: receive the procs' output and start
    the thread that writes it. Idempotent."""
    global _receiver
    with _start_lock:
        if _receiver is not None:
            return
        receiver = OutputReceiver.install(prefix=bool(config.get("prefix_with_rank")))
        _receiver = receiver
        _gate_client_streams()
    threading.Thread(
        target=_write_forever, args=(receiver,), name="monarch-logs", daemon=True
    ).start()
    # Registered after the runtime's own exit hook, so it runs after the procs were
    # stopped (atexit runs hooks last-in first-out).
    atexit.register(_flush_at_exit)
    _register_ipython_flush()


#: How long the writer thread waits for the client to end a line it is writing, in
#: seconds, before it starts a new line itself.
LINE_WAIT = 0.1


class LineGate:
    """The client's ``sys.stdout`` (or ``sys.stderr``) while it receives its procs'
    output: the same stream, except that the ``monarch-logs`` thread writes the procs'
    lines only where the client's own output is at the start of a line.

    Without it a proc's line could land inside a client line: ``print(text)`` writes
    ``text`` and then ``"\\n"``, and an unbuffered stream (``python -u``,
    ``PYTHONUNBUFFERED``) lets other threads run between the two writes. If the client
    leaves a line open (``print(..., end="")``) for longer than :data:`LINE_WAIT`, the
    procs' lines start on a new line. Everything else is the wrapped stream's own
    (``fileno``, ``isatty``, ``buffer``, ``encoding``, ``flush``, ...)."""

    def __init__(self, stream: Any) -> None:
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "_cond", threading.Condition(threading.RLock()))
        object.__setattr__(self, "_at_line_start", True)

    @property
    def wrapped(self) -> Any:
        """The stream this gate writes to."""
        return self._stream

    def write(self, text: str) -> int:
        with self._cond:
            written: int = self._stream.write(text)
            if text:
                ended = text.endswith("\n")
                object.__setattr__(self, "_at_line_start", ended)
                if ended:
                    self._cond.notify_all()
            return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def write_lines(self, text: str, wait: float = LINE_WAIT) -> None:
        """Write whole lines (the procs'), at the start of a line of the client's
        output: wait at most ``wait`` seconds for the client to end the line it is
        writing, then start a new one."""
        if not text:
            return
        with self._cond:
            if not self._cond.wait_for(lambda: self._at_line_start, wait):
                self._stream.write("\n")
            self._stream.write(text if text.endswith("\n") else text + "\n")
            object.__setattr__(self, "_at_line_start", True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._stream, name, value)

    def __repr__(self) -> str:
        return f"<monarch LineGate over {self._stream!r}>"


def _gate_client_streams() -> None:
    """Put a :class:`LineGate` over the client's standard ``sys.stdout`` and
    ``sys.stderr``. Streams replaced by someone else (a notebook's, pytest's,
    ``contextlib.redirect_stdout``) are left as they are: the writer thread writes to
    them as to any stream."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream) is io.TextIOWrapper:
            setattr(sys, name, LineGate(stream))


def _write_forever(receiver: OutputReceiver) -> None:
    """The writer thread: each call to ``next`` marks the previous text written."""
    while True:
        runs = receiver.next(None)
        if runs is None:
            return
        used: list[Any] = []
        for is_stderr, text in runs:
            stream = sys.stderr if is_stderr else sys.stdout
            if stream is None:  # pythonw, or closed on purpose
                continue
            try:
                if isinstance(stream, LineGate):
                    stream.write_lines(text)
                else:
                    stream.write(text)
            except Exception:  # a closed or broken stream: nowhere left to write
                continue
            if stream not in used:
                used.append(stream)
        for stream in used:
            try:
                stream.flush()
            except Exception:
                pass


def flush(timeout: float = FLUSH_TIMEOUT, *, host: bool = False) -> bool:
    """Wait (at most ``timeout`` seconds) until the writer thread has written every
    line that reached this process, ending aggregation windows now. With ``host``,
    this machine's host first sends what its procs wrote so far (from a thread that is
    not a runtime thread). False on timeout; True at once where nothing is received."""
    receiver = _receiver
    if receiver is None:
        return True
    try:
        return receiver.flush(timeout, host)
    except Exception:  # e.g. called on a runtime thread with host=True
        return receiver.flush(timeout, False)


def proc_log_dir() -> str | None:
    """Where this machine's host writes the log files of the procs it spawns (this
    process's host in the client and in workers; ``None`` in a proc, or with log
    files disabled on the host)."""
    from monarch._src.actor import process

    return process.get().agent.log_dir


def _flush_at_exit() -> None:
    flush(FLUSH_TIMEOUT, host=True)


def _register_ipython_flush() -> None:
    """In IPython, flush after each cell, so a cell's output stays in it."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    try:
        shell = ipython.get_ipython()
    except Exception:
        return
    if shell is None:
        return
    shell.events.register("post_run_cell", lambda *_: flush(FLUSH_TIMEOUT, host=True))


# --- log records inside actors -----------------------------------------------------

_prefix_installed = False


#: Whether the prefix is on, looked up for each record: ``monarch.actor`` registers the
#: reading of its ``config.prefix_python_logs_with_actor`` switch, which users assign
#: (:func:`set_prefix_switch`); until then, on.
def _prefix_on() -> bool:
    return True


_prefix_switch: Callable[[], bool] = _prefix_on


def set_prefix_switch(switch: Callable[[], bool]) -> None:
    """Look up whether records get the actor prefix with ``switch()``, for each record."""
    global _prefix_switch
    _prefix_switch = switch


def _prefix_enabled() -> bool:
    return bool(_prefix_switch())


def install_actor_log_prefix() -> None:
    """Prefix the ``logging`` records made inside an actor with ``[actor=<qualified
    name>] `` (a log record factory, so every handler sees it once). Idempotent."""
    global _prefix_installed
    if _prefix_installed:
        return
    _prefix_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        ctx = _current.get()
        # Empty messages carry structured logs (torch.compile's traces): left alone.
        if ctx is not None and record.msg and _prefix_enabled():
            prefix = f"[actor={ctx.actor_instance}] "
            record.actor_prefix = prefix
            record.msg = f"{prefix}{record.msg}"
        return record

    logging.setLogRecordFactory(factory)


def configure_proc_streams() -> None:
    """In a spawned proc: write stdout line by line (it is a pipe to the host, which
    Python would otherwise buffer in blocks until exit)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(line_buffering=True)
        except Exception:  # a replaced stream that cannot: leave it
            pass


# --- ProcMesh.logging_option -------------------------------------------------------


class _LogLevel(Actor):
    """Sets the level of the ``logging`` root logger in a proc."""

    @endpoint
    def set_level(self, level: int) -> None:
        root = logging.getLogger()
        root.setLevel(level)
        if not root.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
            root.addHandler(handler)


_level_actor_names = itertools.count()


async def logging_option(
    mesh: ProcMesh,
    stream_to_client: bool = False,
    aggregate_window_sec: float | None = None,
    level: int = logging.INFO,
) -> None:
    """The implementation of ``ProcMesh.logging_option`` (see its docs)."""
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
        raise ValueError(
            f"logging_option(level={level!r}): expected a logging level from 0 to 255, "
            "e.g. logging.INFO"
        )
    if aggregate_window_sec is not None:
        if (
            isinstance(aggregate_window_sec, bool)
            or not isinstance(aggregate_window_sec, (int, float))
            or not aggregate_window_sec > 0
        ):
            raise ValueError(
                f"logging_option(aggregate_window_sec={aggregate_window_sec!r}): expected "
                "a number of seconds > 0, or None for no aggregation"
            )
        if not stream_to_client:
            raise ValueError(
                "logging_option(aggregate_window_sec=...) needs stream_to_client=True: "
                "only output streamed to the client is aggregated"
            )
    if stream_to_client and not config.get("enable_log_forwarding"):
        warnings.warn(
            "logging_option(stream_to_client=True) has no effect: log forwarding is "
            "disabled (enable_log_forwarding=False), so each host prints its procs' "
            "output itself. Call configure(enable_log_forwarding=True) before spawning "
            "the ProcMesh, or unset HYPERACTOR_MESH_ENABLE_LOG_FORWARDING.",
            stacklevel=3,
        )
    await mesh.initialized
    mesh_id = mesh._handle.mesh_id
    receiver = _receiver
    if receiver is not None and mesh_id is not None:
        # Lines printed before this call are shown the old way (best effort: what this
        # machine's host has read so far; lines still on their way from other hosts
        # may not be).
        flush(FLUSH_TIMEOUT, host=True)
        window = None if aggregate_window_sec is None else float(aggregate_window_sec)
        receiver.set_mode(mesh_id, stream_to_client, window)
    actors = getattr(mesh, "_monarch_log_level", None)
    if actors is None:
        actors = mesh.spawn(f"monarch_log_level_{next(_level_actor_names)}", _LogLevel)
        mesh._monarch_log_level = actors  # type: ignore[attr-defined]
    await actors.set_level.call(level)
