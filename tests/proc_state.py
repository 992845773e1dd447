"""What the tests ask of ``/proc`` about a process they started (directly or not)."""

from __future__ import annotations

import os
import signal
import time


def state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``, ...), or ``None`` if no such process.

    A process can be reaped between opening its ``stat`` file and reading it; the read then
    fails with ``ESRCH`` (``ProcessLookupError``), which means the same as a missing file.
    """
    return _state_in(f"/proc/{pid}/stat")


def _state_in(path: str) -> str | None:
    try:
        with open(path) as f:
            data = f.read()
    except OSError:  # FileNotFoundError, ProcessLookupError
        return None
    fields = data.rpartition(")")[2].split()
    return fields[0] if fields else None


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: one that exited (a zombie not yet reaped) does not."""
    return state(pid) not in (None, "Z", "X")


def freeze(pid: int, timeout: float = 30.0) -> None:
    """Send ``pid`` SIGSTOP and return once every one of its threads has stopped.

    ``kill`` only queues the signal: one thread takes it and then stops the others, and
    until each has been scheduled once more the process's other threads keep running
    (on a busy machine, long enough to answer a message sent after the ``kill``).
    Raises ``AssertionError`` if some thread has not stopped within ``timeout`` seconds.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            threads = []
        states = {tid: state_of_thread(pid, tid) for tid in threads}
        awake = [tid for tid, s in states.items() if s not in ("T", "t", "Z", "X", None)]
        if threads and not awake:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"process {pid} was sent SIGSTOP but threads {awake} still had not "
                f"stopped after {timeout} s (states {states})"
            )
        time.sleep(0.005)


def state_of_thread(pid: int, tid: str) -> str | None:
    """The state letter of thread ``tid`` of process ``pid``, or ``None`` if it is gone."""
    return _state_in(f"/proc/{pid}/task/{tid}/stat")


def voluntary_switches(tid: int) -> int:
    """How many times thread ``tid`` of this process slept (gave up its core to wait):
    its ``voluntary_ctxt_switches``."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")
