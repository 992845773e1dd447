"""``monarch.job.spmd`` across hosts: a torchrun command line with ``--nnodes=2
--nproc-per-node=2`` (the DDP script of tests/job/spmd_ddp_script.py) run by ``SPMDJob``
on worker agents in two network-namespace hosts, from a client (``spmd_client.py``) in the
client namespace. A ``ProcessJob`` cannot put its workers in namespaces, so the client
attaches to the workers of ``test_hosts.py``'s fixtures by address, as the Slurm and
Kubernetes jobs attach to theirs.

Checked: a rank on the second host that raises fails the run, named with its host and
local rank, and the other ranks are stopped; then, on the same hosts, every rank trains
and ends with the same parameters; rank 0's host address is ``MASTER_ADDR``; each rank
has its place (``GROUP_RANK`` is the host). Run with ``-s`` to see the times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster
from .test_hosts import Client, Worker, _env, kept_healthy, running_workers

pytest.importorskip("torch")

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    """Workers in two of the cluster's hosts."""
    yield from running_workers(netns_cluster.hosts[:2], tmp_path_factory.mktemp("spmd-workers"))


@pytest.fixture
def healthy(
    workers: list[Worker], netns_cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    yield from kept_healthy(workers, netns_cluster, keep_running)


class SPMDClient(Client):
    """A client running ``spmd_client.py`` in the client namespace."""

    def __init__(self, cluster: Cluster, out: Path, addresses: list[str]) -> None:
        self.proc = cluster.client.popen(
            [sys.executable, str(HERE / "spmd_client.py"), str(out), *addresses],
            env=_env(),
            cwd=out,  # the job's state cache (.monarch/) goes there, not into the checkout
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.mark.timeout(420)
def test_a_torchrun_command_on_two_namespace_hosts(
    netns_cluster: Cluster, healthy: list[Worker], tmp_path: Path
) -> None:
    client = SPMDClient(netns_cluster, tmp_path, [w.address for w in healthy])
    r = client.result(timeout=360)
    client.finish(timeout=60)
    print(f"failing run {r['failed_s']:.1f} s, DDP run {r['ran_s']:.1f} s")

    assert r["ranks"] == [3], r["error"]
    assert "rank 3 (hosts=1, gpus=1): ValueError: rank 3 was told to fail" in r["error"]
    assert "the other ranks were stopped" in r["error"]

    records = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(4)]
    h0, h1 = (h.ip for h in netns_cluster.hosts[:2])
    for rank, record in enumerate(records):
        env = record["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["GROUP_RANK"] == str(rank // 2) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["MASTER_ADDR"] == h0, (env, h0, h1)
        assert record["same"] is True
        assert record["params"] == records[0]["params"]
    assert len({tuple(r["losses"]) for r in records}) == 4  # each rank its own data
    assert all(w.alive() for w in healthy)  # the hosts outlive the runs
