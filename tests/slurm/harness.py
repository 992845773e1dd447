"""A real Slurm on one machine, for the tests: munged, slurmctld and one slurmd per
network-namespace host.

:class:`SlurmCluster` runs Debian's Slurm (22.05) over a :class:`~multihost.netns.Cluster`
the way a small real cluster runs::

    root namespace   munged (socket and key in the private directory)
    client ns        slurmctld, hostname "ctld"       <- sbatch/squeue/scancel run here
    host ns 0..N-1   slurmd -N nodeI, hostname "nodeI" <- job steps run here

- **munged** runs in the root namespace: its socket is a file, reachable from every
  namespace. It uses a key made for this cluster (``mungekey``).
- **slurmctld** runs in the client namespace under ``unshare --uts --mount``, with its
  hostname set to ``ctld`` (it refuses to start unless its hostname is the
  ``SlurmctldHost``) and the cluster's hosts file bind-mounted on ``/etc/hosts``.
- **slurmd** ``-D -N nodeI`` runs in host namespace *I* under ``unshare --uts --mount``
  with hostname ``nodeI`` and the same hosts file. Job steps inherit namespace, hostname
  and hosts file, so a program binding ``tcp://$(hostname):PORT`` in a step binds that
  host's address, as on a real node.
- Every file (configuration, key, sockets, state, spool, pid and log files) lives under
  one private temporary directory; nothing is written elsewhere.
- cgroups are not usable here: ``proctrack/linuxproc`` and ``task/none``. linuxproc loses
  processes that re-parent to init, so :meth:`SlurmCluster.stop` also kills every process
  left in the namespaces.

Use (as root, with the packages of ``tests/slurm/install_slurm.sh``)::

    ok, reason = available()
    with Cluster.create(2) as net, SlurmCluster.start(net) as slurm:
        out = slurm.command(["sinfo", "-h"])
        ...

Clients run Slurm commands with :attr:`SlurmCluster.env` (``SLURM_CONF``), in the client
namespace (:meth:`SlurmCluster.client_argv`, which also gives them the hosts file, so node
names resolve as on a login node). :meth:`SlurmCluster.stop` ends everything and removes
the directory; it is idempotent and returns what it had to kill.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from multihost.netns import Cluster, Host, NsProcess

__all__ = ["CONTROLLER", "SlurmCluster", "SlurmError", "available"]

#: The hostname of slurmctld (its ``SlurmctldHost``).
CONTROLLER = "ctld"
#: Every package the harness needs (see install_slurm.sh).
PACKAGES = ("slurmd", "slurmctld", "slurm-client", "slurm-wlm-basic-plugins", "munge")
#: Programs that must be on PATH.
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "unshare")
#: How long :meth:`SlurmCluster.start` waits for every node to be idle.
START_TIMEOUT = 30.0
#: How long each daemon gets to exit after SIGTERM before SIGKILL.
STOP_GRACE = 3.0
#: Time limit of each Slurm client command the harness runs.
COMMAND_TIMEOUT = 15.0
#: Seconds without contact after which slurmctld marks a node DOWN (SlurmdTimeout).
SLURMD_TIMEOUT = 6
#: CPUs (cores) declared for each node; ``config_overrides`` lets slurmd accept it.
CPUS_PER_NODE = 4
#: Polling interval of the waits (nothing to block on: daemons and ``ip netns pids``).
POLL = 0.05


class SlurmError(RuntimeError):
    """A daemon did not start, a command failed, or teardown left something behind."""


def available() -> tuple[bool, str]:
    """Whether a real Slurm can run here, and if not, why (and how to fix it)."""
    if not sys.platform.startswith("linux"):
        return False, f"Slurm needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, (
            f"not running as root (euid {os.geteuid()}); the Slurm harness needs root for "
            "network namespaces and daemons: run the tests as root (as CI does)"
        )
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return False, (
            f"{', '.join(missing)} not on PATH; install Slurm and munge with "
            "`make slurm-deps` (tests/slurm/install_slurm.sh, as root)"
        )
    return True, ""


@dataclass
class _Daemon:
    """A daemon started detached (not a child of this process: test leak checks look
    at descendants, and a cluster rebuilt during a test is not that test's leak)."""

    name: str
    pid: int
    start: int | None
    log: Path

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"


def _stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time (clock ticks) of ``pid``, if it exists."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


class SlurmCluster:
    """A running Slurm over a namespace cluster (see the module docs).

    Attributes:
        net: The namespace cluster: node *I* runs in ``net.hosts[I]``, slurmctld in
            ``net.client``.
        root: The private directory holding every file.
        conf: The ``slurm.conf``.
        nodes: The node names, ``node0`` ...
        env: The environment for Slurm clients (this process's, plus ``SLURM_CONF``).
    """

    def __init__(self, net: Cluster, root: Path, nodes: list[str]) -> None:
        self.net = net
        self.root = root
        self.nodes = nodes
        self.conf = root / "slurm.conf"
        self.hosts_file = root / "hosts"
        self.munge_socket = root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[_Daemon] = []
        self._slurmd: dict[str, _Daemon] = {}
        self._stopped = False

    # ----------------------------------------------------------------------------------
    # Start

    @classmethod
    def start(cls, net: Cluster, n_nodes: int | None = None) -> SlurmCluster:
        """Start munged, slurmctld and a slurmd on each of ``n_nodes`` hosts of ``net``
        (all of them by default); return once every node is idle.

        Raises:
            SlurmError: A daemon exited or the nodes were not idle within
                :data:`START_TIMEOUT`; the message has the end of its log. Whatever had
                started is stopped and the directory removed.
        """
        ok, reason = available()
        if not ok:
            raise SlurmError(reason)
        n = len(net.hosts) if n_nodes is None else n_nodes
        if not 1 <= n <= len(net.hosts):
            raise ValueError(f"n_nodes must be within 1..{len(net.hosts)}, got {n_nodes}")
        root = Path(tempfile.mkdtemp(prefix="monarch-slurm-"))
        cluster = cls(net, root, [f"node{i}" for i in range(n)])
        try:
            cluster._write_files()
            cluster._start_munged()
            cluster._start_slurmctld()
            for i, node in enumerate(cluster.nodes):
                cluster._start_slurmd(node, net.hosts[i])
            cluster.wait_nodes_idle()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _write_files(self) -> None:
        root = self.root
        # munged wants its socket's directory searchable by everyone (0755, not writable
        # by others), and its parents searchable; the rest stays private.
        root.chmod(0o711)
        for sub in ("munge", "ctld", "spool", "log", "run"):
            (root / sub).mkdir(mode=0o755 if sub == "munge" else 0o700)
        lines = ["127.0.0.1 localhost", f"{self.net.client.ip} {CONTROLLER}"]
        lines += [f"{self.net.hosts[i].ip} {node}" for i, node in enumerate(self.nodes)]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        for node in self.nodes:
            (root / "spool" / node).mkdir(mode=0o700)
        # slurmd loads a cgroup plugin even with proctrack/linuxproc and task/none; the
        # namespaces' fresh /sys has no cgroup filesystem for autodetection to find, so
        # name the plugin (it then creates nothing: no plugin here uses cgroups).
        (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        nodes = "\n".join(
            f"NodeName={node} NodeAddr={self.net.hosts[i].ip} CPUs={CPUS_PER_NODE} "
            f"Boards=1 SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 "
            "RealMemory=4096 State=UNKNOWN"
            for i, node in enumerate(self.nodes)
        )
        self.conf.write_text(
            f"""\
# Written by tests/slurm/harness.py: a private test cluster.
ClusterName=monarchtest
SlurmctldHost={CONTROLLER}({self.net.client.ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
AcctGatherEnergyType=acct_gather_energy/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
KillWait=2
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT}
InactiveLimit=0
MinJobAge=300
MessageTimeout=5
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _spawn(self, name: str, argv: Sequence[str]) -> _Daemon:
        """Start ``argv`` detached (``setsid --fork``), its output in ``log/NAME.out``;
        its pid comes back through a file the wrapper writes before it execs."""
        log = self.root / "log" / f"{name}.out"
        pidfile = self.root / "run" / f"{name}.pid"
        wrapper = 'echo $$ > "$0" && exec "$@"'
        with open(log, "ab") as out:
            subprocess.run(
                ["setsid", "--fork", "sh", "-c", wrapper, str(pidfile), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=COMMAND_TIMEOUT,
            )
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while not pidfile.exists() or not pidfile.read_text().strip():
            if time.monotonic() > deadline:
                raise SlurmError(f"{name} did not start: {log.read_text(errors='replace')}")
            time.sleep(POLL / 5)  # the detached wrapper writes it within milliseconds
        pid = int(pidfile.read_text())
        stat = _stat(pid)
        daemon = _Daemon(name, pid, None if stat is None else stat[1], log)
        self._daemons.append(daemon)
        return daemon

    def _start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        subprocess.run(
            ["mungekey", "-c", "-k", str(key)], check=True, capture_output=True, timeout=10
        )
        daemon = self._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), daemon, "munged to open its socket")

    def _namespaced(self, host: Host, hostname: str, argv: Sequence[str]) -> list[str]:
        """``argv`` in ``host``'s network namespace, with its own hostname and the
        cluster's hosts file (new UTS and mount namespaces)."""
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
        return host.exec_argv(
            [
                "unshare",
                "--uts",
                "--mount",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                hostname,
                str(self.hosts_file),
                *argv,
            ]
        )

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a client on the login node: in the client namespace, with the
        cluster's hosts file (its hostname stays the machine's)."""
        script = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'
        return self.net.client.exec_argv(
            ["unshare", "--mount", "--", "sh", "-c", script, "sh", str(self.hosts_file), *argv]
        )

    def _start_slurmctld(self) -> None:
        argv = ["slurmctld", "-D", "-i", "-f", str(self.conf)]
        daemon = self._spawn("slurmctld", self._namespaced(self.net.client, CONTROLLER, argv))
        self._wait(self._ping, daemon, "slurmctld to answer")

    def _start_slurmd(self, node: str, host: Host) -> None:
        argv = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
        self._slurmd[node] = self._spawn(f"slurmd-{node}", self._namespaced(host, node, argv))

    def _ping(self) -> bool:
        done = subprocess.run(
            ["scontrol", "ping"], env=self.env, capture_output=True, text=True, timeout=10
        )
        return done.returncode == 0 and "UP" in done.stdout

    def _wait(self, ready: Any, daemon: _Daemon, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if not daemon.alive():
                raise SlurmError(f"{daemon.name} exited before {what}:\n{self.logs_tail()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out waiting for {what}:\n{self.logs_tail()}")
            time.sleep(POLL)  # polling a daemon that has no readiness notification

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` reports it (``idle``, ``alloc``, ``down*``...)."""
        out = self.command(["sinfo", "-h", "-N", "-o", "%N|%t"])
        return dict(line.split("|", 1) for line in out.split())

    def wait_nodes_idle(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every node is ``idle``; raise :class:`SlurmError` with the logs if
        not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for d in self._daemons:
                if not d.alive():
                    raise SlurmError(f"{d.name} exited:\n{self.logs_tail()}")
            states = self.node_states()
            if set(states) == set(self.nodes) and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"nodes not idle within {timeout:g} s: {states}\n{self.logs_tail()}"
                )
            time.sleep(POLL)  # polling slurmctld's view of the nodes

    # ----------------------------------------------------------------------------------
    # Using it

    def command(self, argv: Sequence[str], *, check: bool = True) -> str:
        """Run a Slurm client command (from the root namespace) and return its stdout.

        Raises:
            SlurmError: It failed (with ``check``) or ran past :data:`COMMAND_TIMEOUT`.
        """
        try:
            done = subprocess.run(
                list(argv), env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
            )
        except subprocess.TimeoutExpired as e:
            raise SlurmError(f"`{' '.join(argv)}` ran past {COMMAND_TIMEOUT:g} s") from e
        if check and done.returncode != 0:
            raise SlurmError(
                f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}"
            )
        return done.stdout

    def jobs(self) -> list[str]:
        """The ids of the jobs Slurm still knows as pending, running or completing."""
        out = self.command(["squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i"])
        return out.split()

    def host_of(self, node: str) -> Host:
        """The namespace host running ``node``."""
        return self.net.hosts[self.nodes.index(node)]

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL ``node``'s slurmd (its job steps keep running, as on a real node
        whose daemon crashed)."""
        daemon = self._slurmd[node]
        self._signal_and_wait([daemon], signal.SIGKILL, STOP_GRACE)

    def daemon_pids(self) -> set[int]:
        """The pids of the daemons that are still running."""
        return {d.pid for d in self._daemons if d.alive()}

    def step_processes(self) -> list[NsProcess]:
        """Processes in the namespaces other than the daemons (and slurmctld's helper,
        slurmscriptd): job steps and what they started."""
        daemons = self.daemon_pids()
        return [
            p
            for p in self.net.processes()
            if p.pid not in daemons and "slurmscriptd" not in p.cmdline
        ]

    def wait_steps_gone(self, timeout: float) -> list[NsProcess]:
        """Wait until no job step process is left (a step's ``slurmstepd`` finishes its
        teardown after ``srun`` returned); the processes still there after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            steps = self.step_processes()
            if not steps or time.monotonic() >= deadline:
                return steps
            time.sleep(POLL / 5)  # not our children: nothing to wait() on

    def logs_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of every daemon log, for error messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts) or "(no daemon logs)"

    # ----------------------------------------------------------------------------------
    # Stop

    def stop(self) -> list[str]:
        """Stop the daemons (SIGTERM, then SIGKILL), kill whatever is left in the
        namespaces and whatever names this cluster's directory, and remove the directory.
        Idempotent.

        Returns:
            Descriptions of the job processes that were still running (steps that
            outlived their job, or jobs nobody cancelled): a leak for a test to report.

        Raises:
            SlurmError: Something could not be killed or removed.
        """
        if self._stopped:
            return []
        self._stopped = True
        left = self.step_processes()
        remaining = self._signal_and_wait(self._daemons, signal.SIGTERM, STOP_GRACE)
        self._signal_and_wait(remaining, signal.SIGKILL, STOP_GRACE)
        killed = [f"{p.namespace}: pid {p.pid}: {p.cmdline}" for p in left]
        with contextlib.suppress(Exception):
            self.net.kill_processes()
        killed += self._kill_users_of_root()
        # Wait for what was killed to be gone before removing its files.
        deadline = time.monotonic() + STOP_GRACE
        while self.net.processes() and time.monotonic() < deadline:
            time.sleep(POLL / 5)  # polling `ip netns pids`
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            raise SlurmError(f"could not remove {self.root}")
        return killed

    @staticmethod
    def _signal_and_wait(daemons: list[_Daemon], sig: int, timeout: float) -> list[_Daemon]:
        """Send ``sig`` to the live ``daemons``; return those still alive after
        ``timeout`` (they are not our children: poll /proc)."""
        for d in daemons:
            if d.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d.pid, sig)
        deadline = time.monotonic() + timeout
        while True:
            alive = [d for d in daemons if d.alive()]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(POLL / 5)  # not our children: nothing to wait() on

    def _kill_users_of_root(self) -> list[str]:
        """Kill processes outside the namespaces whose command line names the private
        directory (a daemon that escaped its parent)."""
        killed = []
        marker = str(self.root)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                killed.append(f"pid {entry.name}: {cmdline.strip()}")
        return killed

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
