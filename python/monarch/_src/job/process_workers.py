"""The worker processes of a ``ProcessJob``: what identifies each one (:class:`_Worker`,
pickled with the job), whether it still runs, signalling and stopping them, the
groups never saved (stopped at exit, JOB-3), and the private directory that holds
their sockets, ready files and logs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass

#: The logger of ``monarch._src.job.job``, where this code lived: one name for every
#: part of the job module, so that logging settings made for it keep applying.
logger = logging.getLogger("monarch._src.job.job")


@dataclass(frozen=True)
class _Worker:
    """One worker process of a ``ProcessJob``: what a later process needs to reach it
    and to tell it from an unrelated process that reused its pid."""

    mesh: str
    pid: int
    #: Its start time in clock ticks since boot (``/proc/<pid>/stat``), if known.
    started: int | None
    address: str
    #: The file its output goes to, or ``None`` when it writes to the client's.
    log: str | None = None

    def describe(self) -> str:
        where = f"; its output is in {self.log}" if self.log else ""
        return f"pid {self.pid} of mesh {self.mesh!r} at {self.address}{where}"

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log, if it has one."""
        if self.log is None:
            return ""
        try:
            with open(self.log, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return ""
        return "".join(tail)


#: The ``Popen`` of each worker this process started, by pid, until it is reaped: kept
#: here, not in the job, because a saved job outlives its object (and its pickle must not
#: hold one).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of ``pid`` from ``/proc``, or ``None`` if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is parenthesised and may hold anything: split after it.
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _is_running(worker: _Worker) -> bool:
    popen = _children.get(worker.pid)
    if popen is not None:
        if popen.poll() is None:
            return True
        del _children[worker.pid]  # reaped: its pid may be reused from now on
        return False
    stat = _proc_stat(worker.pid)
    if stat is None:
        if os.path.isdir("/proc"):
            return False
        try:  # no procfs: all we can ask is whether the pid exists
            os.kill(worker.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state, started = stat
    same = worker.started is None or worker.started == started
    return same and state not in ("Z", "X")


def _signal(worker: _Worker, sig: signal.Signals) -> None:
    """Signal the worker's process group (it leads one), if it is still that worker."""
    if not _is_running(worker):
        return
    try:
        os.killpg(worker.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(worker.pid, sig)
        except OSError:
            pass


def _wait_exited(workers: list[_Worker], timeout: float) -> list[_Worker]:
    """Wait up to ``timeout`` seconds for ``workers`` to exit; return those still
    running. Polls: a process that is not our child gives nothing to wait on."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        workers = [w for w in workers if _is_running(w)]
        if not workers or time.monotonic() >= deadline:
            return workers
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class _Workers:
    """The worker processes of one ``ProcessJob`` allocation, and the private directory
    holding their sockets. Plain data: pickled with the job."""

    def __init__(self, socket_dir: str) -> None:
        self.socket_dir = socket_dir
        self.meshes: dict[str, list[_Worker]] = {}

    def all(self) -> list[_Worker]:
        return [w for workers in self.meshes.values() for w in workers]

    def exited(self) -> list[_Worker]:
        return [w for w in self.all() if not _is_running(w)]

    def next_index(self) -> int:
        """The number of the next worker's files (``worker-<n>.sock``): past every
        worker started so far and every file in the directory, so that a worker added
        later never meets an old worker's files (a ready file left by one that was
        killed would read as its own)."""
        used = [len(self.all()) - 1]
        try:
            entries = os.listdir(self.socket_dir)
        except OSError:
            entries = []
        for entry in entries:
            number = entry.removeprefix("worker-").split(".", 1)[0]
            if entry.startswith("worker-") and number.isdigit():
                used.append(int(number))
        return max(used) + 1

    def stop(self, grace: float) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after ``grace``
        seconds, then remove the socket directory."""
        _stop_workers(self.all(), grace)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _stop_workers(workers: list[_Worker], grace: float) -> None:
    """SIGTERM the process group of each of ``workers``, SIGKILL what is left after
    ``grace`` seconds, and wait (``grace`` again) for them to exit."""
    live = [w for w in workers if _is_running(w)]
    for w in live:
        _signal(w, signal.SIGTERM)
    live = _wait_exited(live, grace)
    for w in live:
        _signal(w, signal.SIGKILL)
    live = _wait_exited(live, grace)
    if live:
        logger.warning(
            "ProcessJob workers still running after SIGKILL: %s",
            "; ".join(w.describe() for w in live),
        )


#: Worker groups started by this process and never saved: stopped at its exit (JOB-3).
_unsaved: set[_Workers] = set()


def _valid_mesh(name: object, count: object) -> bool:
    """Whether ``name`` and ``count`` make a mesh of a ``ProcessJob``: a non-empty name
    and a positive number of hosts."""
    return (
        isinstance(name, str)
        and bool(name)
        and isinstance(count, int)
        and not isinstance(count, bool)
        and count >= 1
    )


#: Longest Unix socket path (``sun_path`` holds 108 bytes with the terminating NUL).
_MAX_SOCKET_PATH = 107

#: ``monarch._src.actor.workers.READY_FILE_ENV`` (not imported: it loads the runtime).
_READY_FILE_ENV = "MONARCH_WORKER_READY_FILE"


def _ready_file(address: str) -> str:
    """The file a ``ProcessJob`` worker at ``address`` creates once it serves."""
    return address.removeprefix("ipc://").removesuffix(".sock") + ".ready"


def _inherit_output() -> bool:
    """Whether workers may write to this process's stdout and stderr: not when either
    is a pipe or a socket, which a worker outliving this process (a saved job's) would
    hold open, so that a reader (``| tee``, ``subprocess.run(capture_output=True)``)
    would wait for it."""
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            return False
    return True


def _make_socket_dir() -> str:
    """A fresh private (0700) directory for worker sockets; under ``/tmp`` when the
    default temporary directory's paths would be too long for a socket."""
    directory = tempfile.mkdtemp(prefix="monarch-job-")
    if len(os.path.join(directory, "worker-9999.sock")) > _MAX_SOCKET_PATH:
        os.rmdir(directory)
        directory = tempfile.mkdtemp(prefix="monarch-job-", dir="/tmp")
    return directory
