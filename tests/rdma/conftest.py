"""Fixtures of the ``monarch.rdma`` tests.

As in ``tests/actor``, the client's ``monarch.actor.unhandled_fault_hook`` is a recorder
for the whole session (the default hook would stop the test run when a test kills the
owner of a buffer); a test that kills a proc waits for its failure through ``faults``.

``procs`` is a module-wide mesh of three procs on this host (``{"procs": 3}``); tests that
kill or stop procs use ``own_procs``, a mesh of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fault_recorder import Faults, _record_faults, faults
from monarch.actor import ProcMesh, this_host

__all__ = ["Faults", "_record_faults", "faults", "own_procs", "procs"]


def _start(count: int) -> ProcMesh:
    pm = this_host().spawn_procs(per_host={"procs": count})
    # Started in the background: wait, so that they exist before the leak checks'
    # snapshot of the first test.
    assert pm.initialized.get(timeout=60) is True
    return pm


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """Three procs on this host, shared by the tests of a module that leave them healthy."""
    pm = _start(3)
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture
def own_procs() -> Iterator[ProcMesh]:
    """Three procs for one test, which may kill or stop some of them."""
    pm = _start(3)
    yield pm
    pm.stop().get(timeout=60)
