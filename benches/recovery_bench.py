"""Recovery from a lost host: ``monarch.recovery`` against ``torchrun --max-restarts``
with a checkpoint every step, the same data-parallel training on the same simulated
hosts, side by side in one run.

Each run has four hosts in network namespaces (as the multi-host tests build them), a
fresh cluster per run, and trains ``benches/recovery_workload.py``: an MLP of 1.3 M
parameters, 3 data-parallel ranks on hosts 0-2 with gradients averaged over gloo, SGD
with momentum, each rank's batch a function of (step, rank) only. Host 3 is the spare.
Once the spare is ready the bench lets training start; when step ``--kill-after``
completes it SIGKILLs every process on host 1 (what a host crash does). It measures the
time from the kill to the first step completed after the recovery, and the steps lost:
steps completed before the kill that were computed again (beyond the one in flight).

- **ours**: ``monarch worker`` on each host; the client (client namespace) runs
  ``ElasticTrainer(Trainer, hosts, 3, spares=1)``, whose warm spare sits on host 3. The
  lost replica is replaced by the spare, a survivor's state is copied to it with
  ``monarch.rdma``, the step in flight is computed again. No checkpoint is written.
- **torchrun**: ``python -m torch.distributed.run`` on each host: ``--nnodes=3:3
  --nproc-per-node=1 --max-restarts=3 --monitor-interval=0.1 --rdzv-backend=c10d
  --rdzv-endpoint=<host 0>:29400`` and ``--local-addr=<the host's address>``, with
  ``--rdzv-conf is_host=<1 on host 0>,keep_alive_interval=1,keep_alive_max_attempt=5``;
  host 3's agent starts after the first rendezvous and waits in the redundancy list
  (max nodes reached) for the next round. Rank 0 saves model, optimizer and step after
  every step; a (re)started worker loads the checkpoint. When host 1 dies the surviving
  workers' allreduce fails, their agents restart the worker group, the rendezvous forms
  a new round with the spare, and three new workers import torch, join a new process
  group and load the checkpoint.

torchrun's settings are its fastest sane ones here: a 0.1 s monitor interval (its
default in this torch), and the dead node's rendezvous keep-alive expiring after 5 s
instead of 15 s (1 s x 5 attempts; the default is 5 s x 3), so that the survivors'
re-rendezvous does not wait on it (with 1 s x 2, live agents whose keep-alives ran late
on this busy machine were dropped too, and the agents restarted their workers over and
over). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with the
shared store a spare that joins a later round waits forever for ``MASTER_ADDR``, which
rank 0 only publishes in the first round. ``GLOO_SOCKET_IFNAME=eth0``: the namespaces'
hostname resolves to 127.0.0.1, which torch's gloo would bind otherwise (ours binds the
address that routes to its controller). Both sides: ``OMP_NUM_THREADS=1`` (3 ranks on
this machine's cores).

Needs root (network namespaces); without, it prints why and exits 0. Prints the table
(median, min and max over ``--reps`` runs per side, alternating which side goes first)
and writes JSON (``--out``, default ``.bench/results/recovery.json``).

Usage: ``sudo .venv/bin/python benches/recovery_bench.py [--reps 3] [--out FILE]``;
``make bench-recovery``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from bench_common import (  # noqa: E402
    loadavg,
    machine_line,
    print_rows,
    processes_with_env,
    save_results,
    settle,
)
from multihost_bench import PORT, Side, start_workers, stop_workers  # noqa: E402
from tests.multihost.netns import Cluster, Host, available, cleanup_stale  # noqa: E402

WORKLOAD = ROOT / "benches" / "recovery_workload.py"
MARKER = "MONARCH_RECOVERY_BENCH_RUN"
#: The c10d rendezvous port on host 0.
RDZV_PORT = 29400
#: The host that is killed, and the spare host.
VICTIM, SPARE = 1, 3
SIDES = ("ours", "torchrun")
#: The line of a torchrun agent's report of a completed rendezvous that gives its rank.
RDZV_DONE = re.compile(r"\]\s+group_rank=\d+$")
#: The target: ours resumes in at most this share of torchrun's time.
TARGET_RATIO = 0.2


class Run:
    """The output lines of a run's processes, each with the time it was read, in one
    queue (a thread per stream), and what the bench did when."""

    def __init__(self, log: Path) -> None:
        self.lines: queue.Queue[tuple[str, str | None, float]] = queue.Queue()
        self.log = open(log, "w")
        self.open = 0

    def follow(self, tag: str, stream: IO[str]) -> None:
        self.open += 1

        def pump() -> None:
            for line in stream:
                self.lines.put((tag, line.rstrip("\n"), time.monotonic()))
            self.lines.put((tag, None, time.monotonic()))

        threading.Thread(target=pump, daemon=True).start()

    def next(self, deadline: float) -> tuple[str, str | None, float]:
        tag, line, at = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line is not None:
            self.log.write(f"{at:.3f} {tag}: {line}\n")
        else:
            self.open -= 1
        return tag, line, at

    def note(self, text: str) -> None:
        self.log.write(f"{time.monotonic():.3f} bench: {text}\n")
        self.log.flush()


def _kill_host(cluster: Cluster, host: Host) -> tuple[float, int]:
    """SIGKILL every process in ``host``'s namespace: when, and how many."""
    pids = cluster.pids_in(host)
    at = time.monotonic()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return at, len(pids)


def _kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass


def _env(run_id: str) -> dict[str, str]:
    env = Side("ours", Path(sys.executable), None).env(run_id)
    env[MARKER] = run_id
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _torchrun_argv(cluster: Cluster, i: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    conf = f"is_host={1 if i == 0 else 0},keep_alive_interval=1,keep_alive_max_attempt=5"
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=3:3",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cluster.hosts[0].ip}:{RDZV_PORT}",
        f"--rdzv-id=bench{os.getpid()}",
        f"--rdzv-conf={conf}",
        f"--local-addr={cluster.hosts[i].ip}",
        "--max-restarts=3",
        f"--monitor-interval={args.monitor_interval}",
        str(WORKLOAD),
        "torchrun",
        str(args.steps),
        str(run_dir),
    ]


def run_once(side: str, rep: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One run of ``side`` on a fresh cluster: its events and how it went."""
    run_id = uuid.uuid4().hex
    env = _env(run_id)
    run_dir = logs / f"{side}-{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    run = Run(run_dir / "output.log")
    busy, load = settle(), loadavg()
    t_start = time.perf_counter()
    status = "ok"
    steps: list[tuple[int, float, int]] = []  # (step, done at, generation)
    ev: dict[str, Any] = {}
    procs: list[subprocess.Popen[Any]] = []
    workers: list[subprocess.Popen[bytes]] = []
    files: list[IO[bytes]] = []
    leftovers: list[str] = []
    cluster = Cluster.create(4)
    try:
        if side == "ours":
            worker_logs = [run_dir / f"worker-h{i}.log" for i in range(4)]
            ours = Side("ours", Path(sys.executable), None)
            workers = start_workers(cluster.hosts, ours, env, worker_logs, files)
            addresses = [f"tcp://{h.ip}:{PORT}" for h in cluster.hosts]
            argv = [sys.executable, str(WORKLOAD), "ours", str(args.steps), str(run_dir)]
            client = cluster.client.popen(
                argv + addresses,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            procs.append(client)
            assert client.stdout is not None
            run.follow("client", client.stdout)
        else:
            for i in range(3):
                procs.append(_start_agent(cluster, i, args, run_dir, env, run))
        deadline = time.monotonic() + args.run_timeout
        killed_at: float | None = None
        while run.open > 0:
            try:
                tag, line, at = run.next(deadline)
            except queue.Empty:
                status = f"run timed out after {args.run_timeout} s"
                break
            if line is None:
                continue
            word, _, rest = line.partition(" ")
            if word == "READY" and side == "ours":
                ev["ready"] = at
                (run_dir / "go").touch()
            elif word == "STEP" and tag in ("client", "h0", "h1", "h2", "h3"):
                step, done, gen = rest.split()
                steps.append((int(step), float(done), int(gen)))
                if killed_at is None and int(step) >= args.kill_after:
                    killed_at, n = _kill_host(cluster, cluster.hosts[VICTIM])
                    ev["killed"], ev["killed_processes"] = killed_at, n
                    run.note(f"SIGKILLed {n} processes on host {VICTIM}")
            elif word == "STARTED" and side == "torchrun":
                parts = rest.split()
                if "spare_started" not in ev:
                    # Round 0 is complete (rank 0 joined its process group): start the
                    # spare host's agent now, so that it waits for the next round.
                    procs.append(_start_agent(cluster, SPARE, args, run_dir, env, run))
                    ev["spare_started"] = at
                if int(parts[1]) > 0 and "restarted" not in ev:
                    ev["restarted"] = float(parts[0])
                    ev["resumed_from"] = int(parts[2])
            elif side == "torchrun" and tag == f"h{SPARE}" and "redundancy list" in line:
                if "spare_ready" not in ev:
                    ev["spare_ready"] = at
                    (run_dir / "go").touch()
            elif side == "torchrun" and killed_at is not None and tag != f"h{VICTIM}":
                if "Worker group FAILED" in line and "failure_seen" not in ev:
                    ev["failure_seen"] = at
                elif RDZV_DONE.search(line) and "rendezvous" not in ev:
                    ev["rendezvous"] = at
            elif word == "RECOVERY":
                ev["recovery"] = json.loads(rest)
            elif word == "UNHANDLED":
                ev["unhandled"] = json.loads(rest)
            if word == "DONE":
                ev["done"] = at
                if side == "torchrun":
                    # The other agents end once every worker did.
                    deadline = min(deadline, time.monotonic() + 60)
        if "done" not in ev and status == "ok":
            status = "the training did not finish (no DONE)"
    finally:
        run.note("cleaning up")
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                _kill_group(p)
                p.wait(10)
        stop_workers(workers)
        leftovers = [f"{p.pid} {p.cmdline[:80]}" for p in cluster.destroy()]
        for pid in processes_with_env(MARKER, run_id):
            try:
                os.kill(pid, signal.SIGKILL)
                leftovers.append(str(pid))
            except OSError:
                pass
        for f in files:
            f.close()
        run.log.close()
    metrics = _metrics(side, steps, ev, args)
    if status == "ok" and metrics.get("resume_s") is None:
        status = "no step completed after the recovery"
    return {
        "side": side,
        "rep": rep,
        "status": status,
        "metrics": metrics,
        "events": ev,
        "wall_s": time.perf_counter() - t_start,
        "cpu_busy_before_run": busy,
        "loadavg_before_run": load,
        "leftover_processes_killed": leftovers,
        "run_dir": str(run_dir),
    }


def _start_agent(
    cluster: Cluster,
    i: int,
    args: argparse.Namespace,
    run_dir: Path,
    env: dict[str, str],
    run: Run,
) -> subprocess.Popen[str]:
    """torchrun's agent on host ``i``: its output followed as ``h<i>``. The spare's
    rendezvous logs at DEBUG, where it says it joined the redundancy list."""
    env = dict(env)
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["LOGLEVEL"] = "INFO"
    if i == SPARE:
        env["TORCH_LOGS"] = "+torch.distributed.elastic.rendezvous.dynamic_rendezvous"
    agent = cluster.hosts[i].popen(
        _torchrun_argv(cluster, i, args, run_dir),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert agent.stdout is not None
    run.follow(f"h{i}", agent.stdout)
    return agent


def _metrics(
    side: str, steps: list[tuple[int, float, int]], ev: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Time to resume, steps lost, the steady step time, and the phases of torchrun's
    recovery, all from the kill."""
    m: dict[str, Any] = {}
    killed = ev.get("killed")
    before = [s for s in steps if killed is not None and s[1] < killed]
    if len(before) > 2:
        gaps = [b[1] - a[1] for a, b in itertools.pairwise(before)]
        m["step_ms"] = statistics.median(gaps) * 1e3
    after = [s for s in steps if s[2] > 0]
    if killed is None or not after:
        return m
    first = min(after, key=lambda s: s[1])
    m["resume_s"] = first[1] - killed
    m["resumed_at_step"] = first[0]
    done_before = max((s[0] for s in before), default=-1)
    # The step in flight (done_before + 1) is lost by either side; any step before it
    # computed again is a lost step.
    m["steps_lost"] = max(0, done_before + 1 - first[0])
    m["last_step_before_kill"] = done_before
    if side == "ours" and "recovery" in ev:
        m["recovery_s"] = ev["recovery"]["seconds"]
    for key in ("failure_seen", "rendezvous", "restarted"):
        if key in ev:
            m[f"{key}_s"] = ev[key] - killed
    return m


def _weights_diff(logs: Path, rep: int) -> float | None:
    """The largest difference between the two sides' final weights of repetition
    ``rep`` (both train the same steps on the same data)."""
    import torch

    paths = [logs / f"{side}-{rep}" / f"{side}-final.pt" for side in SIDES]
    if not all(p.exists() for p in paths):
        return None
    a, b = (torch.load(p) for p in paths)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _stat(values: list[float], fmt: str) -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "recovery.json"))
    parser.add_argument("--reps", type=int, default=3, help="runs per side (3)")
    parser.add_argument("--steps", type=int, default=30, help="steps per run (30)")
    parser.add_argument(
        "--kill-after", type=int, default=10, help="kill host 1 when this step is done (10)"
    )
    parser.add_argument(
        "--monitor-interval", type=float, default=0.1, help="torchrun's, in seconds (0.1)"
    )
    parser.add_argument("--run-timeout", type=int, default=400, help="seconds a run may take")
    parser.add_argument("--sides", default="ours,torchrun", help="which sides to run")
    args = parser.parse_args()
    ok, reason = available()
    if not ok:
        print(f"recovery bench skipped: {reason}")
        return 0
    cleanup_stale()
    out = Path(args.out)
    logs = out.parent / "recovery-logs"
    logs.mkdir(parents=True, exist_ok=True)
    import torch

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    diffs: list[float] = []
    chosen = [s for s in SIDES if s in args.sides.split(",")]
    for rep in range(args.reps):
        order = chosen if rep % 2 == 0 else chosen[::-1]
        for side in order:
            print(f"rep {rep + 1}/{args.reps}: {side} ...", end=" ", flush=True)
            r = run_once(side, rep, args, logs)
            runs[side].append(r)
            m = r["metrics"]
            if r["status"] == "ok":
                print(
                    f"resumed {m['resume_s']:.2f} s after the kill, "
                    f"{m['steps_lost']} step(s) lost ({r['wall_s']:.0f} s)",
                    flush=True,
                )
            else:
                print(f"{r['status']} ({r['wall_s']:.0f} s; see {r['run_dir']})", flush=True)
        diff = _weights_diff(logs, rep)
        if diff is not None:
            diffs.append(diff)
        for side in SIDES:  # checkpoints and final weights: 10 MiB each
            for pt in (logs / f"{side}-{rep}").glob("*.pt*"):
                pt.unlink()
    elapsed = time.perf_counter() - t_start

    def values(side: str, key: str) -> list[float]:
        return [
            r["metrics"][key]
            for r in runs[side]
            if r["status"] == "ok" and r["metrics"].get(key) is not None
        ]

    med = {s: {k: values(s, k) for k in ("resume_s", "steps_lost", "step_ms")} for s in SIDES}
    o, t = values("ours", "resume_s"), values("torchrun", "resume_s")
    ratio = statistics.median(o) / statistics.median(t) if o and t else None
    rows = [("metric", "ours", "torchrun --max-restarts", "ours / torchrun")]
    rows.append(
        (
            "host SIGKILLed -> first step after recovery",
            _stat(o, "{:.2f} s"),
            _stat(t, "{:.2f} s"),
            f"{ratio:.3f}" if ratio is not None else "-",
        )
    )
    rows.append(
        (
            "steps lost (beyond the one in flight), each run",
            ", ".join(f"{v:.0f}" for v in values("ours", "steps_lost")) or "n/a",
            ", ".join(f"{v:.0f}" for v in values("torchrun", "steps_lost")) or "n/a",
            "",
        )
    )
    so, st = values("ours", "step_ms"), values("torchrun", "step_ms")
    rows.append(
        (
            "step time before the kill",
            _stat(so, "{:.0f} ms"),
            _stat(st, "{:.0f} ms") + " (checkpoint every step)",
            f"{statistics.median(so) / statistics.median(st):.2f}" if so and st else "-",
        )
    )
    phases = [
        ("  ours: failure seen -> new group ready", "ours", "recovery_s"),
        ("  torchrun: kill -> agent sees the worker group fail", "torchrun", "failure_seen_s"),
        ("  torchrun: kill -> new rendezvous round complete", "torchrun", "rendezvous_s"),
        ("  torchrun: kill -> new workers loaded the checkpoint", "torchrun", "restarted_s"),
    ]
    for name, side, key in phases:
        cells = ["", ""]
        cells[SIDES.index(side)] = _stat(values(side, key), "{:.2f} s")
        rows.append((name, cells[0], cells[1], ""))

    machine = machine_line()
    print(
        f"\nrecovery from a lost host, ours vs torchrun --max-restarts "
        f"({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)"
    )
    print(machine)
    print(
        f"4 network-namespace hosts: 3 ranks + 1 spare; {args.steps} steps, host {VICTIM} "
        f"SIGKILLed once step {args.kill_after} is done; torch {torch.__version__}; "
        f"torchrun --monitor-interval={args.monitor_interval:g}"
    )
    for side in SIDES:
        done = sum(1 for r in runs[side] if r["status"] == "ok")
        print(f"  {side}: {done}/{len(runs[side])} runs completed")
        for r in runs[side]:
            if r["status"] != "ok":
                print(f"    rep {r['rep'] + 1}: {r['status']}")
    print(f"median (min-max) of {args.reps} run(s) per side\n")
    print_rows(rows)
    if ratio is not None:
        met = "met" if ratio <= TARGET_RATIO else "NOT MET"
        print(f"\ntarget: ours / torchrun <= {TARGET_RATIO:g} in time to resume: {met}")
    if diffs:
        print(
            f"\nfinal weights, ours vs torchrun: largest difference {max(diffs):.1e} "
            "(the same training)"
        )
    left = {s: [x for r in runs[s] for x in r["leftover_processes_killed"]] for s in SIDES}
    if any(left.values()):
        print(f"processes left at the end of a run (killed): {left}")

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine,
        "reps": args.reps,
        "params": {
            "steps": args.steps,
            "kill_after": args.kill_after,
            "monitor_interval": args.monitor_interval,
            "torch": torch.__version__,
        },
        "median": {
            s: {k: statistics.median(v) if v else None for k, v in med[s].items()} for s in SIDES
        },
        "ratio_resume_ours_over_torchrun": ratio,
        "target_ratio": TARGET_RATIO,
        "weights_diff": diffs,
        "runs": runs,
        "table": rows,
    }
    return save_results(out, logs, result, runs["ours"])


if __name__ == "__main__":
    sys.exit(main())
