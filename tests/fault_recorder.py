"""The client's fault recorder, shared by the conftests of tests/actor and tests/rdma.

During each test ``monarch.actor.unhandled_fault_hook`` is :data:`RECORDER` (the
default hook would stop the test run, as it stops a program); a test that provokes
failures asserts on what reached the client through the ``faults`` fixture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import monarch.actor
from monarch.actor import MeshFailure


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


RECORDER = Faults()


@pytest.fixture(autouse=True)
def _record_faults() -> Iterator[None]:
    # Installed before every test, never restored: failures arrive asynchronously,
    # possibly after the test that caused them, and must never reach the default
    # (exiting) hook. Before every test, because under pytest-xdist a worker also runs
    # other directories' tests, which may install hooks of their own.
    monarch.actor.unhandled_fault_hook = RECORDER
    yield


@pytest.fixture
def faults() -> Faults:
    """The session's fault recorder (filter by mesh name: failures of earlier tests
    may arrive late)."""
    return RECORDER
