"""Distributed tensors across hosts: worker agents in two network-namespace hosts and a
client (``tensor_client_script.py``) in the client namespace, which spawns a
``{"hosts": 2, "gpus": 2}`` proc mesh and checks, with values it computes itself, ops on
every rank, every reduction over ``gpus``, ``hosts`` and both, reduce-scatter and
all-to-all, ``to_mesh`` from host 0's slice to host 1's and back, and a failing command
followed by normal work. The collectives run over gloo between the hosts' own addresses.

The workers and clients are those of ``test_hosts.py`` (as in ``test_rdma_hosts.py``).
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster
from .test_hosts import PORT, Client, Worker, _env, kept_healthy, running_workers

pytest.importorskip("torch")

HERE = Path(__file__).parent

CHECKS = [
    "ops",
    "reduce/gpus",
    "reduce/hosts",
    "reduce/hosts+gpus",
    "scatter/gpus",
    "scatter/hosts",
    "scatter/hosts+gpus",
    "to_mesh",
    "failure_then_work",
]


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    """Workers in two of the cluster's hosts."""
    yield from running_workers(netns_cluster.hosts[:2], tmp_path_factory.mktemp("tensor-workers"))


@pytest.fixture
def healthy(
    workers: list[Worker], netns_cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    yield from kept_healthy(workers, netns_cluster, keep_running)


class TensorClient(Client):
    """A client running ``tensor_client_script.py`` in the client namespace."""

    def __init__(self, cluster: Cluster, addresses: list[str]) -> None:
        self.proc = cluster.client.popen(
            [sys.executable, str(HERE / "tensor_client_script.py"), *addresses],
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.mark.timeout(300)
def test_tensors_reduce_and_move_across_hosts(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = TensorClient(netns_cluster, [w.address for w in healthy])
    r = client.result(timeout=240)
    client.finish(timeout=60)
    assert r["sizes"] == {"hosts": 2, "gpus": 2}, r
    # Two procs on each host, each reached at its host's address, where its gloo binds.
    ips = [h.ip for h in netns_cluster.hosts[:2]]
    seen = sorted(place["gloo"] for place in r["places"])
    assert seen == sorted(ips * 2), r["places"]
    for place in r["places"]:
        assert f"tcp:{place['gloo']}:" in place["proc"], place
    failed = {name: why for name, why in r["checks"].items() if why}
    assert not failed, "\n".join(f"{name}: {why}" for name, why in failed.items())
    assert sorted(r["checks"]) == sorted(CHECKS), r["checks"]
    assert r["stop_error"] is None, r["stop_error"]
    assert r["failures"] == [], r["failures"]
    assert all(w.alive() for w in healthy)
    assert all(f"{w.host.ip}:{PORT}" in w.address for w in healthy)


@pytest.mark.parametrize(
    ("proc_id", "address"),
    [
        ("anon-0-94e5f15dcbb3@tcp:10.124.0.11:36275", "10.124.0.11"),
        ("anon-1@tcp:127.0.0.1:40191", "127.0.0.1"),
        ("anon-0@tcp:[::1]:40191", "::1"),
        ("anon-0@tcp:[2001:db8::5]:80", "2001:db8::5"),
        ("anon-0@tcp:[fe80::1%eth0]:80", "fe80::1%eth0"),
        ("anon-0@unix:/tmp/monarch/p.sock", "127.0.0.1"),
        ("anon-0@local:3", "127.0.0.1"),
    ],
)
def test_gloo_binds_the_ip_of_the_procs_tcp_address(
    monkeypatch: pytest.MonkeyPatch, proc_id: str, address: str
) -> None:
    """What ``_local_address`` makes gloo bind, for each form of proc id: an IPv6
    address without its brackets (with them kept, or cut at its first colon, gloo
    cannot resolve it and every collective fails)."""
    from monarch._src.actor import process
    from monarch._src.tensor_engine.worker import collectives as worker_collectives

    monkeypatch.setattr(process, "get", lambda: types.SimpleNamespace(proc_id=proc_id))
    assert worker_collectives._local_address() == address
