"""Fixtures of the dashboard tests: ``browser`` (a headless chromium, see
``browser_helpers.py``) and ``dashboard_url`` (the URL, with its token, of an admin server
over the recorded job ``tests/monitoring/fixtures/recorded.json``).

``MONARCH_DASHBOARD_URL=<url printed by a program>`` points the tests at a server that is
already running instead (for developing the page); the checks that depend on what the
recorded job contains then still expect that job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from browser_helpers import Browser, find_browser, require_browser

if TYPE_CHECKING:
    from monarch._rust_bindings import AdminServer

RECORDED = Path(__file__).resolve().parents[1] / "monitoring" / "fixtures" / "recorded.json"


def _skip_or_fail(reason: str) -> None:
    if require_browser():
        pytest.fail(f"MONARCH_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def browser() -> Iterator[Browser]:
    found = find_browser()
    if isinstance(found, str):
        _skip_or_fail(found)
        raise AssertionError("unreachable")
    b = Browser(found)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def dashboard_url() -> Iterator[str]:
    """The dashboard of the recorded job; ``MONARCH_DASHBOARD_URL`` overrides it."""
    override = os.environ.get("MONARCH_DASHBOARD_URL")
    if override:
        yield override
        return
    server = recorded_server()
    try:
        yield str(server.url)
    finally:
        server.stop()


def recorded_server() -> AdminServer:
    """A new admin server over the recorded job (skips, or fails in CI, without it)."""
    try:
        from monarch._rust_bindings import AdminConfig, AdminServer
    except ImportError as e:
        _skip_or_fail(f"the admin server binding is not built ({e})")
        raise AssertionError("unreachable") from e
    return AdminServer.serve_recorded(str(RECORDED), AdminConfig())


@pytest.fixture
def own_server() -> Iterator[AdminServer]:
    """A recorded server of the test's own, which the test may stop."""
    server = recorded_server()
    try:
        yield server
    finally:
        server.stop()
