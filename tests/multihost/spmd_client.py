"""The client of tests/multihost/test_spmd_hosts.py, run in the client network namespace:
``python spmd_client.py OUT_DIR WORKER_ADDRESS...``.

It runs a torchrun command line (``--nnodes=2 --nproc-per-node=2``, the DDP script of
tests/job/spmd_ddp_script.py) with ``monarch.job.spmd.SPMDJob`` on the hosts of the
workers given (attached by address, the way a job type finds workers it did not start):
first with rank 3 (on the second host) told to fail, then normally. Prints one line
``RESULT <json>``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from monarch.actor import HostMesh, attach_to_workers, enable_transport
from monarch.job import JobState, JobTrait
from monarch.job.spmd import SPMDJob, SPMDRunError

SCRIPT = Path(__file__).resolve().parents[1] / "job" / "spmd_ddp_script.py"


class AttachedJob(JobTrait):
    """Workers that are already running, at known addresses: one mesh, ``workers``."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__()
        self._addresses = addresses
        self._hosts: HostMesh | None = None

    def _create(self, client_script: str | None) -> None:
        assert client_script is None

    def _state(self) -> JobState:
        if self._hosts is None:
            self._hosts = attach_to_workers(workers=self._addresses, ca=None, name="workers")
        return JobState({"workers": self._hosts})

    def can_run(self, spec: JobTrait) -> bool:
        return False

    def _kill(self) -> None:
        self._hosts = None


def main(out: str, addresses: list[str]) -> None:
    enable_transport("tcp")
    job = AttachedJob(addresses)
    command = ["torchrun", "--nnodes=2", "--nproc-per-node=2", str(SCRIPT), "--out", out]
    # gloo binds the address of the host's interface, not the one its hostname resolves
    # to (the machine's, outside the namespace): as on Kubernetes (ddp-workers.yaml).
    env = {"GLOO_SOCKET_IFNAME": "eth0"}
    failing = SPMDJob(job, [*command, "--fail-rank", "3"], env=env)
    start = time.monotonic()
    error, ranks = None, None
    try:
        failing.run_spmd(timeout=120)
    except SPMDRunError as e:
        error, ranks = str(e), e.ranks
    failed_s = time.monotonic() - start
    start = time.monotonic()
    SPMDJob(job, [*command, "--steps", "3"], env=env).run_spmd(timeout=180)
    result = {
        "error": error,
        "ranks": ranks,
        "failed_s": failed_s,
        "ran_s": time.monotonic() - start,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
