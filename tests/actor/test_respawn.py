"""Respawning after a failure (issue 37): new procs on the host of a proc that died, on
the surviving host of a mesh that lost one, and on the surviving procs of a failed mesh;
slices of the surviving ranks keep answering; repeated kill/respawn leaks no process,
file descriptor or socket file.

docs/supervision.md, "After a failure: spawning again", says what these tests prove.
Each failure is awaited through the client's fault hook (the session's recorder, which
signals a condition), never by sleeping.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from monarch.actor import Actor, ProcMesh, SupervisionError, context, endpoint, this_host
from monarch.job import ProcessJob
from proc_state import running

if TYPE_CHECKING:  # not imported at run time: procs unpickling this module lack it
    from conftest import Faults

pytestmark = pytest.mark.timeout(120)


class Member(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def rank(self) -> int:
        """This actor's rank in its mesh (``current_rank()`` is relative to the call's
        slice)."""
        return context().actor_instance.rank.rank

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def exit_hard(self) -> None:
        os._exit(3)


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    assert pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


def _kill(members: Member, how: str) -> None:
    """Kill the proc of ``members`` (one rank) the way ``how`` names."""
    if how == "sigkill":
        pid = members.pid.call_one().get(timeout=60)
        os.kill(pid, signal.SIGKILL)
    else:
        members.exit_hard.broadcast()


@pytest.mark.parametrize("how", ["os_exit", "sigkill"])
def test_after_a_proc_dies_survivors_answer_and_new_procs_spawn(
    procs: ProcMesh, faults: Faults, how: str
) -> None:
    name = f"respawn_{how}"
    members = procs.spawn(name, Member)
    pids = members.pid.call().get(timeout=60)
    assert len(set(pids.values())) == 3
    killed_at = time.monotonic()
    _kill(members.slice(gpus=1), how)
    [failure] = faults.wait_for(1, name)
    hook_s = time.monotonic() - killed_at
    assert failure.rank == 1 and "died" in failure.report(), failure.report()
    with pytest.raises(SupervisionError, match="died"):
        members.slice(gpus=1).pid.call_one().get(timeout=30)
    # The surviving ranks' slices keep answering, one by one and together.
    survivors = [members.slice(gpus=0), members.slice(gpus=2)]
    assert [s.rank.call_one().get(timeout=30) for s in survivors] == [0, 2]
    assert sorted(members.slice(gpus=slice(2, 3)).pid.call().get(timeout=30).values()) == [
        pids.item(gpus=2)
    ]
    # A new proc mesh on the same host spawns and answers.
    again = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        fresh = again.spawn(f"{name}_fresh", Member)
        fresh_pids = fresh.pid.call().get(timeout=60)
        answered_s = time.monotonic() - killed_at
        assert len(set(fresh_pids.values()) - set(pids.values())) == 2
        # A new actor mesh on each surviving proc of the failed mesh spawns and answers.
        for gpu in (0, 2):
            on_survivor = procs.slice(gpus=gpu).spawn(f"{name}_on_{gpu}", Member)
            assert on_survivor.pid.call_one().get(timeout=60) == pids.item(gpus=gpu)
        print(
            f"{how}: the fault hook ran {hook_s:.3f} s after the kill; a new proc mesh "
            f"answered {answered_s:.3f} s after it"
        )
    finally:
        again.stop().get(timeout=60)


@pytest.mark.timeout(180)
def test_after_a_host_is_lost_the_surviving_host_spawns(faults: Faults) -> None:
    """A 2-host ProcessJob loses a whole worker (its process group SIGKILLed): the procs
    of the surviving host keep answering, and new procs spawn there."""
    from monarch._src.job import job as job_impl

    job = ProcessJob({"hosts": 2})
    procs = again = None
    try:
        hosts = job.state(cached_path=None).hosts
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        members = procs.spawn("host_lost", Member)
        pids = members.pid.call().get(timeout=60)
        assert len(pids) == 4
        running_job = job._running
        assert isinstance(running_job, ProcessJob) and running_job._workers is not None
        victim = running_job._workers.all()[1]
        killed_at = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)
        failures = faults.wait_for(2, "host_lost")
        hook_s = time.monotonic() - killed_at
        assert sorted(f.rank for f in failures) == [2, 3], [str(f) for f in failures]
        with pytest.raises(SupervisionError):
            members.slice(hosts=1).pid.call().get(timeout=30)
        # The surviving host's ranks keep answering...
        survivors = members.slice(hosts=0).pid.call().get(timeout=30)
        assert sorted(survivors.values()) == sorted(pids.item(hosts=0, gpus=g) for g in (0, 1))
        # ... and new procs spawn on it.
        again = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 2})
        fresh = again.spawn("host_lost_fresh", Member)
        assert fresh.rank.call().get(timeout=60).values() == [0, 1]
        answered_s = time.monotonic() - killed_at
        assert sorted(members.slice(hosts=0).pid.call().get(timeout=30).values()) == sorted(
            survivors.values()
        )
        print(
            f"host lost: the fault hook ran {hook_s:.3f} s after the kill; new procs on "
            f"the surviving host answered {answered_s:.3f} s after it"
        )
        job_impl._children[victim.pid].wait(timeout=30)
    finally:
        for mesh in (again, procs):
            if mesh is not None:
                mesh.stop().get(timeout=60)
        job.kill()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> list[int]:
    """The live processes whose parent is this one (exited ones awaiting a wait, no)."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[1] == me and running(int(entry)):
            found.append(int(entry))
    return found


def _socket_dir() -> Path:
    """The directory of this process's Unix socket (its proc id is
    ``name@unix:/dir/<pid>-<n>-<hex>.sock``)."""
    from monarch._src.actor import process

    address = process.get().proc_id.split("@", 1)[1].removeprefix("unix:").removeprefix("@")
    return Path(address).parent


def _socket_files(directory: Path, pids: set[int]) -> list[str]:
    """The socket files in ``directory`` of the processes ``pids`` (the directory is
    shared with every other monarch process of this user: only ours are counted)."""
    return sorted(f for f in os.listdir(directory) if f.split("-", 1)[0] in {str(p) for p in pids})


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition()`` until true or ``timeout``: what it reads (``/proc``, a
    directory) gives nothing to wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


CYCLES = 15
#: File descriptors the client may hold beyond what it held after the first cycle.
FD_SLACK = 8


@pytest.mark.timeout(300)
def test_repeated_kill_and_respawn_leaks_nothing(faults: Faults) -> None:
    """15 cycles of: spawn 2 procs, SIGKILL one, spawn a new one, stop all. After them
    the client holds no more file descriptors than after the first (plus a little
    slack), has no child process left, and the socket directory holds no more files
    than before."""
    sockets = _socket_dir()
    me = os.getpid()
    before = _socket_files(sockets, {me})
    seen: set[int] = set()  # every proc the cycles started
    fds_after_first = 0
    for cycle in range(CYCLES):
        name = f"cycle_{cycle}"
        pair = this_host().spawn_procs(per_host={"gpus": 2})
        members = pair.spawn(name, Member)
        pids = members.pid.call().get(timeout=60)
        os.kill(pids.item(gpus=1), signal.SIGKILL)
        faults.wait_for(1, name)
        single = this_host().spawn_procs(per_host={"gpus": 1})
        new_pid = single.spawn(f"{name}_new", Member).pid.call_one().get(timeout=60)
        assert new_pid not in pids.values()
        assert members.slice(gpus=0).pid.call_one().get(timeout=30) == pids.item(gpus=0)
        single.stop().get(timeout=60)
        pair.stop().get(timeout=60)
        seen.update([*pids.values(), new_pid])
        if cycle == 0:
            fds_after_first = _open_fds()
    assert len(seen) == 3 * CYCLES
    # Stopped procs exit soon after their stop is confirmed and remove their socket
    # files; a killed proc's file is swept by the next process that serves there.
    assert _wait_until(lambda: not _children(), 30), f"children left: {_children()}"
    assert _wait_until(lambda: _socket_files(sockets, seen | {me}) == before, 30), (
        f"{sockets} held {before} of this test's processes before the cycles, now "
        f"{_socket_files(sockets, seen | {me})}"
    )
    fds = _open_fds()
    print(f"after {CYCLES} cycles: {fds} fds (after the first: {fds_after_first})")
    assert fds <= fds_after_first + FD_SLACK, (
        f"the client holds {fds} file descriptors after {CYCLES} kill/respawn cycles, "
        f"{fds_after_first} after the first: {sorted(os.listdir('/proc/self/fd'))}"
    )
