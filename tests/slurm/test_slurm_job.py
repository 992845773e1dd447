"""SlurmJob on a real Slurm (tests/slurm/harness.py): clients run on the login node (the
client namespace), workers are Slurm tasks on namespace hosts, over authenticated TCP.

The measured numbers (state() to first answer, kill() to job gone) are printed; run with
``-s`` to see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .harness import SlurmCluster

HERE = Path(__file__).parent
REPO = HERE.parent.parent
#: Budgets of the issue, checked with room for a loaded machine (the printed numbers
#: are what to compare with the budgets).
FIRST_CALL_BUDGET_S = 5.0
KILL_BUDGET_S = 5.0
LOAD_ALLOWANCE = 3.0


def client_env(slurm: SlurmCluster) -> dict[str, str]:
    env = dict(slurm.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python"), str(HERE), env.get("PYTHONPATH", "")]
    )
    for name in ("MONARCH_CLUSTER_SECRET", "MONARCH_CLUSTER_AUTH", "MONARCH_TLS_CA"):
        env.pop(name, None)
    env["MONARCH_HOST_CLIENT_LEASE"] = "3s"
    return env


def start_client(
    slurm: SlurmCluster, scenario: str, log_dir: Path, *args: str
) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE / "slurm_client.py"), scenario, str(log_dir), *args]
    return subprocess.Popen(
        slurm.client_argv(argv),
        env=client_env(slurm),
        cwd=log_dir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], tag: str, timeout: float) -> dict[str, Any]:
    """The JSON of the next ``TAG <json>`` line the client prints (other lines skipped)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    import time

    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(f"{tag} "):
            return dict(json.loads(line[len(tag) + 1 :]))
    proc.kill()
    _, err = proc.communicate(timeout=30)
    raise AssertionError(f"no {tag} line from the client; stdout: {''.join(seen)}\nstderr: {err}")


def run_client(
    slurm: SlurmCluster, scenario: str, log_dir: Path, *args: str, timeout: float = 90
) -> dict[str, Any]:
    proc = start_client(slurm, scenario, log_dir, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"client {scenario} timed out:\n{out}\n{err}") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"client {scenario} failed ({proc.returncode}):\n{out}\n{err}\n{slurm.logs_tail()}"
    )
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def hosts_of(answers: list[dict[str, Any]]) -> list[str]:
    return [a["host"] for a in answers]


@pytest.mark.timeout(120)
def test_two_meshes_end_to_end(slurm: SlurmCluster, tmp_path: Path) -> None:
    """SLURM-1: one allocation serves both meshes; the workers authenticate with the
    job's secret; kill() returns once the job ended (SLURM-3)."""
    result = run_client(slurm, "meshes", tmp_path)
    trainers, loaders = result["answers"]["trainers"], result["answers"]["dataloaders"]
    assert hosts_of(trainers) == ["node0", "node1"]
    assert hosts_of(loaders) == ["node2"]
    assert {a["job"] for a in trainers + loaders} == {result["job"]}, "SLURM-1: one allocation"
    assert all(a["secret_set"] for a in trainers + loaders)
    print(
        f"\nslurm: state() to first call answered (2-node mesh of a 3-node job): "
        f"{result['first_call_s']:.2f} s; kill() to job gone: {result['kill_s']:.2f} s"
    )
    assert result["first_call_s"] < FIRST_CALL_BUDGET_S + LOAD_ALLOWANCE
    assert result["kill_s"] < KILL_BUDGET_S + LOAD_ALLOWANCE
    assert slurm.jobs() == [], "SLURM-3: the job is gone once kill() returned"
    log = (tmp_path / f"slurm_{result['job']}_monarch_job.out").read_text()
    assert "monarch worker ready at" in log
    assert "trust" not in log.lower(), "workers never trust all connections"
