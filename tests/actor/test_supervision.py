"""Supervision (issue 5): every failure source becomes a MeshFailure for the owner;
pending and later calls on a failed rank raise SupervisionError; healthy ranks go on."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from monarch.actor import (
    Actor,
    Channel,
    MeshFailure,
    Port,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
    this_host,
)
from proc_state import running

if TYPE_CHECKING:  # not imported at run time: procs unpickling this module lack it
    from conftest import Faults

pytestmark = pytest.mark.timeout(90)


class Worker(Actor):
    def __init__(self) -> None:
        self.cleaned = False

    @endpoint
    def ok(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom in broadcast")

    @endpoint
    def base_exception(self) -> None:
        raise KeyboardInterrupt("not an Exception")

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @endpoint
    def exit_hard(self) -> None:
        os._exit(3)

    @endpoint
    def segfault(self) -> None:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV in native code

    @endpoint
    def kill_me(self) -> None:
        context().actor_instance.kill("asked to")

    @endpoint
    def lose_connection(self) -> None:
        """Shut down every socket of this process that has an address (its proc's
        listener and connections), leaving the process running: a proc that lost its
        connection. The runtime's unnamed socket pairs are left alone."""
        import socket

        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                s = socket.socket(fileno=fd)
            except OSError:
                continue
            try:
                if s.family == socket.AF_UNIX and not (s.getsockname() or _peer(s)):
                    continue
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                s.detach()

    @endpoint(explicit_response_port=True)
    def explicit_boom(self, port: Port[int]) -> None:
        raise RuntimeError("explicit boom")


def _peer(s: object) -> object:
    try:
        return s.getpeername()  # type: ignore[attr-defined]
    except OSError:
        return None


class BadInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("init failed here")

    @endpoint
    def ok(self) -> int:
        return 1


class Supervisor(Actor):
    """Owns a mesh of Workers; handles their failures or not."""

    def __init__(self, handle: bool, seen: Port[str]) -> None:
        self.handle = handle
        self.seen = seen  # each failure offered to __supervise__ is sent here
        self.children: Worker | None = None

    @endpoint
    def spawn_children(self, procs: ProcMesh) -> None:
        self.children = procs.spawn("supervised", Worker)
        self.children.ok.call().get(timeout=30)

    @endpoint
    def break_children(self) -> None:
        assert self.children is not None
        self.children.boom.broadcast()

    @endpoint
    def break_children_by_send(self) -> None:
        from monarch.actor import send

        assert self.children is not None
        send(self.children.boom, (), {})

    @endpoint
    def ok(self) -> int:
        return 1

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.send(str(failure))
        return self.handle


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=30)
    yield pm
    pm.stop().get(timeout=30)


def test_exception_in_broadcast_fails_the_rank_and_reports_to_the_owner(
    procs: ProcMesh, faults: Faults
) -> None:
    w = procs.spawn("bcast", Worker)
    w.slice(gpus=1).boom.broadcast()
    [failure] = faults.wait_for(1, "bcast")
    assert failure.rank == 1 and "boom in broadcast" in failure.report()
    # The report names the actor by its path and says the actor itself failed.
    path = "<root>.<test_supervision.Worker bcast{'gpus': 1/2}>"
    assert failure.path == path
    attribution = f"The actor {path} failed. This occurred because the actor itself failed."
    assert failure.report().splitlines()[1].strip() == attribution, failure.report()
    assert "bcast" in str(failure) and "rank 1" in str(failure)
    # One record, as upstream Monarch prints it: which mesh and rank, then the event.
    assert str(failure).startswith("MeshFailure(mesh_name=bcast, rank=1, crashed_ranks=[1], ")
    assert repr(failure) == str(failure)
    assert failure.mesh is not None and failure.mesh.sizes == {"gpus": 2}
    with pytest.raises(SupervisionError, match="failed"):
        w.slice(gpus=1).ok.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        w.ok.call().get(timeout=30)
    assert w.slice(gpus=0).ok.call_one().get(timeout=30) == 0


def test_base_exception_fails_the_actor_and_the_call(procs: ProcMesh, faults: Faults) -> None:
    w = procs.spawn("base_exc", Worker)
    with pytest.raises(SupervisionError, match="KeyboardInterrupt") as info:
        w.slice(gpus=0).base_exception.call_one().get(timeout=30)
    assert info.value.endpoint is not None and "base_exception" in info.value.endpoint
    # The message says what failed and why in the words upstream Monarch's callers match.
    first = str(info.value)
    assert "The actor base_exc[0] and all its descendants have failed." in first, first
    assert re.search(
        r"Actor base_exc\[0\] exited because of the following reason: KeyboardInterrupt", first
    )
    assert faults.wait_for(1, "base_exc")[0].rank == 0
    with pytest.raises(SupervisionError, match=r"Actor .* exited because of the following reason:"):
        w.slice(gpus=0).ok.call_one().get(timeout=30)


def test_exception_in_explicit_port_endpoint_fails_the_actor(
    procs: ProcMesh, faults: Faults
) -> None:
    w = procs.spawn("explicit", Worker)
    w.slice(gpus=0).explicit_boom.broadcast()
    assert "explicit boom" in faults.wait_for(1, "explicit")[0].report()


def test_failing_init_reports_each_rank(procs: ProcMesh, faults: Faults) -> None:
    m = procs.spawn("badinit", BadInit)
    failures = faults.wait_for(2, "badinit")
    assert sorted(f.rank for f in failures) == [0, 1]
    assert all("init failed here" in f.report() for f in failures)
    with pytest.raises(SupervisionError):
        m.ok.call().get(timeout=30)


def test_kill_fails_the_actor(procs: ProcMesh, faults: Faults) -> None:
    w = procs.spawn("killed", Worker)
    w.slice(gpus=1).kill_me.call_one().get(timeout=30)
    [failure] = faults.wait_for(1, "killed")
    assert "asked to" in failure.report() and failure.rank == 1
    # Through a view or not, calls name the failed actor by its rank in the mesh, the
    # rank its MeshFailure names (its index in the one-rank view is 0).
    for mesh in (w.slice(gpus=1), w):
        with pytest.raises(SupervisionError, match=r"actor mesh 'killed' .* rank 1 cannot"):
            mesh.ok.call().get(timeout=30)


@pytest.mark.parametrize("how", ["sigkill", "os_exit", "segfault"])
def test_a_dead_proc_fails_pending_and_later_calls_from_its_exit(
    procs: ProcMesh, faults: Faults, how: str
) -> None:
    """The proc's exit, which its host reaps and reports, fails the calls ("died"); not
    heartbeats finding it lost ("was lost"). How soon: benches/actor_bench.py (failure
    detection)."""
    name = f"dead_{how}"
    w = procs.spawn(name, Worker)
    pid = w.slice(gpus=1).pid.call_one().get(timeout=30)
    start = time.monotonic()
    if how == "sigkill":
        pending = w.slice(gpus=1).sleep.call_one(60)
        os.kill(pid, signal.SIGKILL)
    elif how == "os_exit":
        pending = w.slice(gpus=1).exit_hard.call_one()
    else:
        pending = w.slice(gpus=1).segfault.call_one()
    with pytest.raises(
        SupervisionError,
        match=r"exited because of the following reason: process failure: proc .* died",
    ):
        pending.get(timeout=30)
    print(f"{how}: the pending call failed after {time.monotonic() - start:.3f} s")
    failure = faults.wait_for(1, name)[0]
    assert failure.rank == 1 and "died" in failure.report()
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).ok.call_one().get(timeout=5)
    assert w.slice(gpus=0).ok.call_one().get(timeout=30) == 0


def test_a_proc_that_loses_its_connection_is_failed_by_the_lost_link(
    procs: ProcMesh, faults: Faults
) -> None:
    """The broken link (or messages coming back undelivered) fails the proc, not
    heartbeats timing out."""
    w = procs.spawn("disconnected", Worker)
    w.ok.call().get(timeout=30)
    start = time.monotonic()
    w.slice(gpus=1).lose_connection.broadcast()
    pending = w.slice(gpus=1).sleep.call_one(60)
    # Whichever the client notices first: its link to the proc breaking, or a message
    # to it coming back undelivered.
    lost = r"was lost: (the host lost its connection|messages to it came back undelivered)"
    with pytest.raises(SupervisionError, match=lost):
        pending.get(timeout=30)
    print(f"the pending call failed after {time.monotonic() - start:.3f} s")
    failure = faults.wait_for(1, "disconnected")[0]
    assert failure.rank == 1 and re.search(lost, failure.report())
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).ok.call_one().get(timeout=5)
    assert w.slice(gpus=0).ok.call_one().get(timeout=30) == 0


def test_supervise_handles_failures_of_owned_meshes(procs: ProcMesh, faults: Faults) -> None:
    seen, seen_rx = Channel[str].open()
    sup = procs.slice(gpus=0).spawn("handling_supervisor", Supervisor, True, seen)
    sup.spawn_children.call_one(procs).get(timeout=30)
    sup.break_children.call_one().get(timeout=30)
    reports = [seen_rx.recv().get(timeout=30) for _ in range(2)]  # one per failed rank
    assert all(r.startswith("MeshFailure(mesh_name=supervised, ") for r in reports)
    # Handled: the supervisor answers (its messages come after the two failures), and
    # nothing reached the client.
    assert sup.ok.call_one().get(timeout=30) == 1
    assert not [f for f in faults.failures if f.mesh_name == "handling_supervisor"]


class AsyncSupervisor(Supervisor):
    """The same, with ``async def __supervise__`` (its endpoints stay sync)."""

    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        import asyncio

        await asyncio.sleep(0)
        self.seen.send("async: " + str(failure))
        return self.handle


@pytest.mark.parametrize("how", ["broadcast", "send"])
@pytest.mark.parametrize("cls", [Supervisor, AsyncSupervisor])
def test_failures_of_endpoints_without_a_reply_port_reach_supervise(
    procs: ProcMesh, faults: Faults, how: str, cls: type[Supervisor]
) -> None:
    seen, seen_rx = Channel[str].open()
    sup = procs.slice(gpus=0).spawn(f"sup_{how}_{cls.__name__}", cls, True, seen)
    sup.spawn_children.call_one(procs.slice(gpus=1)).get(timeout=30)
    if how == "broadcast":
        sup.break_children.call_one().get(timeout=30)
    else:
        sup.break_children_by_send.call_one().get(timeout=30)
    report = seen_rx.recv().get(timeout=30)
    assert "actor mesh 'supervised'" in report
    assert report.startswith("async: ") == (cls is AsyncSupervisor)
    # Handled (an async verdict included): the supervisor goes on.
    assert sup.ok.call_one().get(timeout=30) == 1


class WaitingOwner(Actor):
    """An async actor whose endpoint waits for its own ``__supervise__``."""

    def __init__(self) -> None:
        import asyncio

        self.handled = asyncio.Event()
        self.log: list[str] = []

    @endpoint
    async def break_child_and_wait(self, procs: ProcMesh) -> list[str]:
        import asyncio

        child = procs.spawn("awaited_child", Worker)
        await child.ok.call()
        child.boom.broadcast()
        # Runs __supervise__ while this endpoint awaits: it does not wait for it to return.
        await asyncio.wait_for(self.handled.wait(), 30)
        self.log.append("endpoint returned")
        return self.log

    @endpoint
    async def next_call(self) -> list[str]:
        return self.log

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.log.append(f"supervised {failure.mesh_name}")
        self.handled.set()
        return True


class AsyncWaitingOwner(WaitingOwner):
    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        import asyncio

        await asyncio.sleep(0)
        return super().__supervise__(failure)


@pytest.mark.parametrize("cls", [WaitingOwner, AsyncWaitingOwner])
def test_supervise_runs_while_an_async_endpoint_awaits(
    procs: ProcMesh, faults: Faults, cls: type[WaitingOwner]
) -> None:
    name = f"waiting_{cls.__name__}"
    owner = procs.slice(gpus=0).spawn(name, cls)
    waiting = owner.break_child_and_wait.call_one(procs.slice(gpus=1))
    queued = owner.next_call.call_one()  # sent while the endpoint awaits: runs after it
    log = ["supervised awaited_child", "endpoint returned"]
    assert waiting.get(timeout=60) == log
    assert queued.get(timeout=60) == log
    assert not [f for f in faults.failures if f.mesh_name == name]


def test_unhandled_failures_propagate_to_the_owners_owner(procs: ProcMesh, faults: Faults) -> None:
    seen, _ = Channel[str].open()
    sup = procs.slice(gpus=0).spawn("refusing_supervisor", Supervisor, False, seen)
    sup.spawn_children.call_one(procs).get(timeout=30)
    sup.break_children.call_one().get(timeout=30)
    [failure] = faults.wait_for(1, "refusing_supervisor")
    assert failure.cause is not None and failure.cause.mesh_name == "supervised"
    report = failure.report()
    assert "caused by" in report and "boom in broadcast" in report
    # The supervisor failed before it reported: a call sent after the report fails.
    with pytest.raises(SupervisionError):
        sup.ok.call_one().get(timeout=30)


def test_default_hook_stops_the_program_with_a_report() -> None:
    script = textwrap.dedent(
        """
        import time
        from monarch.actor import Actor, endpoint, this_host

        class Fails(Actor):
            @endpoint
            def boom(self) -> None:
                raise ValueError("unhandled boom")

        procs = this_host().spawn_procs({"gpus": 1})
        procs.spawn("doomed", Fails).boom.broadcast()
        time.sleep(600)  # interrupted by the default hook, or the test times out
        print("not reached")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "not reached" not in out.stdout
    assert "actor mesh 'doomed'" in out.stderr and "unhandled boom" in out.stderr


def test_procs_die_with_a_sigkilled_client() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from monarch.actor import Actor, endpoint, this_host

        class Pid(Actor):
            @endpoint
            def pid(self) -> int:
                return os.getpid()

        pids = this_host().spawn_procs({"gpus": 3}).spawn("p", Pid).pid.call().get().values()
        print(*pids, flush=True)
        sys.stdin.read()
        """
    )
    client = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        pids = [int(p) for p in client.stdout.readline().split()]
        assert len(pids) == 3
        client.kill()
        client.wait(timeout=10)
        deadline = time.monotonic() + 2
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if running(p)]
            time.sleep(0.02)
        assert not alive, f"procs {alive} outlived their SIGKILLed client by 2 s"
    finally:
        client.kill()
        client.wait(timeout=10)
        if client.stdin is not None:
            client.stdin.close()
        if client.stdout is not None:
            client.stdout.close()


def test_chaos_calls_across_8_procs_while_procs_are_killed(faults: Faults) -> None:
    """Calls keep flowing across 8 procs while 3 random procs are SIGKILLed: the client
    never hangs, every call returns or raises SupervisionError, healthy ranks answer."""
    pm = this_host().spawn_procs(per_host={"gpus": 8})
    try:
        w = pm.spawn("chaos", Worker)
        pids = w.pid.call().get(timeout=30).values()
        rng = random.Random(1234)
        victims = rng.sample(range(8), 3)
        stop = threading.Event()

        def killer() -> None:
            for v in victims:
                if stop.wait(0.15):
                    return
                os.kill(pids[v], signal.SIGKILL)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        outcomes = {"ok": 0, "failed": 0}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            rank = rng.randrange(8)
            try:
                assert w.slice(gpus=rank).ok.call_one().get(timeout=10) == rank
                outcomes["ok"] += 1
            except SupervisionError:
                outcomes["failed"] += 1
            try:
                w.ok.call().get(timeout=10)
            except SupervisionError:
                outcomes["failed"] += 1
        stop.set()
        t.join(10)
        healthy = [r for r in range(8) if r not in victims]
        for r in healthy:
            assert w.slice(gpus=r).ok.call_one().get(timeout=10) == r
        for r in victims:
            with pytest.raises(SupervisionError):
                w.slice(gpus=r).ok.call_one().get(timeout=10)
        assert outcomes["ok"] > 0 and outcomes["failed"] > 0
        assert sorted({f.rank for f in faults.wait_for(3, "chaos")}) == sorted(victims)
    finally:
        pm.stop().get(timeout=30)


class Parent(Actor):
    """Spawns a child mesh; records cleanup in a file (it runs in another process)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.child: Worker | None = None

    @endpoint
    def spawn_child(self, procs: ProcMesh) -> None:
        self.child = procs.spawn("stopped_child", Worker)
        self.child.ok.call().get(timeout=30)

    @endpoint
    def get_child(self) -> Worker:
        assert self.child is not None
        return self.child

    def __cleanup__(self, exc: Exception | None) -> None:
        with open(self.marker, "a") as f:
            f.write(f"cleanup exc={exc!r}\n")


def test_stop_runs_cleanup_and_stops_owned_meshes(procs: ProcMesh, tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "cleanup.txt")
    parent = procs.slice(gpus=0).spawn("parent", Parent, marker)
    parent.spawn_child.call_one(procs).get(timeout=30)
    child = parent.get_child.call_one().get(timeout=30)  # a reference to its mesh
    assert child.ok.call().get(timeout=30).values() == [0, 1]
    parent.stop().get(timeout=30)
    with open(marker) as f:
        assert f.read() == "cleanup exc=None\n"
    with pytest.raises(SupervisionError, match="stopped"):
        parent.get_child.call_one().get(timeout=30)
    # The child mesh was stopped with its owner, which waited for that stop before its
    # own completed.
    with pytest.raises(SupervisionError, match="stopped"):
        child.ok.call().get(timeout=30)


class SelfStopper(Actor):
    def __init__(self, marker: str, cleanup_seconds: float) -> None:
        self.marker = marker
        self.cleanup_seconds = cleanup_seconds

    @endpoint
    def stop_after_this(self) -> str:
        context().actor_instance.stop("done with it")
        return "last reply"

    @endpoint
    def ok(self) -> int:
        return 1

    def __cleanup__(self, exc: Exception | None) -> None:
        time.sleep(self.cleanup_seconds)
        with open(self.marker, "a") as f:
            f.write("cleaned\n")


def test_instance_stop_ends_the_actor_after_its_message(procs: ProcMesh, tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "m")
    s = procs.slice(gpus=0).spawn("self_stopper", SelfStopper, marker, 0)
    assert s.stop_after_this.call_one().get(timeout=30) == "last reply"
    with pytest.raises(SupervisionError, match="done with it"):
        s.ok.call_one().get(timeout=30)
    with open(marker) as f:
        assert f.read() == "cleaned\n"  # __cleanup__ ran before the next call was refused


def test_a_slow_sync_cleanup_does_not_hold_up_stop(
    tmp_path: object, capfd: pytest.CaptureFixture[str]
) -> None:
    """__cleanup__ gets the cleanup_timeout config key's time (3 s by default, the
    client's value in its procs); one sleeping 600 s does not block stop."""
    import monarch

    marker = os.path.join(str(tmp_path), "slow")
    with monarch.configured(cleanup_timeout="250ms"):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        s = procs.spawn("slow_cleanup", SelfStopper, marker, 600)
        s.stop().get(timeout=30)  # would time out if stop waited for the cleanup
    finally:
        procs.stop().get(timeout=30)  # the proc's stderr is forwarded by then
    assert not os.path.exists(marker)
    assert "did not finish within 0.25 s" in capfd.readouterr().err
