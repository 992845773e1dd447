"""Nested supervision trees: actors spawn procs and actors of their own, and failures
travel up the owner tree one level at a time.

The tree is client -> A -> B -> C, each level an actor on procs its parent spawned from
inside an endpoint (``this_host().spawn_procs``). C's proc is killed with SIGKILL; the
lowest level whose ``__supervise__`` handles the failure stops it, and every level above
never hears of it. A level that does not handle it fails in turn, naming the child mesh
whose failure it did not handle, and the report the next level gets carries the whole
chain down to the signal. Every ``__supervise__`` also sends what it saw to a port of
the test's, which the test waits on (no polling).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from monarch.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    PortReceiver,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
    this_host,
    this_proc,
)

if TYPE_CHECKING:  # the actors' procs import this module too: no test-only imports
    from conftest import Faults

pytestmark = pytest.mark.timeout(120)


class Leaf(Actor):
    """C: the bottom of the tree."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def paths(self) -> list[str]:
        me = context().actor_instance
        assert me.creator is not None
        return [str(me.creator), str(me)]


class Level(Actor):
    """A or B: spawns the next level on procs of its own and remembers the failures its
    ``__supervise__`` saw (and sends them to ``seen_port``); handles them when
    ``handles`` says so."""

    def __init__(self, handles: bool, seen_port: Port[tuple[str, str]]) -> None:
        self.handles = handles
        self.seen_port = seen_port
        self.seen: list[MeshFailure] = []
        self.below: Level | None = None
        self.leaf: Leaf | None = None
        self.procs: ProcMesh | None = None

    @endpoint
    def build(self, below: list[bool]) -> list[int]:
        """Spawn the levels below (``below``: whether each handles failures; empty: a
        Leaf). Returns the pids of this level's proc and of every level below it."""
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        if not below:
            self.leaf = self.procs.spawn("C", Leaf)
            return [os.getpid(), self.leaf.pid.call_one().get(timeout=60)]
        self.below = self.procs.spawn("B", Level, below[0], self.seen_port)
        return [os.getpid(), *self.below.build.call_one(below[1:]).get(timeout=60)]

    @endpoint
    def paths(self) -> list[str]:
        """The creator's path of each level from this one down, then the leaf's path."""
        me = context().actor_instance
        assert me.creator is not None
        below = self.below.paths if self.below is not None else self.leaf.paths  # type: ignore[union-attr]
        return [str(me.creator), *below.call_one().get(timeout=60)]

    @endpoint
    def seen_reports(self, depth: int = 0) -> list[str]:
        """The reports of the failures this level (``depth`` 0) or the one below saw."""
        if depth == 0:
            return [f.report() for f in self.seen]
        assert self.below is not None, "no level below"
        return self.below.seen_reports.call_one(depth - 1).get(timeout=30)

    @endpoint
    def alive(self) -> str:
        return context().actor_instance.name

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure)
        self.seen_port.send((context().actor_instance.name, failure.report()))
        return self.handles


def wait_exited(pids: list[int], timeout: float = 30) -> None:
    """Wait until every process of ``pids`` has exited (a pidfd becomes readable when
    its process ends)."""
    import select
    import time

    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # already gone (and reaped)
        try:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"process {pid} still runs {timeout} s later")
        finally:
            os.close(fd)


@pytest.fixture
def top() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    yield procs
    procs.stop().get(timeout=30)


def build(
    top: ProcMesh, a_handles: bool, b_handles: bool
) -> tuple[Level, list[int], PortReceiver[tuple[str, str]]]:
    port, seen = Channel[tuple[str, str]].open()
    a = top.spawn("A", Level, a_handles, port)
    pids = a.build.call_one([b_handles]).get(timeout=90)
    assert len(pids) == 3 and len(set(pids)) == 3, pids  # A, B and C: a proc each
    return a, pids, seen


def test_each_actors_path_runs_from_the_root_through_its_creators(top: ProcMesh) -> None:
    a, _, _ = build(top, a_handles=True, b_handles=True)
    a_creator, b_creator, c_creator, c = a.paths.call_one().get(timeout=60)
    level = "test_nested.Level"
    assert a_creator == "<root>"
    assert b_creator == f"<root>.<{level} A{{'procs': 0/1}}>"
    assert c_creator == f"{b_creator}.<{level} B{{'procs': 0/1}}>"
    assert c == f"{c_creator}.<test_nested.Leaf C{{'procs': 0/1}}>"


def test_an_actor_of_a_mesh_without_dimensions_has_no_coordinates_in_its_path() -> None:
    procs = this_host().spawn_procs()  # no per_host: one proc, no dimensions
    try:
        leaf = procs.spawn("solo", Leaf)
        assert leaf.paths.call_one().get(timeout=60) == ["<root>", "<root>.<test_nested.Leaf solo>"]
    finally:
        procs.stop().get(timeout=30)


def test_a_kill_at_the_bottom_is_handled_by_the_parent(top: ProcMesh, faults: Faults) -> None:
    a, (_, _, c_pid), seen = build(top, a_handles=False, b_handles=True)
    os.kill(c_pid, signal.SIGKILL)
    level, report = seen.recv().get(timeout=30)
    assert level == "B", (level, report)
    assert "actor mesh 'C'" in report and "SIGKILL" in report, report
    # Handled by B: B keeps serving (a call through A reaches it), so it never failed;
    # A and the client never hear of it.
    assert len(a.seen_reports.call_one(1).get(timeout=30)) == 1
    assert a.seen_reports.call_one().get(timeout=30) == []
    assert a.alive.call_one().get(timeout=30) == "A"
    assert not [f for f in faults.failures if f.mesh_name == "A"]


def test_an_unhandled_kill_fails_the_parent_and_reaches_the_grandparent(
    top: ProcMesh, faults: Faults
) -> None:
    a, (_, _, c_pid), seen = build(top, a_handles=True, b_handles=False)
    os.kill(c_pid, signal.SIGKILL)
    # B sees it first and does not handle it; then A does. (B and A report from
    # different procs, so their reports may reach the client in either order.)
    reports = dict(seen.recv().get(timeout=30) for _ in range(2))
    assert sorted(reports) == ["A", "B"], reports
    assert "actor mesh 'C'" in reports["B"], reports
    report = reports["A"]
    # A hears that B failed because of C, and how C died: the first paragraph (the
    # headline, the attribution, the cause) names both.
    first = " ".join(report.splitlines()[:3])
    assert "actor mesh 'B'" in first and "'C'" in first, report
    assert f"pid {c_pid}" in report and "SIGKILL" in report, report
    # A handled it, so A keeps serving; B failed: A's call to it raises
    # SupervisionError, which reaches the client as the ActorError of A's endpoint.
    assert a.alive.call_one().get(timeout=30) == "A"
    assert not [f for f in faults.failures if f.mesh_name == "A"]
    with pytest.raises(ActorError, match="SupervisionError: actor mesh 'B'"):
        a.seen_reports.call_one(1).get(timeout=30)


def test_unhandled_at_every_level_the_client_hook_gets_the_whole_chain(
    top: ProcMesh, faults: Faults
) -> None:
    a, (a_pid, _, c_pid), seen = build(top, a_handles=False, b_handles=False)
    os.kill(c_pid, signal.SIGKILL)
    # From different procs: either order of arrival.
    assert sorted(seen.recv().get(timeout=30)[0] for _ in range(2)) == ["A", "B"]
    [failure] = faults.wait_for(1, "A")
    report = failure.report()
    assert f"pid {a_pid}" in str(failure) and "'B'" in str(failure), str(failure)
    assert "'C'" in report and f"pid {c_pid}" in report and "SIGKILL" in report, report
    # Every level names its actor by its path and says what kind of failure it was.
    level, leaf = "test_nested.Level", "test_nested.Leaf"
    a_path = f"<root>.<{level} A{{'procs': 0/1}}>"
    b_path = f"{a_path}.<{level} B{{'procs': 0/1}}>"
    c_path = f"{b_path}.<{leaf} C{{'procs': 0/1}}>"
    unhandled = "This occurred because it did not handle the failure of an actor mesh it owns"
    for path, why in [
        (a_path, unhandled),
        (b_path, unhandled),
        (c_path, "This occurred because its process failed (process failure: Killed(sig=9))."),
    ]:
        assert f"The actor {path} failed. {why}" in report, report
    with pytest.raises(SupervisionError, match="actor mesh 'A'"):
        a.alive.call_one().get(timeout=30)


def test_stopping_a_level_stops_everything_it_spawned(top: ProcMesh) -> None:
    _, (a_pid, b_pid, c_pid), _ = build(top, a_handles=True, b_handles=True)
    top.stop().get(timeout=30)
    wait_exited([a_pid, b_pid, c_pid])


class Sibling(Actor):
    @endpoint
    def fail(self) -> None:
        context().actor_instance.kill()


class LocalOwner(Actor):
    """Spawns actors in its own proc with ``this_proc().spawn``."""

    def __init__(self, seen_port: Port[str]) -> None:
        self.seen_port = seen_port

    @endpoint
    def spawn_and_fail_child(self, how: str) -> int:
        if how == "this_proc":
            child = this_proc().spawn("local_child", Sibling)
        else:  # the instance's own proc, as a ProcMesh
            child = context().actor_instance.proc.spawn("local_child", Sibling)
        child.fail.broadcast()
        return os.getpid()

    @endpoint
    def alive(self) -> bool:
        return True

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen_port.send(str(failure))
        return True


@pytest.mark.parametrize("how", ["this_proc", "instance.proc"])
def test_spawning_on_its_own_proc_inside_an_endpoint_is_supervised_by_the_spawner(
    top: ProcMesh, how: str
) -> None:
    port, seen = Channel[str].open()
    owner = top.spawn("local_owner", LocalOwner, port)
    pid = owner.spawn_and_fail_child.call_one(how).get(timeout=30)
    report = seen.recv().get(timeout=30)
    assert "actor mesh 'local_child'" in report and f"pid {pid}" in report, report
    assert owner.alive.call_one().get(timeout=30)
