"""Fixtures for multi-host tests: simulated hosts in Linux network namespaces.

``netns_cluster`` (session scope) is a :class:`~.netns.Cluster` of three hosts and a
client namespace, shared by every test of the session. Where namespaces cannot be used
(not root, no ``ip``, a container without the capabilities), the tests using it are
skipped with the reason, unless ``MONARCH_REQUIRE_NETNS=1`` is set, as CI does: then they
fail, since a skipped multi-host suite would pass without testing anything.

After each test of this directory, ``_no_leftovers_in_namespaces`` checks that the test
left no process inside the cluster's namespaces, the way the suite-wide leak check of
``tests/conftest.py`` does for child processes, but also catching daemonised ones that
are no longer descendants of pytest: leftovers get 5 s to exit, then are killed and the
test fails with their command lines. Exempt are the processes that were already there
when the test started (started by a wider-scoped fixture) and those the test registered
with ``keep_running``, which stops them itself after the check. Every host that a test
cut off is also reconnected, so one test's partition does not leak into the next.

At the end of the session the cluster is destroyed; if processes were still inside it,
they are reported and the session fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import Cluster, NsProcess, available, cleanup_stale

#: Set to 1 (CI does) to make unusable namespaces an error rather than a skip.
REQUIRE_ENV = "MONARCH_REQUIRE_NETNS"
#: How long processes left in the namespaces get to exit after a test.
GRACE_SECONDS = 5.0
#: How often the check polls the namespaces during the grace period.
POLL_SECONDS = 0.05
#: How long ``keep_running`` waits for a process after SIGTERM, then after SIGKILL.
STOP_TIMEOUT = 5.0

_CLUSTER = pytest.StashKey[Cluster]()


@pytest.fixture(scope="session")
def netns_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Three simulated hosts and a client namespace, for the whole session.

    Skips where namespaces are unusable, or fails if ``MONARCH_REQUIRE_NETNS=1``.
    Leftovers of crashed earlier runs are removed first.
    """
    ok, reason = available()
    if not ok:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(
                f"{REQUIRE_ENV}=1 but network namespaces cannot be used here: {reason}",
                pytrace=False,
            )
        pytest.skip(f"network namespaces unavailable ({reason}); {REQUIRE_ENV}=1 makes this fail")
    cleanup_stale()
    cluster = Cluster.create(3)
    request.config.stash[_CLUSTER] = cluster
    try:
        yield cluster
    finally:
        del request.config.stash[_CLUSTER]
        leftovers = cluster.destroy()
        if leftovers:
            report = _report(leftovers)
            print(
                f"\nmultihost: processes left in the namespaces at exit:\n{report}", file=sys.stderr
            )
            pytest.fail(
                f"{len(leftovers)} process(es) were still inside the cluster's namespaces at "
                f"the end of the session (now killed):\n{report}\nstop every process a "
                "fixture starts in a host before the fixture ends",
                pytrace=False,
            )


@pytest.fixture
def keep_running() -> Iterator[list[subprocess.Popen[Any]]]:
    """A list to append processes that may outlive the test body (a server in a host).

    The leftover check does not count them (nor their descendants); after it, this fixture
    stops each one: SIGTERM, up to 5 s to exit, then SIGKILL.
    """
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


@pytest.fixture(autouse=True)
def _no_leftovers_in_namespaces(
    request: pytest.FixtureRequest, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[None]:
    """Fail the test if it leaves a process inside the cluster's namespaces.

    It requests ``keep_running`` so that ``keep_running`` is torn down after this check:
    the kept processes are still running while they are exempted here, then stopped.
    """
    before = _snapshot(request)
    yield
    cluster = request.config.stash.get(_CLUSTER, None)
    if cluster is None:  # no cluster (yet): the test could not have started anything
        return
    for host in cluster.members:
        host.restore()
    kept = {proc.pid for proc in keep_running}
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        leftovers = [
            p
            for p in cluster.processes()
            if (p.pid, _start_ticks(p.pid)) not in before and not _descends(p.pid, kept)
        ]
        if not leftovers or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)  # polling the namespaces for exits; nothing to wait on
    if not leftovers:
        return
    _kill(cluster, leftovers)
    pytest.fail(
        f"test left {len(leftovers)} process(es) inside the cluster's namespaces, still "
        f"running {GRACE_SECONDS:g} s after it ended (now killed):\n{_report(leftovers)}\n"
        "wait for every process a test starts in a host, or register it in `keep_running`",
        pytrace=False,
    )


def _snapshot(request: pytest.FixtureRequest) -> set[tuple[int, int | None]]:
    cluster = request.config.stash.get(_CLUSTER, None)
    if cluster is None:
        return set()
    return {(p.pid, _start_ticks(p.pid)) for p in cluster.processes()}


def _start_ticks(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    return int(data[data.rindex(")") + 2 :].split()[19])


def _descends(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or a descendant of one."""
    seen = set()
    while pid > 1 and pid not in seen:
        if pid in ancestors:
            return True
        seen.add(pid)
        try:
            data = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        except OSError:
            return False
        pid = int(data[data.rindex(")") + 2 :].split()[1])
    return False


def _kill(cluster: Cluster, procs: list[NsProcess]) -> None:
    """SIGKILL ``procs`` and wait (bounded) until they have left the namespaces."""
    targets = {(p.pid, _start_ticks(p.pid)) for p in procs}
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        if not {(p.pid, _start_ticks(p.pid)) for p in cluster.processes()} & targets:
            return
        time.sleep(POLL_SECONDS)  # polling the namespaces for exits; nothing to wait on


def _report(procs: list[NsProcess]) -> str:
    return "\n".join(f"  {p.namespace}: pid {p.pid}: {p.cmdline}" for p in procs)
