"""Data-parallel training with distributed tensors: gradient reductions overlapped with
the backward pass (on a comms stream) against reductions on the main stream.

What it measures: ``examples/ddp_tensors.py``'s training (an MLP replicated on a mesh of
4 procs of this host, ``this_host().spawn_procs(per_host={"gpus": 4})``, CPU tensors,
each rank on its own shard of the batch, the gradients averaged with
``reduce_("gpus", "avg")`` as ``monarch.grad_generator`` yields them, then SGD), in its
two versions, in the same run, on the same mesh:

- **overlapped**: each gradient is borrowed onto ``monarch.Stream("comms")`` and
  reduced there while the main stream goes on with the backward pass;
- **main stream**: the same reductions in line with the backward pass.

Each version has its own replica of the model, warmed up (``--warmup`` steps, which
also make the process groups) before timing. Then, ``--reps`` times, alternating which
version goes first, each runs ``--steps`` steps and one fetch of the last loss (which
waits for the steps to end); the time per step is that over ``--steps``. The table
gives the median (and the range) over the repetitions, the time the client spent
recording the steps (before the fetch), and the ratio overlapped / main stream (under
1: the overlap wins). A third replica, timed after both in each repetition, runs the
same steps without the reductions: the difference between it and the main-stream
version is the reductions' cost, the most an overlap could hide. Last, the losses of
the two versions are checked against the same training in one process (plain torch,
the whole batch): both must match.

``--network RATE`` runs the same measurement with one proc on each of 4 simulated hosts
instead (network namespaces, as the multi-host tests build them; needs root, else it
says why and skips): each host's interface sends at most RATE (a ``tc`` token bucket,
e.g. ``1gbit``), a worker agent (``monarch worker``) runs in each host and this script
runs again as the client in the cluster's client namespace, reducing over ``"hosts"``
with gloo over TCP. There the reductions wait on the links, not on the processors, as
between the machines of a cluster; on one host of 2 cores they compete with the
computation for the same cores.

Usage: ``.venv/bin/python benches/ddp_tensors_bench.py [--reps N] [--steps N] [--quick]
[--network RATE] [--out FILE]``; ``make bench-ddp`` (also part of ``make bench``) runs it
on this host and with ``--network $(BENCH_DDP_NETWORK)``. Writes JSON (default
``.bench/results/ddp_tensors.json``, ``ddp_tensors_network.json`` with ``--network``);
prints one JSON line per timed run as it goes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

from bench_common import loadavg, machine_line, print_rows, save_results  # noqa: E402

#: Procs of the mesh (data-parallel ranks).
PROCS = 4
#: The longest a spawn or a fetch may take.
CALL_TIMEOUT_S = 120.0
#: The largest difference allowed between a distributed loss and the one-process one.
LOSS_TOLERANCE = 1e-3
MODES = ("main", "overlapped")
#: Timed beside them, outside the ratio: the same steps without the reductions.
COMPUTE = "compute only"


def _load_example() -> ModuleType:
    path = ROOT / "examples" / "ddp_tensors.py"
    spec = importlib.util.spec_from_file_location("ddp_tensors_example", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _timed(
    replica: Any, comms: Any, start: int, steps: int, reduce: bool = True
) -> tuple[float, float]:
    """Seconds per step of ``steps`` steps, wall and recording only."""
    import monarch

    t0 = time.perf_counter()
    for i in range(start, start + steps):
        replica.step(i, comms, reduce)
    t1 = time.perf_counter()
    monarch.fetch_shard(replica.losses[-1]).get(timeout=CALL_TIMEOUT_S)
    t2 = time.perf_counter()
    return (t2 - t0) / steps, (t1 - t0) / steps


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="JSON results (.bench/results/...)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per version (5)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed run (10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width (1024)")
    parser.add_argument("--layers", type=int, default=4, help="linear layers (4)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank (64)")
    parser.add_argument("--quick", action="store_true", help="a small model, 2 short runs")
    parser.add_argument(
        "--network",
        metavar="RATE",
        help="one proc on each of 4 simulated hosts (network namespaces, needs root), "
        "each host's link limited to RATE (tc tbf, e.g. 1gbit, 500mbit)",
    )
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds (--network)")
    # Internal: the client of --network, run in the cluster's client namespace.
    parser.add_argument("--attach", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup, args.hidden, args.batch = 2, 3, 1, 64, 16
    if args.out is None:
        name = "ddp_tensors_network.json" if args.network else "ddp_tensors.json"
        args.out = str(ROOT / ".bench" / "results" / name)
    return args


def _config(ex: ModuleType, args: argparse.Namespace) -> Any:
    return ex.Config(
        in_dim=256,
        hidden=args.hidden,
        out_dim=16,
        layers=args.layers,
        batch_per_rank=args.batch,
        lr=0.01,
    )


def _measure(
    ex: ModuleType, cfg: Any, mesh: Any, dim: str, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Both versions and the compute-only replica on ``mesh`` (data-parallel over
    ``dim``): the timed runs, the loss check against one process, and the status."""
    runs: list[dict[str, Any]] = []
    check: dict[str, Any] = {}
    status = "ok"
    try:
        every = (*MODES, COMPUTE)
        replicas = {m: ex.Replica(mesh, cfg, dim) for m in every}
        streams = {"main": None, "overlapped": ex.comms_stream(), COMPUTE: None}
        done = {m: 0 for m in every}
        for m in every:
            _timed(replicas[m], streams[m], 0, args.warmup, m != COMPUTE)
            done[m] = args.warmup
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for m in (*order, COMPUTE):
                wall, rec = _timed(replicas[m], streams[m], done[m], args.steps, m != COMPUTE)
                done[m] += args.steps
                run = {
                    "rep": rep,
                    "mode": m,
                    "step_ms": wall * 1e3,
                    "record_ms": rec * 1e3,
                    "loadavg": loadavg(),
                }
                runs.append(run)
                print(json.dumps(run), flush=True)
        want = ex.train_reference(cfg, PROCS, done["main"])
        for m in MODES:
            got = replicas[m].fetch_losses()
            worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
            check[m] = {"steps": len(got), "max_loss_diff": worst}
            if worst > LOSS_TOLERANCE:
                status = f"{m}: losses differ from one process by {worst:.2e}"
    except Exception as e:
        status = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"failed: {status}", flush=True)
    return runs, check, status


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.network and not args.attach:
        return _drive_cluster(args, argv if argv is not None else sys.argv[1:])
    # torch first: the procs fork from a template process that has then imported it.
    import torch

    from monarch.actor import attach_to_workers, enable_transport, this_host

    ex = _load_example()
    cfg = _config(ex, args)
    n_params = sum(p.numel() for p in ex.make_model(cfg).parameters())
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    if args.attach:
        # One proc on each simulated host: the reductions cross the shaped links.
        enable_transport("tcp")
        hosts = attach_to_workers(workers=args.attach.split(","), ca=None)
        mesh, dim = hosts.spawn_procs(per_host={"gpus": 1}), "hosts"
        where = f"{PROCS} hosts (network namespaces), 1 proc each, links of {args.network}"
    else:
        mesh, dim = this_host().spawn_procs(per_host={"gpus": PROCS}), "gpus"
        where = f"{PROCS} procs on this host"
    try:
        mesh.initialized.get(timeout=CALL_TIMEOUT_S)
        if mesh.size(dim) != PROCS:
            raise RuntimeError(f"the mesh has {mesh.size(dim)} ranks on {dim!r}, not {PROCS}")
        runs, check, status = _measure(ex, cfg, mesh, dim, args)
    finally:
        mesh.stop().get(timeout=60)
    elapsed = time.perf_counter() - t_start
    return _report(args, cfg, n_params, runs, check, status, started, elapsed, where, torch)


def _report(
    args: argparse.Namespace,
    cfg: Any,
    n_params: int,
    runs: list[dict[str, Any]],
    check: dict[str, Any],
    status: str,
    started: datetime.datetime,
    elapsed: float,
    where: str,
    torch: Any,
) -> int:
    """Prints the table and writes the JSON results; the exit status."""
    med: dict[str, dict[str, float]] = {}
    rows: list[tuple[str, ...]] = [
        ("version", "per step (median)", "range", "recording (median)", "runs")
    ]
    names = {
        "main": "main stream",
        "overlapped": "overlapped (comms stream)",
        COMPUTE: "no reductions (compute only)",
    }
    for m in (*MODES, COMPUTE):
        walls = [r["step_ms"] for r in runs if r["mode"] == m]
        recs = [r["record_ms"] for r in runs if r["mode"] == m]
        if not walls:
            rows.append((m, "n/a", "", "", "0"))
            continue
        med[m] = {"step_ms": statistics.median(walls), "record_ms": statistics.median(recs)}
        rows.append(
            (
                names[m],
                f"{med[m]['step_ms']:.1f} ms",
                f"{min(walls):.1f}-{max(walls):.1f} ms",
                f"{med[m]['record_ms']:.1f} ms",
                str(len(walls)),
            )
        )
    ratio = None
    if "main" in med and "overlapped" in med:
        ratio = med["overlapped"]["step_ms"] / med["main"]["step_ms"]
    per_rep = []
    for rep in range(args.reps):
        pair = {r["mode"]: r["step_ms"] for r in runs if r["rep"] == rep}
        if "main" in pair and "overlapped" in pair:
            per_rep.append(pair["overlapped"] / pair["main"])

    mode = "quick" if args.quick else "full"
    print(
        f"\ndata-parallel training, reductions overlapped vs on the main stream "
        f"({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)"
    )
    print(machine_line())
    print(
        f"{mode}: {where}; MLP {cfg.in_dim}-{cfg.hidden}x{cfg.layers - 1}-"
        f"{cfg.out_dim} ({n_params:,} parameters, {n_params * 4 / 2**20:.1f} MiB of "
        f"gradients a step), {cfg.batch_per_rank} samples per rank; {args.reps} runs of "
        f"{args.steps} steps per version, alternating which goes first\n"
    )
    print_rows(rows)
    if ratio is not None:
        spread = ", ".join(f"{x:.2f}" for x in per_rep)
        print(f"\noverlapped / main stream: {ratio:.2f} (median; per repetition: {spread})")
    if "main" in med and COMPUTE in med:
        cost = med["main"]["step_ms"] - med[COMPUTE]["step_ms"]
        print(
            f"the reductions add {cost:.1f} ms to a step on the main stream: what an "
            "overlap could hide at most"
        )
    for m, c in check.items():
        print(f"{m}: {c['steps']} steps, losses within {c['max_loss_diff']:.1e} of one process")
    if status != "ok":
        print(f"status: {status}")

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine_line(),
        "mode": mode,
        "where": where,
        "network": args.network,
        "reps": args.reps,
        "params": {
            "procs": PROCS,
            "steps": args.steps,
            "warmup": args.warmup,
            "config": vars(cfg),
            "parameters": n_params,
            "torch": torch.__version__,
        },
        "median": med,
        "ratio_overlapped_over_main": ratio,
        "ratio_per_rep": per_rep,
        "loss_check": check,
        "status": status,
        "runs": runs,
        "table": rows,
    }
    out = Path(args.out)
    return save_results(out, out.parent, result, [{"status": status}])


def _shape(host: Any, rate: str) -> None:
    """Limit what ``host`` sends to ``rate`` (a token bucket on its interface: a NIC of
    that speed; every host sends through its own, so each link is that fast)."""
    bits = _rate_bits(rate)
    burst = max(64 << 10, bits // 8 // 250)  # at least one 4 ms tick of tokens
    argv = ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate]
    argv += ["burst", str(burst), "latency", "50ms"]
    done = host.run(argv, timeout=30, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` in {host.name} failed: {done.stderr.strip()}")


def _rate_bits(rate: str) -> int:
    """Bits a second of a tc rate (``1gbit``, ``500mbit``, ``100kbit``, ``1000000bit``)."""
    units = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    for unit in sorted(units, key=len, reverse=True):
        if rate.lower().endswith(unit):
            try:
                return int(float(rate[: -len(unit)]) * units[unit])
            except ValueError:
                break
    raise SystemExit(f"--network {rate!r}: give a rate as tc takes it, e.g. 1gbit or 500mbit")


def _drive_cluster(args: argparse.Namespace, argv: list[str]) -> int:
    """``--network``: 4 simulated hosts with shaped links, a worker in each, and this
    script again as the client, in the cluster's client namespace."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benches"))
    from multihost_bench import PORT, Side, start_workers, stop_workers
    from tests.multihost.netns import Cluster, available, cleanup_stale

    _rate_bits(args.network)
    ok, reason = available()
    if not ok:
        print(f"ddp bench --network skipped: {reason}")
        return 0
    cleanup_stale()
    logs = Path(args.out).parent / "ddp-network-logs"
    logs.mkdir(parents=True, exist_ok=True)
    side = Side("ours", Path(sys.executable), None)
    files: list[Any] = []
    workers: list[subprocess.Popen[bytes]] = []
    with Cluster.create(PROCS) as cluster:
        try:
            for h in cluster.hosts:
                _shape(h, args.network)
            env = side.env(f"ddp-{os.getpid()}")
            # The simulated hosts share this machine's cores: each gets its share, as
            # the procs of one host do (spawn_procs sets it only for several procs).
            env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // PROCS)))
            worker_logs = [logs / f"worker-h{i}.log" for i in range(PROCS)]
            workers = start_workers(cluster.hosts, side, env, worker_logs, files)
            addresses = ",".join(f"tcp://{h.ip}:{PORT}" for h in cluster.hosts)
            client = cluster.client.popen(
                [sys.executable, __file__, *argv, "--attach", addresses], env=env
            )
            try:
                return client.wait(timeout=args.run_timeout)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait(10)
                print(f"the client ran past --run-timeout ({args.run_timeout} s)")
                return 1
        finally:
            stop_workers(workers)
            for f in files:
                f.close()


if __name__ == "__main__":
    sys.exit(main())
