"""Failures the recovery tests inject, and the failures that reached the fault hook.

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
