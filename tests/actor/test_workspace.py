"""``HostMesh.sync_workspace``: a local directory (and an environment's packages)
mirrored to every host of a mesh, by content hash, with deletions and permissions, and
the procs' modules reloaded with ``auto_reload``.

The hosts are two workers on this machine (a ``ProcessJob``) whose workspace
directories differ (``WORKSPACE_DIR`` of each worker), so each test checks both copies.
The multi-host version, where the hosts' file systems differ, is
``tests/multihost/test_workspace_hosts.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch._src.actor import code_sync
from monarch.actor import Actor, HostMesh, endpoint, this_host
from monarch.job import ProcessJob
from monarch.tools.config import (
    CondaEnvironment,
    HostOutOfSpaceError,
    Workspace,
    WorkspacePathError,
)
from monarch.tools.config.environment import CondaEnvironment as UpstreamPathEnvironment
from monarch.tools.config.workspace import Workspace as UpstreamPathWorkspace

pytestmark = pytest.mark.timeout(180)


class RootsJob(ProcessJob):
    """Workers on this machine, each with its own ``WORKSPACE_DIR`` under ``roots``."""

    def __init__(self, meshes: dict[str, int], roots: Path) -> None:
        super().__init__(meshes)
        self.roots = roots

    def _worker_command(self, address: str) -> list[str]:
        root = self.roots / Path(address.rpartition("/")[2]).stem
        return ["env", f"WORKSPACE_DIR={root}", *super()._worker_command(address)]


class Probe(Actor):
    @endpoint
    def load(self, name: str) -> dict[str, Any]:
        """Import module ``name`` here: where from, and its ``VALUE``."""
        module = importlib.import_module(name)
        return {
            "workspace_dir": os.environ.get("WORKSPACE_DIR"),
            "file": module.__file__,
            "value": getattr(module, "VALUE", None),
        }


@pytest.fixture(scope="module")
def job_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HostMesh, list[Path]]]:
    roots = tmp_path_factory.mktemp("roots")
    job = RootsJob({"hosts": 2}, roots)
    try:
        mesh = job.state(cached_path=None).hosts
        yield mesh, [roots / "worker-0", roots / "worker-1"]
        mesh.shutdown().get(timeout=60)
    finally:
        job.kill()


@pytest.fixture
def hosts(job_hosts: tuple[HostMesh, list[Path]]) -> Iterator[tuple[HostMesh, list[Path]]]:
    """The two hosts; the procs a test started on them (the sync's own included) are
    stopped after it."""
    yield job_hosts
    job_hosts[0].stop().get(timeout=60)


def sync(mesh: HostMesh, workspace: Workspace, **kwargs: Any) -> code_sync.SyncStats:
    asyncio.run(asyncio.wait_for(mesh.sync_workspace(workspace, **kwargs), timeout=120))
    stats: code_sync.SyncStats | None = mesh._workspace_sync.last  # type: ignore[attr-defined]
    assert stats is not None
    return stats


def write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def test_workspace_has_upstreams_names_and_mappings(tmp_path: Path) -> None:
    assert UpstreamPathWorkspace is Workspace and UpstreamPathEnvironment is CondaEnvironment
    ws = Workspace(dirs=[tmp_path / "torch", str(tmp_path / "github" / "titan")])
    assert ws.dirs == {tmp_path / "torch": "torch", tmp_path / "github" / "titan": "titan"}
    assert ws.env == CondaEnvironment()
    mapped = Workspace(dirs={tmp_path / "torch": "github/pytorch"}, env=None)
    assert mapped.dirs == {tmp_path / "torch": "github/pytorch"} and mapped.env is None
    assert Workspace.null() == Workspace(env=None) != Workspace()
    assert CondaEnvironment("/opt/env").conda_prefix == "/opt/env"
    with pytest.raises(ValueError, match="not a directory"):
        Workspace(dirs=[""])
    with pytest.raises(TypeError, match="expected a list"):
        Workspace(dirs="/a/dir")


def test_paths_outside_the_workspace_are_refused_before_anything_runs(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    write(outside, "not yours")
    src = tmp_path / "proj"
    write(src / "a.py", "VALUE = 1\n")
    (src / "leak.txt").symlink_to(outside)
    host = this_host()
    with pytest.raises(WorkspacePathError, match=r"leak.txt is a symbolic link .* outside"):
        asyncio.run(host.sync_workspace(Workspace(dirs=[src])))
    (src / "leak.txt").unlink()
    for name in ("../up", "/abs", "a/../../b", code_sync.STATE_DIR):
        with pytest.raises(WorkspacePathError, match="outside the hosts' workspace"):
            asyncio.run(host.sync_workspace(Workspace(dirs={src: name})))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        asyncio.run(host.sync_workspace(Workspace(dirs=[tmp_path / "missing"])))
    with pytest.raises(TypeError, match=r"expected a monarch\.tools\.config\.Workspace"):
        asyncio.run(host.sync_workspace([src]))  # type: ignore[arg-type]
    # Refused on the client: no sync proc was started for any of them.
    state = host.__dict__.get("_workspace_sync")
    assert state is None or state.procs is None


def test_mirrors_to_each_hosts_directory_then_only_changes(
    hosts: tuple[HostMesh, list[Path]], tmp_path: Path
) -> None:
    mesh, roots = hosts
    src = tmp_path / "proj"
    write(src / "pkg" / "__init__.py", "")
    write(src / "pkg" / "mod.py", "VALUE = 1\n")
    write(src / "run.sh", "#!/bin/sh\necho hi\n", 0o755)
    write(src / "big.bin", "x" * 200_000)
    (src / "empty").mkdir()
    (src / "alias.py").symlink_to("pkg/mod.py")
    (src / "pkg" / "__pycache__").mkdir()
    write(src / "pkg" / "__pycache__" / "mod.cpython-311.pyc", "stale")
    ws = Workspace(dirs=[src])

    first = sync(mesh, ws)
    assert first.files == 5 and first.sent_files == 4  # alias is a link: no content
    assert first.sent_bytes == len("VALUE = 1\n") + len("#!/bin/sh\necho hi\n") + 200_000
    assert first.roots == {0: str(roots[0]), 1: str(roots[1])}
    for root in roots:
        copy = root / "proj"
        assert (copy / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
        assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o755
        assert (copy / "empty").is_dir() and not (copy / "pkg" / "__pycache__").exists()
        assert os.readlink(copy / "alias.py") == "pkg/mod.py"

    procs = mesh.spawn_procs(per_host={"gpus": 1})
    try:
        probe = procs.spawn("probe", Probe)
        seen = probe.load.call("pkg.mod").get(timeout=60)
        for point, got in seen.items():
            root = roots[point["hosts"]]
            assert got == {
                "workspace_dir": str(root),
                "file": str(root / "proj" / "pkg" / "mod.py"),
                "value": 1,
            }

        # Changed, added, deleted, renamed (same content), permission changed.
        write(src / "pkg" / "mod.py", "VALUE = 22\n")
        write(src / "pkg" / "new.py", "VALUE = 'new'\n")
        (src / "run.sh").unlink()
        (src / "big.bin").rename(src / "moved.bin")
        (src / "pkg" / "__init__.py").chmod(0o600)
        second = sync(mesh, ws, auto_reload=True)
        assert second.sent_files == 2
        assert second.sent_bytes == len("VALUE = 22\n") + len("VALUE = 'new'\n")
        for rank, root in enumerate(roots):
            copy = root / "proj"
            assert not (copy / "run.sh").exists() and not (copy / "big.bin").exists()
            assert (copy / "moved.bin").stat().st_size == 200_000
            assert stat.S_IMODE((copy / "pkg" / "__init__.py").stat().st_mode) == 0o600
            assert sorted(second.changed[rank]) == [
                "proj/big.bin", "proj/moved.bin", "proj/pkg/mod.py", "proj/pkg/new.py",
                "proj/run.sh",
            ]  # fmt: skip
        # The running actors see the new code: reloaded, and the new module importable.
        assert second.reloaded == [[["pkg.mod"], ["pkg.mod"]]]
        assert [v["value"] for v in probe.load.call("pkg.mod").get(timeout=60).values()] == [22, 22]
        assert [v["value"] for v in probe.load.call("pkg.new").get(timeout=60).values()] == [
            "new",
            "new",
        ]

        third = sync(mesh, ws)
        assert third.sent_bytes == 0 and third.changed == {0: [], 1: []}
        assert third.manifest_bytes < 100  # only what changed since the last sync: nothing
    finally:
        procs.stop().get(timeout=60)
    with pytest.raises(RuntimeError, match="cannot call sync_workspace on a sliced host mesh"):
        sync(mesh.slice(hosts=0), ws)
    with pytest.raises(NotImplementedError, match=r"Use HostMesh\.sync_workspace instead"):
        asyncio.run(procs.sync_workspace(ws))


def test_large_files_go_in_pieces_and_kinds_can_change(
    hosts: tuple[HostMesh, list[Path]], tmp_path: Path
) -> None:
    mesh, roots = hosts
    src = tmp_path / "kinds"
    huge = os.urandom(2 * code_sync.BATCH_BYTES + 12345)  # three messages
    (src / "d").mkdir(parents=True)
    (src / "huge.bin").write_bytes(huge)
    write(src / "dup1.txt", "same\n")
    write(src / "dup2.txt", "same\n")
    write(src / "d" / "x.txt", "in d\n")
    write(src / "f", "a file\n")
    (src / "l").symlink_to("f")
    ws = Workspace(dirs={src: "kinds"})
    first = sync(mesh, ws)
    assert first.sent_files == 4  # the two copies of "same" once
    assert first.sent_bytes == len(huge) + len("same\n") + len("in d\n") + len("a file\n")
    for root in roots:
        assert (root / "kinds" / "huge.bin").read_bytes() == huge
        assert (root / "kinds" / "dup2.txt").read_text() == "same\n"
    # A directory becomes a file, a file a directory, a link a file.
    for f in (src / "d").iterdir():
        f.unlink()
    (src / "d").rmdir()
    write(src / "d", "now a file\n")
    (src / "f").unlink()
    write(src / "f" / "y.txt", "in f\n")
    (src / "l").unlink()
    write(src / "l", "now a file too\n")
    sync(mesh, ws)
    for root in roots:
        copy = root / "kinds"
        assert (copy / "d").read_text() == "now a file\n"
        assert (copy / "f" / "y.txt").read_text() == "in f\n"
        assert not (copy / "l").is_symlink() and (copy / "l").read_text() == "now a file too\n"
        assert (copy / "huge.bin").stat().st_size == len(huge)


def test_procs_spawned_after_a_sync_use_the_synced_environment(
    hosts: tuple[HostMesh, list[Path]], tmp_path: Path
) -> None:
    mesh, roots = hosts
    prefix = tmp_path / "env"
    major, minor = sys.version_info[:2]
    packages = prefix / "lib" / f"python{major}.{minor}" / "site-packages"
    write(packages / "fakepkg_ws" / "__init__.py", "VALUE = 'from the env'\n")
    src = tmp_path / "flat"
    write(src / "flatmod_ws.py", "VALUE = 'flat'\n")
    ws = Workspace(dirs={src: ""}, env=CondaEnvironment(str(prefix)))
    stats = sync(mesh, ws, conda=True)
    assert stats.sent_files == 2
    procs = mesh.spawn_procs(name="envprocs")
    try:
        probe = procs.spawn("probe", Probe)
        for point, got in probe.load.call("fakepkg_ws").get(timeout=60).items():
            env = roots[point["hosts"]] / code_sync.ENV_DIR
            assert got["file"] == str(env / "fakepkg_ws" / "__init__.py")
            assert got["value"] == "from the env"
        for point, got in probe.load.call("flatmod_ws").get(timeout=60).items():
            assert got["file"] == str(roots[point["hosts"]] / "flatmod_ws.py")
    finally:
        procs.stop().get(timeout=60)
    # A flat mirror (mapped to "") never deletes the sync's own directory.
    (src / "flatmod_ws.py").unlink()
    sync(mesh, Workspace(dirs={src: ""}, env=None))
    for root in roots:
        assert not (root / "flatmod_ws.py").exists()
        assert (root / code_sync.ENV_DIR / "fakepkg_ws" / "__init__.py").exists()


def test_out_of_space_errors_name_the_host() -> None:
    failure = {
        "rank": 2,
        "where": "host rank 2 (node7, proc code_sync-1@tcp:10.0.0.7:1)",
        "root": "/ws",
        "nospace": True,
        "error": "OSError: [Errno 28] No space left on device",
    }
    with pytest.raises(HostOutOfSpaceError, match=r"host rank 2 \(node7.*about 4096 bytes") as e:
        code_sync._raise_failures([failure], {2: 4096})
    assert e.value.errno == 28 and isinstance(e.value, OSError)
