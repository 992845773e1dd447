"""Fixtures for the real-Slurm tests: a Slurm cluster over network-namespace hosts.

``slurm`` (session scope) is a :class:`~.harness.SlurmCluster` of three nodes over a
namespace cluster of its own. Where it cannot run (not root, no namespaces, Slurm or munge
not installed), the tests using it are skipped with the reason, unless
``MONARCH_REQUIRE_SLURM=1`` is set, as CI does: then they fail, since a skipped Slurm
suite would pass without testing anything.

After each test, ``_no_jobs_or_steps_left`` checks that the test left no Slurm job and no
process in the namespaces other than the daemons: leftovers get 10 s to go (a cancelled
job ends within ``KillWait``), then are cancelled and killed and the test fails naming
them. Every node is back to idle (a test that cut a host off or killed a slurmd restarts
the cluster with ``break_cluster``: the next test gets a fresh one).

At the end of the session the cluster is stopped; if processes had to be killed then, the
session fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest

from multihost.netns import Cluster, cleanup_stale
from multihost.netns import available as netns_available

from .harness import SlurmCluster, SlurmError, available

#: Set to 1 (CI does) to make a Slurm that cannot run an error rather than a skip.
REQUIRE_ENV = "MONARCH_REQUIRE_SLURM"
#: How long a test's jobs and job processes get to end after it.
GRACE_SECONDS = 10.0
POLL_SECONDS = 0.05
#: Nodes of the session's cluster.
NODES = 3


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but Slurm cannot run here: {reason}", pytrace=False)
    pytest.skip(f"Slurm unavailable ({reason}); {REQUIRE_ENV}=1 makes this fail")


class _Holder:
    """The session's cluster, rebuilt when a test broke it (a cut host, a dead slurmd)."""

    def __init__(self) -> None:
        self.net: Cluster | None = None
        self.slurm: SlurmCluster | None = None
        self.broken = False
        self.leftovers: list[str] = []

    def get(self) -> SlurmCluster:
        if self.slurm is not None and not self.broken:
            return self.slurm
        self.close(report=not self.broken)
        cleanup_stale()
        self.net = Cluster.create(NODES)
        self.slurm = SlurmCluster.start(self.net)
        self.broken = False
        return self.slurm

    def close(self, report: bool = True) -> None:
        """Stop the cluster; what had to be killed counts as a leak when ``report``
        (a broken cluster's job processes on a cut host are expected)."""
        if self.slurm is not None:
            killed = self.slurm.stop()
            if report:
                self.leftovers += killed
            self.slurm = None
        if self.net is not None:
            self.net.destroy()
            self.net = None


@pytest.fixture(scope="session")
def _slurm_holder() -> Iterator[_Holder]:
    ok, reason = netns_available()
    if ok:
        ok, reason = available()
    if not ok:
        _unavailable(reason)
    holder = _Holder()
    try:
        yield holder
    finally:
        holder.close(report=not holder.broken)
        if holder.leftovers:
            pytest.fail(
                "Slurm: processes were left in the namespaces when the cluster stopped "
                "(now killed):\n  " + "\n  ".join(holder.leftovers),
                pytrace=False,
            )


@pytest.fixture
def slurm(_slurm_holder: _Holder) -> Iterator[SlurmCluster]:
    """The session's Slurm cluster, idle, checked for leftovers after the test."""
    try:
        cluster = _slurm_holder.get()
    except SlurmError as e:
        _unavailable(str(e))
        raise
    yield cluster
    _check_left(cluster, _slurm_holder)


@pytest.fixture
def break_cluster(slurm: SlurmCluster, _slurm_holder: _Holder) -> Iterator[None]:
    """Request it in a test that breaks a node (cut, slurmd killed): the cluster is
    rebuilt for the next test (torn down before ``slurm``, which then skips its check)."""
    yield
    _slurm_holder.broken = True


def _check_left(cluster: SlurmCluster, holder: _Holder) -> None:
    if holder.broken:
        return  # rebuilt before the next test; stopping it kills what is left
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        jobs = cluster.jobs()
        steps = cluster.step_processes()
        if (not jobs and not steps) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)  # polling Slurm and the namespaces; nothing to wait on
    if not jobs and not steps:
        return
    if jobs:
        cluster.command(["scancel", *jobs], check=False)
    for p in steps:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    holder.broken = True  # a fresh cluster for the next test
    report = [f"job {j}" for j in jobs] + [
        f"{p.namespace}: pid {p.pid}: {p.cmdline}" for p in steps
    ]
    pytest.fail(
        f"test left Slurm jobs or job processes {GRACE_SECONDS:g} s after it ended (now "
        "cancelled and killed):\n  " + "\n  ".join(report) + "\nkill() every SlurmJob a "
        "test applies",
        pytrace=False,
    )
