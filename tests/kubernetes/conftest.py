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

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the Kubernetes tests need `pip install kubernetes`")

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # for multihost.netns
    sys.path.insert(0, str(HERE.parent))

from fake_apiserver import EventWaiter, FakeApiServer, FakeKubelet  # noqa: E402

from multihost.netns import Cluster, available, cleanup_stale  # noqa: E402

REQUIRE_ENV = "MONARCH_REQUIRE_NETNS"
NAMESPACE = "monarch-test"
#: Seconds a client script may run.
CLIENT_TIMEOUT = 90.0


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


@dataclass
class FakeK8s:
    api: FakeApiServer
    kubelet: FakeKubelet
    cluster: Cluster
    kubeconfig: Path
    tmp: Path
    events: EventWaiter

    def run(self, script: Path, *args: str, timeout: float = CLIENT_TIMEOUT) -> tuple[int, str]:
        """Run ``script ARGS`` in the client namespace (as a client pod would run);
        its exit status and output."""
        env = dict(os.environ)
        for key in ("MONARCH_CLUSTER_SECRET", "MONARCH_CLUSTER_AUTH", "MONARCH_TLS_CA"):
            env.pop(key, None)
        env.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)  # run as users run it
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE.parents[1] / "python"), str(HERE), env.get("PYTHONPATH", "")]
        )
        done = self.cluster.client.run(
            [sys.executable, str(script), *args],
            timeout=timeout,
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
        )
        return done.returncode, done.stdout + done.stderr

    def client(self, *args: str, timeout: float = CLIENT_TIMEOUT) -> tuple[int, dict, str]:
        """Run ``k8s_client.py ARGS``; its exit status, the JSON of its ``RESULT`` line
        (or ``{}``) and its output."""
        code, output = self.run(
            HERE / "k8s_client.py",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            NAMESPACE,
            *args,
            timeout=timeout,
        )
        result: dict = {}
        for line in output.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line.removeprefix("RESULT "))
        return code, result, output


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
