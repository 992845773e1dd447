"""Stopping a proc mesh, and the end of the program, stop each actor gracefully: its
running concurrent endpoint tasks are cancelled, ``__cleanup__`` runs, and the actor
is released so its finalizers run; then the proc exits. A stuck actor costs at most
the stop timeout (see docs/actors.md, "Stopping")."""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import monarch
from monarch.actor import (
    Actor,
    Port,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
)
from proc_state import running

if TYPE_CHECKING:  # not imported at run time: procs unpickling this module lack it
    from conftest import Faults

pytestmark = pytest.mark.timeout(120)


def _note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


class Finalized(Actor):
    """Notes its cleanup and its finalizer in a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ping(self) -> int:
        return 1

    def __cleanup__(self, exc: BaseException | None) -> None:
        _note(self.path, "cleanup")

    def __del__(self) -> None:
        _note(self.path, "del")


class Busy(Actor):
    """Has a concurrent endpoint task running forever when the proc stops."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = asyncio.Event()

    @concurrent_endpoint
    async def forever(self) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _note(self.path, "cancelled")
            raise

    @endpoint
    async def wait_started(self) -> None:
        await self.started.wait()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        _note(self.path, "cleanup")

    def __del__(self) -> None:
        _note(self.path, "del")


class Reraises(Actor):
    """The asyncio idiom: a concurrent endpoint that cleans up on cancellation and lets
    the ``CancelledError`` go on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = asyncio.Event()

    @concurrent_endpoint
    async def forever(self) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _note(self.path, "cancelled")
            raise
        finally:
            _note(self.path, "finally")

    @endpoint
    async def wait_started(self) -> None:
        await self.started.wait()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        _note(self.path, f"cleanup:{exc}")


class _Note:
    """Notes ``line`` in ``path`` when finalized. Its ``__del__`` runs while the
    interpreter finalizes, when module globals (builtins included) may be gone already:
    it uses only what it holds."""

    def __init__(self, path: str, line: str) -> None:
        self.path = path
        self.line = line

    def __del__(self, _open: Any = open) -> None:
        with _open(self.path, "a") as f:
            f.write(self.line + "\n")


#: Set in a proc by ``ProcExit.hold``: an object only a module global keeps.
_HELD: _Note | None = None


class ProcExit(Actor):
    @endpoint
    def hold(self, path: str) -> int:
        global _HELD
        _HELD = _Note(path, "global-del")
        atexit.register(_note, path, "atexit")
        return os.getpid()


class HangsAtExit(Actor):
    @endpoint
    def hang_at_exit(self) -> int:
        atexit.register(time.sleep, 300)
        return os.getpid()


class Stuck(Actor):
    @endpoint
    def hang(self, seconds: float) -> None:
        time.sleep(seconds)


def _lines(path: Path, count: int, timeout: float = 30) -> list[str]:
    """The file's lines once it has ``count`` (the finalizer runs on the actor's
    thread, after the stop's answer may have come)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (a script's statements, which may import from this module) as a
    program of its own; its exit status and output."""
    script = tmp_path / "script.py"
    here = Path(__file__).parent
    prelude = f"import sys\nsys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
    script.write_text(prelude + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)


def test_proc_mesh_stop_cancels_tasks_cleans_up_and_finalizes(tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    plain = tmp_path / "plain"
    busy = tmp_path / "busy"
    finalized = procs.slice(gpus=0).spawn("finalized", Finalized, str(plain))
    running = procs.slice(gpus=1).spawn("busy", Busy, str(busy))
    assert finalized.ping.call_one().get(timeout=60) == 1
    pending = running.forever.call_one()
    running.wait_started.call_one().get(timeout=60)
    procs.stop().get(timeout=60)
    # Each proc exited after its actors' stop procedures, in order.
    assert plain.read_text().split() == ["cleanup", "del"]
    assert busy.read_text().split() == ["cancelled", "cleanup", "del"]
    with pytest.raises(Exception):  # the cancelled call does not hang  # noqa: B017
        pending.get(timeout=60)


@pytest.mark.parametrize("what", ["actor_mesh", "proc_mesh"])
def test_a_stop_cancelling_an_endpoint_that_reraises_is_not_a_failure(
    tmp_path: Path, faults: Faults, what: str
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    notes = tmp_path / "notes"
    name = f"reraises_{what}"
    actors = procs.spawn(name, Reraises, str(notes))
    pending = actors.forever.call_one()
    actors.wait_started.call_one().get(timeout=60)
    try:
        if what == "actor_mesh":
            actors.stop().get(timeout=60)
        else:
            procs.stop().get(timeout=60)
        # The cancelled call ends as the stop's, not as a failure of the actor.
        with pytest.raises(SupervisionError, match="was stopped") as info:
            pending.get(timeout=60)
        assert "CancelledError" not in str(info.value)
        # The endpoint's except and finally blocks ran, then __cleanup__(None).
        assert _lines(notes, 3) == ["cancelled", "finally", "cleanup:None"]
    finally:
        if what == "actor_mesh":
            procs.stop().get(timeout=60)
    # Nothing reached the client's fault hook: a failure report, sent before the proc
    # answered the stop, would be there by now.
    assert not [f for f in faults.failures if f.mesh_name == name]


def test_the_program_ends_normally_after_a_stop_cancelled_a_reraising_endpoint(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes"
    out = _run_script(
        tmp_path,
        f"""
            from test_stop import Reraises
            from monarch.actor import this_host

            procs = this_host().spawn_procs(per_host={{"gpus": 1}})
            actors = procs.spawn("reraises", Reraises, {str(notes)!r})
            actors.forever.broadcast()
            actors.wait_started.call_one().get(timeout=60)
            print("returning")
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "failed" not in out.stderr, out.stderr[-3000:]
    assert _lines(notes, 3) == ["cancelled", "finally", "cleanup:None"]


@pytest.mark.parametrize("fork_server", [True, False])
def test_a_stopped_proc_finalizes_its_interpreter(tmp_path: Path, fork_server: bool) -> None:
    with monarch.configured(spawn_fork_server=fork_server):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    notes = tmp_path / "notes"
    pid = procs.spawn("proc_exit", ProcExit).hold.call_one(str(notes)).get(timeout=60)
    start = time.monotonic()
    procs.stop().get(timeout=60)
    assert time.monotonic() - start < 15
    # The proc has exited when the stop completes: its atexit handlers ran, then the
    # module teardown released what a module global held.
    assert notes.read_text().split() == ["atexit", "global-del"]
    assert not running(pid)


def test_a_hanging_atexit_handler_costs_at_most_the_stop_timeout() -> None:
    with monarch.configured(stop_actor_timeout="2s"):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    pid = procs.spawn("hangs", HangsAtExit).hang_at_exit.call_one().get(timeout=60)
    start = time.monotonic()
    procs.stop().get(timeout=60)
    assert time.monotonic() - start < 15  # not the 300 s of the handler
    assert not running(pid)


def test_a_stuck_actor_costs_at_most_the_stop_timeout(tmp_path: Path) -> None:
    with monarch.configured(stop_actor_timeout="2s"):
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    notes = tmp_path / "notes"
    stuck = procs.slice(gpus=0).spawn("stuck", Stuck)
    fine = procs.slice(gpus=1).spawn("fine", Finalized, str(notes))
    fine.ping.call_one().get(timeout=60)
    stuck.hang.broadcast(300)
    start = time.monotonic()
    procs.stop().get(timeout=60)
    assert time.monotonic() - start < 15  # not the 300 s of the stuck endpoint
    assert notes.read_text().split() == ["cleanup", "del"]


def test_the_end_of_the_program_stops_actors_gracefully(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    out = _run_script(
        tmp_path,
        f"""
            from test_stop import Finalized
            from monarch.actor import this_host, this_proc

            procs = this_host().spawn_procs(per_host={{"gpus": 2}})
            remote = procs.spawn("remote", Finalized, {str(notes)!r})
            local = this_proc().spawn("local", Finalized, {str(notes)!r})
            assert remote.ping.call().get(timeout=60)
            assert local.ping.call_one().get(timeout=60) == 1
            print("returning")
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "returning" in out.stdout
    # Three actors (two procs and the client's own proc), each cleaned up and finalized.
    assert sorted(_lines(notes, 6)) == ["cleanup"] * 3 + ["del"] * 3


def test_a_proc_slow_to_exit_at_the_end_of_the_program_is_killed_quietly(
    tmp_path: Path,
) -> None:
    """At the end of the program each proc gets a second to exit, then is killed: that
    is the expected end of a proc the program did not stop, so nothing is printed."""
    out = _run_script(
        tmp_path,
        """
            from test_stop import HangsAtExit
            from monarch.actor import this_host

            procs = this_host().spawn_procs(per_host={"gpus": 2})
            pids = procs.spawn("hangs", HangsAtExit).hang_at_exit.call().get(timeout=60)
            print(*pids.values())
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "did not stop" not in out.stderr and "WARN" not in out.stderr, out.stderr
    assert not any(running(int(pid)) for pid in out.stdout.split())


class Answerer(Actor):
    @endpoint
    def ask(self) -> int:
        return 1


class Asker(Actor):
    """Calls ``answerer`` for ever: when the answerer's proc stops first, the call
    raises out of this broadcast endpoint and the actor fails."""

    def __init__(self, answerer: Answerer, port: Port[str]) -> None:
        self.answerer, self.port = answerer, port

    @endpoint
    def run(self) -> None:
        self.port.send("looping")
        while True:
            self.answerer.ask.call_one().get(timeout=30)


def ask_then_stop() -> str:
    """Spawn an answerer and three askers on four procs, wait until every asker calls
    it in a loop, then stop the procs (from the client, or from an owner actor)."""
    from monarch.actor import Channel

    procs = this_host().spawn_procs(per_host={"p": 4})
    port, looping = Channel[str].open()
    answerer = procs.slice(p=0).spawn("answerer", Answerer)
    askers = procs.slice(p=slice(1, 4)).spawn("asker", Asker, answerer, port)
    askers.run.broadcast()
    for _ in range(3):
        looping.recv().get(timeout=60)
    procs.stop().get(timeout=60)
    return "stopped"


def test_an_actor_failing_because_its_peer_stopped_first_is_no_failure(
    tmp_path: Path,
) -> None:
    """A proc mesh stops its procs all at once: an actor whose peer's proc stopped
    first fails on its next call, and that is part of the stop, not a failure of the
    program (with the default fault hook, one would end it with exit status 1)."""
    out = _run_script(
        tmp_path,
        """
            from test_stop import ask_then_stop

            print(ask_then_stop())
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["stopped"]
    assert "unhandled failure" not in out.stderr, out.stderr[-3000:]


class AskersOwner(Actor):
    """Owns a proc mesh of an answerer and askers (see above), and stops it."""

    @endpoint
    def run_and_stop(self) -> str:
        return ask_then_stop()

    @endpoint
    def alive(self) -> bool:
        return True


def test_an_owner_actor_is_not_failed_by_the_stop_of_what_it_owns(faults: Faults) -> None:
    procs = this_host().spawn_procs(per_host={"p": 1})
    try:
        owner = procs.spawn("askers_owner", AskersOwner)
        assert owner.run_and_stop.call_one().get(timeout=90) == "stopped"
        # Had a failure of the stopped mesh reached it, the owner (no __supervise__)
        # would have failed, and this call would raise.
        assert owner.alive.call_one().get(timeout=30)
        assert not [f for f in faults.failures if f.mesh_name == "askers_owner"]
    finally:
        procs.stop().get(timeout=60)


def test_stopping_an_actor_mesh_releases_its_actors(tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    notes = tmp_path / "notes"
    actors = procs.spawn("released", Finalized, str(notes))
    actors.ping.call().get(timeout=60)
    actors.stop().get(timeout=60)
    try:
        assert _lines(notes, 2) == ["cleanup", "del"]
    finally:
        procs.stop().get(timeout=60)


@pytest.mark.timeout(300)
def test_stopping_a_proc_mesh_while_its_actors_spawn_is_not_a_failure(tmp_path: Path) -> None:
    # Right after the spawn, some procs get it while they stop: those refuse it. A stop
    # the owner asked for is no failure of what it stops, whatever state the spawn was
    # in: nothing reaches the fault hook, calls say the actors were stopped, and the
    # program ends with status 0. Repeated to hit the race.
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import monarch.actor
            from monarch.actor import Actor, SupervisionError, endpoint, this_host

            class Pong(Actor):
                @endpoint
                def ping(self) -> int:
                    return 1

            def hook(failure):
                print(f"FAULT HOOK: {failure}", flush=True)
                sys.exit(1)

            monarch.actor.unhandled_fault_hook = hook
            for i in range(4):
                procs = this_host().spawn_procs(per_host={"gpus": 12})
                actors = procs.spawn(f"racing{i}", Pong)
                assert len(actors) == 12
                procs.stop().get(timeout=60)
                try:
                    actors.ping.call().get(timeout=60)
                except SupervisionError as e:
                    assert "stopped" in str(e), str(e)
                else:
                    raise AssertionError("a call to the actors of a stopped proc mesh returned")
            print("done", flush=True)
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert "FAULT HOOK" not in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done" in out.stdout
