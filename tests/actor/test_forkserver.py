"""Procs forked from a host's fork server (a template interpreter), and the plain path.

A host forks the procs of the default bootstrap command from one template process per
program; these tests check that a forked proc is the same proc an exec'd one would be
(own process group, stdin pipe, bootstrap variables, stderr prefixed), that its exit is
reported and reaped, that the template never outlives its procs or its host, and that
``spawn_fork_server=False`` or a custom bootstrap command starts fresh interpreters.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING

import pytest

from monarch._src import config
from monarch.actor import Actor, SupervisionError, endpoint, this_host
from proc_state import running

if TYPE_CHECKING:  # not imported at run time: procs unpickling this module lack it
    from conftest import Faults

pytestmark = pytest.mark.timeout(90)


class Probe(Actor):
    @endpoint
    def info(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "pgid": os.getpgid(0),
            "rank": os.environ.get("HYPERACTOR_MESH_PROC_RANK"),
            "stdin": os.readlink("/proc/self/fd/0"),
            "stderr": os.readlink("/proc/self/fd/2"),
            "fork_fd": os.environ.get("MONARCH_FORK_SERVER_FD"),
        }

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def collector(self) -> tuple[int, int]:
        """How many objects the collector ignores, and how many of a fresh cycle it
        collects."""
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        return gc.get_freeze_count(), gc.collect()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _exists(pid: int) -> bool:
    """Running or a zombie nobody reaped."""
    return os.path.exists(f"/proc/{pid}")


def _wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.02)


def test_procs_are_forked_from_one_template_that_exits_with_them() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="forked")
    probes = pm.spawn("probe", Probe)
    infos = [v for _, v in probes.info.call().get(timeout=60).items()]
    templates = {i["ppid"] for i in infos}
    assert len(templates) == 1, f"procs of one spawn have several parents: {infos}"
    (template,) = templates
    assert template != os.getpid()
    assert "monarch._src.actor.forkserver" in _cmdline(template)
    assert sorted(i["rank"] for i in infos) == ["0", "1", "2", "3"]
    for i in infos:
        assert i["pgid"] == i["pid"], "a forked proc leads its own process group"
        assert i["stdin"].startswith("pipe:"), "stdin is the host's stop pipe"
        assert i["stderr"].startswith("pipe:"), "stderr is the host's prefixing pipe"
        assert i["fork_fd"] is None, "the template's socket variable is not inherited"
    # A second spawn reuses the running template.
    more = this_host().spawn_procs(per_host={"gpus": 2}, name="forked_more")
    again = [v for _, v in more.spawn("probe", Probe).info.call().get(timeout=60).items()]
    assert {i["ppid"] for i in again} == {template}
    pids = [i["pid"] for i in infos + again]
    pm.stop().get(timeout=30)
    more.stop().get(timeout=30)
    # Reaped (no zombies left under the template), and the template itself is gone.
    _wait_until(lambda: not any(_exists(p) for p in pids), 10, "the procs are reaped")
    _wait_until(lambda: not running(template), 10, "the idle template exits")


def test_a_killed_forked_proc_is_reported_and_reaped(faults: Faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="forked_kill")
    probes = pm.spawn("probe_kill", Probe)
    try:
        victim = probes.slice(gpus=1).info.call_one().get(timeout=60)
        pending = probes.slice(gpus=1).sleep.call_one(60)
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="died"):
            pending.get(timeout=30)
        failure = faults.wait_for(1, "probe_kill")[0]
        assert failure.rank == 1 and "SIGKILL" in failure.report()
        _wait_until(lambda: not _exists(victim["pid"]), 10, "the killed proc is reaped")
        assert probes.slice(gpus=0).info.call_one().get(timeout=30)["rank"] == "0"
    finally:
        pm.stop().get(timeout=30)


def test_a_killed_template_fails_its_procs_and_the_next_spawn_gets_a_new_one(
    faults: Faults,
) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="forked_lost")
    probes = pm.spawn("probe_lost", Probe)
    infos = [v for _, v in probes.info.call().get(timeout=60).items()]
    template = infos[0]["ppid"]
    pending = probes.slice(gpus=0).sleep.call_one(60)
    os.kill(template, signal.SIGKILL)
    with pytest.raises(SupervisionError):
        pending.get(timeout=30)
    assert len(faults.wait_for(2, "probe_lost")) == 2
    _wait_until(lambda: not any(running(i["pid"]) for i in infos), 10, "its procs die")
    fresh = this_host().spawn_procs(per_host={"gpus": 2}, name="forked_after")
    try:
        after = [v for _, v in fresh.spawn("probe", Probe).info.call().get(timeout=60).items()]
        assert {i["ppid"] for i in after} != {template}
        assert all("forkserver" in _cmdline(i["ppid"]) for i in after)
    finally:
        fresh.stop().get(timeout=30)
        pm.stop().get(timeout=30)


def test_a_forked_procs_collector_leaves_the_templates_objects_alone() -> None:
    """What the template imported is frozen before each fork: a proc's collections do
    not write to those objects (which would copy their shared pages) and are cheap,
    which is most of a stopping proc's work. Its own garbage is still collected."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="frozen")
    try:
        frozen, collected = pm.spawn("probe", Probe).collector.call_one().get(timeout=60)
    finally:
        pm.stop().get(timeout=30)
    # The template holds the runtime's modules: tens of thousands of objects.
    assert frozen > 10_000, f"the template froze only {frozen} objects"
    assert collected >= 1, "the proc's own cycle was not collected"
    with config.configured(spawn_fork_server=False):
        plain = this_host().spawn_procs(per_host={"gpus": 1}, name="not_frozen")
    try:
        frozen, _ = plain.spawn("probe", Probe).collector.call_one().get(timeout=60)
    finally:
        plain.stop().get(timeout=30)
    assert frozen == 0, "a fresh interpreter freezes nothing"


def test_fork_server_off_starts_a_fresh_interpreter_per_proc() -> None:
    with config.configured(spawn_fork_server=False):
        pm = this_host().spawn_procs(per_host={"gpus": 2}, name="plain")
    try:
        infos = [v for _, v in pm.spawn("probe", Probe).info.call().get(timeout=60).items()]
        assert {i["ppid"] for i in infos} == {os.getpid()}
    finally:
        pm.stop().get(timeout=30)


_CLIENT = textwrap.dedent(
    """
    import os, sys
    from monarch.actor import Actor, endpoint, this_host

    class Probe(Actor):
        @endpoint
        def pids(self) -> list:
            print(f"forked proc {os.getpid()} writes to stderr", file=sys.stderr, flush=True)
            return [os.getpid(), os.getppid()]

    pm = this_host().spawn_procs(per_host={"gpus": 3}, name="orphans")
    pids = set()
    for _, (pid, ppid) in pm.spawn("p", Probe).pids.call().get(timeout=60).items():
        pids.update((pid, ppid))
    print(" ".join(map(str, sorted(pids))), flush=True)
    sys.stdin.read()
    """
)


def test_a_sigkilled_client_leaves_no_template_and_no_forked_proc() -> None:
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stderr is not None
        line = client.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 4, f"expected 3 procs and their template, got {line!r}"
        # The forked proc's stderr is a pipe its host reads: the line reaches the
        # client's stderr, prefixed (forwarded, so possibly after the reply).
        stderr = ""
        while "[orphans 0] forked proc" not in stderr:
            got = client.stderr.readline()
            assert got, f"the client's stderr ended without the proc's line: {stderr}"
            stderr += got
        client.kill()
        client.wait(timeout=10)
        _wait_until(lambda: not any(running(p) for p in pids), 5, "all die with the client")
    finally:
        client.kill()
        client.wait(timeout=10)
        for stream in (client.stdin, client.stdout, client.stderr):
            if stream is not None:
                stream.close()
