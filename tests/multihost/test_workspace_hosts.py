"""``HostMesh.sync_workspace`` across network-namespace hosts whose file systems differ:
each worker runs in a mount namespace of its own, its ``WORKSPACE_DIR`` a private tmpfs
at the same path, so a file that reaches one host's copy is seen by no other host and
not by the client (``workspace_client.py``, in the client namespace).

Host 2's tmpfs is small (2 MiB, 64 inodes), for the out-of-space errors.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster, Host
from .test_hosts import PORT, Client, Worker, _env, kept_healthy

HERE = Path(__file__).parent
#: Each host's tmpfs: (size, inodes); host 2's is small.
TMPFS = [("64m", 4096), ("64m", 4096), ("2m", 64)]


class WorkspaceWorker(Worker):
    """A worker whose ``WORKSPACE_DIR`` is a tmpfs private to it (and its procs): a
    mount namespace of its own, made by ``unshare``, gone with its last process."""

    def __init__(self, host: Host, log_dir: Path, root: Path, tmpfs: tuple[str, int]) -> None:
        super().__init__(host, log_dir)
        self.root = root
        self.tmpfs = tmpfs

    def start(self) -> None:
        seen = self.log.stat().st_size if self.log.exists() else 0
        size, inodes = self.tmpfs
        env = _env()
        env["WORKSPACE_DIR"] = str(self.root)
        command = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o "size=$1,nr_inodes=$2,mode=0755" tmpfs "$WORKSPACE_DIR" '
            '&& shift 2 && exec "$@"',
            "sh", size, str(inodes),
            sys.executable, "-m", "monarch.tools.cli", "worker", "--address", self.address,
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = self.host.popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        if self.registry is not None:
            self.registry.append(self.proc)
        deadline = time.monotonic() + 60
        marker = f"monarch worker ready at tcp:{self.host.ip}:{PORT}"
        while marker not in self.log.read_bytes()[seen:].decode(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker in {self.host.name} did not start: {self.log.read_text()[-2000:]}"
                )
            time.sleep(0.05)  # polling the log for the ready line; no event to wait on


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkspaceWorker]]:
    logs = tmp_path_factory.mktemp("workspace-workers")
    root = tmp_path_factory.mktemp("workspace-root")  # every host mounts its own here
    started = [WorkspaceWorker(h, logs, root, TMPFS[i]) for i, h in enumerate(netns_cluster.hosts)]
    try:
        for w in started:
            w.start()
        yield started
    finally:
        for w in started:
            w.stop()


@pytest.fixture
def healthy(
    workers: list[WorkspaceWorker],
    netns_cluster: Cluster,
    keep_running: list[subprocess.Popen[Any]],
) -> Iterator[list[Worker]]:
    yield from kept_healthy(list(workers), netns_cluster, keep_running)


class WorkspaceClient(Client):
    def __init__(self, cluster: Cluster, scenario: str, scratch: Path, addresses: list[str]):
        self.proc = cluster.client.popen(
            [sys.executable, str(HERE / "workspace_client.py"), scenario, str(scratch), *addresses],
            env=_env(),
            cwd=scratch,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _run(cluster: Cluster, scenario: str, scratch: Path, workers: list[Worker]) -> dict[str, Any]:
    client = WorkspaceClient(cluster, scenario, scratch, [w.address for w in workers])
    result = client.result(timeout=180)
    client.finish()
    return result


@pytest.mark.timeout(240)
def test_sync_reaches_each_hosts_own_file_system(
    netns_cluster: Cluster, healthy: list[Worker], tmp_path: Path
) -> None:
    r = _run(netns_cluster, "mirror", tmp_path, healthy)
    root = str(healthy[0].root)  # type: ignore[attr-defined]
    first, second = r["first"], r["second"]
    assert first["roots"] == {"0": root, "1": root, "2": root}
    # Sent once by the client, down the host tree: each content once.
    assert first["files"] == 4 and first["sent_files"] == 4
    assert sorted(first["changed"]["2"]) == [
        "proj/gone.txt", "proj/pkg/__init__.py", "proj/pkg/wsmod.py", "proj/tool.sh",
    ]  # fmt: skip
    for host, loaded in enumerate(r["loaded"]):
        assert loaded["host"] == host
        assert loaded["file"] == f"{root}/proj/pkg/wsmod.py" and loaded["value"] == 1
    # A file written into host 0's copy is on host 0 only; the client sees no copy at all.
    assert r["marked"] == [True, False, False]
    assert r["client_sees_copy"] is False
    # The second sync: one changed file sent, one deletion, one mode; running actors
    # reloaded the module.
    assert second["sent_files"] == 1 and second["sent_bytes"] == len("VALUE = 'second'\n")
    # A mirror: host 0's own file is not the client's, so it is deleted too.
    assert sorted(second["changed"]["0"]) == [
        "proj/gone.txt", "proj/only-here.txt", "proj/pkg/wsmod.py",
    ]  # fmt: skip
    for other in ("1", "2"):
        assert sorted(second["changed"][other]) == ["proj/gone.txt", "proj/pkg/wsmod.py"]
    assert second["reloaded"] == [[["pkg.wsmod"], ["pkg.wsmod"], ["pkg.wsmod"]]]
    assert [v["value"] for v in r["after"]] == ["second"] * 3
    assert [v["listing"] for v in r["after"]] == [["pkg", "tool.sh"]] * 3
    assert [v["tool_mode"] for v in r["loaded"]] == [0o755] * 3
    assert [v["tool_mode"] for v in r["after"]] == [0o700] * 3


@pytest.mark.timeout(240)
def test_a_host_out_of_space_is_named(
    netns_cluster: Cluster, healthy: list[Worker], tmp_path: Path
) -> None:
    r = _run(netns_cluster, "nospace", tmp_path, healthy)
    ip = netns_cluster.hosts[2].ip
    # Refused before anything was sent: the host, its free and needed bytes.
    assert r["big"] is not None and r["big_errno"] == 28
    assert "host rank 2 (" in r["big"] and f"tcp:{ip}:" in r["big"], r["big"]
    assert "bytes free in its workspace directory" in r["big"]
    assert "nothing was sent" in r["big"]
    # Out of inodes while staging what it lacks: the host, and how much the sync needs.
    assert r["many"] is not None and f"tcp:{ip}:" in r["many"], r["many"]
    assert "ran out of space (bytes or inodes) receiving" in r["many"], r["many"]
    assert "No space left on device" in r["many"] and "nothing was applied" in r["many"]
    assert r["cleaned"]["sent_files"] == 0
