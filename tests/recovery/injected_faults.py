"""Failures the recovery tests inject, the failures that reached the fault hook, and
whether a process still runs.

A test names a fault by creating a file in the directory of ``$FAULTS`` (the ``faults``
fixture); the replica or rank that reaches that point calls :func:`fire`, which removes
the file, so each fault fires once. Imported by the tests and, through them, by their
procs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Failures that reached ``monarch.actor.unhandled_fault_hook`` during the module: the
#: trainers handle their replicas' failures, so anything here is a bug.
unhandled: list[Any] = []


def fire(name: str) -> bool:
    """Whether the fault file ``name`` was there (it is removed: a fault fires once)."""
    path = Path(os.environ.get("FAULTS", "/nonexistent")) / name
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
