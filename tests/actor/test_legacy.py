"""The spellings of earlier releases: ``proc_mesh(...)``, ``await proc_mesh(...)``,
``await procs.spawn(...)``; each still works and warns with today's spelling. The blog
post's DDP script (``blog_ddp.py``) runs unchanged."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import monarch.actor
from monarch._src.actor import cuda_devices
from monarch.actor import Actor, ProcMesh, ValueMesh, current_rank, endpoint, this_host
from monarch.actor import proc_mesh as legacy_proc_mesh

HERE = Path(__file__).resolve().parent


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start
        self.rank = current_rank().rank

    @endpoint
    def incr(self) -> int:
        self.value += 1
        return self.value

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


class Spawner(Actor):
    """Returns meshes from its endpoints (the runtime awaits what an async endpoint's
    coroutine is, never the mesh it returns)."""

    def __init__(self) -> None:
        # Awaiting a mesh here would warn: make that an error this proc cannot miss.
        warnings.simplefilter("error", DeprecationWarning)

    @endpoint
    async def make(self) -> Counter:
        return monarch.actor.this_proc().spawn("child", Counter, 40)


# --- proc_mesh ---------------------------------------------------------------------------


def test_proc_mesh_is_given_but_not_exported() -> None:
    assert "proc_mesh" not in monarch.actor.__all__
    assert "proc_mesh" not in vars(monarch.actor)
    assert monarch.actor.proc_mesh is legacy_proc_mesh
    with pytest.raises(AttributeError, match="no attribute 'local_proc_mesh'"):
        monarch.actor.local_proc_mesh  # noqa: B018


@pytest.mark.timeout(90)
def test_proc_mesh_warns_with_todays_spelling() -> None:
    with pytest.warns(DeprecationWarning) as record:
        procs = legacy_proc_mesh(gpus=2, env={"LEGACY_ENV": "on"})
    try:
        message = str(record[0].message)
        assert record[0].filename == __file__  # points at the caller
        assert "this_host().spawn_procs(per_host={'gpus': 2}, env={...})" in message
        assert "'hosts': 1" in message and "without await" in message
        assert isinstance(procs, ProcMesh)
        assert procs.sizes == {"hosts": 1, "gpus": 2}
        counters = procs.spawn("counters", Counter, 0)
        assert counters.env.call("LEGACY_ENV").get(timeout=60).values() == ["on", "on"]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_proc_mesh_hosts_and_default_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_devices, "local_gpu_count", lambda: 0)
    # The old form never pins GPUs: the decision is not even asked for.
    monkeypatch.setattr(cuda_devices, "spawn_variables", pytest.fail)
    with pytest.warns(DeprecationWarning, match=r"per_host=\{'hosts': 2, 'gpus': 1\}"):
        procs = legacy_proc_mesh(hosts=2, setup=lambda: None)
    try:
        assert procs.sizes == {"hosts": 2, "gpus": 1}
        assert procs.initialized.get(timeout=60) is True
    finally:
        procs.stop().get(timeout=30)
    with pytest.raises(TypeError, match="positive int"):
        legacy_proc_mesh(gpus="2")  # type: ignore[arg-type]


# --- awaitable meshes --------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_await_proc_mesh_and_spawn() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})

    async def run() -> None:
        with pytest.warns(DeprecationWarning, match=r"await procs\.initialized"):
            assert await procs is procs
        counters = procs.spawn("counters", Counter, 10)  # plain spawn: no warning
        with pytest.warns(DeprecationWarning, match=r"await actors\.initialized") as record:
            same = await counters
        assert same is counters
        assert record[0].filename == __file__
        assert "procs.spawn('name', MyActor)" in str(record[0].message)
        assert (await counters.incr.call()).values() == [11, 11]

    try:
        asyncio.run(run())
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_awaiting_a_mesh_that_cannot_start_raises() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    procs.stop().get(timeout=30)
    counters = procs.spawn("late", Counter, 0)

    async def run() -> None:
        with (
            pytest.warns(DeprecationWarning),
            pytest.raises(RuntimeError, match="already been stopped"),
        ):
            await counters

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_meshes_are_awaitable_value_meshes_are_not() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        counters = procs.spawn("counters", Counter, 0)
        assert inspect.isawaitable(procs) and inspect.isawaitable(counters)
        result = counters.incr.call().get(timeout=60)
        assert isinstance(result, ValueMesh) and not inspect.isawaitable(result)
        assert not inspect.isawaitable(this_host())
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_an_endpoint_returning_a_mesh_returns_it() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        spawner = procs.spawn("spawner", Spawner)
        child = spawner.make.call_one().get(timeout=60)
        assert child.incr.call_one().get(timeout=60) == 41
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_a_value_mesh_iterates_as_point_value_pairs() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        result = procs.spawn("counters", Counter, 0).incr.call().get(timeout=60)
        assert len(result) == 3
        assert [(dict(point), value) for point, value in result] == [
            ({"gpus": g}, 1) for g in range(3)
        ]
        assert [value for point, value in result] == result.values()
    finally:
        procs.stop().get(timeout=30)


# --- the blog's script --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(180)
def test_the_blog_script_runs_unchanged() -> None:
    env = {**os.environ, "DDP_MASTER_PORT": str(_free_port())}
    out = subprocess.run(
        [sys.executable, str(HERE / "blog_ddp.py")],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    stdout = out.stdout
    for rank in (0, 1):
        assert f"self.rank={rank} Finished running basic DDP example" in stdout
        assert re.search(rf"Rank {rank}: PID=\d+, Device=cpu, GPU Memory=0.0MB", stdout)
    assert "Found 2 ranks in the mesh" in stdout
    losses = re.findall(r"Losses across ranks: \['([\d.]+)', '([\d.]+)'\]", stdout)
    norms = re.findall(r"Gradient norms: \['([\d.]+)', '([\d.]+)'\]", stdout)
    assert len(losses) == 3 and len(norms) == 3
    assert all(a == b for a, b in norms), norms  # DDP averaged the gradients
    assert "DDP example completed successfully!" in stdout
    # Each old form warned once, with today's spelling.
    warned = [line for line in out.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(warned) == 3, out.stderr[-4000:]
    assert "this_host().spawn_procs(per_host={'gpus': 2}, env={...})" in warned[0]
    assert "awaiting a ProcMesh is deprecated" in warned[1]
    assert "awaiting the actor mesh spawn returns is deprecated" in warned[2]
