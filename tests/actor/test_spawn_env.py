"""spawn_procs(env=...), and CUDA_VISIBLE_DEVICES for the procs of a "gpus" dimension.

This machine has no GPU: the decision is tested with made-up GPU counts, as functions
and end to end, with procs whose entry point counts a given number of GPUs (a
``bootstrap_command`` that replaces ``local_gpu_count`` before serving).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch._src.actor import cuda_devices
from monarch._src.actor.cuda_devices import (
    PIN_ENV,
    device_for_proc,
    local_gpu_count,
    pin_this_proc,
    spawn_variables,
)
from monarch.actor import Actor, BootstrapCommand, HostMesh, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.job import ProcessJob

CVD = "CUDA_VISIBLE_DEVICES"


class Env(Actor):
    @endpoint
    def get(self, names: list[str]) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}


def env_of(procs: ProcMesh, *names: str) -> list[tuple[dict[str, int], dict[str, str | None]]]:
    probe = procs.spawn("env", Env)
    return [(dict(p), env) for p, env in probe.get.call(list(names)).get(timeout=60)]


def with_gpus(count: int) -> BootstrapCommand:
    """Procs that see ``count`` GPUs, otherwise started like any proc."""
    code = (
        "import monarch.actor\n"
        "from monarch._src.actor import cuda_devices, runtime\n"
        f"cuda_devices.local_gpu_count = lambda: {count}\n"
        "runtime.serve_child()\n"
    )
    return BootstrapCommand(sys.executable, sys.executable, ["-c", code], {})


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CVD, raising=False)


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[HostMesh]:
    job = ProcessJob({"hosts": 2})
    try:
        yield job.state(cached_path=None).hosts
    finally:
        job.kill()


# --- env= --------------------------------------------------------------------------------


def _record_before_actors() -> None:
    os.environ["SEEN_BY_BOOTSTRAP"] = os.environ.get("SPAWN_ENV_A", "<unset>")


@pytest.mark.timeout(90)
def test_env_reaches_every_proc_before_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPAWN_ENV_INHERITED", "client")
    procs = this_host().spawn_procs(
        per_host={"hosts": 2, "gpus": 2},
        env={"SPAWN_ENV_A": "a=1 b", "SPAWN_ENV_INHERITED": "spawn", "SPAWN_ENV_EMPTY": ""},
        bootstrap=_record_before_actors,
    )
    try:
        got = env_of(
            procs, "SPAWN_ENV_A", "SPAWN_ENV_INHERITED", "SPAWN_ENV_EMPTY", "SEEN_BY_BOOTSTRAP"
        )
        assert len(got) == 4
        for _, env in got:
            assert env == {
                "SPAWN_ENV_A": "a=1 b",
                "SPAWN_ENV_INHERITED": "spawn",
                "SPAWN_ENV_EMPTY": "",
                "SEEN_BY_BOOTSTRAP": "a=1 b",
            }
        assert "SPAWN_ENV_A" not in os.environ  # the client's own is untouched
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_env_reaches_procs_on_other_hosts(two_hosts: HostMesh) -> None:
    procs = two_hosts.spawn_procs(per_host={"gpus": 1}, env={"SPAWN_ENV_REMOTE": "yes"})
    try:
        got = env_of(procs, "SPAWN_ENV_REMOTE")
        assert got == [({"hosts": h, "gpus": 0}, {"SPAWN_ENV_REMOTE": "yes"}) for h in range(2)]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ([("A", "1")], "expected a dict of str to str, got list"),
        ({"A": 1}, r"the entry 'A': 1 is not str to str \(str to int\)"),
        ({"A": "1", 2: "x"}, r"the entry 2: 'x' is not str to str \(int to str\)"),
        ({"A": None}, "the entry 'A': None"),
    ],
)
def test_env_must_map_strings_to_strings(env: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        this_host().spawn_procs(per_host={"gpus": 1}, env=env)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"A=B": "1"}, "not a valid environment variable"),
        ({"": "1"}, "not a valid environment variable"),
        ({"A": "x\0y"}, "not a valid environment variable"),
        ({PIN_ENV: "1:2"}, "set by monarch itself"),
        ({"MONARCH_BOOTSTRAP_FN": "x"}, "set by monarch itself"),
    ],
)
def test_env_names_are_checked(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        this_host().spawn_procs(per_host={"gpus": 1}, env=env)


# --- CUDA_VISIBLE_DEVICES: the decision ---------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "stride", "size", "gpus", "visible", "want"),
    [
        (0, 1, 4, 4, None, "0"),
        (3, 1, 4, 4, None, "3"),
        (5, 1, 4, 4, None, "1"),  # {"replica": 2, "gpus": 4}: rank 5 is gpus 1
        (5, 3, 2, 2, None, "1"),  # {"gpus": 2, "x": 3}: rank 5 is gpus 1, x 2
        (2, 3, 2, 2, None, "0"),
        (0, 1, 4, 0, None, None),  # no GPU
        (1, 1, 4, 8, None, None),  # more GPUs than procs: the user chooses
        (1, 1, 4, 2, None, None),  # fewer: procs share
        (1, 1, 4, 4, "2,3", None),  # already set
        (1, 1, 4, 4, "", None),  # set, even empty
    ],
)
def test_device_for_proc(
    rank: int, stride: int, size: int, gpus: int, visible: str | None, want: str | None
) -> None:
    assert device_for_proc(rank, stride, size, gpus, visible) == want


def test_spawn_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert spawn_variables({"gpus": 4}) == {PIN_ENV: "1:4"}
    assert spawn_variables({"hosts": 2, "gpus": 4}) == {PIN_ENV: "1:4"}
    assert spawn_variables({"gpus": 2, "x": 3, "y": 2}) == {PIN_ENV: "6:2"}
    assert spawn_variables({"procs": 4}) == {}
    assert spawn_variables({}) == {}
    # An explicit CUDA_VISIBLE_DEVICES anywhere wins: the spawn's own variables ...
    assert spawn_variables({"gpus": 4}, {"A": "1"}, {CVD: "0"}) == {}
    # ... or the spawning process's environment.
    monkeypatch.setenv(CVD, "1")
    assert spawn_variables({"gpus": 4}) == {}
    monkeypatch.delenv(CVD)
    with configured(spawn_cuda_visible_devices=False):
        assert spawn_variables({"gpus": 4}) == {}
    monkeypatch.setenv("MONARCH_SPAWN_CUDA_VISIBLE_DEVICES", "0")
    assert spawn_variables({"gpus": 4}) == {}


def test_pin_this_proc() -> None:
    rank = "HYPERACTOR_MESH_PROC_RANK"
    env = {PIN_ENV: "2:4", rank: "5"}
    assert pin_this_proc(env, gpu_count=4) == "2"
    assert env == {CVD: "2", rank: "5"}  # the request is consumed
    env = {PIN_ENV: "1:4", rank: "1"}
    assert pin_this_proc(env, gpu_count=2) is None and env == {rank: "1"}
    env = {PIN_ENV: "1:4", rank: "1", CVD: "7"}
    assert pin_this_proc(env, gpu_count=4) is None and env[CVD] == "7"
    assert pin_this_proc({rank: "1"}, gpu_count=4) is None  # not asked
    assert pin_this_proc({PIN_ENV: "1:4"}, gpu_count=4) is None  # no rank
    assert pin_this_proc({PIN_ENV: "garbage", rank: "0"}, gpu_count=4) is None


def _fake_nvidia_smi(directory: Path, body: str) -> None:
    smi = directory / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


@pytest.mark.timeout(30)
def test_local_gpu_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_gpu_count() >= 0  # this machine, whatever it has
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir()
    monkeypatch.setattr(cuda_devices, "_NVIDIA_PROC_DIR", str(gpus))
    assert local_gpu_count() == 3
    # Without the driver's directory: nvidia-smi -L, if there is one.
    monkeypatch.setattr(cuda_devices, "_NVIDIA_PROC_DIR", str(tmp_path / "missing"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert local_gpu_count() == 0
    _fake_nvidia_smi(bin_dir, "echo 'GPU 0: A (UUID: x)'; echo 'GPU 1: B (UUID: y)'")
    assert local_gpu_count() == 2
    _fake_nvidia_smi(bin_dir, "echo 'NVIDIA-SMI has failed'; exit 9")
    assert local_gpu_count() == 0
    _fake_nvidia_smi(bin_dir, "exec sleep 30")
    monkeypatch.setattr(cuda_devices, "_NVIDIA_SMI_TIMEOUT", 0.5)
    assert local_gpu_count() == 0  # a hung nvidia-smi counts as no GPU


# --- CUDA_VISIBLE_DEVICES: end to end -----------------------------------------------------


def visible_devices(procs: ProcMesh) -> list[tuple[dict[str, int], str | None]]:
    try:
        return [(point, env[CVD]) for point, env in env_of(procs, CVD, PIN_ENV)]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_each_proc_gets_the_gpu_of_its_coordinate() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4}, bootstrap_command=with_gpus(4))
    assert visible_devices(procs) == [({"gpus": g}, str(g)) for g in range(4)]


@pytest.mark.timeout(90)
def test_the_gpus_dimension_among_others() -> None:
    procs = this_host().spawn_procs(
        per_host={"replica": 2, "gpus": 2}, bootstrap_command=with_gpus(2)
    )
    assert visible_devices(procs) == [
        ({"replica": r, "gpus": g}, str(g)) for r in range(2) for g in range(2)
    ]


@pytest.mark.timeout(120)
def test_each_host_pins_its_own_procs(two_hosts: HostMesh) -> None:
    procs = two_hosts.spawn_procs(per_host={"gpus": 2}, bootstrap_command=with_gpus(2))
    assert visible_devices(procs) == [
        ({"hosts": h, "gpus": g}, str(g)) for h in range(2) for g in range(2)
    ]


@pytest.mark.timeout(120)
def test_nothing_is_set_unless_the_gpus_match() -> None:
    # Other GPU counts, no "gpus" dimension, and this machine's real (GPU-less) procs.
    for per_host, command in (
        ({"gpus": 2}, with_gpus(4)),
        ({"gpus": 2}, with_gpus(0)),
        ({"procs": 2}, with_gpus(2)),
        ({"gpus": 2}, None),
    ):
        procs = this_host().spawn_procs(per_host=per_host, bootstrap_command=command)
        assert [cvd for _, cvd in visible_devices(procs)] == [None, None], per_host


def _choose_device_nine() -> None:
    os.environ[CVD] = "9"


@pytest.mark.timeout(120)
def test_an_explicit_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    spawn = this_host().spawn_procs
    fake = with_gpus(2)
    procs = spawn(per_host={"gpus": 2}, bootstrap_command=fake, env={CVD: "5"})
    assert [cvd for _, cvd in visible_devices(procs)] == ["5", "5"]
    procs = spawn(per_host={"gpus": 2}, bootstrap_command=fake.with_env({CVD: "4"}))
    assert [cvd for _, cvd in visible_devices(procs)] == ["4", "4"]
    procs = spawn(per_host={"gpus": 2}, bootstrap_command=fake, bootstrap=_choose_device_nine)
    assert [cvd for _, cvd in visible_devices(procs)] == ["9", "9"]
    with configured(spawn_cuda_visible_devices=False):
        procs = spawn(per_host={"gpus": 2}, bootstrap_command=fake)
    assert [cvd for _, cvd in visible_devices(procs)] == [None, None]
    monkeypatch.setenv(CVD, "3")  # the client's (inherited by procs on its host)
    procs = spawn(per_host={"gpus": 2}, bootstrap_command=fake)
    assert [cvd for _, cvd in visible_devices(procs)] == ["3", "3"]
