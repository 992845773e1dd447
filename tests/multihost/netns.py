"""Simulated hosts on one machine: Linux network namespaces joined by a bridge.

A :class:`Cluster` is a small private network that lives inside this machine::

    root namespace                      namespaces
    ───────────────                     ──────────
    bridge mb12345  10.x.0.1/24 ──┬── mb12345v0 ═ eth0  mb12345-h0  10.x.0.11
      (the client address,        ├── mb12345v1 ═ eth0  mb12345-h1  10.x.0.12
       :attr:`Cluster.root_ip`)   ├── ...
                                  └── mb12345vc ═ eth0  mb12345-c   10.x.0.10

Each simulated host is a network namespace with its own loopback and one interface,
``eth0``, the namespace end of a veth pair whose other end is a port of the bridge. A
process started with :meth:`Host.popen` sees only that host's network: it binds the host's
address, its ``127.0.0.1`` is private to the host, and it reaches the others (and the test
process, in the root namespace, at :attr:`Cluster.root_ip`) over the bridge. The client
namespace, :attr:`Cluster.client`, is one more such host, for tests whose client must not
run in the root namespace. Everything else (files, processes, users) is shared: a
namespace isolates the network only.

Typical use, as root::

    ok, reason = available()
    if not ok:
        raise SystemExit(reason)
    with Cluster.create(2) as cluster:
        h0, h1 = cluster.hosts
        server = h0.popen([sys.executable, "-m", "http.server", "--bind", h0.ip, "8000"])
        ...
        h0.cut()  # h0 is now unreachable; its TCP connections go silent
        h0.restore()
        server.terminate()
        server.wait(timeout=10)

Guarantees:

- Names and the subnet are unique among live clusters, across processes: the bridge is
  ``mb<pid % 100000>`` (plus ``n<k>`` for the k-th cluster of a process), and the subnet
  ``10.x.0.0/24`` (x in 100..199) is one that no interface of the root namespace uses.
  Creation is serialised by a lock file, so two test runs started at once do not clash.
- Every ``ip`` command runs with a timeout; a failure raises :class:`NetnsError` with the
  command and its error output.
- A failed :meth:`Cluster.create` removes whatever it had made. :meth:`Cluster.destroy`
  kills the processes left in the namespaces and removes everything; it is idempotent and
  also runs at interpreter exit for a cluster that was never destroyed.
- A run that died without destroying its cluster (SIGKILL, a crash) leaves it behind; the
  bridge's alias records the pid that made it, and :func:`cleanup_stale` removes the
  leftovers of runs whose process is gone.

The bridge does not route: hosts are on one subnet, so no ``net.ipv4.ip_forward`` is
needed. Where the ``br_netfilter`` module is loaded, ``bridge-nf-call-iptables`` would
pass bridged packets through the root namespace's iptables (whose FORWARD policy is DROP
on a machine running Docker); it is set to 0 while any cluster lives and restored when the
last one is destroyed.

Only the standard library is used; everything needs root (see :func:`available`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import fnmatch
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, NamedTuple

__all__ = [
    "Cluster",
    "Host",
    "NetnsError",
    "NsProcess",
    "available",
    "cleanup_stale",
]

#: Time limit of every ``ip`` command (seconds).
COMMAND_TIMEOUT = 10.0
#: How long :meth:`Cluster.kill_processes` waits for killed processes to be gone.
KILL_TIMEOUT = 5.0
#: How often waits poll (``ip netns pids``, the lock file).
POLL_INTERVAL = 0.05
#: How long :meth:`Cluster.create` and :func:`cleanup_stale` wait for the lock file.
LOCK_TIMEOUT = 30.0
#: Default glob of :func:`cleanup_stale`: the default prefix is the bridge's name.
DEFAULT_PREFIX_GLOB = "mb*"

_ALIAS_TAG = "monarch-netns"
_ALIAS_RE = re.compile(rf"^{_ALIAS_TAG} pid=(\d+) start=(\d+) prefix=(\S+)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")
_IFNAMSIZ = 15
_MAX_HOSTS = 200  # addresses .11 .. .210; veth names stay within 15 characters
_BRNF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_STATE_DIR = Path("/run/monarch-netns") if Path("/run").is_dir() else Path("/tmp/monarch-netns")


class NetnsError(RuntimeError):
    """An ``ip`` command failed or timed out, or the cluster could not be set up."""


class NsProcess(NamedTuple):
    """A process found inside one of a cluster's namespaces."""

    namespace: str
    pid: int
    cmdline: str


# --------------------------------------------------------------------------------------
# Running `ip`


def _ip(*args: str, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run ``ip ARGS`` and return its stdout; raise :class:`NetnsError` if it fails."""
    argv = ["ip", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from e
    except OSError as e:
        raise NetnsError(f"cannot run `{' '.join(argv)}`: {e}") from e
    if done.returncode != 0:
        raise NetnsError(
            f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def _netns_names() -> set[str]:
    return {entry["name"] for entry in json.loads(_ip("-j", "netns", "list") or "[]")}


def _links(*filter_args: str) -> list[dict[str, Any]]:
    links: list[dict[str, Any]] = json.loads(_ip("-j", "link", "show", *filter_args) or "[]")
    return links


def _ns_pids(namespace: str) -> list[int]:
    return [int(tok) for tok in _ip("netns", "pids", namespace).split()]


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    return int(data[data.rindex(")") + 2 :].split()[19])


def _alive(pid: int, start: int) -> bool:
    return _start_ticks(pid) == start


# --------------------------------------------------------------------------------------
# The lock serialising creation and clean-up, across threads and processes


class _Lock:
    """A reentrant lock held on ``_STATE_DIR/lock`` (``flock``) and within the process."""

    def __init__(self) -> None:
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd = -1

    @contextlib.contextmanager
    def held(self, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
        if not self._thread_lock.acquire(timeout=timeout):
            raise NetnsError(f"could not take the netns lock within {timeout:g} s")
        try:
            if self._depth == 0:
                self._fd = self._flock(timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    os.close(self._fd)  # releases the flock
                    self._fd = -1
        finally:
            self._thread_lock.release()

    @staticmethod
    def _flock(timeout: float) -> int:
        _STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(_STATE_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise NetnsError(
                        f"{_STATE_DIR / 'lock'} is held by another process for more than "
                        f"{timeout:g} s; is another test run stuck creating a cluster?"
                    ) from None
                time.sleep(POLL_INTERVAL)  # polling a lock that has no wait-with-timeout


_LOCK = _Lock()


# --------------------------------------------------------------------------------------
# bridge-nf-call-iptables: 0 while any cluster lives (callers hold _LOCK)


def _brnf_saved() -> Path:
    return _STATE_DIR / "bridge-nf-call-iptables.saved"


def _brnf_acquire() -> None:
    """Set bridge-nf-call-iptables to 0, saving the old value for the last destroy.

    Where it cannot be written (a read-only ``/proc/sys``), it is left as it is: bridged
    traffic then still flows unless the root namespace's iptables drop it.
    """
    if not _BRNF.exists():
        return
    with contextlib.suppress(OSError):
        current = _BRNF.read_text().strip()
        if current != "0":
            if not _brnf_saved().exists():
                _brnf_saved().write_text(current)
            _BRNF.write_text("0")


def _live_owned_bridges() -> list[str]:
    names = []
    for link in _links("type", "bridge"):
        m = _ALIAS_RE.match(link.get("ifalias", ""))
        if m and _alive(int(m[1]), int(m[2])):
            names.append(str(link["ifname"]))
    return names


def _brnf_release_if_unused() -> None:
    saved = _brnf_saved()
    if saved.exists() and not _live_owned_bridges():
        if _BRNF.exists():
            _BRNF.write_text(saved.read_text().strip())
        saved.unlink()


# --------------------------------------------------------------------------------------
# Availability


def available() -> tuple[bool, str]:
    """Tell whether network namespaces can be used here, and if not, why.

    Checks that this is Linux, that we run as root, that ``ip`` (iproute2) is on ``PATH``,
    and that a throwaway namespace and bridge can really be created, entered and deleted
    (a container without ``CAP_NET_ADMIN``/``CAP_SYS_ADMIN`` fails there).

    Returns:
        ``(True, "")`` when :meth:`Cluster.create` can work, else ``(False, reason)``
        where ``reason`` says what is missing and how to get it.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux, this is {sys.platform}"
    euid = os.geteuid()
    if euid != 0:
        return False, (
            f"not running as root (euid {euid}); creating network namespaces needs root: "
            "run the tests as root (as CI does)"
        )
    if shutil.which("ip") is None:
        return False, "`ip` (iproute2) is not on PATH; install iproute2"
    pid = os.getpid()
    namespace, bridge = f"mbprobe{pid}", f"mbp{pid % 100000}"
    try:
        _ip("netns", "add", namespace)
        try:
            _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
            _ip("link", "add", "name", bridge, "type", "bridge")
            _ip("link", "del", bridge)
        finally:
            with contextlib.suppress(NetnsError):
                _ip("link", "del", bridge)
            _ip("netns", "del", namespace)
    except NetnsError as e:
        return False, f"cannot create a network namespace and a bridge: {e}"
    return True, ""


# --------------------------------------------------------------------------------------
# Hosts and clusters


@dataclass(frozen=True)
class Host:
    """One simulated host: a network namespace with one interface, ``eth0``.

    Attributes:
        name: The namespace's name (as in ``ip netns list``).
        ip: The host's IPv4 address on the cluster's subnet (``/24``).
        veth: The root-namespace end of the host's veth pair, a port of the bridge;
            :meth:`cut` and :meth:`restore` set it down and up.
    """

    name: str
    ip: str
    veth: str

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """Return the command line that runs ``argv`` inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host's namespace; wait for it as for any ``Popen``.

        ``ip netns exec`` enters the namespace and execs ``argv``, so the returned
        process's pid is that of ``argv`` itself, and signals reach it directly.
        ``popen_kwargs`` go to :class:`subprocess.Popen` unchanged: the environment is
        inherited unless ``env`` is given, and the process stays in this process group
        and session (``start_new_session=False``), so it is a descendant of the caller
        that a leak check can see.
        """
        return subprocess.Popen(self.exec_argv(argv), **popen_kwargs)

    def run(
        self, argv: Sequence[str], *, timeout: float, **run_kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside this host's namespace to completion, within ``timeout``.

        Like :func:`subprocess.run` (``run_kwargs`` go to it: ``capture_output``,
        ``text``, ``check``, ...). The timeout is required.

        Raises:
            subprocess.TimeoutExpired: ``argv`` ran past ``timeout``; it has been killed.
        """
        return subprocess.run(self.exec_argv(argv), timeout=timeout, **run_kwargs)

    def cut(self) -> None:
        """Partition this host from the network: its bridge port goes down.

        The host can then reach no one and no one can reach it (the other hosts, the
        client namespace and the root namespace alike); its own loopback still works.
        Nothing is reset: a TCP connection to or from the host is not closed, it goes
        silent (sends are buffered and retransmitted, receives time out), and resumes
        after :meth:`restore` if neither end gave up meanwhile. New connection attempts
        time out (no RST, no ICMP error). Idempotent.
        """
        _ip("link", "set", "dev", self.veth, "down")

    def restore(self) -> None:
        """Reconnect a host that :meth:`cut` partitioned. Idempotent."""
        _ip("link", "set", "dev", self.veth, "up")


class Cluster:
    """Simulated hosts, each in a network namespace, joined by a bridge.

    Made by :meth:`create`; remove it with :meth:`destroy` or by using it as a context
    manager.

    Attributes:
        hosts: The simulated hosts, ``<prefix>-h0`` .. at ``10.x.0.11`` ...
        client: The client namespace ``<prefix>-c`` at ``10.x.0.10``, for a client that
            must run off the root namespace.
        root_ip: The bridge's address, ``10.x.0.1``: the root namespace (the test
            process) as the hosts see it.
        bridge: The bridge's name in the root namespace.
        prefix: The prefix of the namespaces' names.
        subnet: The cluster's ``/24``.
    """

    _counter: ClassVar[Iterator[int]] = itertools.count()
    #: Clusters not yet destroyed, for the atexit hook.
    _live: ClassVar[set[Cluster]] = set()

    def __init__(self, bridge: str, prefix: str, subnet: ipaddress.IPv4Network, n_hosts: int):
        """Describe a cluster without creating anything; use :meth:`create` instead."""
        base = subnet.network_address
        self.bridge = bridge
        self.prefix = prefix
        self.subnet = subnet
        self.root_ip = str(base + 1)
        self.hosts = [
            Host(name=f"{prefix}-h{i}", ip=str(base + 11 + i), veth=f"{bridge}v{i}")
            for i in range(n_hosts)
        ]
        self.client = Host(name=f"{prefix}-c", ip=str(base + 10), veth=f"{bridge}vc")
        self._destroyed = False

    def __repr__(self) -> str:
        return (
            f"Cluster(bridge={self.bridge!r}, subnet={self.subnet}, "
            f"hosts={[h.name for h in self.hosts]}, client={self.client.name!r})"
        )

    @property
    def members(self) -> list[Host]:
        """Every namespace of the cluster: :attr:`hosts`, then :attr:`client`."""
        return [*self.hosts, self.client]

    @classmethod
    def create(cls, n_hosts: int, prefix: str | None = None) -> Cluster:
        """Create a bridge, ``n_hosts`` host namespaces and the client namespace.

        Args:
            n_hosts: How many hosts, 1 to 200.
            prefix: Prefix of the namespaces' names (``<prefix>-h0``, ..., ``<prefix>-c``);
                by default the bridge's name, which :func:`cleanup_stale` matches by
                default. No existing namespace may start with ``<prefix>-``.

        Raises:
            ValueError: ``n_hosts`` or ``prefix`` is invalid.
            NetnsError: Something could not be created (see :func:`available`); what was
                created is removed first.
        """
        if not 1 <= n_hosts <= _MAX_HOSTS:
            raise ValueError(f"n_hosts must be within 1..{_MAX_HOSTS}, got {n_hosts}")
        if prefix is not None and not _NAME_RE.match(prefix):
            raise ValueError(
                f"prefix {prefix!r} must be letters, digits, '_', '.' and '-' (not first)"
            )
        with _LOCK.held():
            links = {str(link["ifname"]) for link in _links()}
            bridge = _pick_bridge_name(links)
            prefix = prefix or bridge
            clashing = sorted(n for n in _netns_names() if n.startswith(f"{prefix}-"))
            if clashing:
                raise ValueError(
                    f"namespaces {clashing} already use the prefix {prefix!r}: pick another "
                    "prefix, or remove them (cleanup_stale() removes those of dead runs)"
                )
            cluster = cls(bridge, prefix, _pick_subnet(), n_hosts)
            cls._live.add(cluster)
            try:
                cluster._build()
            except BaseException:
                with contextlib.suppress(Exception):
                    cluster.destroy()
                raise
        return cluster

    def _build(self) -> None:
        start = _start_ticks(os.getpid())
        _ip("link", "add", "name", self.bridge, "type", "bridge", "forward_delay", "0")
        alias = f"{_ALIAS_TAG} pid={os.getpid()} start={start} prefix={self.prefix}"
        _ip("link", "set", "dev", self.bridge, "alias", alias)
        _ip("addr", "add", f"{self.root_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", "dev", self.bridge, "up")
        _brnf_acquire()
        for host in self.members:
            _ip("netns", "add", host.name)
            _ip(
                "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.name
            )
            _ip("link", "set", "dev", host.veth, "master", self.bridge, "up")
            _ip("-n", host.name, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", host.name, "link", "set", "dev", "lo", "up")
            _ip("-n", host.name, "link", "set", "dev", "eth0", "up")

    def pids_in(self, namespace: str | Host) -> list[int]:
        """Return the pids of the live processes inside ``namespace`` (zombies excluded).

        Raises:
            NetnsError: The namespace does not exist.
        """
        return _ns_pids(namespace.name if isinstance(namespace, Host) else namespace)

    def processes(self) -> list[NsProcess]:
        """Return every live process inside the cluster's namespaces."""
        return _processes([h.name for h in self.members])

    def kill_processes(
        self, exempt: Collection[int] = (), timeout: float = KILL_TIMEOUT
    ) -> list[NsProcess]:
        """SIGKILL every process in the cluster's namespaces but ``exempt``; wait till gone.

        Returns:
            The processes killed (with the command lines they had).

        Raises:
            NetnsError: Some were still there ``timeout`` seconds later (stuck in the
                kernel, or replaced by new ones as fast as they were killed).
        """
        return _kill_all([h.name for h in self.members], exempt, timeout)

    def destroy(self) -> list[NsProcess]:
        """Kill what runs in the namespaces, then delete namespaces, veths and bridge.

        Idempotent: a second call does nothing and returns ``[]``. Also restores
        ``bridge-nf-call-iptables`` when this was the last live cluster.

        Returns:
            The processes that were still inside the namespaces and had to be killed
            (a test fixture can fail a test that left them behind).

        Raises:
            NetnsError: Some part could not be removed; everything else was.
        """
        if self._destroyed:
            return []
        errors: list[str] = []
        killed: list[NsProcess] = []
        with _LOCK.held():
            try:
                killed = self.kill_processes()
            except NetnsError as e:
                errors.append(str(e))
            errors += _remove(self.bridge, [h.name for h in self.members])
            self._destroyed = True
            type(self)._live.discard(self)
        if errors:
            raise NetnsError(
                f"could not fully destroy {self!r}: "
                + "; ".join(errors)
                + (f" (killed {killed})" if killed else "")
            )
        return killed

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()


def _pick_bridge_name(links: set[str]) -> str:
    base = f"mb{os.getpid() % 100000}"
    while True:
        k = next(Cluster._counter)
        name = base if k == 0 else f"{base}n{k}"
        if len(name) > _IFNAMSIZ - 4:  # room for "v<3 digits>"
            raise NetnsError(f"ran out of bridge names after {name!r}")
        if name not in links:
            return name


#: Route types that `ip route` prints before the destination.
_ROUTE_TYPES = frozenset(
    "unicast local broadcast multicast anycast unreachable prohibit blackhole throw nat".split()
)


def _pick_subnet() -> ipaddress.IPv4Network:
    """A ``10.x.0.0/24`` (x in 100..199, starting from the pid) no local address uses."""
    used: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            used.append(ipaddress.IPv4Interface(m[1]).network)
    for line in _ip("-4", "-o", "route", "show", "table", "all").splitlines():
        words = line.split() or [""]
        dest = words[1] if words[0] in _ROUTE_TYPES and len(words) > 1 else words[0]
        with contextlib.suppress(ValueError):
            net = ipaddress.IPv4Network(dest, strict=False)
            if net.prefixlen >= 16:  # a default or 10/8 route is no clash: ours is narrower
                used.append(net)
    first = os.getpid() % 100
    for i in range(100):
        candidate = ipaddress.IPv4Network(f"10.{100 + (first + i) % 100}.0.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetnsError("every subnet 10.100.0.0/24 .. 10.199.0.0/24 is in use here")


def _processes(namespaces: Sequence[str]) -> list[NsProcess]:
    """Live processes in those of ``namespaces`` that exist."""
    existing = _netns_names()
    return [
        NsProcess(name, pid, _cmdline(pid))
        for name in namespaces
        if name in existing
        for pid in _ns_pids(name)
    ]


def _kill_all(
    namespaces: Sequence[str], exempt: Collection[int], timeout: float
) -> list[NsProcess]:
    """SIGKILL the processes in ``namespaces`` but ``exempt`` and wait till they are gone."""
    killed: dict[int, NsProcess] = {}
    deadline = time.monotonic() + timeout
    while True:
        remaining = [p for p in _processes(namespaces) if p.pid not in exempt]
        if not remaining:
            return list(killed.values())
        if time.monotonic() >= deadline:
            raise NetnsError(
                f"processes still in the namespaces {timeout:g} s after SIGKILL: "
                + ", ".join(f"{p.namespace} pid {p.pid} ({p.cmdline})" for p in remaining)
            )
        for proc in remaining:
            killed.setdefault(proc.pid, proc)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        time.sleep(POLL_INTERVAL)  # polling `ip netns pids`: nothing to wait on


def _remove(bridge: str, namespaces: Sequence[str]) -> list[str]:
    """Delete veths, namespaces and bridge, whichever exist; return the errors."""
    errors = []
    existing_ns = _netns_names()
    links = {str(link["ifname"]) for link in _links()}
    veth = re.compile(rf"^{re.escape(bridge)}v(\d+|c)$")
    veths = sorted(n for n in links if veth.match(n))
    for name in veths:  # deleting one end of a veth pair deletes both
        with contextlib.suppress(NetnsError):
            _ip("link", "del", "dev", name)
    for name in namespaces:
        if name in existing_ns:
            try:
                _ip("netns", "del", name)
            except NetnsError as e:
                errors.append(str(e))
    if bridge in links:
        try:
            _ip("link", "del", "dev", bridge)
        except NetnsError as e:
            errors.append(str(e))
    leftover = {str(link["ifname"]) for link in _links()} & {bridge, *veths}
    if leftover:
        errors.append(f"links still present after deletion: {sorted(leftover)}")
    try:
        _brnf_release_if_unused()
    except OSError as e:
        errors.append(f"cannot restore {_BRNF}: {e}")
    return errors


def cleanup_stale(prefix_glob: str = DEFAULT_PREFIX_GLOB) -> list[str]:
    """Remove the clusters of runs that died without destroying them.

    A cluster is stale when the process recorded in its bridge's alias (pid and start
    time) no longer exists. For each stale cluster whose prefix matches ``prefix_glob``
    (an :mod:`fnmatch` pattern), the processes still in its namespaces are killed and its
    namespaces (``<prefix>-h<N>``, ``<prefix>-c``), veths and bridge are deleted. Live
    clusters, of this process or any other, are never touched.

    Returns:
        The names of the bridges and namespaces removed.

    Raises:
        NetnsError: An ``ip`` command failed.
    """
    removed: list[str] = []
    with _LOCK.held():
        all_ns = _netns_names()
        for link in _links("type", "bridge"):
            m = _ALIAS_RE.match(link.get("ifalias", ""))
            if not m or _alive(int(m[1]), int(m[2])) or not fnmatch.fnmatchcase(m[3], prefix_glob):
                continue
            bridge, prefix = str(link["ifname"]), m[3]
            member = re.compile(rf"^{re.escape(prefix)}-(h\d+|c)$")
            namespaces = sorted(n for n in all_ns if member.match(n))
            errors = []
            try:
                _kill_all(namespaces, (), KILL_TIMEOUT)
            except NetnsError as e:
                errors.append(str(e))
            errors += _remove(bridge, namespaces)
            if errors:
                raise NetnsError(f"cannot remove stale cluster {bridge}: " + "; ".join(errors))
            removed += [bridge, *namespaces]
        _brnf_release_if_unused()
    return removed


@atexit.register
def _destroy_live_clusters() -> None:
    """Last resort for a cluster nobody destroyed: do not leave it behind at exit."""
    for cluster in list(Cluster._live):
        with contextlib.suppress(Exception):
            cluster.destroy()
