"""Tests of the network-namespace harness itself (``netns.py`` and its fixtures).

They pin what multi-host tests rely on: a host's server is reachable from the other
hosts, the client namespace and the root namespace at the host's address; ``cut()`` makes
a host unreachable without resetting connections and ``restore()`` undoes it; loopback is
per host; ``destroy()`` and ``cleanup_stale()`` leave nothing behind; the fixtures catch a
process a test leaves in a host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import netns
from .netns import Cluster, Host

HERE = Path(__file__).resolve().parent

#: A TCP echo server: prints its port, then serves ``count`` connections one after the
#: other, answering each chunk with ``<label> from <peer ip>: <chunk>``. It gives up (and
#: fails) if no client comes for 30 s, so it never outlives a broken test for long.
SERVER = """
import socket, sys
label, bind, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with socket.socket() as s:
    s.bind((bind, 0))
    s.listen()
    s.settimeout(30)
    print(s.getsockname()[1], flush=True)
    for _ in range(count):
        conn, (peer, _) = s.accept()
        with conn:
            conn.settimeout(30)
            while data := conn.recv(1024):
                conn.sendall(f"{label} from {peer}: ".encode() + data)
"""

#: Connects to ``ip:port`` within ``timeout`` s, sends ``ping`` and prints the answer, or
#: ``timeout``, or ``error:<errno name>``.
PROBE = """
import errno, socket, sys
ip, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    with socket.create_connection((ip, port), timeout=timeout) as c:
        c.sendall(b"ping")
        print(c.recv(1024).decode())
except TimeoutError:
    print("timeout")
except OSError as e:
    print("error:" + errno.errorcode.get(e.errno or 0, str(e.errno)))
"""

#: Starts ``sleep 600`` in a new session and exits without waiting for it: the sleep is
#: re-parented away from pytest, so only the namespace checks can find it.
DAEMON = (
    "import subprocess; subprocess.Popen(['sleep', '600'], start_new_session=True, "
    "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
)


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Read one line of ``proc``'s unbuffered stdout, waiting at most ``timeout`` s."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no line from {proc.args!r} within {timeout:g} s")
        chunk = os.read(fd, 1024)
        if not chunk:
            raise EOFError(f"{proc.args!r} exited ({proc.wait(timeout=5)}) before printing")
        data += chunk
    return data.decode().strip()


@contextlib.contextmanager
def serve(host: Host | None, count: int, bind: str | None = None) -> Iterator[int]:
    """Run :data:`SERVER` in ``host`` (None: the root namespace); yield its port.

    On a clean exit of the block the server must have served ``count`` connections and
    exited with 0; if the block raises, the server is killed. Either way it is waited for.
    """
    label = host.name if host else "root"
    argv = [sys.executable, "-c", SERVER, label, bind or (host.ip if host else ""), str(count)]
    proc: subprocess.Popen[bytes] = (
        host.popen(argv, stdout=subprocess.PIPE, bufsize=0)
        if host
        else subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0)
    )
    ok = False
    try:
        yield int(_read_line(proc, timeout=15))
        ok = True
    finally:
        if not ok:
            proc.kill()
        try:
            returncode = proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
            assert proc.stdout is not None
            proc.stdout.close()
    assert returncode == 0, f"server in {label} exited with {returncode}"


def probe(ip: str, port: int, *, via: Host | None, timeout: float = 5.0) -> str:
    """Run :data:`PROBE` in ``via`` (None: the root namespace) and return what it printed."""
    argv = [sys.executable, "-c", PROBE, ip, str(port), str(timeout)]
    done = subprocess.run(
        via.exec_argv(argv) if via else argv,
        capture_output=True,
        text=True,
        timeout=timeout + 20,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.timeout(60)
def test_host_server_is_reachable_from_other_host_and_root(netns_cluster: Cluster) -> None:
    h0, h1 = netns_cluster.hosts[:2]
    with serve(h0, count=2) as port:
        assert probe(h0.ip, port, via=h1) == f"{h0.name} from {h1.ip}: ping"
        assert probe(h0.ip, port, via=None) == f"{h0.name} from {netns_cluster.root_ip}: ping"


@pytest.mark.timeout(60)
def test_hosts_reach_the_root_namespace_at_root_ip(netns_cluster: Cluster) -> None:
    h0 = netns_cluster.hosts[0]
    with serve(None, count=1, bind=netns_cluster.root_ip) as port:
        assert probe(netns_cluster.root_ip, port, via=h0) == f"root from {h0.ip}: ping"


@pytest.mark.timeout(60)
def test_client_namespace_reaches_every_host(netns_cluster: Cluster) -> None:
    client = netns_cluster.client
    with contextlib.ExitStack() as stack:
        ports = [stack.enter_context(serve(h, count=1)) for h in netns_cluster.hosts]
        for host, port in zip(netns_cluster.hosts, ports, strict=True):
            assert probe(host.ip, port, via=client) == f"{host.name} from {client.ip}: ping"


@pytest.mark.timeout(60)
def test_cut_makes_connects_time_out_and_restore_reconnects(netns_cluster: Cluster) -> None:
    h0, h1 = netns_cluster.hosts[:2]
    with serve(h0, count=2) as port:  # both connections come after restore()
        h0.cut()
        try:
            assert probe(h0.ip, port, via=h1, timeout=1.0) == "timeout"
            assert probe(h0.ip, port, via=None, timeout=1.0) == "timeout"
        finally:
            h0.restore()
        assert probe(h0.ip, port, via=h1, timeout=10.0) == f"{h0.name} from {h1.ip}: ping"
        root_ip = netns_cluster.root_ip
        assert probe(h0.ip, port, via=None, timeout=10.0) == f"{h0.name} from {root_ip}: ping"


@pytest.mark.timeout(60)
def test_cut_silences_a_connection_without_resetting_it(netns_cluster: Cluster) -> None:
    h0 = netns_cluster.hosts[0]
    prefix = f"{h0.name} from {netns_cluster.root_ip}: ".encode()
    with serve(h0, count=1) as port, socket.create_connection((h0.ip, port), timeout=10) as c:
        c.sendall(b"one")
        assert c.recv(1024) == prefix + b"one"
        h0.cut()
        try:
            c.sendall(b"two")  # buffered: the cut drops packets, it reports no error
            c.settimeout(1.0)
            with pytest.raises(TimeoutError):
                c.recv(1024)
        finally:
            h0.restore()
        c.settimeout(20)  # TCP retransmits "two" once the link is back
        assert c.recv(1024) == prefix + b"two"


@pytest.mark.timeout(60)
def test_loopback_is_private_to_each_host(netns_cluster: Cluster) -> None:
    h0, h1 = netns_cluster.hosts[:2]
    with serve(h0, count=1, bind="127.0.0.1") as port:
        assert probe("127.0.0.1", port, via=h0) == f"{h0.name} from 127.0.0.1: ping"
        assert probe("127.0.0.1", port, via=h1) == "error:ECONNREFUSED"
        assert probe(h0.ip, port, via=h1) == "error:ECONNREFUSED"
        # The root namespace's loopback is its own too (something else may listen there).
        assert not probe("127.0.0.1", port, via=None).startswith(h0.name)


@pytest.mark.timeout(30)
def test_available_reports_why_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, reason = netns.available()
    assert not ok
    assert "not running as root (euid 1000)" in reason


@pytest.mark.timeout(60)
def test_available_as_an_unprivileged_user_fails_with_the_reason() -> None:
    """As a real non-root user, even past the euid check, creating a namespace fails."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run as another user")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    started = subprocess.run(
        [*as_nobody, sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=30
    )
    if started.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable}: {started.stderr.strip()}")
    # The module's source comes on stdin: nobody may not be able to read this checkout.
    code = (
        "import os, sys, types; m = types.ModuleType('netns'); sys.modules['netns'] = m; "
        "exec(compile(sys.stdin.read(), 'netns.py', 'exec'), m.__dict__); "
        "print(m.available()); os.geteuid = lambda: 0; print(m.available())"
    )
    done = subprocess.run(
        [*as_nobody, sys.executable, "-c", code],
        input=(HERE / "netns.py").read_text(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    plain, past_euid_check = done.stdout.splitlines()
    assert plain.startswith("(False, 'not running as root (euid 65534)")
    assert past_euid_check.startswith("(False, 'cannot create a network namespace")


def _netns_names() -> set[str]:
    out = subprocess.run(
        ["ip", "-j", "netns", "list"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return {e["name"] for e in json.loads(out or "[]")}


def _link_names() -> set[str]:
    out = subprocess.run(
        ["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return {e["ifname"] for e in json.loads(out or "[]")}


@pytest.mark.timeout(60)
def test_destroy_kills_what_is_left_and_removes_everything(netns_cluster: Cluster) -> None:
    cluster = Cluster.create(1)
    try:
        assert cluster.bridge != netns_cluster.bridge
        assert not cluster.subnet.overlaps(netns_cluster.subnet)
        cluster.hosts[0].run([sys.executable, "-c", DAEMON], timeout=30, check=True)
        assert [p.cmdline for p in cluster.processes()] == ["sleep 600"]
    finally:
        killed = cluster.destroy()
    assert [(p.namespace, p.cmdline) for p in killed] == [(cluster.hosts[0].name, "sleep 600")]
    assert cluster.destroy() == []  # idempotent
    assert not {h.name for h in cluster.members} & _netns_names()
    assert not {cluster.bridge, *(h.veth for h in cluster.members)} & _link_names()
    assert netns_cluster.bridge in _link_names()


@pytest.mark.timeout(60)
def test_cleanup_stale_removes_clusters_of_dead_runs_only(netns_cluster: Cluster) -> None:
    prefix = f"stale{os.getpid()}"  # not matched by cleanup_stale()'s default glob
    crashed_run = (  # makes a cluster, leaves a daemon in it, and dies without cleaning up
        "import os, subprocess, sys; sys.path.insert(0, sys.argv[1]); import netns; "
        "c = netns.Cluster.create(1, prefix=sys.argv[2]); "
        "p = c.hosts[0].popen(['sleep', '600'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(c.bridge, p.pid, flush=True); os._exit(0)"
    )
    done = subprocess.run(
        [sys.executable, "-B", "-c", crashed_run, str(HERE), prefix],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    bridge, pid = done.stdout.split()
    namespaces = {f"{prefix}-h0", f"{prefix}-c"}
    assert namespaces <= _netns_names()
    assert bridge in _link_names()

    assert netns.cleanup_stale() == []  # the default glob does not match this prefix
    assert sorted(netns.cleanup_stale(prefix)) == sorted([bridge, *namespaces])
    assert not namespaces & _netns_names()
    assert not {n for n in _link_names() if n.startswith(bridge)}
    assert not Path(f"/proc/{pid}/ns/net").exists(), "the daemon left in the namespace lives"
    assert netns.cleanup_stale(netns_cluster.prefix) == [], "a live cluster was removed"
    assert netns_cluster.bridge in _link_names()


INNER_TESTS = f"""
import subprocess, sys
import pytest

DAEMON = {DAEMON!r}


@pytest.fixture(scope="module")
def forgotten_server(netns_cluster):
    netns_cluster.hosts[2].run([sys.executable, "-c", DAEMON], timeout=30, check=True)


def test_leaves_a_daemon(netns_cluster):
    netns_cluster.hosts[0].run([sys.executable, "-c", DAEMON], timeout=30, check=True)


def test_keeps_a_process(netns_cluster, keep_running):
    keep_running.append(netns_cluster.hosts[1].popen(["sleep", "600"]))


def test_with_a_process_from_a_wider_fixture(netns_cluster, forgotten_server):
    pass
"""


@pytest.mark.timeout(120)
def test_fixtures_catch_processes_left_in_the_namespaces(
    pytester: pytest.Pytester, netns_cluster: Cluster
) -> None:
    package = pytester.path / "multihost"
    package.mkdir()
    for name in ("__init__.py", "netns.py", "conftest.py"):
        shutil.copy(HERE / name, package / name)
    (package / "test_inner.py").write_text(INNER_TESTS)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=100)

    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaves_a_daemon*",
            "*test left 1 process(es) inside the cluster's namespaces*",
            "*-h0: pid *: sleep 600",
            "*ERROR at teardown of test_with_a_process_from_a_wider_fixture*",
            "*1 process(es) were still inside the cluster's namespaces at the end of the session*",
            "*-h2: pid *: sleep 600",
        ]
    )
    assert "test_keeps_a_process" not in result.stdout.str().split("short test summary")[-1]
    match = re.search(r"(\S+)-h0: pid", result.stdout.str())
    assert match, "the report names the namespace"
    inner_prefix = match[1]
    assert inner_prefix != netns_cluster.prefix
    left = sorted(n for n in _netns_names() if n.startswith(f"{inner_prefix}-"))
    assert not left, f"the inner session left namespaces behind: {left}"
