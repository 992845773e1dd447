"""``monarch.rdma`` across hosts: worker agents in two network-namespace hosts and a client
(``rdma_client_script.py``) in the client namespace. An actor on host 0 owns a 64 MiB
buffer; the actor on host 1 and the client read and write it over TCP (the backend the
handle reports), with one ``RDMATcpFallbackWarning`` per process; killing host 0's worker
makes transfers raise ``SupervisionError`` naming the owner, not hang.

The workers and clients are those of ``test_hosts.py`` (same fixtures' style: the
workers live for the module, a test that breaks one restarts nothing itself, the next
``healthy`` does).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster
from .test_hosts import Client, Worker, _env, kept_healthy, running_workers

pytest.importorskip("torch")

HERE = Path(__file__).parent
#: Prompt: the client's supervision budget across hosts is 5 s; this is generous.
PROMPT_S = 10


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    """Workers in two of the cluster's hosts: host 0 owns, host 1 uses."""
    yield from running_workers(netns_cluster.hosts[:2], tmp_path_factory.mktemp("rdma-workers"))


@pytest.fixture
def healthy(
    workers: list[Worker], netns_cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    """Both workers running before the test (one that an earlier test killed is
    restarted)."""
    yield from kept_healthy(workers, netns_cluster, keep_running)


class RdmaClient(Client):
    """A client running ``rdma_client_script.py`` in the client namespace."""

    def __init__(self, cluster: Cluster, scenario: str, addresses: list[str]) -> None:
        self.proc = cluster.client.popen(
            [sys.executable, str(HERE / "rdma_client_script.py"), scenario, *addresses],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def _addresses(workers: list[Worker]) -> list[str]:
    return [w.address for w in workers]


def _check_use(report: dict[str, Any], owner_id: str, who: str) -> None:
    n = 64 << 20
    assert (report["size"], report["owner"], report["backend"]) == (n, owner_id, "tcp"), (
        who,
        report,
    )
    for step in ("read", "tail", "read_back", "action", "owner_check"):
        assert report[step] == "", (who, step, report[step])
    # The first transfer over TCP in a process warns, once.
    assert report["warnings"] == ["RDMATcpFallbackWarning"], (who, report["all_warnings"])


@pytest.mark.timeout(300)
def test_buffer_of_one_host_read_and_written_from_others_over_tcp(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = RdmaClient(netns_cluster, "transfers", _addresses(healthy))
    r = client.result(timeout=240)
    client.finish()
    owner_id = r["owner"]["actor_id"]
    assert healthy[0].host.ip in owner_id, r["owner"]
    assert r["other"]["actor_id"] != owner_id
    _check_use(r["remote"], owner_id, "actor on host 1")
    _check_use(r["local"], owner_id, "client")
    kind, message = r["after_drop"]
    assert kind == "dropped" and "dropped" in message, r["after_drop"]
    assert r["failures"] == [], r["failures"]


@pytest.mark.timeout(300)
def test_killed_owner_host_fails_transfers_with_supervision_error(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = RdmaClient(netns_cluster, "owner_host_killed", _addresses(healthy))
    client.expect("READY", timeout=240)
    victim = healthy[0]
    assert victim.proc is not None
    killed_at = time.monotonic()
    victim.proc.kill()
    victim.proc.wait(10)
    client.tell(repr(killed_at))
    r = client.result(timeout=240)
    client.finish()
    owner_id = r["owner"]["actor_id"]
    report = r["report"]
    assert report["bad"] == [], report
    assert report["ok"] >= 1, report
    assert report["error"] is not None, "reads went on succeeding after the owner's host died"
    kind, message = report["error"]
    assert kind == "SupervisionError" and owner_id in message, report["error"]
    assert report["failed_at"] - killed_at < PROMPT_S, report
    assert len(report["after"]) == 2
    for kind, message, took in report["after"]:
        assert kind == "SupervisionError" and owner_id in message, (kind, message)
        assert took < PROMPT_S, took
    kind, message, took = r["client_after"]
    assert kind == "SupervisionError" and owner_id in message, r["client_after"]
    assert took < PROMPT_S, took
    assert r["failures"], "the client was told of the lost host"
