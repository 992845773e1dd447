"""``monarch.job.spmd.serve(..., scheduler="slurm")`` on a real Slurm (tests/slurm/harness.py):
a torchrun command line, ``--nnodes=2 --nproc-per-node=1``, the DDP script of
tests/job/spmd_ddp_script.py, run by a client on the login node on two Slurm nodes
(namespace hosts). ``serve`` submits the allocation (a ``SlurmJob`` from
``scheduler_cfg``) and saves it in the state cache, ``run_spmd`` trains on 2 ranks, a
second client reconnects through the cache and runs again, and ``kill`` ends the job.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .harness import SlurmCluster

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "job" / "spmd_ddp_script.py"

CLIENT = """\
import sys
import time

from monarch.job.spmd import job_load, serve

out, logs, action = sys.argv[1:4]
command = ["torchrun", "--nnodes=2", "--nproc-per-node=1", {script!r}, "--steps", "2"]
start = time.monotonic()
if action == "serve":
    job = serve(
        [*command, "--out", out],
        scheduler="slurm",
        scheduler_cfg={{
            "python_exe": sys.executable,
            "time": "00:10:00",
            "job_dir": logs,
            "job_start_timeout": 60,
        }},
    )
else:
    job = job_load()  # the job the first client saved
served = time.monotonic()
job.run_spmd(timeout=150)
print(f"RESULT {{job.job.slurm_job_id}} {{served - start:.1f}} {{time.monotonic() - served:.1f}}")
if action == "kill":
    job.kill()
"""


def _client(slurm: SlurmCluster, cwd: Path, out: Path, action: str) -> list[str]:
    env = dict(slurm.env)
    env.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)  # as users run it
    client = cwd / "client.py"
    client.write_text(CLIENT.format(script=str(SCRIPT)))
    argv = [sys.executable, str(client), str(out), str(cwd), action]
    done = subprocess.run(
        slurm.client_argv(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=200
    )
    logs = "\n".join(p.read_text() for p in cwd.glob("slurm_*.out"))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}\n{logs}"
    return lines[-1].split()[1:]


@pytest.mark.timeout(300)
def test_serve_a_torchrun_command_on_two_slurm_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    start = time.monotonic()
    job_id, served_s, ran_s = _client(slurm, tmp_path, out, "serve")
    records = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for rank, record in enumerate(records):
        env = record["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank) and env["LOCAL_RANK"] == "0"
        assert record["same"] is True and record["params"] == records[0]["params"]
    assert [r["host"] for r in records] == ["node0", "node1"]
    # The rendezvous is the address rank 0's worker serves on: node0's, not a loopback.
    master = ipaddress.ip_address(records[0]["env"]["MASTER_ADDR"])
    assert not master.is_loopback, master
    assert len(slurm.jobs()) == 1  # the allocation outlives the client (saved)

    # A second client reconnects to the saved job, runs again on the same nodes, ends it.
    for f in out.iterdir():
        f.unlink()
    again_id, _, again_s = _client(slurm, tmp_path, out, "kill")
    assert again_id == job_id
    assert sorted(f.name for f in out.iterdir()) == ["rank-0.json", "rank-1.json"]
    assert slurm.jobs() == []
    print(
        f"serve {served_s} s, run_spmd {ran_s} s, again {again_s} s, "
        f"total {time.monotonic() - start:.1f} s"
    )
