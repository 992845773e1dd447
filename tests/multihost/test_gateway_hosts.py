"""A client outside the cluster (issue 38): ``monarch.actor.attach`` through a gateway.

A worker runs in each of three network-namespace hosts. The client runs in the client
namespace, whose routes reach only host 0 (the gateway): every other member's address
(hosts 1 and 2, and the root namespace) is an ``unreachable`` route there, so a direct
connection fails at once. Through host 0's worker it still spawns on every host, calls,
casts and gathers, receives on its own ports and its procs' output, learns of a proc's
death, and shuts the workers down. The routes are removed after each test (the session
cluster is left as it was found).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster, Host
from .test_hosts import PORT, SECRET, Worker, _env, running_workers

HERE = Path(__file__).parent


def _route(host: Host, verb: str, ip: str) -> None:
    done = host.run(
        ["ip", "route", verb, "unreachable", f"{ip}/32"],
        timeout=10,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and verb == "add":
        raise RuntimeError(f"cannot add a route in {host.name}: {done.stderr.strip()}")


@pytest.fixture
def gateway_only(netns_cluster: Cluster) -> Iterator[list[str]]:
    """The client namespace reaches host 0 only: the addresses it cannot reach."""
    blocked = [h.ip for h in netns_cluster.hosts[1:]] + [netns_cluster.root_ip]
    try:
        for ip in blocked:
            _route(netns_cluster.client, "add", ip)
        yield blocked
    finally:
        for ip in blocked:
            _route(netns_cluster.client, "del", ip)


@pytest.fixture
def workers(netns_cluster: Cluster, tmp_path: Path) -> Iterator[list[Worker]]:
    """A worker on each host, for this test only (``drive`` shuts them down)."""
    yield from running_workers(netns_cluster.hosts, tmp_path)


def _client(cluster: Cluster, *args: str, secret: str = SECRET) -> dict[str, Any]:
    done = cluster.client.run(
        [sys.executable, str(HERE / "gateway_client.py"), *args],
        env=_env(secret),
        capture_output=True,
        text=True,
        timeout=200,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"client exited with {done.returncode}\nstdout:\n{done.stdout[-4000:]}\n"
        f"stderr:\n{done.stderr[-4000:]}"
    )
    value: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    value["stdout"] = done.stdout
    return value


@pytest.mark.timeout(240)
def test_a_client_that_reaches_only_the_gateway_drives_every_host(
    netns_cluster: Cluster, workers: list[Worker], gateway_only: list[str]
) -> None:
    gateway = workers[0].address
    addresses = [w.address for w in workers]
    r = _client(
        netns_cluster,
        "drive",
        gateway,
        *addresses,
        "--unreachable",
        *addresses[1:],
    )
    # The client really cannot reach hosts 1 and 2 itself.
    for address, outcome in r["direct"].items():
        assert outcome != "connected", (address, outcome)
    # Its proc id carries the gateway's address: that is how the procs reach it.
    assert r["client_proc"].endswith(f"@tcp:{netns_cluster.hosts[0].ip}:{PORT}"), r
    # Spawned on every host, at each host's own address.
    ips = sorted(p["ip"] for p in r["places"])
    assert ips == sorted(h.ip for h in netns_cluster.hosts for _ in range(2)), r["places"]
    for place in r["places"]:
        host = place["rank"]["hosts"]
        assert place["proc"].split("@", 1)[1].startswith(f"tcp:{netns_cluster.hosts[host].ip}:")
    assert r["totals"] == [55] * 6, "a cast reached every rank, a call gathered them"
    assert r["reported"] == list(range(6)), "every rank sent to the client's port"
    for rank in range(6):
        assert f"[members {rank}] said by rank {rank}" in r["stdout"], r["stdout"][-3000:]
    # The death of rank 5 (host 2) reached the fault hook and fails calls to it.
    assert r["failures"] and "rank 5" in r["failures"][0], r["failures"]
    assert "exited with status 3" in r["failures"][0], r["failures"]
    assert r["error"] is not None and "unexpected" not in r["error"], r["error"]
    assert r["survivors"] == 1
    # HostMesh.shutdown() ended every worker, each one through the gateway.
    for w in workers:
        assert w.proc is not None
        assert w.proc.wait(timeout=30) == 0, w.log.read_text()[-2000:]
    print(
        f"\ngateway: attach {r['attached_s']:.3f} s, spawn 6 procs on 3 hosts and call "
        f"{r['spawned_s']:.2f} s, death to fault hook {r['detected_s']:.2f} s, shutdown "
        f"{r['shutdown_s']:.2f} s"
    )


@pytest.mark.timeout(120)
def test_attach_after_monarch_started_raises_naming_the_fix(
    netns_cluster: Cluster, workers: list[Worker]
) -> None:
    r = _client(netns_cluster, "late", workers[0].address)
    assert r["error"] is not None
    assert "must come before" in r["error"] and "first thing" in r["error"], r["error"]


@pytest.mark.timeout(120)
def test_wrong_credentials_are_rejected_by_the_gateway_naming_it(
    netns_cluster: Cluster, workers: list[Worker], gateway_only: list[str]
) -> None:
    gateway = workers[0].address
    r = _client(netns_cluster, "credentials", gateway, secret="not-the-cluster-secret")
    assert r["error"] is not None
    assert f"tcp:{netns_cluster.hosts[0].ip}:{PORT}" in r["error"], r["error"]
    assert "authentication failed" in r["error"], r["error"]
    assert "MONARCH_CLUSTER_SECRET" in r["error"], r["error"]
    assert r["took_s"] < 15, r
    # The gateway logged the rejection.
    assert "rejected a TCP connection" in workers[0].log.read_text()
