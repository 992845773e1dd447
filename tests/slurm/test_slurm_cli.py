"""The ``monarch`` command with a SlurmJob, on a real Slurm (tests/slurm/harness.py).

``monarch apply jobs.job`` submits the allocation from the login node (the client
namespace) and returns with the job running; ``status``, ``exec`` and ``kill`` are new
processes that reconnect through the saved state, as a user's shell session does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .harness import SlurmCluster
from .test_slurm_job import client_env

#: Seconds one command may take.
TIMEOUT = 90

JOBS = textwrap.dedent(
    """
    import sys

    from monarch.job import SlurmJob

    job = SlurmJob({{"trainers": 2}}, python_exe=sys.executable, log_dir={log_dir!r},
                   job_start_timeout=60)
    """
)


def monarch(slurm: SlurmCluster, project: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``monarch ARGV`` on the login node, in ``project``."""
    command = slurm.client_argv([sys.executable, "-m", "monarch.tools.cli", *argv])
    return subprocess.run(
        command,
        cwd=project,
        env=client_env(slurm),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.timeout(300)
def test_apply_status_exec_kill(slurm: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS.format(log_dir=str(tmp_path)))
    applied = False
    try:
        done = monarch(slurm, tmp_path, "apply", "jobs.job")
        assert done.returncode == 0, f"apply: {done.stdout}\n{done.stderr}"
        applied = True
        jobs = slurm.jobs()
        assert len(jobs) == 1, f"one allocation for the job: {jobs}"

        done = monarch(slurm, tmp_path, "status")
        assert done.returncode == 0, f"status: {done.stdout}\n{done.stderr}"
        assert "trainers" in done.stdout, done.stdout

        # One rank by default, streamed: the first host of the first mesh.
        done = monarch(slurm, tmp_path, "exec", "--", "hostname")
        assert done.returncode == 0, f"exec: {done.stdout}\n{done.stderr}"
        assert "node0" in done.stdout, done.stdout

        # Every host, per-rank files; the exit status is the largest of the runs.
        out_dir = tmp_path / "out"
        done = monarch(
            slurm,
            tmp_path,
            "exec",
            "--all",
            "--output-dir",
            str(out_dir),
            "--",
            "sh",
            "-c",
            'hostname; [ "$MONARCH_RANK_HOSTS" = 1 ] && exit 3; exit 0',
        )
        assert done.returncode == 3, f"exec --all: {done.stdout}\n{done.stderr}"
        logs = sorted(out_dir.rglob("rank_*.log"))
        assert [p.name for p in logs] == ["rank_0.log", "rank_1.log"], logs
        assert [p.read_text().strip() for p in logs] == ["node0", "node1"]

        done = monarch(slurm, tmp_path, "kill")
        assert done.returncode == 0, f"kill: {done.stdout}\n{done.stderr}"
        applied = False
        assert slurm.jobs() == [], "kill returns once the job has ended"
    finally:
        if applied:
            for job in slurm.jobs():
                slurm.command(["scancel", job], check=False)
