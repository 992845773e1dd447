"""Recovery of data-parallel training across real hosts (docs/recovery.md): four
network-namespace hosts, a worker agent in each, and a client (``recovery_client.py``)
in the client namespace that trains 3 replicas of ``ElasticTrainer`` on hosts 0-2 with a
warm spare on host 3.

In the middle of step 3, while every replica waits (on a file the test creates) just
before its gradients' allreduce, the test breaks host 1: it SIGKILLs everything running
there (the worker, its fork server and the replica's proc), or cuts its link. The run
must replace the lost replica with the spare on host 3, compute that step again (and no
other) and end with the weights of a run without the failure (one reference run per
module); nothing may be left running on any host.

The four hosts are a cluster of this module's own (the session's ``netns_cluster`` has
three, which the other multi-host tests count on), with the same after-test check for
processes left behind as the session cluster's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    GRACE_SECONDS,
    POLL_SECONDS,
    REQUIRE_ENV,
    _descends,
    _kill,
    _report,
    _start_ticks,
)
from .netns import Cluster, available, cleanup_stale
from .test_hosts import HERE, Client, Worker, _env, kept_healthy, running_workers

pytest.importorskip("torch")

#: Hosts: 3 for the replicas, 1 spare.
HOSTS = 4
#: Steps of each run, and how many are done when host 1 is broken.
STEPS = 6
KILL_AT = 3


@pytest.fixture(scope="module")
def cluster4() -> Iterator[Cluster]:
    """Four simulated hosts and a client namespace, for this module."""
    ok, reason = available()
    if not ok:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but network namespaces cannot be used here: {reason}")
        pytest.skip(f"network namespaces unavailable ({reason}); {REQUIRE_ENV}=1 makes this fail")
    cleanup_stale()
    cluster = Cluster.create(HOSTS)
    try:
        yield cluster
    finally:
        leftovers = cluster.destroy()
        if leftovers:
            pytest.fail(
                f"{len(leftovers)} process(es) were still inside the recovery cluster's "
                f"namespaces at the end of the module (now killed):\n{_report(leftovers)}",
                pytrace=False,
            )


@pytest.fixture(scope="module")
def workers4(cluster4: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    yield from running_workers(cluster4.hosts, tmp_path_factory.mktemp("recovery-workers"))


@pytest.fixture
def healthy4(
    workers4: list[Worker], cluster4: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    """Every worker running (one an earlier test broke restarted), and after the test:
    every host reconnected and no process the test started left in the namespaces."""
    before = {(p.pid, _start_ticks(p.pid)) for p in cluster4.processes()}
    yield from kept_healthy(workers4, cluster4, keep_running)
    kept = {proc.pid for proc in keep_running}
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        leftovers = [
            p
            for p in cluster4.processes()
            if (p.pid, _start_ticks(p.pid)) not in before and not _descends(p.pid, kept)
        ]
        if not leftovers or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)  # polling the namespaces for exits; nothing to wait on
    if leftovers:
        _kill(cluster4, leftovers)
        pytest.fail(
            f"test left {len(leftovers)} process(es) in the recovery cluster's namespaces "
            f"{GRACE_SECONDS:g} s after it ended (now killed):\n{_report(leftovers)}",
            pytrace=False,
        )


class RecoveryClient(Client):
    """``recovery_client.py`` in the client namespace (``expect``, ``result`` and
    ``finish`` as for the other clients): a run without failure when ``kill_at`` is
    -1, which writes its weights to ``reference``; else a run broken after ``kill_at``
    steps, compared with them."""

    def __init__(
        self, cluster: Cluster, addresses: list[str], kill_at: int, reference: Path, gate: Path
    ) -> None:
        argv = [str(HERE / "recovery_client.py"), str(STEPS), str(kill_at), str(reference)]
        argv.append(str(gate))
        self.proc = cluster.client.popen(
            [sys.executable, *argv, *addresses],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def go(self, broke_at: float) -> None:  # type: ignore[override]
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {broke_at}\n")
        self.proc.stdin.flush()


@pytest.fixture(scope="module")
def reference(
    cluster4: Cluster, workers4: list[Worker], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The weights of a run without failure (3 replicas, a spare, ``STEPS`` steps), for
    every case of the module: each case's broken run must end with them."""
    path = tmp_path_factory.mktemp("recovery") / "reference.json"
    client = RecoveryClient(cluster4, [w.address for w in workers4], -1, path, path.parent)
    took = client.result(timeout=180)["run_s"]
    client.finish()
    print(f"\nreference run (no failure): {took:.1f} s")
    return path


def _break(cluster: Cluster, workers: list[Worker], host: int, how: str) -> float:
    """Break ``host``: SIGKILL every process running on it (its worker, the worker's
    fork server, the replica's proc), or cut its link. When it broke (monotonic)."""
    victim = cluster.hosts[host]
    if how == "cut":
        victim.cut()
        return time.monotonic()
    pids = cluster.pids_in(victim)
    assert pids, f"nothing runs in {victim.name}"
    broke_at = time.monotonic()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker = workers[host]
    assert worker.proc is not None
    worker.proc.wait(10)
    return broke_at


def _wait_for_files(paths: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise AssertionError(f"the replicas did not reach the gated step: no {missing}")
        time.sleep(0.005)  # polling files the replicas create; nothing to wait on


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["kill", "cut"])
def test_a_host_lost_mid_step_is_replaced_by_the_spare_and_the_weights_match(
    cluster4: Cluster, healthy4: list[Worker], reference: Path, tmp_path: Path, how: str
) -> None:
    started = time.monotonic()
    addresses = [w.address for w in healthy4]
    client = RecoveryClient(cluster4, addresses, KILL_AT, reference, tmp_path)
    pid, host = (int(v) for v in client.expect("READY ").split())
    assert host == 1, f"replica 1 runs on host {host}, not host 1"
    assert pid in cluster4.pids_in(cluster4.hosts[1]), "replica 1's proc is not on host 1"
    # Every replica is inside step KILL_AT, before its gradients' allreduce.
    _wait_for_files([tmp_path / f"in-step-{rank}" for rank in range(3)], timeout=60)
    broke_at = _break(cluster4, healthy4, 1, how)
    (tmp_path / "go").touch()
    client.go(broke_at)
    r = client.result(timeout=180)
    client.finish()
    rec = r["recovery"]
    print(
        f"\n{how}: run {r['run_s']:.1f} s (start {r['start_s']:.1f} s, stop "
        f"{r['stop_s']:.1f} s); break -> next completed step "
        f"{r['break_to_next_step_s']:.2f} s (recovery {rec['seconds']:.2f} s, "
        f"{rec['attempts']} attempt(s)); whole test {time.monotonic() - started:.1f} s; "
        f"new spare on host(s) {r['spare_hosts_after']}"
    )
    assert r["diff"] <= 1e-6, r
    assert r["hosts_before"] == [0, 1, 2] and r["spare_hosts"] == [3], r
    # The step in flight was computed again, and only it.
    assert rec["step"] == KILL_AT, rec
    assert r["steps"] == list(range(STEPS)), r
    assert rec["lost"] == [1] and rec["world"] == 3 and rec["source"] == 0, rec
    # Host 1 was lost, not only a process: the spare on host 3 took replica 1's place.
    assert rec["replaced"] == {"1": 3}, rec
    assert r["hosts_after"] == [0, 3, 2], r
    assert rec["attempts"] == 1, rec
    # Every failure of the replicas' meshes went to the trainer, not to the hook.
    assert not r["unhandled"], r
