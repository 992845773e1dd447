"""The fixture of the tests of the ``monarch`` command: ``project``, a directory with a
module of jobs (see ``cli_helpers.py``), whose applied jobs are killed after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import Project


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path)
    try:
        yield p
    finally:
        p.kill_all()
