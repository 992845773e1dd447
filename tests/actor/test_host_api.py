"""Members of ``HostMesh`` that upstream's scripts use: ``is_fake_in_process``,
``with_python_executable``, whose interpreter the procs that actors spawn use too, and
``spawn_procs(bootstrap_command=...)`` with a function giving each point its command."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import monarch
from monarch.actor import (
    Actor,
    ActorError,
    BootstrapCommand,
    Point,
    ProcMesh,
    default_bootstrap_cmd,
    endpoint,
    this_host,
)
from monarch.job import ProcessJob

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
    # spawn_procs returned: the failure is the procs', reported where upstream does, as
    # upstream's ActorError, with the bootstrap function's traceback.
    errors = []
    for _ in range(2):
        with pytest.raises(ActorError) as info:
            procs.initialized.get(timeout=60)
        errors.append(info.value)
    error = errors[0]
    assert type(error) is ActorError
    assert isinstance(error.exception, ValueError)
    assert str(error.exception) == "bootstrap refused"
    assert "bootstrap function given to spawn_procs raised on rank" in error.message
    assert "Traceback of where the remote call failed" in str(error)
    assert "in _failing_bootstrap" in str(error)  # the function's own frame
    assert "ValueError: bootstrap refused" in str(error)
    assert str(errors[1]) == str(error)  # asked again, the same answer

    async def awaited() -> None:
        await procs.initialized

    with pytest.raises(ActorError, match="bootstrap refused"):
        asyncio.run(asyncio.wait_for(awaited(), 60))
    procs.stop().get(timeout=60)


def _exits_at_bootstrap() -> None:
    os._exit(3)


def test_procs_that_cannot_start_otherwise_raise_runtime_error() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_exits_at_bootstrap)
    with pytest.raises(RuntimeError, match="failed to start") as info:
        procs.initialized.get(timeout=60)
    assert "exit status: 3" in str(info.value)
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


# --- per-point bootstrap commands ----------------------------------------------------------


class Argv(Actor):
    @endpoint
    def seen(self) -> tuple[str | None, list[str]]:
        return os.environ.get("POINT_TAG"), sys.argv[1:]


def _per_point(point: Point) -> BootstrapCommand:
    tag = "-".join(f"{k}{v}" for k, v in point.items())
    command = default_bootstrap_cmd().with_env({"POINT_TAG": tag})
    command.args = ["-m", "monarch._src.actor.bootstrap", f"rank={point.rank}"]
    return command


def _seen_by_point(procs: ProcMesh) -> dict[str, tuple[str | None, list[str]]]:
    try:
        seen = procs.spawn("argv", Argv).seen.call().get(timeout=90)
        return {"-".join(f"{k}{v}" for k, v in p.items()): got for p, got in seen}
    finally:
        procs.stop().get(timeout=60)


def test_a_per_point_bootstrap_command_gives_each_proc_its_own() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=_per_point)
    assert _seen_by_point(procs) == {
        "gpus0": ("gpus0", ["rank=0"]),
        "gpus1": ("gpus1", ["rank=1"]),
    }


def test_per_point_commands_follow_the_points_across_hosts() -> None:
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        procs = hosts.spawn_procs(per_host={"gpus": 2}, bootstrap_command=_per_point)
        assert _seen_by_point(procs) == {
            f"hosts{h}-gpus{g}": (f"hosts{h}-gpus{g}", [f"rank={2 * h + g}"])
            for h in range(2)
            for g in range(2)
        }
    finally:
        job.kill()


def test_a_per_point_function_is_called_with_each_point_of_the_proc_mesh() -> None:
    points: list[Point] = []

    def record(point: Point) -> BootstrapCommand:
        points.append(point)
        return default_bootstrap_cmd()

    procs = this_host().spawn_procs(per_host={"replica": 2, "gpus": 2}, bootstrap_command=record)
    try:
        assert [(p.rank, dict(p)) for p in points] == [
            (2 * r + g, {"replica": r, "gpus": g}) for r in range(2) for g in range(2)
        ]
        assert procs.initialized.get(timeout=90) is True
    finally:
        procs.stop().get(timeout=60)


def test_a_per_point_function_returning_something_else_is_a_type_error() -> None:
    def wrong(point: Point) -> Any:
        return ["python", "-m", "x"] if point.rank == 1 else default_bootstrap_cmd()

    with pytest.raises(TypeError, match=r"for point \{'gpus': 1\} \(rank 1\): expected a Boot"):
        this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=wrong)
    with pytest.raises(TypeError, match="expected a BootstrapCommand, got str"):
        this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command="python")  # type: ignore[arg-type]


def test_a_per_point_function_that_raises_surfaces_its_error() -> None:
    def refuse(point: Point) -> BootstrapCommand:
        raise LookupError(f"no command for {point.rank}")

    with pytest.raises(LookupError, match="no command for 0") as info:
        this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=refuse)
    if sys.version_info >= (3, 11):
        assert "bootstrap_command({'gpus': 0}) (rank 0)" in str(info.value.__notes__)


WORKERS_BY_MODULE = """
import signal, subprocess, sys, tempfile
from monarch.actor import Actor, attach_to_workers, endpoint

class Hello(Actor):
    @endpoint
    def doit(self) -> str:
        return "hello!"

with tempfile.TemporaryDirectory() as d:
    addresses = [f"ipc://{d}/{i}" for i in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "monarch.tools.worker", "--addr", a],
            stdout=subprocess.PIPE,
            text=True,
        )
        for a in addresses
    ]
    try:
        for w in workers:
            print(w.stdout.readline().strip(), flush=True)
        hosts = attach_to_workers(ca="trust_all_connections", workers=addresses)
        print(hosts.spawn_procs().spawn("hello", Hello).doit.call().get(timeout=60).values())
        hosts.shutdown().get(timeout=60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
            print("worker exit status", w.wait(timeout=30), flush=True)
"""


def test_python_m_monarch_tools_worker_serves_a_worker() -> None:
    """Upstream Monarch's way to start a worker, ``python -m monarch.tools.worker --addr
    ADDRESS``, is ``monarch worker --address ADDRESS``."""
    out = subprocess.run(
        [sys.executable, "-c", WORKERS_BY_MODULE], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" at ")[0] for line in lines[:2]] == ["monarch worker ready"] * 2, lines
    assert "['hello!', 'hello!']" in lines, lines
    assert lines[-2:] == ["worker exit status 0"] * 2, lines
