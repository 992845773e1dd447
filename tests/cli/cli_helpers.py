"""Helpers for the tests of the ``monarch`` command: a project directory holding a small
module of jobs, and a runner of ``python -m monarch.tools.cli`` in it. A module of its
own name, so that the tests import it whichever ``conftest`` was imported first.

The jobs are ``ProcessJob`` workers started by ``monarch apply`` subprocesses: they
outlive the command that started them (that is the point), so each test kills what it
applied and checks, through the saved state, that the workers are gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

#: Seconds one command of these tests may take.
TIMEOUT = 90.0

JOBS = textwrap.dedent(
    """
    from monarch.job import ProcessJob

    job = ProcessJob({"trainers": 2, "loaders": 1})
    one = ProcessJob({"hosts": 1})


    def two() -> ProcessJob:
        return ProcessJob({"hosts": 2})


    not_a_job = 42
    """
)


@dataclass
class Result:
    status: int
    out: str
    err: str


class Project:
    """A directory with ``jobs.py``, where ``run(...)`` runs the ``monarch`` command."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "jobs.py").write_text(JOBS)

    def run(self, *argv: str, input: str | None = None, check: int | None = 0) -> Result:
        done = subprocess.run(
            [sys.executable, "-m", "monarch.tools.cli", *argv],
            cwd=self.root,
            input=input,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=cli_env(),
        )
        result = Result(done.returncode, done.stdout, without_logs(done.stderr))
        if check is not None:
            assert result.status == check, f"monarch {' '.join(argv)}: {result}"
        return result

    def worker_pids(self, context: str = "default") -> list[int]:
        """The worker pids of the ProcessJob saved in ``context``."""
        from monarch._src.job.job import ProcessJob, job_load

        path = self.root / ".monarch" / context / "state.pkl"
        job = job_load(str(path))
        assert isinstance(job, ProcessJob) and job._workers is not None
        return [w.pid for w in job._workers.all()]

    def kill_all(self) -> None:
        """Kill the job of every context (teardown)."""
        monarch_dir = self.root / ".monarch"
        if not monarch_dir.is_dir():
            return
        for state in monarch_dir.glob("*/state.pkl"):
            pids = self.worker_pids(state.parent.name)
            self.run("kill", state.parent.name, check=None)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


#: A line of the runtime's log (``2025-01-01T00:00:00.000000Z  WARN ...``).
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z +[A-Z]+ .*\n?", re.MULTILINE)


def without_logs(text: str) -> str:
    """``text`` without the runtime's log lines (its warnings, such as a lost host's)."""
    return _LOG_LINE.sub("", text)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SHELL"] = "/bin/sh"
    return env


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def assert_gone(pids: list[int]) -> None:
    """The processes ``pids`` have exited: ``monarch kill`` returns once they did."""
    assert pids
    assert not [p for p in pids if running(p)], f"workers still running: {pids}"
