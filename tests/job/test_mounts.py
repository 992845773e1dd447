"""JobTrait.remote_mount and gather_mount: a directory of the client on every host (and
a venv's interpreter for the procs), every host's directory on the client, refreshed at
each state(); declared wrongly, a clear error at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from monarch.actor import Actor, endpoint
from monarch.job import LocalJob, ProcessJob

pytestmark = pytest.mark.timeout(180)


class Probe(Actor):
    @endpoint
    def look(self, path: str) -> tuple[list[str], str, str, int]:
        data = os.path.join(path, "data.txt")
        with open(data) as f:
            text = f.read()
        return sorted(os.listdir(path)), text, sys.executable, os.stat(data).st_mode & 0o222

    @endpoint
    def write(self, path: str, text: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "out.txt"), "w") as f:
            f.write(text)


def _project(root: Path) -> Path:
    src = root / "project"
    (src / ".venv" / "bin").mkdir(parents=True)
    (src / "pkg").mkdir()
    (src / "data.txt").write_text("v1")
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    # A virtual environment's interpreter is a link to the base one.
    (src / ".venv" / "bin" / "python").symlink_to(sys.executable)
    return src


def test_remote_and_gather_mounts_copy_at_each_state(tmp_path: Path) -> None:
    src = _project(tmp_path)
    mnt = tmp_path / "hosts" / "project"
    gathered = tmp_path / "gathered"
    job = ProcessJob({"hosts": 2})
    job.remote_mount(str(src), mntpoint=str(mnt))
    job.gather_mount(str(tmp_path / "out" / "$SUBDIR"), str(gathered))
    (tmp_path / "out" / "hosts_0").mkdir(parents=True)
    (tmp_path / "out" / "hosts_1").mkdir(parents=True)
    try:
        state = job.state(cached_path=None)
        procs = state.hosts.spawn_procs()
        seen = procs.spawn("probe", Probe).look.call(str(mnt)).get(timeout=60).values()
        for names, text, executable, write_bits in seen:
            assert names == [".venv", "data.txt", "pkg"] and text == "v1"
            # The procs run the interpreter inside the mount; the copy is read-only.
            assert executable == str(mnt / ".venv" / "bin" / "python")
            assert write_bits == 0
        assert sorted(os.listdir(gathered)) == ["hosts_0", "hosts_1"]
        # Each host writes into its own directory; the next state() gathers it, and
        # carries the source's change to the hosts.
        writers = procs.spawn("writer", Probe)
        for rank in (0, 1):
            writers.slice(hosts=rank).write.call_one(
                str(tmp_path / "out" / f"hosts_{rank}"), f"from {rank}"
            ).get(timeout=60)
        procs.stop().get(timeout=60)
        (src / "data.txt").write_text("v2")
        state = job.state(cached_path=None)
        assert (gathered / "hosts_1" / "out.txt").read_text() == "from 1"
        procs = state.hosts.spawn_procs()
        seen = procs.spawn("probe", Probe).look.call(str(mnt)).get(timeout=60).values()
        assert [text for _, text, _, _ in seen] == ["v2", "v2"]
        procs.stop().get(timeout=60)
    finally:
        job.kill()


def test_a_host_whose_mount_is_the_source_is_left_alone(tmp_path: Path) -> None:
    src = _project(tmp_path)
    job = LocalJob()
    job.remote_mount(str(src), python_exe=None)  # mntpoint: the same path
    try:
        state = job.state(cached_path=None)
        assert (src / "data.txt").read_text() == "v1"
        assert os.stat(src / "data.txt").st_mode & 0o200  # untouched: still writable
        assert not any(p.name.endswith(".monarch-mount") for p in tmp_path.iterdir())
        assert "hosts" in state
    finally:
        job.kill()


def test_mounts_declared_wrongly_fail_at_once(tmp_path: Path) -> None:
    job = ProcessJob({"hosts": 1})
    with pytest.raises(ValueError, match="is not a directory on this machine"):
        job.remote_mount(str(tmp_path / "missing"))
    src = tmp_path / "plain"
    src.mkdir()
    with pytest.raises(ValueError, match=r"python_exe '.venv/bin/python' not found"):
        job.remote_mount(str(src))
    with pytest.raises(TypeError, match="meshes must be a list of mesh names"):
        job.gather_mount("/data", str(tmp_path / "g"), meshes="hosts")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match=r"options \['block_size'\] configure upstream"):
        job.remote_mount(str(src), python_exe=None, block_size=4096)
    job.gather_mount("/data", str(tmp_path / "g"), meshes=["trainers"])
    try:
        with pytest.raises(
            ValueError, match=r"no mesh named 'trainers'; its meshes are \['hosts'\]"
        ):
            job.state(cached_path=None)
    finally:
        job.kill()
