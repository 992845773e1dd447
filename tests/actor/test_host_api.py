"""Members of ``HostMesh`` that upstream's scripts use: ``is_fake_in_process``, and
``with_python_executable``, whose interpreter the procs that actors spawn use too."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

import monarch
from monarch.actor import Actor, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


def test_host_meshes_are_not_fake() -> None:
    assert this_host().is_fake_in_process is False


class Nester(Actor):
    @endpoint
    def nested_python(self) -> str:
        procs = this_host().spawn_procs(per_host={"inner": 1})
        try:
            return procs.spawn("inner", Reporter).python.call_one().get(timeout=60)
        finally:
            procs.stop().get(timeout=60)


class Reporter(Actor):
    @endpoint
    def python(self) -> str:
        return os.environ.get("MONARCH_TEST_WRAPPER", "")


def test_with_python_executable_applies_to_procs_that_actors_spawn(tmp_path: Path) -> None:
    # A wrapper interpreter that notes each start in a file, then runs the real one.
    log = tmp_path / "starts"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho start >> "{log}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    # A fresh interpreter per proc, so that every proc start goes through the wrapper.
    with monarch.configured(spawn_fork_server=False):
        procs = this_host().with_python_executable(str(wrapper)).spawn_procs(per_host={"outer": 1})
    try:
        procs.spawn("nester", Nester).nested_python.call_one().get(timeout=90)
    finally:
        procs.stop().get(timeout=60)
    # The outer proc and the one its actor spawned both started through it.
    assert log.read_text().split() == ["start", "start"]


def _failing_bootstrap() -> None:
    raise ValueError("bootstrap refused")


def test_a_failing_bootstrap_surfaces_on_initialized_not_at_spawn() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_failing_bootstrap)
    # spawn_procs returned: the failure is the procs', reported where upstream does.
    with pytest.raises(RuntimeError, match="failed to start") as info:
        procs.initialized.get(timeout=60)
    assert "bootstrap refused" in str(info.value)  # the proc's last lines
    procs.stop().get(timeout=60)
