"""Members of ``HostMesh`` that upstream's scripts use: ``is_fake_in_process``, and
``with_python_executable``, whose interpreter the procs that actors spawn use too."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

import monarch
from monarch.actor import Actor, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


def test_host_meshes_are_not_fake() -> None:
    assert this_host().is_fake_in_process is False


class Nester(Actor):
    @endpoint
    def nested_python(self) -> str:
        procs = this_host().spawn_procs(per_host={"inner": 1})
        try:
            return procs.spawn("inner", Reporter).python.call_one().get(timeout=60)
        finally:
            procs.stop().get(timeout=60)


class Reporter(Actor):
    @endpoint
    def python(self) -> str:
        return os.environ.get("MONARCH_TEST_WRAPPER", "")


def test_with_python_executable_applies_to_procs_that_actors_spawn(tmp_path: Path) -> None:
    # A wrapper interpreter that notes each start in a file, then runs the real one.
    log = tmp_path / "starts"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho start >> "{log}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    # A fresh interpreter per proc, so that every proc start goes through the wrapper.
    with monarch.configured(spawn_fork_server=False):
        procs = this_host().with_python_executable(str(wrapper)).spawn_procs(per_host={"outer": 1})
    try:
        procs.spawn("nester", Nester).nested_python.call_one().get(timeout=90)
    finally:
        procs.stop().get(timeout=60)
    # The outer proc and the one its actor spawned both started through it.
    assert log.read_text().split() == ["start", "start"]


def _failing_bootstrap() -> None:
    raise ValueError("bootstrap refused")


def test_a_failing_bootstrap_surfaces_on_initialized_not_at_spawn() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_failing_bootstrap)
    # spawn_procs returned: the failure is the procs', reported where upstream does.
    with pytest.raises(RuntimeError, match="failed to start") as info:
        procs.initialized.get(timeout=60)
    assert "bootstrap refused" in str(info.value)  # the proc's last lines
    procs.stop().get(timeout=60)


class Affinity(Actor):
    @endpoint
    def cpus(self) -> list[int]:
        import threading

        # The proc's main thread and a thread started now: both bound.
        seen: list[set[int]] = []
        t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
        assert seen[0] == os.sched_getaffinity(0)
        return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs to bind procs apart")
def test_proc_bind_binds_each_proc_to_its_cpus() -> None:
    procs = this_host().spawn_procs(
        per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}, {"physcpubind": "1"}]
    )
    try:
        got = procs.spawn("affinity", Affinity).cpus.call().get(timeout=60)
        assert got.item(gpus=0) == [0] and got.item(gpus=1) == [1]
    finally:
        procs.stop().get(timeout=60)


def _node0_cpus() -> list[int] | None:
    from monarch._src.actor.proc_bind import parse_list

    try:
        with open("/sys/devices/system/node/node0/cpulist") as f:
            return sorted(parse_list(f.read().strip()))
    except OSError:
        return None


@pytest.mark.skipif(
    _node0_cpus() in (None, sorted(os.sched_getaffinity(0))),
    reason="no NUMA node 0 with a part of the CPUs here (binding to it would show nothing)",
)
def test_proc_bind_cpunodebind_uses_the_nodes_cpus() -> None:
    node0 = _node0_cpus()
    procs = this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpunodebind": "0"}])
    try:
        assert procs.spawn("node", Affinity).cpus.call_one().get(timeout=60) == node0
    finally:
        procs.stop().get(timeout=60)


def test_proc_bind_entries_are_checked() -> None:
    with pytest.raises(ValueError, match="expected keys among"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cores": "0"}])
    with pytest.raises(ValueError, match="expected a list like"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "3-1"}])
    with pytest.raises(ValueError, match="one per proc"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
