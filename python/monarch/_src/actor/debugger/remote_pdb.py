"""The proc side of remote pdb: ``breakpoint()`` and post-mortem in actor endpoints.

A proc started by monarch runs :func:`install`: ``sys.breakpointhook`` becomes
:func:`remote_breakpointhook`, and the actor host calls :func:`end_of_call` after each
endpoint call. ``breakpoint()`` in an endpoint then opens a session of
:class:`RemotePdb`, a ``pdb.Pdb`` whose input and output are messages to the client's
:class:`~.controller.DebugController`:

- opening: the session fetches (or spawns) the controller, opens a :class:`Channel`
  for its input and registers, keyed by the actor's name and rank;
- when pdb waits for a line, the session sends what pdb printed and its prompt
  (``output``), then waits on its channel; meanwhile it sends a heartbeat every
  second, and it gives up when the actor ended (its mesh or proc was stopped: pdb
  quits, the endpoint raises ``BdbQuit``) or, with ``MONARCH_DEBUG_ATTACH_TIMEOUT``,
  when nobody attached in time (pdb continues, with a warning on stderr);
- it ends (``ended``) when pdb continues without breakpoints, quits, or when the
  endpoint call returns.

Only the paused actor's thread waits: the proc's other actors, and the other ranks,
go on. pdb is confined to the endpoint: its bottom frame is the endpoint's (``where``
and ``up`` stop there), it does not stop in monarch's or asyncio's frames, and the
session ends when the endpoint returns, so stepping never leads into the messaging
machinery.

Post-mortem: when an endpoint raises an ``Exception`` and either a session was opened
during that call (as upstream Monarch does) or ``MONARCH_DEBUG_POST_MORTEM`` is set, a
session opens on the exception's traceback (from the endpoint's frame down) before the
caller gets its ``ActorError``.
"""

from __future__ import annotations

import bdb
import contextvars
import inspect
import io
import linecache
import os
import pdb
import sys
import time
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from monarch._src.actor import process
from monarch._src.actor.debugger import protocol

if TYPE_CHECKING:
    from monarch._src.actor.channel import Port, PortReceiver

__all__ = ["RemotePdb", "end_of_call", "install", "remote_breakpointhook"]

#: The module whose frames call endpoints: a session's frames end below them.
_HOST_MODULE = "monarch._src.actor.actor_host"
#: The functions of that module that call endpoints (and then :func:`end_of_call`).
_ENDPOINT_CALLERS = frozenset({"_call_sync", "_invoke"})
#: Code flags of frames that return each time they suspend (coroutines, generators).
_SUSPENDABLE = (
    inspect.CO_COROUTINE
    | inspect.CO_GENERATOR
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)
#: Modules pdb never stops in (``skip``): the runtime and what it runs on.
_SKIP = [
    "monarch._src.*",
    "monarch._rust_bindings",
    "asyncio",
    "asyncio.*",
    "threading",
    "contextvars",
    "concurrent.*",
    "selectors",
    "cloudpickle",
    "cloudpickle.*",
    "pickle",
    "copyreg",
    "weakref",
    "_weakrefset",
]
#: How long opening a session may take (fetching the controller, registering).
_OPEN_TIMEOUT = 60.0
#: The file name cloudpickle gives code it pickles by value (e.g. defined in
#: ``__main__``); its frames keep their module's ``__file__`` in their globals.
_DYNAMIC = "<dynamic-code>"

#: The session of the endpoint call running in this context, if one was opened.
_current_pdb: contextvars.ContextVar[RemotePdb | None] = contextvars.ContextVar(
    "monarch_remote_pdb", default=None
)


def install() -> None:
    """Make ``breakpoint()`` and endpoint exceptions of this proc remote (a proc
    started by monarch calls this at start)."""
    from monarch._src.actor import actor_host

    sys.breakpointhook = remote_breakpointhook
    actor_host.after_call_hook = end_of_call


def _warn(text: str) -> None:
    print(f"monarch: {text}", file=sys.stderr, flush=True)


def _is_host_frame(frame: FrameType) -> bool:
    return frame.f_globals.get("__name__") == _HOST_MODULE


def _source_file(frame: FrameType | None) -> str | None:
    """The real file of a frame of code pickled by value (else ``None``), with its lines
    made what linecache gives for ``<dynamic-code>``, so that pdb shows them."""
    if frame is None or frame.f_code.co_filename != _DYNAMIC:
        return None
    path = frame.f_globals.get("__file__")
    if not isinstance(path, str):
        return None
    lines = linecache.getlines(path)
    if lines:
        # No mtime: linecache.checkcache() keeps the entry.
        linecache.cache[_DYNAMIC] = (sum(map(len, lines)), None, lines, _DYNAMIC)
    return path


def _where(frame: FrameType) -> tuple[str, str, int]:
    """``(function, file, line)`` of a frame, for the session list."""
    code = frame.f_code
    return code.co_name, _source_file(frame) or code.co_filename, frame.f_lineno


def _entry_frame(frame: FrameType) -> FrameType:
    """The endpoint's frame: the outermost frame above ``frame`` not called by the
    actor host (the outermost frame of the thread outside an endpoint)."""
    while frame.f_back is not None and not _is_host_frame(frame.f_back):
        frame = frame.f_back
    return frame


class _Who:
    """Who is paused: the running actor, or this proc outside any actor."""

    def __init__(self) -> None:
        from monarch._src.actor.context import _current

        ctx = _current.get()
        instance = ctx.actor_instance if ctx is not None else None
        self.hosted: Any = instance._hosted if instance is not None else None
        if instance is not None and self.hosted is not None:
            self.name = instance.name
            self.rank = instance.rank.rank
            self.coords = {str(k): int(v) for k, v in instance.rank.items()}
            self.actor_id = str(instance.actor_id)
            self.mesh_id = int(self.hosted.driven.mesh_id)
        else:
            state = process.get()
            self.name = "proc"
            self.rank = state.agent.boot_rank[0]
            self.coords = {}
            self.actor_id = state.proc_id
            self.mesh_id = 0

    def alive(self) -> bool:
        """False once the actor ended (stopped, failed or aborted)."""
        if self.hosted is None:
            return True
        status = str(self.hosted.driven.status)
        return not (status == "stopped" or status.startswith("failed"))

    def describe(self) -> str:
        return f"actor {self.name!r} rank {self.rank}"


def _wait(fut: Any, timeout: float) -> Any:
    # The future's own wait, not Future.get(): an async endpoint's thread runs its loop,
    # which pdb blocks anyway; get() would warn about it.
    return fut._impl.wait(timeout)


class _Link:
    """A session's messages to and from the debug controller."""

    def __init__(self, who: _Who, frame: FrameType, post_mortem: str | None) -> None:
        from monarch._src.actor.actor_mesh import get_or_spawn_controller
        from monarch._src.actor.channel import Channel
        from monarch._src.actor.debugger.controller import (
            CONTROLLER_NAME,
            DebugController,
            SessionInfo,
        )

        self.who = who
        self.controller: Any = _wait(
            get_or_spawn_controller(CONTROLLER_NAME, DebugController), _OPEN_TIMEOUT
        )
        self.port: Port[Any]
        self.receiver: PortReceiver[Any]
        self.port, self.receiver = Channel.open()
        function, filename, lineno = _where(frame)
        info = SessionInfo(
            actor_name=who.name,
            rank=who.rank,
            coords=who.coords,
            hostname=os.uname().nodename,
            pid=os.getpid(),
            actor_id=who.actor_id,
            mesh_id=who.mesh_id,
            function=function,
            filename=filename,
            lineno=lineno,
            post_mortem=post_mortem,
        )
        self.sid, self.name = _wait(
            self.controller.register.call_one(info, self.port), _OPEN_TIMEOUT
        )
        self.attached = False
        self.closed = False

    def send(self, text: str, prompt: str | None, where: tuple[str, str, int] | None) -> None:
        if not self.closed:
            self.controller.output.broadcast(self.sid, text, prompt, where)

    def read_line(self) -> str | None:
        """The next input line; ``None`` when nobody attached within the attach timeout.

        Raises:
            bdb.BdbQuit: the actor ended meanwhile.
        """
        from monarch._src.actor.channel import _Receive
        from monarch._src.actor.debugger.controller import HEARTBEAT

        try:
            limit = None if self.attached else protocol.attach_timeout()
        except ValueError as e:
            _warn(f"{e}; waiting until somebody attaches")
            limit = None
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            wait = HEARTBEAT
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                kind, value = _Receive(self.receiver).wait(wait)
            except TimeoutError:
                if not self.who.alive():
                    raise bdb.BdbQuit(f"{self.who.describe()} ended at a breakpoint") from None
                self.controller.heartbeat.broadcast(self.sid)
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if kind == "attached":
                self.attached = True
                deadline = None
            elif kind == "line":
                self.attached = True
                return str(value)

    def close(self, why: str) -> None:
        if not self.closed:
            self.closed = True
            self.controller.ended.broadcast(self.sid, why)


class _Output(io.StringIO):
    """pdb's stdout: kept until pdb waits for a line (or the session ends)."""

    def take(self) -> str:
        text = self.getvalue()
        self.seek(0)
        self.truncate(0)
        return text


class _Input:
    """pdb's stdin (it only calls ``readline``): each line comes from the controller."""

    def __init__(self, pdb: RemotePdb) -> None:
        self._pdb = pdb

    def readline(self, size: int | None = -1, /) -> str:
        return self._pdb._read_line()


class RemotePdb(pdb.Pdb):
    """A pdb session driven through the debug controller: see the module docs."""

    def __init__(self, who: _Who, entry: FrameType | None, post_mortem: str | None = None):
        self._out = _Output()
        super().__init__(
            stdin=cast(IO[str], _Input(self)),
            stdout=self._out,
            skip=_SKIP,
            nosigint=True,
            readrc=False,
        )
        self.prompt = "(Pdb) "
        self._who = who
        self._entry = entry
        self._post_mortem = post_mortem
        self._link: _Link | None = None
        #: Set when the session could not open: pdb continues at once.
        self._unreachable = False

    # --- confining pdb to the endpoint -------------------------------------------------------

    def set_trace(self, frame: FrameType | None = None) -> None:
        if frame is None:
            frame = sys._getframe().f_back
        assert frame is not None
        super().set_trace(frame)
        entry = self._entry
        if entry is not None:
            # The endpoint's frame is the bottom one: the host's frames are not traced.
            self.botframe = entry
            outer = entry.f_back
            while outer is not None:
                outer.f_trace = None
                outer = outer.f_back

    def dispatch_return(self, frame: FrameType, arg: Any) -> Any:
        trace = super().dispatch_return(frame, arg)
        if frame is self._entry and not frame.f_code.co_flags & _SUSPENDABLE:
            # The bottom frame returned (or raised): nothing below it is debugged.
            sys.settrace(None)
            self._end("the call returned")
            return None
        return trace

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self._end("continued")

    def set_quit(self) -> None:
        super().set_quit()
        self._end("quit")

    # --- source of code pickled by value ---------------------------------------------------------

    def onecmd(self, line: str) -> bool:
        _source_file(self.curframe)
        return bool(super().onecmd(line))

    def format_stack_entry(self, frame_lineno: tuple[FrameType, int], lprefix: str = ": ") -> str:
        path = _source_file(frame_lineno[0])
        text = super().format_stack_entry(frame_lineno, lprefix)
        return text.replace(_DYNAMIC, path, 1) if path is not None else text

    def do_interact(self, arg: str) -> None:
        self.error("interact is not available in a remote session; use p, pp or !statement")

    # --- the session -----------------------------------------------------------------------------

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        if self._unreachable:
            return
        if self._link is None or self._link.closed:
            where = frame
            if where is None and isinstance(traceback, TracebackType):
                tb = traceback
                while tb.tb_next is not None:
                    tb = tb.tb_next
                where = tb.tb_frame
            assert where is not None
            try:
                self._link = _Link(self._who, where, self._post_mortem)
            except Exception as e:
                self._unreachable = True
                _warn(
                    f"{self._who.describe()} did not stop in pdb: no debug session could "
                    f"be opened with the client ({e})"
                )
                if frame is not None:
                    self.set_continue()
                return
        super().interaction(frame, traceback)

    def _read_line(self) -> str:
        link = self._link
        if link is None or link.closed:
            return "c\n"
        text, prompt = self._out.take(), self.prompt
        if text.endswith(prompt):
            text = text[: -len(prompt)]
        else:
            prompt = ""
        where = _where(self.curframe) if self.curframe is not None else None
        link.send(text, prompt, where)
        try:
            line = link.read_line()
        except bdb.BdbQuit:
            _warn(f"{self._who.describe()} ended while paused in pdb; leaving pdb")
            self._end("the actor ended")
            return "q\n"
        if line is None:
            _warn(
                f"nobody attached to {self._who.describe()} paused in pdb within "
                f"{protocol.ATTACH_TIMEOUT_ENV}={os.environ.get(protocol.ATTACH_TIMEOUT_ENV)} "
                "s; continuing"
            )
            self._end("nobody attached in time; it continued")
            return "c\n"
        return line

    def _end(self, why: str) -> None:
        link = self._link
        if link is not None and not link.closed:
            rest = self._out.take()
            if rest:
                link.send(rest, None, None)
            link.close(why)
        if self._entry is not None:
            self._entry.f_trace = None


# --- the hooks ---------------------------------------------------------------------------------


def remote_breakpointhook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` of procs: open a remote pdb session in the caller's frame
    (``PYTHONBREAKPOINT=0`` turns breakpoints off; another hook named there is used
    instead)."""
    hook = os.environ.get("PYTHONBREAKPOINT", "").strip()
    if hook == "0":
        return None
    if hook and hook != "pdb.set_trace":
        return sys.__breakpointhook__(*args, **kwargs)
    frame = sys._getframe(1)
    current = _current_pdb.get()
    if current is not None and not current._unreachable:
        p = current  # a second breakpoint of the same endpoint call
    else:
        entry = _entry_frame(frame)
        p = RemotePdb(_Who(), entry)
        caller = entry.f_back
        if caller is not None and caller.f_code.co_name in _ENDPOINT_CALLERS:
            # An endpoint call (not __init__, __supervise__, another thread): its end
            # ends the session, and may open a post-mortem one.
            _current_pdb.set(p)
    header = kwargs.get("header")
    if header is not None:
        p.message(header)
    p.set_trace(frame)
    return None


def _post_mortem_wanted(session_opened: bool) -> bool:
    if session_opened:
        return True
    try:
        return protocol.post_mortem_enabled()
    except ValueError as e:
        _warn(f"{e}; post-mortem stays off")
        return False


def end_of_call(error: BaseException | None) -> None:
    """After each endpoint call of a proc (``error``: what it raised): end its session,
    and run a post-mortem session if wanted (see the module docs)."""
    p = _current_pdb.get()
    if p is not None:
        _current_pdb.set(None)
        sys.settrace(None)
        p._end("the endpoint call returned")
    if error is None or not isinstance(error, Exception) or isinstance(error, bdb.BdbQuit):
        return
    if not _post_mortem_wanted(p is not None and not p._unreachable):
        return
    tb = error.__traceback__
    while tb is not None and _is_host_frame(tb.tb_frame):
        tb = tb.tb_next
    if tb is None:
        return
    summary = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    pm = RemotePdb(_Who(), None, post_mortem=summary)
    pm.reset()
    try:
        pm.interaction(None, tb)
    finally:
        pm._end("post-mortem ended")
