"""Multi-host benchmark on one machine, this project and upstream Monarch side by side:
three hosts in network namespaces (as the multi-host tests build them), a worker in each,
a client in a fourth namespace.

Measures call_one to a proc on another host against call_one to a proc on the client's
own host (both over TCP), call() to every proc of a 3 x 4 mesh, spawning 3 x 4 procs
across hosts, spawning 64 procs on one host, and how long the client takes to see a host
fail (its worker SIGKILLed; its link cut), by its fault hook and by a call pending on the
failed host raising. The same client script runs under this project's venv and, when it
is installed (``make bench-peers``), under upstream Monarch's (``.bench/venv-upstream``,
PyPI ``torchmonarch``), each run on a fresh cluster, alternating; the table gives both,
their ratio and the budgets. Needs root; prints a table and writes JSON (``--out``).

How each side is driven (the differences are only these):

- ours: ``python -m monarch.tools.cli worker --address tcp://<host ip>:<port>`` in each
  host namespace, ``MONARCH_CLUSTER_SECRET`` set; the client does
  ``enable_transport("tcp")`` and ``attach_to_workers(workers=[...], ca=None)``.
- upstream: ``run_worker_loop_forever(address="tcp://<host ip>:<port>",
  ca="trust_all_connections")`` in each host namespace (upstream implements only
  ``trust_all_connections``); the client does
  ``enable_transport("tcp://<client ip>:0")`` and
  ``attach_to_workers(workers=[...], ca="trust_all_connections")``. Upstream's
  ``enable_transport("tcp")`` (``ChannelTransport.TcpWithHostname``) binds the address the
  machine's hostname resolves to; the namespaces share the hostname, and here it resolves
  to 127.0.0.1 only, so upstream panics ("hostname resolved to no non-loopback,
  non-link-local address; configure an explicit transport address"). The explicit
  address is the one upstream asks for.

Every wait has a timeout: a failure is looked for for at most ``--detect-cap`` seconds
(20) and is otherwise reported as not detected; a run has ``--run-timeout`` seconds (300).
A side that cannot run, or a run that fails, is reported with its reason, never made up.
Worker and client process groups are killed after each run and the cluster (namespaces,
bridge, whatever still runs inside) is destroyed.

Usage: ``sudo .venv/bin/python benches/multihost_bench.py [--reps N] [--impls
ours,upstream] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from bench_common import (  # noqa: E402
    NotedCells,
    loadavg,
    machine_line,
    print_rows,
    processes_with_env,
    run_outcome,
    save_results,
    settle,
)
from tests.multihost.netns import Cluster, Host, available, cleanup_stale  # noqa: E402

PORT = 26600
SECRET = "multihost-bench"
MARKER = "MONARCH_MULTIHOST_BENCH_RUN"

# One client script for both implementations; argv: impl, the client's IP, the workers'
# addresses, the failure-detection cap (s). It prints "METRIC {key, value}" and
# "ERROR {key, error}" lines as it goes (so a run that hangs later still leaves what it
# measured), "BREAK kill|cut <host>" when the driver must break a host (and then reads
# "go <monotonic time it broke it>"), and "DONE" at the end.
CLIENT = r"""
import json, os, statistics, sys, threading, time

impl, client_ip, cap = sys.argv[1], sys.argv[2], float(sys.argv[3])
workers = sys.argv[4:]

def emit(kind, payload):
    print(kind + " " + json.dumps(payload), flush=True)

def record(key, value):
    emit("METRIC", {"key": key, "value": value})

def fail(key, e):
    emit("ERROR", {"key": key, "error": (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]})

failures = []
try:
    import monarch.actor
    from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, x: int) -> int:
            return x

        @endpoint
        def nap(self, seconds: float) -> None:
            time.sleep(seconds)

    def on_fault(failure):
        failures.append(time.monotonic())
        text = (str(failure).strip().splitlines() or ["?"])[0][:300]
        print("fault hook at %.3f: %s" % (time.monotonic(), text), file=sys.stderr, flush=True)

    monarch.actor.unhandled_fault_hook = on_fault
    if impl == "upstream":
        enable_transport("tcp://" + client_ip + ":0")
        hosts = attach_to_workers(workers=workers, ca="trust_all_connections")
    else:
        enable_transport("tcp")
        hosts = attach_to_workers(workers=workers, ca=None)
    t = time.perf_counter()
    hosts.initialized.get(timeout=60)
    record("attach_s", time.perf_counter() - t)
except BaseException as e:
    fail("setup", e)
    print("DONE", flush=True)
    os._exit(1)

def timed(mesh, n):
    samples = []
    for i in range(n):
        t = time.perf_counter()
        mesh.echo.call_one(i).get(timeout=60)
        samples.append(time.perf_counter() - t)
    return samples

# call_one to a proc on the client's host and on another host, interleaved in blocks so
# that a burst of noise on this shared machine hits both alike.
try:
    local = this_host().spawn_procs(per_host={"gpus": 1}).spawn("local", Echo)
    local.echo.call_one(0).get(timeout=120)
except BaseException as e:
    local = None
    fail("call_one_same_host_us", e)
try:
    remote = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("remote", Echo)
    remote.echo.call_one(0).get(timeout=120)
except BaseException as e:
    remote = None
    fail("call_one_cross_host_us", e)
pairs = [(k, m, []) for k, m in (("same", local), ("cross", remote)) if m is not None]
try:
    for _, m, _s in pairs:
        timed(m, 100)
    for block in range(4):
        for _, m, s in pairs[:: 1 if block % 2 == 0 else -1]:
            s.extend(timed(m, 500))
    for k, _, s in pairs:
        record("call_one_" + k + "_host_us", statistics.median(s) * 1e6)
except BaseException as e:
    for k, _, _s in pairs:
        fail("call_one_" + k + "_host_us", e)

grid = None
try:
    t = time.perf_counter()
    procs = hosts.spawn_procs(per_host={"gpus": 4}, name="grid")
    procs.initialized.get(timeout=120)
    record("spawn_3x4_ready_s", time.perf_counter() - t)
    grid = procs.spawn("grid", Echo)
    grid.echo.call(0).get(timeout=120)
    record("spawn_3x4_s", time.perf_counter() - t)
except BaseException as e:
    fail("spawn_3x4_s", e)
if grid is not None:
    try:
        for i in range(20):
            grid.echo.call(i).get(timeout=60)
        samples = []
        for i in range(200):
            t = time.perf_counter()
            grid.echo.call(i).get(timeout=60)
            samples.append(time.perf_counter() - t)
        record("call_3x4_us", statistics.median(samples) * 1e6)
    except BaseException as e:
        fail("call_3x4_us", e)

try:
    t = time.perf_counter()
    big = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 64}, name="big")
    big.initialized.get(timeout=180)
    record("spawn_64_one_host_ready_s", time.perf_counter() - t)
    bigm = big.spawn("big", Echo)
    bigm.echo.call(0).get(timeout=180)
    record("spawn_64_one_host_s", time.perf_counter() - t)
    big.stop().get(timeout=60)
except BaseException as e:
    fail("spawn_64_one_host_s", e)

# Failure detection: a nap() call is pending on the victim host's procs; the driver
# breaks the host and says when; the client waits (at most `cap` s) for its fault hook
# and for the pending call to raise.
for what, victim in (("kill", 2), ("crash", 1), ("cut", 0)):
    if grid is None:
        fail("detect_" + what + "_s", RuntimeError("no 3 x 4 mesh to break"))
        continue
    try:
        pending = grid.slice(hosts=victim).nap.call(cap + 60)
        time.sleep(0.2)  # the call reaches the procs
        raised = []

        def watch(fut=pending, out=raised):
            try:
                fut.get(timeout=cap + 5)
                out.append(("returned", time.monotonic()))
            except TimeoutError:
                pass
            except BaseException as e:
                out.append((type(e).__name__, time.monotonic()))

        failures.clear()
        print("BREAK " + what + " " + str(victim), flush=True)
        t0 = float(sys.stdin.readline().split()[1])  # when the driver broke the host
        print("broke host %d (%s) at %.3f" % (victim, what, t0), file=sys.stderr, flush=True)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = t0 + cap
        while not (failures and raised) and time.monotonic() < deadline:
            time.sleep(0.001)
        hook = failures[0] - t0 if failures else None
        call = raised[0][1] - t0 if raised and raised[0][1] <= deadline else None
        record("detect_" + what + "_s", hook)
        record("detect_" + what + "_call_s", call)
        if raised:
            print(
                "pending call on host %d ended at %.3f: %s" % (victim, raised[0][1], raised[0][0]),
                file=sys.stderr,
                flush=True,
            )
            record("detect_" + what + "_call_outcome", raised[0][0])
        if raised and raised[0][0] == "returned":
            fail("detect_" + what + "_call_s", RuntimeError("the pending call returned"))
    except BaseException as e:
        fail("detect_" + what + "_s", e)
print("DONE", flush=True)
os._exit(0)
"""

# Upstream's worker: its documented entry point, nothing else.
UPSTREAM_WORKER = (
    "import sys\n"
    "from monarch.actor import run_worker_loop_forever\n"
    'run_worker_loop_forever(address=sys.argv[1], ca="trust_all_connections")\n'
)

# The table: key, name, unit, budget (None, or (bound, kind): "ratio-max" = ours/upstream
# at most bound; "abs-max" = ours at most bound, in the unit; "rel-max" = ours over ours'
# same-host call_one at most bound).
ROWS = [
    ("call_one_same_host_us", "call_one, proc on the client's host (TCP)", "us", None),
    ("call_one_cross_host_us", "call_one, proc on another host", "us", (0.25, "ratio-max")),
    ("cross_over_same_host", "call_one across hosts / same host", "x", (1.5, "abs-max")),
    ("call_3x4_us", "call() to 3 hosts x 4 procs", "us", None),
    ("spawn_3x4_s", "spawn 3 x 4 procs -> first reply", "s", None),
    ("spawn_64_one_host_s", "spawn 64 procs on one host -> first reply", "s", (1.0, "abs-max")),
    ("detect_kill_s", "worker SIGKILLed -> fault hook", "s", (1.0, "abs-max")),
    ("detect_kill_call_s", "worker SIGKILLed -> pending call raises", "s", None),
    ("detect_crash_s", "host crash (all its processes SIGKILLed) -> fault hook", "s", None),
    ("detect_crash_call_s", "host crash -> pending call raises", "s", None),
    ("detect_cut_s", "host link cut -> fault hook", "s", (3.0, "abs-max")),
    ("detect_cut_call_s", "host link cut -> pending call raises", "s", None),
]
DETECT_KEYS = {key for key, *_ in ROWS if key.startswith("detect_")}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "us":
        return f"{value:,.0f} µs" if value >= 1000 else f"{value:.1f} µs"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.2f}{unit}"


class Side:
    """One implementation: how to start its workers and its client."""

    def __init__(self, key: str, python: Path, missing: str | None) -> None:
        self.key = key
        self.python = python
        self.missing = missing

    def env(self, run_id: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env[MARKER] = run_id
        env["PATH"] = f"{self.python.parent}:{env.get('PATH', '/usr/bin:/bin')}"
        if self.key == "ours":
            env["MONARCH_CLUSTER_SECRET"] = SECRET
            env["PYTHONPATH"] = str(ROOT / "python")
        return env

    def worker_argv(self, address: str) -> list[str]:
        if self.key == "ours":
            return [str(self.python), "-m", "monarch.tools.cli", "worker", "--address", address]
        return [str(self.python), "-c", UPSTREAM_WORKER, address]

    def version(self) -> str:
        code = (
            "import importlib.metadata as m\n"
            "for d in ('torchmonarch', 'monarch'):\n"
            "    try:\n        print(d, m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n"
            "else:\n    print('version unknown')\n"
        )
        try:
            done = subprocess.run(
                [str(self.python), "-c", code],
                capture_output=True,
                text=True,
                timeout=60,
                env=self.env("version"),
            )
            return (done.stdout.strip() or done.stderr.strip()[-200:]) or "version unknown"
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"version unknown ({e})"


def make_sides(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Side]:
    """The sides named by ``--impls`` (``ours``, ``upstream``), each with the reason it
    cannot run when its python is missing."""
    sides = []
    for key in args.impls.split(","):
        if key == "ours":
            py = Path(args.ours_python)
        elif key == "upstream":
            py = Path(args.upstream_venv) / "bin" / "python"
        else:
            parser.error(f"unknown side {key!r} (ours, upstream)")
        missing = None if py.exists() else f"not installed: {py} is missing (`make bench-peers`)"
        sides.append(Side(key, py, missing))
    return sides


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # each was started in a session (group) of its own
    except OSError:
        pass


def start_workers(
    hosts: list[Host],
    side: Side,
    env: dict[str, str],
    log_paths: list[Path],
    files: list[IO[bytes]],
) -> list[subprocess.Popen[bytes]]:
    """A worker of ``side`` on each namespace host, listening on ``PORT`` of its address,
    in a session of its own, writing to its log (the opened logs go into ``files``)."""
    workers: list[subprocess.Popen[bytes]] = []
    for h, log_path in zip(hosts, log_paths, strict=True):
        log = open(log_path, "wb")
        files.append(log)
        workers.append(
            h.popen(
                side.worker_argv(f"tcp://{h.ip}:{PORT}"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return workers


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker's group, SIGKILL it where the worker is not gone within 10 s,
    then SIGKILL the group anyway (procs the worker left in it)."""
    for w in workers:
        _kill_group(w, signal.SIGTERM)
    for w in workers:
        try:
            w.wait(10)
        except subprocess.TimeoutExpired:
            _kill_group(w, signal.SIGKILL)
            w.wait(10)
    for w in workers:
        _kill_group(w, signal.SIGKILL)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    # The most telling line: the last exception or panic message, else the last line.
    for ln in reversed(lines):
        if "Error" in ln or "panicked" in ln or "Exception" in ln:
            return ln.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def run_once(side: Side, rep: int, args: argparse.Namespace, logs: Path) -> dict:
    """One run of one side on a fresh cluster: its metrics, errors and how it went."""
    run_id = uuid.uuid4().hex
    env = side.env(run_id)
    metrics: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    status = "ok"
    busy = settle()
    load = loadavg()
    t_start = time.perf_counter()
    workers: list[subprocess.Popen] = []
    client: subprocess.Popen | None = None
    worker_logs = [logs / f"{side.key}-{rep}-worker-h{i}.log" for i in range(3)]
    client_log = logs / f"{side.key}-{rep}-client.log"
    files: list[IO[bytes]] = []
    leftovers: list[str] = []
    cluster = Cluster.create(3)
    try:
        workers += start_workers(cluster.hosts, side, env, worker_logs, files)
        addresses = [f"tcp://{h.ip}:{PORT}" for h in cluster.hosts]
        err = open(client_log, "wb")
        files.append(err)
        client = cluster.client.popen(
            [
                str(side.python),
                "-c",
                CLIENT,
                side.key,
                cluster.client.ip,
                str(args.detect_cap),
                *addresses,
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        assert client.stdout is not None and client.stdin is not None
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream=client.stdout) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + args.run_timeout
        done = False
        killed_host = None
        while not done:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                status = f"run timed out after {args.run_timeout} s"
                break
            if line is None:
                rc = client.wait(10)
                if rc != 0 or "setup" in errors:
                    status = f"client exited (rc {rc})"
                break
            kind, _, rest = line.strip().partition(" ")
            if kind == "METRIC":
                m = json.loads(rest)
                metrics[m["key"]] = m["value"]
            elif kind == "ERROR":
                e = json.loads(rest)
                errors[e["key"]] = e["error"]
            elif kind in ("BREAK", "DONE") and killed_host is not None:
                # What still runs on the host whose worker was killed, once the client
                # has finished looking for the failure.
                metrics["processes_left_on_host_after_worker_kill"] = len(
                    cluster.pids_in(killed_host)
                )
                killed_host = None
            if kind == "BREAK":
                what, victim = rest.split()
                host = cluster.hosts[int(victim)]
                doomed = cluster.pids_in(host) if what == "crash" else []
                broken_at = time.monotonic()  # one clock for every namespace
                if what == "kill":  # the worker process alone
                    workers[int(victim)].send_signal(signal.SIGKILL)
                    killed_host = host
                elif what == "crash":  # everything running on the host
                    for pid in doomed:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                else:
                    host.cut()
                client.stdin.write(f"go {broken_at}\n")
                client.stdin.flush()
            elif kind == "DONE":
                done = True
    finally:
        if client is not None:
            try:
                client.wait(15)
            except subprocess.TimeoutExpired:
                _kill_group(client, signal.SIGKILL)
                client.wait(10)
        for h in cluster.hosts:
            h.restore()
        stop_workers(workers)
        time.sleep(0.3)
        leftovers = [f"{p.pid} {p.cmdline[:80]}" for p in cluster.destroy()]
        for pid in processes_with_env(MARKER, run_id):  # anything that left the netns
            try:
                os.kill(pid, signal.SIGKILL)
                leftovers.append(str(pid))
            except OSError:
                pass
        for f in files:
            f.close()
    if "setup" in errors:
        status = f"failed ({errors['setup']})"
    elif status != "ok":
        tail = _last_line(client_log)
        status += f": {tail}" if tail else ""
    same, cross = metrics.get("call_one_same_host_us"), metrics.get("call_one_cross_host_us")
    if same and cross:
        metrics["cross_over_same_host"] = cross / same
    return {
        "rep": rep,
        "status": status,
        "metrics": metrics,
        "errors": errors,
        "wall_s": time.perf_counter() - t_start,
        "cpu_busy_before_run": busy,
        "loadavg_before_run": load,
        "leftover_processes_killed": leftovers,
        "client_log": str(client_log),
        "worker_logs": [str(p) for p in worker_logs],
    }


def aggregate(side: Side, runs: list[dict], cap: float) -> dict[str, dict]:
    """Median over the runs of every metric, or why there is none."""
    agg: dict[str, dict] = {}
    for key, *_ in ROWS:
        values, reasons = [], []
        for run in runs:
            m = run["metrics"]
            if key in m and m[key] is not None:
                values.append(m[key])
            elif key in m and key in DETECT_KEYS:
                reasons.append(f"not detected within {cap:g} s")
            elif key in run["errors"]:
                reasons.append(run["errors"][key])
            elif run["status"] != "ok":
                reasons.append(run["status"])
            else:
                reasons.append("not measured")
        if values and len(values) * 2 > len(runs):
            agg[key] = {"value": statistics.median(values), "values": values}
        elif side.missing:
            agg[key] = {"value": None, "error": side.missing}
        else:
            agg[key] = {
                "value": None,
                "values": values,
                "error": reasons[0] if reasons else "not run",
            }
    return agg


def budget_cells(key: str, budget, ours, upstream) -> tuple[str, str]:
    if budget is None:
        return "", ""
    bound, kind = budget
    if kind == "ratio-max":
        text = f"ours/upstream <= {bound:g}"
        if ours is None or not upstream:
            return text, "n/a"
        return text, "met" if ours / upstream <= bound else "NOT MET"
    unit = "x" if key == "cross_over_same_host" else " s"
    text = f"ours <= {bound:g}{unit}"
    if ours is None:
        return text, "n/a"
    return text, "met" if ours <= bound else "NOT MET"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "multihost.json"))
    parser.add_argument("--reps", type=int, default=1, help="runs per side (default 1)")
    parser.add_argument("--impls", default="ours,upstream", help="which sides, in order")
    parser.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--upstream-venv", default=str(ROOT / ".bench" / "venv-upstream"))
    parser.add_argument(
        "--detect-cap", type=float, default=20.0, help="seconds to wait for a failure (20)"
    )
    parser.add_argument(
        "--run-timeout", type=int, default=300, help="seconds one run may take (300)"
    )
    args = parser.parse_args()
    ok, reason = available()
    if not ok:
        print(f"multihost bench skipped: {reason}")
        return 0
    cleanup_stale()
    out = Path(args.out)
    logs = out.parent / "multihost-logs"
    logs.mkdir(parents=True, exist_ok=True)

    sides = make_sides(parser, args)
    versions = {s.key: s.missing or s.version() for s in sides}

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    runs: dict[str, list[dict]] = {s.key: [] for s in sides}
    active = [s for s in sides if not s.missing]
    for rep in range(args.reps):
        shift = rep % max(len(active), 1)
        for side in active[shift:] + active[:shift]:
            print(f"rep {rep + 1}/{args.reps}: {side.key} ...", end=" ", flush=True)
            result = run_once(side, rep, args, logs)
            runs[side.key].append(result)
            print(run_outcome(result), flush=True)
        active = [s for s in active if "timed out" not in runs[s.key][-1]["status"]]
    elapsed = time.perf_counter() - t_start

    aggs = {s.key: aggregate(s, runs[s.key], args.detect_cap) for s in sides}
    for s in sides:  # a side none of whose runs went through: say why, once
        if not s.missing and runs[s.key] and all(r["status"] != "ok" for r in runs[s.key]):
            s.missing = runs[s.key][0]["status"]
    cell = NotedCells(aggs, as_is=lambda err: err.startswith("not detected"))
    notes = cell.notes

    rows = [("metric", "ours", "upstream", "ours/upstream", "budget", "met")]
    for key, name, unit, budget in ROWS:
        o = aggs.get("ours", {}).get(key, {}).get("value")
        u = aggs.get("upstream", {}).get(key, {}).get("value")
        if o is not None and u:
            ratio = f"{o / u:.2f}" if o / u >= 0.1 else f"{o / u:.2g}"
        elif o is not None and key in DETECT_KEYS and "upstream" in aggs:
            err = aggs["upstream"][key].get("error", "")
            ratio = f"< {o / args.detect_cap:.2g}" if err.startswith("not detected") else "-"
        else:
            ratio = "-"
        text, met = budget_cells(key, budget, o, u)
        rows.append((name, cell(key, unit, "ours"), cell(key, unit, "upstream"), ratio, text, met))

    machine = machine_line()
    print(f"\nmulti-host, namespace hosts ({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)")
    print(machine)
    for s in sides:
        done = sum(1 for r in runs[s.key] if r["status"] == "ok")
        state = s.missing if s.missing else f"{done}/{len(runs[s.key])} runs completed"
        print(f"  {s.key}: {versions[s.key]}; {state}")
    print(f"median of {args.reps} run(s) per side; ratio = ours / upstream\n")
    print_rows(rows)
    for k, note in enumerate(notes, 1):
        print(f"[{k}] {note}")
    left = {
        s.key: [r["metrics"].get("processes_left_on_host_after_worker_kill") for r in runs[s.key]]
        for s in sides
        if any("processes_left_on_host_after_worker_kill" in r["metrics"] for r in runs[s.key])
    }
    if left:
        print(
            "processes still running on the host whose worker was SIGKILLed, once the client "
            "stopped looking: " + ", ".join(f"{k} {v}" for k, v in left.items())
        )
    up = next((s for s in sides if s.key == "upstream"), None)
    if up is not None and up.missing:
        failed = runs["upstream"] and not up.missing.startswith("failed")
        print(f"upstream: failed ({up.missing})" if failed else f"upstream: {up.missing}")

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine,
        "reps": args.reps,
        "detect_cap_s": args.detect_cap,
        "versions": versions,
        "median": aggs,
        "runs": runs,
        "table": rows,
        "notes": notes,
    }
    return save_results(out, logs, result, runs.get("ours", []))


if __name__ == "__main__":
    sys.exit(main())
