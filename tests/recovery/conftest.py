"""Fixtures of the recovery tests: the fault hook records instead of ending the run, and
``faults`` is the directory where a test names the failures to inject (see
``injected_faults``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from injected_faults import unhandled

import monarch.actor


@pytest.fixture(autouse=True, scope="module")
def _no_unhandled_failures() -> Iterator[None]:
    # Never restored: failures may arrive after a test, and must not reach the default
    # (exiting) hook. Each test checks that ``unhandled`` stayed empty.
    monarch.actor.unhandled_fault_hook = unhandled.append
    yield


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAULTS", str(tmp_path))
    unhandled.clear()
    return tmp_path
