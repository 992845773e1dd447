"""Fixtures of the distributed-tensor tests.

``mesh`` is a module-wide mesh of four procs on this host, ``{"hosts": 2, "gpus": 2}``,
activated by no one (tests activate it, or views of it, themselves). Tests that kill or
stop procs use ``own_mesh``. As in ``tests/actor``, the client's fault hook is a recorder
for the session (a killed proc must not stop the test run).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests_tensor_helpers import preloading_torch

from fault_recorder import Faults, _record_faults, faults
from monarch.actor import ProcMesh, this_host

__all__ = ["Faults", "_record_faults", "faults", "mesh", "own_mesh"]


def _start(per_host: dict[str, int]) -> ProcMesh:
    with preloading_torch():
        pm = this_host().spawn_procs(per_host=per_host)
    assert pm.initialized.get(timeout=120) is True
    return pm


@pytest.fixture(scope="module")
def mesh() -> Iterator[ProcMesh]:
    pm = _start({"hosts": 2, "gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture
def own_mesh() -> Iterator[ProcMesh]:
    pm = _start({"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)
