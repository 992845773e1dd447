"""A client that attaches to two worker hosts, calls its actors on them, then kills the
workers or the procs and returns at once; run by ``test_exit.py``, many times per case.

Usage: ``python exit_script.py TRANSPORT KILL`` where

* TRANSPORT: ``ipc`` (the workers of a ``monarch.job.ProcessJob``, on Unix sockets) or
  ``tcp`` (two ``monarch worker`` processes on ``tcp://127.0.0.1``, attached with
  ``attach_to_workers``);
* KILL: ``procs`` (SIGKILL every proc the script spawned) or ``hosts`` (SIGKILL every
  worker's process group), as the script's last statements.

The failures of the killed procs reach the client while it returns and exits: it must
end promptly with exit status 1 (the default fault hook), every time. It prints
``WORKERS <pid> ...`` (each leads its process group) as soon as the workers run, so
that the test can end those a hung run left behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys

from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint
from monarch.job import ProcessJob

TRANSPORT, KILL = sys.argv[1:3]
SECRET = "exit-test-secret"


class Where(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tcp_workers() -> tuple[list[int], list[str]]:
    """Two workers on free loopback ports; ended at this script's exit, after the
    client's own exit (this hook is registered before the runtime starts)."""
    os.environ["MONARCH_CLUSTER_SECRET"] = SECRET
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", "tcp://127.0.0.1:0"],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    atexit.register(lambda: [kill_group(w.pid) for w in workers])
    print("WORKERS " + " ".join(str(w.pid) for w in workers), flush=True)
    addresses = []
    for w in workers:
        assert w.stdout is not None
        line = w.stdout.readline()  # "monarch worker ready at tcp:127.0.0.1:PORT"
        assert line.startswith("monarch worker ready at tcp:"), line
        addresses.append("tcp://" + line.split("tcp:", 1)[1].strip())
    return [w.pid for w in workers], addresses


if TRANSPORT == "tcp":
    enable_transport("tcp://127.0.0.1:0")
    worker_pids, addresses = tcp_workers()
    hosts = attach_to_workers(workers=addresses, ca=None)
else:
    job = ProcessJob({"hosts": 2})
    hosts = job.state(cached_path=None).hosts
    running = job._running
    assert isinstance(running, ProcessJob) and running._workers is not None
    worker_pids = [w.pid for w in running._workers.all()]
    print("WORKERS " + " ".join(str(p) for p in worker_pids), flush=True)

procs = hosts.spawn_procs(per_host={"gpus": 2})
pids = sorted(procs.spawn("where", Where).pid.call().get(timeout=60).values())
assert len(pids) == 4, pids
print("CALLED", flush=True)
if KILL == "procs":
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
else:
    for pid in worker_pids:
        kill_group(pid)
