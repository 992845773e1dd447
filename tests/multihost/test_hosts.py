"""Real multi-host tests: a worker agent in each of three network-namespace hosts, and
clients (``client_script.py``) in the client namespace, all over authenticated TCP.

Each test that breaks a host (kills, freezes or cuts it) restarts its worker after.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from output_lines import LineReader
from proc_state import freeze

from .netns import Cluster, Host

HERE = Path(__file__).parent
PORT = 26600
SECRET = "multihost-test-secret"
#: The lease of a client on its procs (short, so the reaping test is quick).
LEASE = "2s"


def _env(secret: str = SECRET) -> dict[str, str]:
    env = dict(os.environ)
    env["MONARCH_CLUSTER_SECRET"] = secret
    env["MONARCH_HOST_CLIENT_LEASE"] = LEASE
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent.parent / "python"), env.get("PYTHONPATH", "")]
    )
    env.pop("MONARCH_CLUSTER_AUTH", None)
    # A client that gives no answer in time is sent SIGABRT: its threads' stacks then
    # end its stderr (what it was waiting on).
    env["PYTHONFAULTHANDLER"] = "1"
    return env


class Worker:
    """A worker agent in one host namespace, its output in a file."""

    def __init__(self, host: Host, log_dir: Path) -> None:
        self.host = host
        self.address = f"tcp://{host.ip}:{PORT}"
        self.log = log_dir / f"worker-{host.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: Where a (re)started worker is registered as outliving the test (the
        #: ``keep_running`` list of the test running, which stops it after).
        self.registry: list[subprocess.Popen[Any]] | None = None

    def start(self) -> None:
        seen = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = self.host.popen(
                [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", self.address],
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if self.registry is not None:
            self.registry.append(self.proc)
        deadline = time.monotonic() + 60
        marker = f"monarch worker ready at tcp:{self.host.ip}:{PORT}"
        while marker not in self.log.read_bytes()[seen:].decode(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker in {self.host.name} did not start: {self.log.read_text()[-2000:]}"
                )
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def running_workers(hosts: list[Host], log_dir: Path) -> Iterator[list[Worker]]:
    """A worker started on each of ``hosts``, all stopped when the generator closes
    (the body of a module-scoped ``workers`` fixture)."""
    started = [Worker(h, log_dir) for h in hosts]
    try:
        for w in started:
            w.start()
        yield started
    finally:
        for w in started:
            w.stop()


def kept_healthy(
    workers: list[Worker], cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    """Every worker running before the test; one the test broke, or that an earlier
    test's break made this restart, is stopped after the test (and restarted by the
    next one); every host's network is restored (the body of a ``healthy`` fixture)."""
    for w in workers:
        w.registry = keep_running
        if not w.alive():
            w.start()
    yield workers
    for w in workers:
        w.registry = None
    for host in cluster.hosts:
        host.restore()


@pytest.fixture(scope="module")
def workers(
    netns_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    yield from running_workers(netns_cluster.hosts, tmp_path_factory.mktemp("workers"))


@pytest.fixture
def healthy(
    workers: list[Worker], netns_cluster: Cluster, keep_running: list[subprocess.Popen[Any]]
) -> Iterator[list[Worker]]:
    yield from kept_healthy(workers, netns_cluster, keep_running)


class Client:
    """A client program in the client namespace."""

    def __init__(self, cluster: Cluster, scenario: str, addresses: list[str], secret: str = SECRET):
        self.proc = cluster.client.popen(
            [sys.executable, str(HERE / "client_script.py"), scenario, *addresses],
            env=_env(secret),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def expect(self, prefix: str, timeout: float = 120) -> str:
        """The next stdout line starting with ``prefix`` (other lines are skipped)."""
        lines = LineReader.of(self.proc)
        line = lines.until(prefix, timeout)
        if line is not None:
            return line[len(prefix) :].strip()
        self.proc.send_signal(signal.SIGABRT)  # its stacks, to stderr (PYTHONFAULTHANDLER)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
        out = "".join(lines.seen)
        raise AssertionError(
            f"client gave no {prefix!r} line; stdout:\n{out[-2000:]}\nstderr:\n{err[-8000:]}"
        )

    def result(self, timeout: float = 120) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.expect("RESULT ", timeout))
        return value

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> None:
        try:
            self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=30)
            raise
        assert self.proc.returncode == 0, f"client exited with {self.proc.returncode}"


def _addresses(workers: list[Worker]) -> list[str]:
    return [w.address for w in workers]


@pytest.mark.timeout(240)
def test_spawn_cast_gather_order_and_nested_spawn_across_hosts(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = Client(netns_cluster, "spawn_cast", _addresses(healthy))
    r = client.result()
    client.finish()
    assert r["sizes"] == {"hosts": 3, "gpus": 2}
    # Every proc is reached directly over TCP at its own host's address.
    by_host: dict[str, int] = {}
    for place in r["places"]:
        addr = place["proc"].split("@", 1)[1]
        assert addr.startswith("tcp:"), place
        ip = addr.split(":")[1]
        by_host[ip] = by_host.get(ip, 0) + 1
        assert place["rank"]["hosts"] == [h.ip for h in netns_cluster.hosts].index(ip)
    assert by_host == {h.ip: 2 for h in netns_cluster.hosts}
    assert r["ordered"] is True
    assert len(r["nested"]) == 2


@pytest.mark.timeout(240)
def test_procs_output_reaches_the_client_across_hosts(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    """docs/logging.md: each worker sends its procs' lines to the client over TCP,
    with mesh-wide ranks; a dying proc's last words come before its failure (LOG-2)."""
    client = Client(netns_cluster, "output", _addresses(healthy))
    r = client.result()
    client.finish()
    lines = r["all"].splitlines()
    for rank in range(3):
        said = f"[talk {rank}] stdout of rank {rank} on "
        assert any(line.startswith(said) for line in lines), r["all"]
    assert r["before_failure"], "the failure reached the fault hook"
    assert "[talk 2] last words" in r["before_failure"][0], r


def _break_and_check(
    cluster: Cluster, workers: list[Worker], breaker: str
) -> tuple[dict[str, Any], Client]:
    client = Client(cluster, "failure", _addresses(workers))
    client.expect("READY")
    victim = workers[2]
    assert victim.proc is not None
    if breaker == "kill":
        victim.proc.kill()
        victim.proc.wait(10)
    elif breaker == "stop":
        freeze(victim.proc.pid)
    elif breaker == "cut":
        cluster.hosts[2].cut()
    client.go()
    r = client.result()
    assert r["failures"], r
    assert f"worker@tcp:{cluster.hosts[2].ip}:{PORT}" in r["failures"][0], r
    assert r["error"] is not None and "unexpected" not in r["error"], r
    assert r["healthy"] == 4, r
    return r, client


def _recover(cluster: Cluster, workers: list[Worker], client: Client, breaker: str) -> None:
    victim = workers[2]
    if breaker == "cut":
        cluster.hosts[2].restore()
    else:
        victim.stop()
        victim.start()
    client.go()
    assert client.result()["again"] == 1
    client.finish()


@pytest.mark.timeout(240)
def test_sigkilled_worker_fails_its_procs_and_the_rest_keeps_working(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    r, client = _break_and_check(netns_cluster, healthy, "kill")
    # Found lost by its connection failing (at once), not by heartbeats (2 s). How soon:
    # benches/multihost_bench.py (failure detection).
    assert r["detected_s"] is not None, r
    assert "its connection failed" in r["failures"][0], r
    assert "heartbeat" not in r["failures"][0], r
    _recover(netns_cluster, healthy, client, "kill")


@pytest.mark.timeout(240)
def test_sigstopped_worker_is_found_by_heartbeats(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    r, client = _break_and_check(netns_cluster, healthy, "stop")
    assert r["detected_s"] is not None and r["detected_s"] < 10, r
    _recover(netns_cluster, healthy, client, "stop")


@pytest.mark.timeout(240)
def test_partitioned_host_is_lost_and_comes_back(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    r, client = _break_and_check(netns_cluster, healthy, "cut")
    assert r["detected_s"] is not None and r["detected_s"] < 10, r
    _recover(netns_cluster, healthy, client, "cut")


#: The config's ``stop_actor_timeout`` (its default): how long stopping waits for a proc,
#: and ending a worker for its answer (plus 2 s).
STOP_TIMEOUT = 10.0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["known", "silent"])
def test_shutdown_does_not_wait_on_lost_hosts(
    netns_cluster: Cluster, healthy: list[Worker], mode: str
) -> None:
    """docs/hosts.md, "Ending the workers": with host 2's worker killed and host 1 cut
    off, HostMesh.shutdown() waits on neither once they are known lost (``known``), and
    on the cut one at most the time heartbeats take to find it lost (``silent``: shut
    down at once). It still ends the worker that answers."""
    client = Client(netns_cluster, "shutdown_lost", [*_addresses(healthy), mode])
    client.expect("READY")
    killed = healthy[2]
    assert killed.proc is not None
    killed.proc.kill()
    killed.proc.wait(10)
    netns_cluster.hosts[1].cut()
    client.go()
    r = client.result()
    client.finish()
    print(f"shutdown with lost hosts ({mode}): {r['took']:.2f} s")
    if mode == "known":
        # Neither lost host was asked to end nor waited on: each "was lost already".
        for host in netns_cluster.hosts[1:]:
            worker = f"worker@tcp:{host.ip}:{PORT}"
            assert any(worker in f for f in r["failures"]), r
            assert any(f"{worker}: it was lost already" in w for w in r["not_ended"]), r
        # Nor are their procs: nothing waits out stop_actor_timeout (10 s) on them.
        assert r["took"] < STOP_TIMEOUT - 2.0, f"shutdown took {r['took']:.1f} s: {r}"
    else:
        # The cut host is waited on until heartbeats find it lost (the configured
        # host_heartbeat_timeout), not for its answer (stop_actor_timeout and more).
        cut = f"worker@tcp:{netns_cluster.hosts[1].ip}:{PORT}: it was lost"
        assert any(cut in w and "answered no heartbeat" in w for w in r["not_ended"]), r
        assert r["took"] < STOP_TIMEOUT, f"shutdown took {r['took']:.1f} s: {r}"
    ended = healthy[0].proc
    assert ended is not None
    assert ended.wait(30) == 0, "the worker that answered was not ended by shutdown"
    # The cut worker goes too (the next test starts a fresh one): a request to end it,
    # sent before it was found lost, would reach it once its network is back.
    healthy[1].stop()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.timeout(240)
def test_killed_client_procs_are_reaped_and_workers_serve_the_next_client(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = Client(netns_cluster, "hold", _addresses(healthy))
    pids = client.result()["pids"]
    assert len(pids) == 6 and all(_running(p) for p in pids)
    client.proc.kill()
    client.proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _running(p)], "procs of a dead client outlived its lease"
    assert all(w.alive() for w in healthy)
    nxt = Client(netns_cluster, "spawn_cast", _addresses(healthy))
    assert nxt.result()["sizes"] == {"hosts": 3, "gpus": 2}
    nxt.finish()


@pytest.mark.timeout(240)
def test_wrong_secret_is_rejected_naming_the_worker(
    netns_cluster: Cluster, healthy: list[Worker]
) -> None:
    client = Client(netns_cluster, "wrong_credentials", _addresses(healthy), secret="wrong")
    r = client.result()
    client.finish()
    assert r["error"] is not None and "authentication failed" in r["error"], r
    assert healthy[0].address in r["error"], r
    assert r["spawn_error"] is not None, r
    # The workers logged the rejection, and still serve.
    assert "rejected a TCP connection" in healthy[0].log.read_text(errors="replace")
    assert all(w.alive() for w in healthy)


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.timeout(240)
def test_garbage_and_pickles_on_a_worker_port_execute_nothing(
    netns_cluster: Cluster, healthy: list[Worker], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(str(marker)))
    target = (netns_cluster.hosts[0].ip, PORT)
    for blob in [b"GET / HTTP/1.0\r\n\r\n" * 10, payload * 4, os.urandom(4096)]:
        with socket.create_connection(target, timeout=10) as s:
            s.settimeout(15)
            s.sendall(blob)
            # The worker closes the connection without answering anything but its
            # handshake.
            got = b""
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except (ConnectionResetError, TimeoutError):
                pass
            assert len(got) <= 41 + 32, got
    assert not marker.exists(), "a pickle sent to a worker port was executed"
    assert all(w.alive() for w in healthy)
    client = Client(netns_cluster, "spawn_cast", _addresses(healthy))
    assert client.result()["sizes"] == {"hosts": 3, "gpus": 2}
    client.finish()
