"""SlurmJob.add_mesh on a running job (issue 37, hosts added to a running job): the new
mesh gets a Slurm allocation of its own, with the job's settings and secret, whose
workers come up like the first ones; both meshes answer one client; kill() cancels both;
the saved job holds both, so a later client reconnects to them.

Run with ``-s`` to see the measured times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import SlurmCluster
from .test_slurm_job import hosts_of, run_client


@pytest.mark.timeout(150)
def test_a_mesh_added_to_a_running_job_gets_an_allocation_of_its_own(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    result = run_client(slurm, "add-mesh", tmp_path, "kill", timeout=120)
    first, second = result["jobs"]
    assert result["job"] == first, "slurm_job_id stays the first allocation's"
    assert result["saved_jobs"] == [first, second], "the cache was saved again with both"
    assert result["meshes"] == ["trainers", "extra"]
    trainers, extra = result["answers"]["trainers"], result["answers"]["extra"]
    assert hosts_of(trainers) == ["node0", "node1"]
    assert {a["job"] for a in trainers} == {first}
    assert hosts_of(extra) == ["node2"]
    assert {a["job"] for a in extra} == {second}, "the added mesh runs in its own job"
    assert all(a["secret_set"] for a in trainers + extra), "the job's secret, both"
    assert (
        result["taken"] is not None and "already has a mesh named 'trainers'" in (result["taken"])
    ), result["taken"]
    print(
        f"\nslurm: add_mesh to the added mesh answering: {result['added_s']:.2f} s; "
        f"kill() of both allocations: {result['kill_s']:.2f} s"
    )
    assert result["jobs_after_kill"] == []
    assert slurm.jobs() == [], "kill() cancels both allocations"
    log = (tmp_path / f"slurm_{second}_monarch_job.out").read_text()
    # The first added allocation serves at monarch_port + ntasks_per_node.
    assert "monarch worker ready at tcp:" in log and ":22223" in log, log


@pytest.mark.timeout(150)
def test_a_new_client_reconnects_to_the_added_allocation(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    first = run_client(slurm, "add-mesh", tmp_path, "leave", timeout=120)
    assert sorted(slurm.jobs()) == sorted(first["jobs"]), "both left running"
    second = run_client(slurm, "add-mesh-reconnect", tmp_path)
    assert second["jobs"] == first["jobs"], "JOB-2: the grown job is reused"
    assert hosts_of(second["answers"]["trainers"]) == ["node0", "node1"]
    assert hosts_of(second["answers"]["extra"]) == ["node2"]
    assert slurm.jobs() == []
