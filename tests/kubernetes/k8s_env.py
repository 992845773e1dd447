"""What the Kubernetes tests share: the test namespace, and :class:`FakeK8s`, a fake
API server with its kubelet and how to run a client against it (the fixtures that make
them are in ``conftest.py``). A module of its own name, so that the tests import it
whichever other ``conftest`` module was imported first."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the Kubernetes tests need `pip install kubernetes`")

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # for multihost.netns
    sys.path.insert(0, str(HERE.parent))

from fake_apiserver import EventWaiter, FakeApiServer, FakeKubelet  # noqa: E402

from multihost.netns import Cluster  # noqa: E402

REQUIRE_ENV = "MONARCH_REQUIRE_NETNS"
NAMESPACE = "monarch-test"
#: Seconds a client script may run.
CLIENT_TIMEOUT = 90.0


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
