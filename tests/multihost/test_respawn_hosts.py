"""A replacement host joins a running client (issue 37): with actors running on three
network-namespace hosts, host 2's worker is SIGKILLed, a new worker starts in host 2's
namespace, and the same client attaches to it (``attach_to_workers``), spawns there and
calls the new actors together with the survivors' actors of the first mesh (hosts 0 and
1), each side also calling the other.

The workers and the client are those of ``test_hosts.py`` (its fixtures' style: the
workers live for the module; a worker a test broke is restarted by the next ``healthy``).
Run with ``-s`` to see the measured times.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .netns import Cluster
from .test_hosts import PORT, Client, Worker, kept_healthy, running_workers


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    yield from running_workers(netns_cluster.hosts, tmp_path_factory.mktemp("respawn-workers"))


@pytest.fixture
def healthy(
    workers: list[Worker], netns_cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    yield from kept_healthy(workers, netns_cluster, keep_running)


@pytest.mark.timeout(240)
def test_a_replacement_worker_joins_and_works_with_the_survivors(
    netns_cluster: Cluster,
    healthy: list[Worker],
    keep_running: list[subprocess.Popen[Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    client = Client(netns_cluster, "replacement", [w.address for w in healthy])
    client.expect("READY")
    victim = healthy[2]
    assert victim.proc is not None
    killed_at = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    assert client.proc.stdin is not None
    client.proc.stdin.write(f"{killed_at}\n")
    client.proc.stdin.flush()
    victim.proc.wait(10)
    client.expect("READY")
    # The replacement: a new worker process in host 2's namespace, at its address.
    joining = Worker(netns_cluster.hosts[2], tmp_path_factory.mktemp("replacement"))
    joining.registry = keep_running  # stopped after the test
    joining.start()
    assert joining.address == victim.address
    client.proc.stdin.write(joining.address + "\n")
    client.proc.stdin.flush()
    r = client.result()
    client.finish()
    lost = f"worker@tcp:{netns_cluster.hosts[2].ip}:{PORT}"
    assert r["detected_s"] is not None and r["failures"], r
    assert all(lost in f for f in r["failures"]), r
    assert r["error"] is not None and "unexpected" not in r["error"], r
    # The survivors (hosts 0 and 1) kept answering, before and after the host joined.
    assert len(r["survivors"]) == 4 and set(r["survivors"]) <= set(r["before"]), r
    assert len(r["together"]) == 4 and r["together"] == r["survivors"], r
    # The new procs run on the joining worker's host, reached over TCP there.
    assert len(r["places"]) == 2, r
    for place in r["places"]:
        assert place["proc"].split("@", 1)[1].startswith(f"tcp:{netns_cluster.hosts[2].ip}:")
    new_pids = sorted(p["pid"] for p in r["places"])
    assert not set(new_pids) & set(r["before"])
    assert r["new_to_old"] == [r["survivors"]] * 2, r
    assert r["old_to_new"] == [new_pids] * 4, r
    print(
        f"\nreplacement host: the fault hook ran {r['detected_s']:.3f} s after the kill; "
        f"attach + spawn + first answers from the new worker: {r['joined_s']:.2f} s; "
        f"kill to the new procs answering (a worker started in between): "
        f"{r['kill_to_answer_s']:.2f} s"
    )
    joining.stop()
