"""``monarch.actor.attach`` on one machine: a client attached to one worker (its
gateway) drives two workers through it, and the errors a user can hit.

The workers and the clients are subprocesses (``attach`` must be a process's first
monarch call); the workers serve ``tcp://127.0.0.1`` on sockets this test binds and
passes (socket activation), with a cluster secret. tests/multihost/test_gateway_hosts.py
runs the same client from a network namespace that reaches only the gateway.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch._src.actor.workers import READY_LINE

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "multihost" / "gateway_client.py"
SECRET = "gateway-test-secret"


def _env(secret: str = SECRET) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("MONARCH_CLUSTER_AUTH", "MONARCH_TLS_CA", "MONARCH_TLS_CERT", "MONARCH_TLS_KEY"):
        env.pop(name, None)
    env["MONARCH_CLUSTER_SECRET"] = secret
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return env


class LocalWorker:
    """A worker on a loopback port it inherited, its output in a file."""

    def __init__(self, log: Path) -> None:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "monarch.tools.cli",
                    "worker",
                    "--address",
                    f"tcp://127.0.0.1:fd{sock.fileno()}",
                ],
                pass_fds=(sock.fileno(),),
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        sock.close()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while READY_LINE not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)  # polling the worker's log for its ready line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[LocalWorker]]:
    started = [LocalWorker(tmp_path / f"worker{i}.log") for i in range(2)]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        for w in started:
            w.stop()


def _client(*args: str, secret: str = SECRET) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), *args],
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
def test_an_attached_client_drives_two_workers_through_one(workers: list[LocalWorker]) -> None:
    gateway = workers[0].address
    r = _client("drive", gateway, *[w.address for w in workers])
    assert r["client_proc"].endswith(f"@tcp:127.0.0.1:{workers[0].port}"), r
    assert r["totals"] == [55] * 4
    assert r["reported"] == list(range(4))
    for rank in range(4):
        assert f"[members {rank}] said by rank {rank}" in r["stdout"]
    assert r["failures"] and "exited with status 3" in r["failures"][0], r["failures"]
    assert r["error"] is not None and "unexpected" not in r["error"], r["error"]
    assert r["survivors"] == 1
    for w in workers:
        assert w.proc.wait(timeout=30) == 0, "HostMesh.shutdown() ended the worker"


@pytest.mark.timeout(120)
def test_attach_after_monarch_started_raises_saying_to_call_it_first(
    workers: list[LocalWorker],
) -> None:
    r = _client("late", workers[0].address)
    assert r["error"] is not None
    assert "must come before the client's first use of monarch" in r["error"], r["error"]
    assert "first thing in your program" in r["error"], r["error"]


@pytest.mark.timeout(120)
def test_a_gateway_refuses_wrong_credentials_naming_itself(workers: list[LocalWorker]) -> None:
    r = _client("credentials", workers[0].address, secret="wrong-secret")
    assert r["error"] is not None
    assert f"tcp:127.0.0.1:{workers[0].port}" in r["error"], r["error"]
    assert "authentication failed" in r["error"], r["error"]
    assert "rejected a TCP connection" in workers[0].log.read_text()


@pytest.mark.timeout(120)
def test_attaching_to_something_that_is_not_a_worker_says_so(tmp_path: Path) -> None:
    # Nothing listens on a port that was bound and closed.
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    r = _client("credentials", f"tcp://127.0.0.1:{port}")
    assert r["error"] is not None
    assert f"tcp:127.0.0.1:{port}" in r["error"] and "refused" in r["error"], r["error"]


@pytest.mark.timeout(120)
def test_when_the_gateway_dies_every_host_is_lost_and_the_fault_hook_hears(
    workers: list[LocalWorker],
) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), "gateway-dies", workers[0].address]
        + [w.address for w in workers],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", line + proc.stderr.read() if proc.stderr else line
        workers[0].proc.kill()
        workers[0].proc.wait(timeout=10)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, err[-4000:]
    r = json.loads(lines[-1][len("RESULT ") :])
    # Both hosts' procs (the gateway's own, and those behind it) fail, promptly.
    assert len(r["failures"]) == 4, r
    assert all("lost" in f for f in r["failures"]), r["failures"]
    assert r["detected_s"] < 10, r


def test_attach_checks_its_address() -> None:
    from monarch.actor import attach

    for bad in ("", "   ", None, 26600):
        with pytest.raises(ValueError, match="gateway address"):
            attach(bad)  # type: ignore[arg-type]
