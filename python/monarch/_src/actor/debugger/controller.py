"""The debug controller: the client-side end of remote pdb sessions.

:class:`DebugController` is a singleton actor of the client process
(``get_or_spawn_controller("debug_controller", DebugController)``), spawned by the
first ``breakpoint()`` of any proc (or by :func:`debug_controller`). Each pdb session of
a proc (see :mod:`.remote_pdb`) registers with it (:meth:`DebugController.register`),
sends it what pdb prints and when pdb waits for a line (``output``), a heartbeat every
second while it waits (``heartbeat``), and its end (``ended``); the controller sends
the session its input lines through the session's :class:`Port`. When a session first
waits, the client's stderr gets one line naming it, where it is, and the
``monarch debug`` command to run.

The controller also serves ``monarch debug`` clients over TCP (:mod:`.protocol`), on
its own asyncio loop: each connection gets the ``monarch_dbg>`` prompt (see
:mod:`.commands`). A session is attached to at most one client at a time; several
clients may be connected. The session of a proc of this machine that exited ends;
one of another machine that missed its heartbeats for :data:`STALE_AFTER` seconds is
listed as unresponsive.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from monarch._rust_bindings import monitor_record_event
from monarch._src.actor.actor import Actor
from monarch._src.actor.actor_mesh import get_or_spawn_controller
from monarch._src.actor.channel import Port
from monarch._src.actor.debugger import commands, protocol
from monarch._src.actor.endpoint import endpoint

__all__ = ["CONTROLLER_NAME", "DebugController", "SessionInfo", "debug_controller"]

#: The name of the controller singleton.
CONTROLLER_NAME = "debug_controller"
#: How often a waiting session sends a heartbeat, in seconds.
HEARTBEAT = 1.0
#: A waiting session not heard from for this long is listed as unresponsive.
STALE_AFTER = 5 * HEARTBEAT
#: How long ``cast`` waits for the sessions' answers before it shows what it has.
CAST_WAIT = 10.0

_PROMPT = "monarch_dbg> "


@dataclass
class SessionInfo:
    """Who is paused, and where (sent by the proc when the session opens)."""

    actor_name: str
    rank: int
    coords: dict[str, int]
    hostname: str
    pid: int
    actor_id: str
    #: The actor mesh (0: no actor, the proc itself).
    mesh_id: int
    function: str
    filename: str
    lineno: int
    #: The exception of a post-mortem session (``"ValueError: bad"``), else ``None``.
    post_mortem: str | None = None
    where: tuple[str, str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.where = (self.function, self.filename, self.lineno)


class _Client:
    """One ``monarch debug`` connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._reader = reader
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                raw = await self._reader.readline()
                if not raw:
                    break
                self.lines.put_nowait(raw.decode(errors="replace"))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.lines.put_nowait(None)

    def out(self, text: str) -> None:
        if text and not self.writer.is_closing():
            self.writer.write(protocol.encode("out", text))

    async def ask(self, prompt: str) -> None:
        """Ask for one line (it arrives on :attr:`lines`)."""
        if not self.writer.is_closing():
            self.writer.write(protocol.encode("input", prompt))
        await self.writer.drain()

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self.writer.drain()
        except ConnectionError:
            pass
        self.writer.close()


class _Session:
    """One registered pdb session, as the controller sees it."""

    def __init__(self, sid: int, name: str, info: SessionInfo, port: Port[Any]) -> None:
        self.sid = sid
        self.name = name
        self.rank = info.rank
        self.info = info
        self.port = port
        #: What pdb printed that no client has shown yet.
        self.backlog: list[str] = []
        #: pdb's prompt while it waits for a line, else ``None`` (running).
        self.prompt: str | None = None
        self.where = info.where
        #: Why the session ended, once it did.
        self.ended: str | None = None
        self.attached: _Client | None = None
        #: Whether the client's user was told it waits.
        self.announced = False
        self.last_heard = time.monotonic()
        self.changed = asyncio.Event()

    def send_line(self, line: str) -> None:
        self.prompt = None
        self.port.send(("line", line if line.endswith("\n") else line + "\n"))

    def take_backlog(self) -> str:
        text = "".join(self.backlog)
        self.backlog.clear()
        return text

    def label(self) -> str:
        return f"{self.name} {self.rank}"


class _Gone(Exception):
    """The client disconnected."""


class DebugController(Actor):
    """The client's registry of remote pdb sessions, and the ``monarch debug`` server:
    see the module docs."""

    def __init__(self) -> None:
        self._sessions: dict[int, _Session] = {}
        #: The name each actor mesh is listed under (unique: ``name#2`` for a second
        #: mesh of the same name), by ``(actor name, mesh id)``.
        self._names: dict[tuple[str, int], str] = {}
        self._next_sid = 1
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None

    # --- the server ------------------------------------------------------------------------

    async def _ensure_server(self) -> tuple[str, int]:
        if self._server is None or self._address is None:
            host, port = protocol.server_address()
            try:
                server = await asyncio.start_server(self._serve_client, host, port)
            except OSError as e:
                print(
                    f"monarch: the debug server cannot listen on {host}:{port} ({e}); set "
                    f"{protocol.PORT_ENV} to a free port (0: any)",
                    file=sys.stderr,
                    flush=True,
                )
                raise
            self._server = server
            self._address = (host, server.sockets[0].getsockname()[1])
        return self._address

    def _command_hint(self) -> str:
        assert self._address is not None
        host, port = self._address
        local = host in ("localhost", "127.0.0.1", "::1")
        return "monarch debug" + ("" if local else f" --host {host}") + f" --port {port}"

    # --- endpoints of the procs' sessions ---------------------------------------------------

    @endpoint
    async def serve(self) -> tuple[str, int]:
        """Start serving ``monarch debug`` (if not yet); the host and port."""
        return await self._ensure_server()

    @endpoint
    async def register(self, info: SessionInfo, port: Port[Any]) -> tuple[int, str]:
        """A new session: its id and the actor name it is listed under."""
        await self._ensure_server()
        name = self._names.get((info.actor_name, info.mesh_id))
        if name is None:
            taken = set(self._names.values())
            name, n = info.actor_name, 1
            while name in taken:
                n += 1
                name = f"{info.actor_name}#{n}"
            self._names[(info.actor_name, info.mesh_id)] = name
        for old in [
            s
            for s in self._sessions.values()
            if s.info.actor_id == info.actor_id and s.rank == info.rank
        ]:
            self._end(old, "replaced by a new session of the same actor")
        sid = self._next_sid
        self._next_sid += 1
        self._sessions[sid] = _Session(sid, name, info, port)
        what = (
            f"is in post-mortem after {info.post_mortem}"
            if info.post_mortem is not None
            else "is paused at a breakpoint"
        )
        monitor_record_event(
            "breakpoint",
            f"actor {name!r} rank {info.rank} {what} in {info.function} "
            f"({info.filename}:{info.lineno})",
            mesh=info.actor_name,
            actor=info.actor_id,
            rank=info.rank,
        )
        return sid, name

    def _announce(self, s: _Session) -> None:
        """Tell the client's user that ``s`` waits (once, at its first prompt)."""
        s.announced = True
        if s.info.post_mortem is not None:
            what = f"is in post-mortem after {s.info.post_mortem}"
        else:
            what = "is paused at a breakpoint"
        function, filename, lineno = s.where
        print(
            f"monarch: actor {s.name!r} rank {s.rank} {what} in {function} "
            f"({filename}:{lineno}); to debug it, run: {self._command_hint()}",
            file=sys.stderr,
            flush=True,
        )

    @endpoint
    async def output(
        self, sid: int, text: str, prompt: str | None, where: tuple[str, str, int] | None
    ) -> None:
        """What session ``sid`` printed; with ``prompt``, it now waits for a line."""
        s = self._sessions.get(sid)
        if s is None:
            return
        s.last_heard = time.monotonic()
        if text:
            s.backlog.append(text)
        if prompt is not None:
            s.prompt = prompt
        if where is not None:
            s.where = where
        if prompt is not None and not s.announced:
            self._announce(s)
        s.changed.set()

    @endpoint
    async def heartbeat(self, sid: int) -> None:
        s = self._sessions.get(sid)
        if s is not None:
            s.last_heard = time.monotonic()

    @endpoint
    async def ended(self, sid: int, why: str) -> None:
        s = self._sessions.get(sid)
        if s is not None:
            self._end(s, why)

    @endpoint
    async def sessions(self) -> list[dict[str, Any]]:
        """The sessions: actor name, rank, coords, host, function, file, line, and
        whether each waits at its prompt."""
        self._prune()
        return [
            {
                "actor_name": s.name,
                "rank": s.rank,
                "coords": dict(s.info.coords),
                "hostname": s.info.hostname,
                "function": s.where[0],
                "filename": s.where[1],
                "lineno": s.where[2],
                "waiting": s.prompt is not None,
            }
            for s in self._sorted()
        ]

    # --- bookkeeping ---------------------------------------------------------------------------

    def _end(self, s: _Session, why: str) -> None:
        self._sessions.pop(s.sid, None)
        if s.ended is None:
            s.ended = why
        s.changed.set()

    def _prune(self) -> None:
        """End the sessions of procs of this machine that exited."""
        host = os.uname().nodename
        for s in list(self._sessions.values()):
            if s.info.hostname == host and not _pid_alive(s.info.pid):
                self._end(s, "its process exited")

    @staticmethod
    def _unresponsive(s: _Session) -> bool:
        """Whether a waiting session missed its heartbeats (its proc, on another
        machine, may be gone; it is listed until it is known to be)."""
        return s.prompt is not None and time.monotonic() - s.last_heard > STALE_AFTER

    def _sorted(self) -> list[_Session]:
        return sorted(self._sessions.values(), key=lambda s: (s.name, s.rank, s.sid))

    def _table(self) -> str:
        self._prune()
        sessions = self._sorted()
        if not sessions:
            return "No sessions: no actor is paused in pdb.\n"
        rows = [("Actor", "Rank", "Coords", "Host", "Function", "Location", "State")]
        for s in sessions:
            coords = ",".join(f"{k}={v}" for k, v in s.info.coords.items()) or "-"
            if s.attached is not None:
                state = "attached"
            elif self._unresponsive(s):
                state = f"unresponsive ({time.monotonic() - s.last_heard:.0f} s)"
            elif s.prompt is not None:
                state = "waiting"
            else:
                state = "running"
            function, filename, lineno = s.where
            rows.append(
                (
                    s.name,
                    str(s.rank),
                    coords,
                    s.info.hostname,
                    function,
                    f"{filename}:{lineno}",
                    state,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        return "\n".join(lines) + "\n"

    # --- a monarch debug client ---------------------------------------------------------------

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        client = _Client(reader, writer)
        try:
            client.out(
                "Monarch debugger: actors paused in pdb. Type `help` for the commands.\n"
                + self._table()
            )
            while True:
                await client.ask(_PROMPT)
                line = await client.lines.get()
                if line is None:
                    break
                try:
                    cmd = commands.parse(line)
                except ValueError as e:
                    client.out(f"{e}\n")
                    continue
                if isinstance(cmd, commands.Quit):
                    client.out("Leaving the debugger; paused actors stay paused.\n")
                    break
                if isinstance(cmd, commands.Help):
                    client.out(commands.HELP)
                elif isinstance(cmd, commands.List):
                    client.out(self._table())
                elif isinstance(cmd, commands.Attach):
                    await self._attach(client, cmd)
                elif isinstance(cmd, commands.Cast):
                    await self._cast(client, cmd)
                elif isinstance(cmd, commands.Continue):
                    self._continue(client)
        except (_Gone, ConnectionError):
            pass
        except Exception as e:  # a bug here must not take the controller down
            client.out(f"monarch debug server error: {e!r}\n")
        finally:
            for s in self._sessions.values():
                if s.attached is client:
                    s.attached = None
            await client.close()

    def _find(self, client: _Client, actor: str | None, rank: int) -> _Session | None:
        self._prune()
        if actor is None:
            names = {s.name for s in self._sessions.values()}
            if len(names) != 1:
                client.out(
                    "give the actor name too: attach <actor> <rank> (actors: "
                    f"{', '.join(sorted(names)) or 'none'})\n"
                )
                return None
            (actor,) = names
        for s in self._sorted():
            if s.name == actor and s.rank == rank:
                return s
        client.out(f"No session of actor {actor!r} rank {rank}; `list` shows the sessions.\n")
        return None

    async def _next_event(self, client: _Client, s: _Session) -> str | None:
        """The client's next line, or ``""`` when the session changed first (since its
        ``changed`` event was last cleared) or a heartbeat's time passed.

        Raises:
            _Gone: the client disconnected.
        """
        if not client.lines.empty():
            line = client.lines.get_nowait()
        else:
            got_line = asyncio.ensure_future(client.lines.get())
            changed = asyncio.ensure_future(s.changed.wait())
            done, _ = await asyncio.wait(
                {got_line, changed}, timeout=HEARTBEAT, return_when=asyncio.FIRST_COMPLETED
            )
            changed.cancel()
            if got_line not in done:
                got_line.cancel()
                self._prune()  # a session whose process exited ends
                return ""
            line = got_line.result()
        if line is None:
            raise _Gone
        return line

    async def _attach(self, client: _Client, cmd: commands.Attach) -> None:
        s = self._find(client, cmd.actor, cmd.rank)
        if s is None:
            return
        if s.attached is not None:
            client.out(f"{s.label()} is attached by another monarch debug client.\n")
            return
        s.attached = client
        s.port.send(("attached", ""))
        client.out(
            f"Attached to actor {s.name!r} rank {s.rank}. Type pdb commands; `detach` "
            "returns to the monarch_dbg prompt.\n"
        )
        asked = False
        try:
            while True:
                s.changed.clear()
                client.out(s.take_backlog())
                if s.ended is not None:
                    client.out(f"Session of {s.label()} ended: {s.ended}.\n")
                    if asked and await client.lines.get() is None:
                        # (the line typed at pdb's prompt answers nothing now)
                        raise _Gone
                    return
                if s.prompt is not None and not asked:
                    await client.ask(s.prompt)
                    asked = True
                line = await self._next_event(client, s)
                if not line:
                    continue
                asked = False
                if s.prompt is None:
                    continue  # it stopped waiting (it ended): said above
                if line.strip() == "detach":
                    client.out(f"Detached from {s.label()}; it stays paused.\n")
                    return
                s.send_line(line)
        finally:
            if s.attached is client:
                s.attached = None

    async def _cast(self, client: _Client, cmd: commands.Cast) -> None:
        self._prune()
        targets = [
            s
            for s in self._sorted()
            if s.name == cmd.actor and cmd.ranks.matches(s.rank, s.info.coords)
        ]
        if not targets:
            client.out(f"No session of actor {cmd.actor!r} matches {cmd.ranks}; see `list`.\n")
            return
        ready: list[_Session] = []
        for s in targets:
            if s.attached is not None and s.attached is not client:
                client.out(f"[{s.label()}] skipped: attached by another monarch debug client\n")
            elif s.prompt is None:
                client.out(f"[{s.label()}] skipped: running, not at its prompt\n")
            else:
                ready.append(s)
        for s in ready:
            s.backlog.clear()
            s.send_line(cmd.command)

        async def answered(s: _Session) -> None:
            while s.prompt is None and s.ended is None:
                s.changed.clear()
                await s.changed.wait()

        if ready:
            waits = [asyncio.ensure_future(answered(s)) for s in ready]
            _, pending = await asyncio.wait(waits, timeout=CAST_WAIT)
            for w in pending:
                w.cancel()
        for s in ready:
            text = s.take_backlog()
            for line in text.splitlines():
                client.out(f"[{s.label()}] {line}\n")
            if s.ended is not None:
                client.out(f"[{s.label()}] session ended: {s.ended}\n")
            elif s.prompt is None:
                client.out(f"[{s.label()}] still running; attach to see what it prints next\n")

    def _continue(self, client: _Client) -> None:
        self._prune()
        count = 0
        for s in self._sorted():
            if s.prompt is not None and s.attached in (None, client):
                s.backlog.clear()
                s.send_line("c")
                count += 1
        client.out(f"Continued {count} session(s).\n")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def debug_controller() -> DebugController:
    """The client's debug controller, spawned on first use, serving ``monarch debug``
    (``MONARCH_DEBUG_SERVER_HOST``/``_PORT``). Blocks until it serves."""
    controller = get_or_spawn_controller(CONTROLLER_NAME, DebugController).get()
    controller.serve.call_one().get()
    return controller
