"""Multi-host benchmark on one machine: three hosts in network namespaces (as the
multi-host tests build them), a worker in each, a client in a fourth namespace.

Measures call_one to a proc on another host against call_one to a proc on the client's
own host (both over TCP), call() to every proc of a 3 x 4 mesh, spawning 3 x 4 procs
across hosts, spawning 64 procs on one host, and how long the client takes to see a
host fail (its worker SIGKILLed; its link cut). Needs root; prints a table and writes
JSON (``--out``).

Usage: ``sudo .venv/bin/python benches/multihost_bench.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multihost.netns import Cluster, available, cleanup_stale  # noqa: E402

PORT = 26600
SECRET = "multihost-bench"

CLIENT = r"""
import json, os, statistics, sys, time
from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint, this_host
import monarch.actor

class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x

def timed_calls(mesh, n):
    mesh.echo.call_one(0).get(timeout=60)
    samples = []
    for i in range(n):
        t = time.perf_counter()
        mesh.echo.call_one(i).get(timeout=60)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6

failures = []
monarch.actor.unhandled_fault_hook = lambda f: failures.append(time.monotonic())
enable_transport("tcp")
hosts = attach_to_workers(workers=sys.argv[1:], ca=None)
hosts.initialized.get(timeout=60)
out = {}
local = this_host().spawn_procs(per_host={"gpus": 1}).spawn("local", Echo)
out["call_one_same_host_us"] = timed_calls(local, 2000)
remote = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("remote", Echo)
out["call_one_cross_host_us"] = timed_calls(remote, 2000)
t = time.perf_counter()
procs = hosts.spawn_procs(per_host={"gpus": 4}, name="grid")
procs.initialized.get(timeout=120)
out["spawn_3x4_s"] = time.perf_counter() - t
grid = procs.spawn("grid", Echo)
grid.echo.call(0).get(timeout=60)
samples = []
for i in range(200):
    t = time.perf_counter()
    grid.echo.call(i).get(timeout=60)
    samples.append(time.perf_counter() - t)
out["call_3x4_us"] = statistics.median(samples) * 1e6
t = time.perf_counter()
big = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 64}, name="big")
big.initialized.get(timeout=300)
out["spawn_64_one_host_s"] = time.perf_counter() - t
big.stop().get(timeout=60)
for what in ("kill", "cut"):
    victim = 2 if what == "kill" else 0
    failures.clear()
    print("BREAK " + what + " " + str(victim), flush=True)
    t0 = float(sys.stdin.readline().split()[1])  # when the driver broke the host
    deadline = t0 + 30
    while not failures and time.monotonic() < deadline:
        time.sleep(0.001)
    out["detect_" + what + "_s"] = (failures[0] - t0) if failures else None
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "multihost.json"))
    args = parser.parse_args()
    ok, reason = available()
    if not ok:
        print(f"multihost bench skipped: {reason}")
        return 0
    cleanup_stale()
    env = dict(os.environ)
    env["MONARCH_CLUSTER_SECRET"] = SECRET
    env["PYTHONPATH"] = str(ROOT / "python")
    with Cluster.create(3) as cluster:
        workers = []
        logs = []
        for h in cluster.hosts:
            log = open(f"/tmp/monarch-bench-worker-{h.name}.log", "wb")
            logs.append(log)
            address = f"tcp://{h.ip}:{PORT}"
            workers.append(
                h.popen(
                    [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", address],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        addresses = [f"tcp://{h.ip}:{PORT}" for h in cluster.hosts]
        client = cluster.client.popen(
            [sys.executable, "-c", CLIENT, *addresses],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None and client.stdin is not None
        result = None
        try:
            for line in client.stdout:
                if line.startswith("BREAK "):
                    _, what, victim = line.split()
                    broken_at = time.monotonic()  # one clock for every namespace
                    if what == "kill":
                        workers[int(victim)].send_signal(signal.SIGKILL)
                    else:
                        cluster.hosts[int(victim)].cut()
                    client.stdin.write(f"go {broken_at}\n")
                    client.stdin.flush()
                elif line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT ") :])
                    break
        finally:
            client.wait(60)
            for w in workers:
                if w.poll() is None:
                    w.terminate()
            for h in cluster.hosts:
                h.restore()
            for w in workers:
                try:
                    w.wait(15)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait(10)
            for log in logs:
                log.close()
    if result is None:
        print("multihost bench failed: the client gave no result")
        return 1
    result["cross_over_same_host"] = (
        result["call_one_cross_host_us"] / result["call_one_same_host_us"]
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    rows = [
        ("call_one, same host (TCP)", f"{result['call_one_same_host_us']:.1f} µs", ""),
        (
            "call_one, across hosts",
            f"{result['call_one_cross_host_us']:.1f} µs",
            f"{result['cross_over_same_host']:.2f}x same host (budget <= 1.5x)",
        ),
        ("call() to 3 x 4 procs", f"{result['call_3x4_us']:.1f} µs", ""),
        ("spawn 3 x 4 procs across hosts", f"{result['spawn_3x4_s']:.2f} s", ""),
        ("spawn 64 procs on one host", f"{result['spawn_64_one_host_s']:.2f} s", "budget <= 1 s"),
        ("host SIGKILL detected", f"{result['detect_kill_s']:.3f} s", "budget <= 1 s"),
        ("cut link detected", f"{result['detect_cut_s']:.3f} s", "budget <= 3 s"),
    ]
    print("| measure | ours | note |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
