"""Fixtures of the recovery tests: the fault hook records instead of ending the run, and
``faults`` is the directory where a test names the failures to inject (see
``injected_faults``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from injected_faults import unhandled

import monarch.actor
from fault_recorder import RECORDER
from monarch.actor import MeshFailure


def _hook(failure: MeshFailure) -> None:
    """The recovery tests' fault hook: records a failure that reached it (each test
    checks there is none) and passes it to the session's recorder."""
    RECORDER(failure)  # what the other directories' tests wait on, in this same process
    unhandled.append(failure)


@pytest.fixture(autouse=True, scope="module")
def _no_unhandled_failures() -> Iterator[None]:
    # Never restored: failures may arrive after a test, and must not reach the default
    # (exiting) hook. Each test checks that ``unhandled`` stayed empty. The session's
    # recorder (tests/fault_recorder.py) still gets every failure: under pytest-xdist a
    # worker runs other directories' tests, which wait on it, in the same process.
    monarch.actor.unhandled_fault_hook = _hook
    yield


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAULTS", str(tmp_path))
    unhandled.clear()
    return tmp_path
