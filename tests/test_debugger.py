"""Remote pdb: ``breakpoint()`` in endpoints, driven from ``monarch debug``.

Each test runs a client script (``CLIENT``) in a subprocess: it spawns two procs and
calls endpoints that stop at ``breakpoint()``. The client's debug controller serves on
a free port (``MONARCH_DEBUG_SERVER_PORT=0``) and names it in the line it prints to its
stderr for each paused actor, which is also how a test knows a session is open. The
test drives ``monarch debug --port P`` in a pseudo-terminal (pexpect), as a user would,
and checks what the client script prints once its calls return. Where the script must
wait for the test, it reads a line from its stdin.
"""

from __future__ import annotations

import io
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from monarch._src.actor.debugger import commands, protocol

CLIENT = """\
import os
import sys
import time

from monarch.actor import Actor, context, debug_controller, endpoint, this_host


class Debugee(Actor):
    @endpoint
    def bp(self, x: int) -> int:
        rank = context().actor_instance.rank.rank
        y = x * 2 + rank
        breakpoint()
        z = y + 1
        return z

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def fail(self, x: int) -> float:
        divisor = x - x
        return x / divisor

    @endpoint
    def bp_then_fail(self, x: int) -> None:
        breakpoint()
        raise ValueError(f"bad {x}")

    @endpoint
    def set_env(self, key: str, value: str) -> None:
        os.environ[key] = value


class AsyncDebugee(Actor):
    @endpoint
    async def bp(self, x: int) -> int:
        y = x * 3
        breakpoint()
        return y + 1


class Other(Actor):
    @endpoint
    def ping(self) -> str:
        return "other"


class Misc(Actor):
    def __init__(self) -> None:
        self.ready = False
        breakpoint()
        self.ready = True

    @endpoint
    def quitter(self) -> int:
        breakpoint()
        return 5


class AsyncStepper(Actor):
    @endpoint
    async def step(self) -> int:
        import asyncio

        a = 1
        breakpoint()
        await asyncio.sleep(0.01)
        b = a + 1
        return b


def report(what, fut):
    try:
        value = fut.get(timeout=120)
    except Exception as e:
        inner = getattr(e, "exception", e)
        print(what, "raised", type(inner).__name__, flush=True)
    else:
        if hasattr(value, "values"):
            value = list(value.values())
        print(what, value, flush=True)


def go():
    sys.stdin.readline()  # the test's go-ahead


mode = sys.argv[1]
procs = this_host().spawn_procs({"gpus": 2})
debugee = procs.spawn("debugee", Debugee)
rank0 = debugee.slice(gpus=0)
if mode == "one":
    report("result", rank0.bp.call_one(10))
    asynchronous = procs.slice(gpus=1).spawn("adebugee", AsyncDebugee)
    report("async result", asynchronous.bp.call_one(5))
elif mode == "two":
    report("result", debugee.bp.call(10))
elif mode == "post_mortem":
    report("plain", rank0.fail.call_one(1))
    report("after breakpoint", rank0.bp_then_fail.call_one(2))
    debugee.set_env.call("MONARCH_DEBUG_POST_MORTEM", "1").get()
    report("post-mortem", debugee.slice(gpus=1).fail.call_one(3))
elif mode == "unattached":
    paused = rank0.bp.call_one(10)
    go()
    for s in debug_controller().sessions.call_one().get():
        print("session", s["actor_name"], s["rank"], s["function"], s["waiting"], flush=True)
    report("other rank", debugee.slice(gpus=1).ping.call_one())
    report("same proc", procs.spawn("other", Other).ping.call())
    # Stopping the paused actor's own mesh waits for it like for any busy actor.
    stopme = procs.slice(gpus=1).spawn("stopme", Debugee)
    paused_too = stopme.bp.call_one(1)
    go()
    started = time.monotonic()
    stopme.stop().get(timeout=60)
    print("actor mesh stopped in", round(time.monotonic() - started, 1), flush=True)
    report("paused too", paused_too)
    started = time.monotonic()
    procs.stop().get(timeout=60)
    print("stopped in", round(time.monotonic() - started, 1), flush=True)
    report("paused call", paused)
    later = this_host().spawn_procs({"gpus": 1}).spawn("late", Debugee)
    pending = later.bp.call_one(1)
    go()
    print("exiting", flush=True)
elif mode == "misc":
    misc = procs.slice(gpus=0).spawn("misc", Misc)
    report("quitter", misc.quitter.call_one())
    report("async step", procs.slice(gpus=1).spawn("stepper", AsyncStepper).step.call_one())
elif mode == "timeout":
    report("result", rank0.bp.call_one(10))
if mode != "unattached":
    go()  # the test's debugger is done with the client's debug server
"""

#: What the client prints (to stderr) for each session that opens.
PAUSED = re.compile(
    r"monarch: actor '([^']+)' rank (\d+) is (?:paused|in post-mortem).*--port (\d+)"
)
PROMPT = "monarch_dbg> "
PDB = "(Pdb) "


class Client:
    """The client script in a subprocess; threads collect its output lines."""

    def __init__(self, tmp_path: Path, mode: str, **env: str) -> None:
        script = tmp_path / "debug_client.py"
        script.write_text(CLIENT)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_DEBUG_")}
        environ.update({protocol.PORT_ENV: "0", **env})
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
            cwd=tmp_path,
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stderr: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        for pipe, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(pipe, lines), daemon=True).start()

    @staticmethod
    def _pump(pipe: io.TextIOWrapper | None, lines: queue.Queue[str | None]) -> None:
        assert pipe is not None
        for line in pipe:
            lines.put(line)
        lines.put(None)

    def _wait(
        self, lines: queue.Queue[str | None], pattern: str | re.Pattern[str]
    ) -> re.Match[str]:
        deadline = time.monotonic() + 90
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"the client ended without {pattern!r}; saw {self.seen}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def out(self, pattern: str) -> re.Match[str]:
        """Wait for a line of the client's stdout matching ``pattern``."""
        return self._wait(self.stdout, pattern)

    def paused(self) -> tuple[str, int, int]:
        """Wait for the next session notice: ``(actor, rank, port)``."""
        m = self._wait(self.stderr, PAUSED)
        return m.group(1), int(m.group(2)), int(m.group(3))

    def err(self, pattern: str) -> re.Match[str]:
        return self._wait(self.stderr, pattern)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


class Debugger:
    """``monarch debug --port P`` in a pseudo-terminal."""

    def __init__(self, port: int, console_script: bool = False) -> None:
        if console_script:
            command, args = str(Path(sys.executable).with_name("monarch")), []
        else:
            command, args = sys.executable, ["-m", "monarch.tools.cli"]
        self.transcript = io.StringIO()
        self.child = pexpect.spawn(
            command,
            [*args, "debug", "--port", str(port)],
            env={**os.environ, "TERM": "dumb"},
            encoding="utf-8",
            timeout=60,
            dimensions=(50, 250),
        )
        self.child.logfile_read = self.transcript

    def expect(self, text: str) -> str:
        """Wait for ``text``; what was printed before it."""
        try:
            self.child.expect_exact(text)
        except (pexpect.TIMEOUT, pexpect.EOF):
            raise AssertionError(
                f"monarch debug never printed {text!r}; transcript:\n{self.transcript.getvalue()}"
            ) from None
        return str(self.child.before)

    def cmd(self, line: str, prompt: str) -> str:
        """Type ``line`` and wait for ``prompt``: what was printed in between (after the
        terminal's echo of the line)."""
        self.child.sendline(line)
        _echo, _, out = self.expect(prompt).partition("\n")
        return out.replace("\r\n", "\n")

    def quit(self) -> None:
        self.child.sendline("quit")
        self.child.expect(pexpect.EOF)
        self.child.close()
        assert self.child.exitstatus == 0, self.transcript.getvalue()

    def close(self) -> None:
        if self.child.isalive():
            self.child.close(force=True)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    """``run.client(mode, **env)`` and ``run.debugger(port)``, closed at teardown."""
    opened: list[Client | Debugger] = []

    class Runner:
        @staticmethod
        def client(mode: str, **env: str) -> Client:
            c = Client(tmp_path, mode, **env)
            opened.append(c)
            return c

        @staticmethod
        def debugger(port: int, console_script: bool = False) -> Debugger:
            d = Debugger(port, console_script)
            opened.append(d)
            return d

    yield Runner()
    for thing in reversed(opened):
        thing.close()


@pytest.mark.timeout(180)
def test_attach_list_print_step_and_continue(run: Any) -> None:
    client = run.client("one")
    actor, rank, port = client.paused()
    assert (actor, rank) == ("debugee", 0)
    dbg = run.debugger(port, console_script=True)
    banner = dbg.expect(PROMPT)
    assert re.search(r"debugee\s+0\s+gpus=0\s+\S+\s+bp\s+\S*debug_client.py:14\s+waiting", banner)
    out = dbg.cmd("list", PROMPT)
    assert re.search(r"debugee\s+0\s+gpus=0\s+\S+\s+bp\s+\S*debug_client.py:14\s+waiting", out)
    out = dbg.cmd("attach debugee 0", PDB)
    assert "debug_client.py(14)bp()" in out and "-> z = y + 1" in out
    out = dbg.cmd("l", PDB)
    assert "breakpoint()" in out and "->\t        z = y + 1" in out
    assert dbg.cmd("p y", PDB).strip() == "20"
    # The endpoint's frame is the bottom one: none of monarch's frames show.
    where = dbg.cmd("where", PDB)
    assert "bp()" in where and "actor_host" not in where and "_src" not in where
    assert "-> return z" in dbg.cmd("n", PDB)
    assert dbg.cmd("p z", PDB).strip() == "21"
    assert "ended" in dbg.cmd("c", PROMPT)
    assert client.out(r"^result ").string.strip() == "result 21"

    # An async endpoint: the same, on its actor's event loop.
    assert client.paused() == ("adebugee", 0, port)
    assert "-> return y + 1" in dbg.cmd("a adebugee 0", PDB)
    assert dbg.cmd("p y", PDB).strip() == "15"
    assert "ended" in dbg.cmd("c", PROMPT)
    dbg.quit()
    assert client.out(r"^async result ").string.strip() == "async result 16"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(180)
def test_two_ranks_are_listed_and_attached_one_after_the_other(run: Any) -> None:
    client = run.client("two")
    paused = [client.paused() for _ in range(2)]
    assert sorted(p[:2] for p in paused) == [("debugee", 0), ("debugee", 1)]
    dbg = run.debugger(paused[0][2])
    table = dbg.expect(PROMPT)
    assert re.search(r"debugee\s+0\s+gpus=0 .*waiting", table)
    assert re.search(r"debugee\s+1\s+gpus=1 .*waiting", table)
    dbg.cmd("attach debugee 1", PDB)
    assert dbg.cmd("p y", PDB).strip() == "21"
    assert "ended" in dbg.cmd("c", PROMPT)
    table = dbg.cmd("list", PROMPT)
    assert re.search(r"debugee\s+0\s", table) and not re.search(r"debugee\s+1\s", table)
    dbg.cmd("attach debugee 0", PDB)
    assert dbg.cmd("p y", PDB).strip() == "20"
    assert "stays paused" in dbg.cmd("detach", PROMPT)
    assert "waiting" in dbg.cmd("list", PROMPT)
    dbg.cmd("a 0", PDB)  # one actor name: the rank is enough
    assert "ended" in dbg.cmd("c", PROMPT)
    assert "No sessions" in dbg.cmd("list", PROMPT)
    dbg.quit()
    assert client.out(r"^result ").string.strip() == "result [21, 22]"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(180)
def test_cast_and_continue(run: Any) -> None:
    client = run.client("two")
    client.paused()
    _, _, port = client.paused()
    dbg = run.debugger(port)
    dbg.expect(PROMPT)
    out = dbg.cmd("cast debugee ranks(1) p y * 10", PROMPT)
    assert "[debugee 1] 210" in out and "[debugee 0]" not in out
    out = dbg.cmd("cast debugee * p (y, x)", PROMPT)
    assert "[debugee 0] (20, 10)" in out and "[debugee 1] (21, 10)" in out
    out = dbg.cmd("cast debugee gpus=0 n", PROMPT)
    assert "[debugee 0] -> return z" in out and "[debugee 1]" not in out
    assert "Continued 2 session(s)." in dbg.cmd("continue", PROMPT)
    dbg.quit()
    assert client.out(r"^result ").string.strip() == "result [21, 22]"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(180)
def test_post_mortem(run: Any) -> None:
    client = run.client("post_mortem")
    # Off by default: an endpoint exception goes straight to the caller.
    assert client.out(r"^plain ").string.strip() == "plain raised ZeroDivisionError"
    # After a breakpoint in the same call, the exception opens a post-mortem session.
    actor, rank, port = client.paused()
    assert (actor, rank) == ("debugee", 0)
    dbg = run.debugger(port)
    dbg.expect(PROMPT)
    dbg.cmd("attach debugee 0", PDB)
    assert "ended" in dbg.cmd("c", PROMPT)
    assert "in post-mortem after ValueError: bad 2" in client.err("post-mortem").string
    assert "-> raise ValueError" in dbg.cmd("attach debugee 0", PDB)
    assert dbg.cmd("p x", PDB).strip() == "2"
    assert "ended" in dbg.cmd("c", PROMPT)
    assert client.out(r"^after breakpoint ").string.strip() == "after breakpoint raised ValueError"
    # With MONARCH_DEBUG_POST_MORTEM=1 in the procs' environment: every exception.
    assert "after ZeroDivisionError: division by zero" in client.err("post-mortem").string
    table = dbg.cmd("list", PROMPT)
    assert re.search(r"debugee\s+1\s+gpus=1\s+\S+\s+fail\s+\S*debug_client.py:24\s+waiting", table)
    assert "-> return x / divisor" in dbg.cmd("attach debugee 1", PDB)
    assert dbg.cmd("p divisor, x", PDB).strip() == "(0, 3)"
    where = dbg.cmd("where", PDB)
    assert "fail()" in where and "actor_host" not in where
    assert "ended" in dbg.cmd("c", PROMPT)
    dbg.quit()
    assert client.out(r"^post-mortem ").string.strip() == "post-mortem raised ZeroDivisionError"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(180)
def test_init_quit_and_stepping_over_an_await(run: Any) -> None:
    client = run.client("misc")
    _, _, port = client.paused()
    dbg = run.debugger(port)
    dbg.expect(PROMPT)
    # A breakpoint in __init__; stepping out of it ends the session.
    assert "-> self.ready = True" in dbg.cmd("attach misc 0", PDB)
    assert dbg.cmd("p self.ready", PDB).strip() == "False"
    where = dbg.cmd("where", PDB)
    assert "__init__()" in where and "actor_host" not in where
    assert "--Return--" in dbg.cmd("n", PDB)
    assert "ended: the call returned" in dbg.cmd("n", PROMPT)
    # q ends the session and aborts the call.
    assert client.paused()[:2] == ("misc", 0)
    dbg.cmd("attach misc 0", PDB)
    assert "ended: quit" in dbg.cmd("q", PROMPT)
    assert client.out(r"^quitter ").string.strip() == "quitter raised BdbQuit"
    # n steps over an await in an async endpoint.
    assert client.paused()[:2] == ("stepper", 0)
    assert "-> await asyncio.sleep(0.01)" in dbg.cmd("attach stepper 0", PDB)
    assert "-> b = a + 1" in dbg.cmd("n", PDB)
    assert "-> return b" in dbg.cmd("n", PDB)
    assert "ended" in dbg.cmd("c", PROMPT)
    dbg.quit()
    assert client.out(r"^async step ").string.strip() == "async step 2"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(180)
def test_a_breakpoint_nobody_attaches_to_blocks_nothing_else(run: Any) -> None:
    client = run.client("unattached", HYPERACTOR_STOP_ACTOR_TIMEOUT="2s")
    assert client.paused()[:2] == ("debugee", 0)
    client.go()
    # The controller lists the session (debug_controller() is the client's singleton).
    assert client.out(r"^session ").string.strip() == "session debugee 0 bp True"
    # The other rank, and another actor on the paused actor's own proc, answer.
    assert client.out(r"^other rank ").string.strip() == "other rank pong"
    assert client.out(r"^same proc ").string.strip() == "same proc ['other', 'other']"
    # Stopping the paused actor's own mesh takes stop_actor_timeout (2 s here): then
    # the actor is aborted, leaves pdb, and its call fails.
    assert client.paused()[:2] == ("stopme", 0)
    client.go()
    seconds = float(client.out(r"^actor mesh stopped in (\S+)").group(1))
    assert 1.5 < seconds < 10, seconds
    assert client.out(r"^paused too ").string.strip() == "paused too raised BdbQuit"
    # Stopping the mesh stops the paused proc at once; the paused call fails.
    seconds = float(client.out(r"^stopped in (\S+)").group(1))
    assert seconds < 10, seconds
    assert client.out(r"^paused call ").string.strip() == "paused call raised SupervisionError"
    # The client exits although an actor is paused (and its call pending).
    assert client.paused()[:2] == ("late", 0)
    client.go()
    client.out(r"^exiting")
    started = time.monotonic()
    assert client.wait(timeout=30) == 0
    assert time.monotonic() - started < 10


@pytest.mark.timeout(120)
def test_an_attach_timeout_continues_with_a_warning(run: Any) -> None:
    client = run.client("timeout", **{protocol.ATTACH_TIMEOUT_ENV: "0.5"})
    assert client.paused()[:2] == ("debugee", 0)
    assert "nobody attached to actor 'debugee' rank 0" in client.err("nobody attached").string
    assert client.out(r"^result ").string.strip() == "result 21"
    client.go()
    assert client.wait() == 0


@pytest.mark.timeout(120)
def test_a_busy_port_skips_the_breakpoint_with_a_warning(run: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        client = run.client("timeout", **{protocol.PORT_ENV: str(port)})
        assert f"cannot listen on localhost:{port}" in client.err("cannot listen").string
        assert "actor 'debugee' rank 0 did not stop in pdb" in client.err("did not stop").string
        assert client.out(r"^result ").string.strip() == "result 21"
        client.go()
        assert client.wait() == 0


@pytest.mark.timeout(60)
def test_monarch_debug_without_a_server_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "monarch.tools.cli",
            "debug",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert f"cannot connect to the debug server at 127.0.0.1:{port}" in out.stderr


# --- parsing --------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_commands_parse() -> None:
    assert commands.parse("") is None
    assert commands.parse("list") == commands.parse("l") == commands.List()
    assert commands.parse("a trainer 3") == commands.Attach("trainer", 3)
    assert commands.parse("attach 2") == commands.Attach(None, 2)
    assert commands.parse("c") == commands.Continue()
    assert commands.parse("quit") == commands.parse("q") == commands.Quit()
    assert commands.parse("h") == commands.Help()
    cast = commands.parse("cast trainer ranks(gpus=1:3, hosts=0) p loss")
    assert isinstance(cast, commands.Cast) and cast.command == "p loss"
    assert cast.ranks.matches(9, {"hosts": 0, "gpus": 2})
    assert not cast.ranks.matches(9, {"hosts": 1, "gpus": 2})
    for spec, ranks in [("*", [0, 1, 2, 3, 4]), ("1,3", [1, 3]), ("1:4:2", [1, 3]), ("3:", [3, 4])]:
        cast = commands.parse(f"cast trainer {spec} n")
        assert isinstance(cast, commands.Cast)
        assert [r for r in range(5) if cast.ranks.matches(r, {})] == ranks, spec
    for bad, message in [
        ("attach", "usage: attach"),
        ("attach x y", "is not a rank"),
        ("cast trainer 0", "usage: cast"),
        ("cast trainer ranks(0 p x", "closing parenthesis"),
        ("cast trainer 0,gpus=1 p x", "mix"),
        ("cast trainer x:y p x", "is not a rank"),
        ("frobnicate", "unknown command"),
    ]:
        with pytest.raises(ValueError, match=message):
            commands.parse(bad)


@pytest.mark.timeout(10)
def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (protocol.HOST_ENV, protocol.PORT_ENV, protocol.PROTOCOL_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(protocol.ATTACH_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(protocol.POST_MORTEM_ENV, raising=False)
    assert protocol.server_address() == ("localhost", 27000)
    assert protocol.server_address("h", 1) == ("h", 1)
    assert protocol.attach_timeout() is None
    assert protocol.post_mortem_enabled() is False
    monkeypatch.setenv(protocol.HOST_ENV, "example")
    monkeypatch.setenv(protocol.PORT_ENV, "1234")
    monkeypatch.setenv(protocol.ATTACH_TIMEOUT_ENV, "2.5")
    monkeypatch.setenv(protocol.POST_MORTEM_ENV, "true")
    assert protocol.server_address() == ("example", 1234)
    assert protocol.attach_timeout() == 2.5
    assert protocol.post_mortem_enabled() is True
    monkeypatch.setenv(protocol.ATTACH_TIMEOUT_ENV, "0")
    assert protocol.attach_timeout() is None
    for var, value, message in [
        (protocol.PORT_ENV, "http", "not a port number"),
        (protocol.PROTOCOL_ENV, "unix", "tcp only"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(ValueError, match=message):
                protocol.server_address()
    monkeypatch.setenv(protocol.ATTACH_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        protocol.attach_timeout()
    monkeypatch.setenv(protocol.POST_MORTEM_ENV, "maybe")
    with pytest.raises(ValueError, match="set it to 1 or 0"):
        protocol.post_mortem_enabled()
    assert protocol.decode(protocol.encode("input", "(Pdb) ")) == ("input", "(Pdb) ")
    with pytest.raises(ValueError, match="not a message"):
        protocol.decode(b'{"run": "rm"}\n')
