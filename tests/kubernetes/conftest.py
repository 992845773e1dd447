"""Fixtures for the Kubernetes tests: a fake API server whose kubelet runs real
``monarch worker`` processes in network-namespace hosts (``fake_apiserver.py``).

``k8s_hosts`` (session scope) is a :class:`multihost.netns.Cluster` of three hosts and
a client namespace. Where namespaces cannot be used (not root, no ``ip``), the tests
using it are skipped with the reason, unless ``MONARCH_REQUIRE_NETNS=1`` is set (as CI
does): then they fail. ``fake_k8s`` gives each test a fresh API server (listening on
the bridge, so that clients in the client namespace reach it), kubelet and kubeconfig,
and after the test checks that no process is left in the namespaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the Kubernetes tests need `pip install kubernetes`")

from k8s_env import REQUIRE_ENV, EventWaiter, FakeApiServer, FakeK8s, FakeKubelet

from multihost.netns import Cluster, available, cleanup_stale


@pytest.fixture(scope="session")
def k8s_hosts() -> Iterator[Cluster]:
    ok, reason = available()
    if not ok:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but network namespaces cannot be used here: {reason}")
        pytest.skip(f"network namespaces unavailable ({reason}); {REQUIRE_ENV}=1 makes this fail")
    cleanup_stale()
    cluster = Cluster.create(3)
    try:
        yield cluster
    finally:
        leftovers = cluster.destroy()
        if leftovers:
            pytest.fail(f"processes were left in the Kubernetes tests' hosts: {leftovers}")


@pytest.fixture
def fake_k8s(k8s_hosts: Cluster, tmp_path: Path) -> Iterator[FakeK8s]:
    logs = tmp_path / "logs"
    logs.mkdir()
    api = FakeApiServer(host=k8s_hosts.root_ip)
    kubelet = FakeKubelet(api, k8s_hosts.hosts, logs)
    try:
        yield FakeK8s(
            api,
            kubelet,
            k8s_hosts,
            api.write_kubeconfig(tmp_path / "kubeconfig"),
            tmp_path,
            EventWaiter(api),
        )
    finally:
        kubelet.close()
        api.close()
        left = k8s_hosts.processes()
        if left:
            k8s_hosts.kill_processes()
            pytest.fail(f"the test left processes in the hosts (now killed): {left}")
