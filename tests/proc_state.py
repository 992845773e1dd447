"""What the tests ask of ``/proc`` about a process they started (directly or not)."""

from __future__ import annotations


def state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``, ...), or ``None`` if no such process.

    A process can be reaped between opening its ``stat`` file and reading it; the read then
    fails with ``ESRCH`` (``ProcessLookupError``), which means the same as a missing file.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:  # FileNotFoundError, ProcessLookupError
        return None
    fields = data.rpartition(")")[2].split()
    return fields[0] if fields else None


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: one that exited (a zombie not yet reaped) does not."""
    return state(pid) not in (None, "Z", "X")
