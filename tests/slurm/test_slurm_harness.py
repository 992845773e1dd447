"""The Slurm harness itself: up and down within budget, leaving no process or file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.netns import Cluster

from .harness import SlurmCluster

HERE = Path(__file__).parent
REPO = HERE.parent.parent
#: How long a step's slurmstepd may take to finish after srun returned (the grace the
#: ``slurm`` fixture gives every test's leftovers).
STEP_GRACE_S = 10.0


@pytest.mark.timeout(60)
def test_harness_up_and_down_leaves_nothing(slurm: SlurmCluster) -> None:
    """A second, two-node cluster beside the session's: up, a two-node step, down."""
    t0 = time.monotonic()
    net = Cluster.create(2)
    try:
        cluster = SlurmCluster.start(net)
        t_up = time.monotonic() - t0
        argv = cluster.client_argv(["srun", "-N2", "-l", "hostname"])
        done = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=30)
        assert sorted(done.stdout.split()) == ["0:", "1:", "node0", "node1"], done
        # srun returns once the tasks ended; each node's slurmstepd then finishes its
        # teardown. Given the grace every Slurm test gets, the step is gone.
        assert cluster.wait_steps_gone(STEP_GRACE_S) == [], "the step ended"
        root = cluster.root
        t1 = time.monotonic()
        leftovers = cluster.stop()
        t_down = time.monotonic() - t1
        assert leftovers == [], "the step ended: nothing was left to kill"
        assert not root.exists(), "every file was under the private directory"
        assert net.processes() == [], "no process is left in the namespaces"
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(root) not in out, "no daemon outside the namespaces is left"
    finally:
        net.destroy()
    # How fast: benches/slurm_bench.py measures the harness up and down (no timed assert).
    print(f"\nslurm harness: up {t_up:.2f} s, down {t_down:.2f} s (with the namespaces)")


@pytest.mark.timeout(200)
def test_spmd_slurm_example_trains_ddp_across_two_nodes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """examples/spmd_slurm.py: DDP over gloo, one rank per Slurm node, via monarch.spmd."""
    argv = [
        sys.executable,
        str(REPO / "examples" / "spmd_slurm.py"),
        "--nodes",
        "2",
        "--steps",
        "3",
        "--log-dir",
        str(tmp_path),
        "--start-timeout",
        "60",
        "--train-timeout",
        "120",
    ]
    env = dict(slurm.env)
    env.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)  # as users run it
    done = subprocess.run(
        slurm.client_argv(argv),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    logs = "\n".join(p.read_text() for p in tmp_path.glob("slurm_*.out"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
    assert "trained on 2 ranks over 2 Slurm nodes: True" in done.stdout, done.stdout
    # The ranks' prints reach the client (forwarded proc output) or the job's log.
    printed = done.stdout + logs
    assert "rank 0/2 on node0" in printed and "rank 1/2 on node1" in printed, printed
    assert printed.count("replicas identical: True") == 2, printed
    assert slurm.jobs() == []
