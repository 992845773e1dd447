"""Mutual TLS between a worker and its clients (``ca=`` and ``private_key=``).

The CA and node certificates are made by the ``openssl`` commands of docs/security.md
(the tests are skipped without ``openssl``). The worker runs
``run_worker_loop_forever`` in a subprocess; each client runs in a subprocess of its
own too, since a process's TCP mode is for its whole life.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from monarch._src.actor.workers import READY_LINE, attach_to_workers

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("bash") is None,
    reason="the openssl command (or bash, to run the commands of docs/security.md) is "
    "not installed",
)

ROOT = Path(__file__).resolve().parents[1]

CLIENT = """\
import json
import sys

from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x + 1


worker, ca, key = sys.argv[1:4]
enable_transport("tcp-localhost")
hosts = attach_to_workers(workers=[worker], ca=ca, private_key=key)
try:
    hosts.initialized.get(timeout=60)
except Exception as e:
    print("RESULT " + json.dumps({"error": str(e)}), flush=True)
    sys.exit(0)
procs = hosts.spawn_procs(per_host={"gpus": 2})
answers = procs.spawn("echo", Echo).echo.call(41).get(timeout=60)
procs.stop().get(timeout=60)
print("RESULT " + json.dumps({"answers": sorted(answers.values())}), flush=True)
"""


#: The block of docs/security.md that makes a CA and a node's files (after its marker).
_PKI_BLOCK = re.compile(r"<!-- test_tls: pki -->\n```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass
class Pki:
    """The files of a test CA and a node (its key followed by its certificate)."""

    ca: Path
    node: Path


def _make_pki(dir: Path) -> Pki:
    """A CA and one node certificate signed by it, made by the commands of
    docs/security.md."""
    match = _PKI_BLOCK.search((ROOT / "docs" / "security.md").read_text())
    assert match, "docs/security.md lost its block that makes a CA (<!-- test_tls: pki -->)"
    dir.mkdir()
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", match.group(1)],
        cwd=dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return Pki(ca=dir / "ca.pem", node=dir / "node.pem")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in (
        "MONARCH_CLUSTER_SECRET",
        "MONARCH_CLUSTER_AUTH",
        "MONARCH_TLS_CA",
        "MONARCH_TLS_CERT",
        "MONARCH_TLS_KEY",
    ):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Worker:
    address: str
    log: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("pki") / "cluster")


@pytest.fixture
def worker(cluster: Pki, tmp_path: Path) -> Iterator[Worker]:
    """A worker on this machine whose credentials are the cluster's."""
    port = _free_port()
    log = tmp_path / "worker.log"
    code = (
        "from monarch.actor import run_worker_loop_forever\n"
        f"run_worker_loop_forever(address='tcp://127.0.0.1:{port}', "
        f"ca={str(cluster.ca)!r}, private_key={str(cluster.node)!r})\n"
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=_env(), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        marker = f"{READY_LINE} tcp:127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while marker not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield Worker(address=f"tcp://127.0.0.1:{port}", log=log)
    finally:
        _stop(proc)


def _client(worker: Worker, pki: Pki, tmp_path: Path) -> dict[str, object]:
    """Runs the client program with `pki`'s credentials; returns its result."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    out = subprocess.run(
        [sys.executable, str(script), worker.address, str(pki.ca), str(pki.node)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    result: dict[str, object] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


@pytest.mark.timeout(240)
def test_a_client_with_the_clusters_certificate_spawns_and_calls(
    cluster: Pki, worker: Worker, tmp_path: Path
) -> None:
    result = _client(worker, cluster, tmp_path)
    assert result == {"answers": [42, 42]}, result


@pytest.mark.timeout(240)
def test_a_client_with_a_certificate_of_another_ca_is_refused(
    worker: Worker, tmp_path: Path
) -> None:
    intruder = _make_pki(tmp_path / "intruder")
    result = _client(worker, intruder, tmp_path)
    error = str(result.get("error"))
    assert "authentication" in error, result
    assert worker.address.removeprefix("tcp://") in error, result
    # The worker logged why it refused the client, and still serves.
    deadline = time.monotonic() + 30
    while "rejected a TCP connection" not in worker.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, worker.log.read_text()[-2000:]
        time.sleep(0.05)


@pytest.mark.timeout(30)
def test_credentials_are_checked_before_anything_starts(cluster: Pki, tmp_path: Path) -> None:
    """Bad credentials raise before this process's mode changes (so this runs in the
    test process)."""
    nowhere = ["tcp://127.0.0.1:1"]
    with pytest.raises(ValueError, match=r"ca=.*private_key="):
        attach_to_workers(workers=nowhere, ca=str(cluster.ca))
    with pytest.raises(FileNotFoundError, match=r"missing\.pem"):
        attach_to_workers(
            workers=nowhere, ca=str(tmp_path / "missing.pem"), private_key=str(cluster.node)
        )
    with pytest.raises(FileNotFoundError, match="private_key="):
        attach_to_workers(workers=nowhere, ca=str(cluster.ca), private_key=str(tmp_path / "no"))
    # A key and certificate of another CA: the runtime refuses them, naming the files.
    stranger = _make_pki(tmp_path / "stranger")
    with pytest.raises(ValueError, match="not accepted under the CA"):
        attach_to_workers(workers=nowhere, ca=str(cluster.ca), private_key=str(stranger.node))
