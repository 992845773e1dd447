"""Fixtures of the ``monarch.rdma`` tests.

As in ``tests/actor``, the client's ``monarch.actor.unhandled_fault_hook`` is a recorder
for the whole session (the default hook would stop the test run when a test kills the
owner of a buffer); a test that kills a proc waits for its failure through ``faults``.

``procs`` is a module-wide mesh of three procs on this host (``{"procs": 3}``); tests that
kill or stop procs use ``own_procs``, a mesh of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, this_host


class Faults:
    """The failures that reached the client's fault hook, in order."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self._changed = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._changed:
            self.failures.append(failure)
            self._changed.notify_all()

    def wait_for(self, count: int, mesh_name: str, timeout: float = 30) -> list[MeshFailure]:
        """Wait until ``count`` failures of ``mesh_name`` arrived; return them."""

        def of_mesh() -> list[MeshFailure]:
            return [f for f in self.failures if f.mesh_name == mesh_name]

        with self._changed:
            if not self._changed.wait_for(lambda: len(of_mesh()) >= count, timeout):
                raise AssertionError(
                    f"expected {count} failure(s) of {mesh_name!r} within {timeout} s, got "
                    f"{[str(f) for f in self.failures]}"
                )
            return of_mesh()


_RECORDER = Faults()


@pytest.fixture(autouse=True, scope="session")
def _record_faults() -> Iterator[None]:
    # Never restored during the session: failures arrive asynchronously, possibly after
    # the test that caused them, and must never reach the default (exiting) hook.
    monarch.actor.unhandled_fault_hook = _RECORDER
    yield


@pytest.fixture
def faults() -> Faults:
    """The session's fault recorder (filter by mesh name)."""
    return _RECORDER


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
