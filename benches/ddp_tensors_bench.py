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

Usage: ``.venv/bin/python benches/ddp_tensors_bench.py [--reps N] [--steps N] [--quick]
[--out FILE]``; ``make bench-ddp`` (also part of ``make bench``). Writes JSON (default
``.bench/results/ddp_tensors.json``); prints one JSON line per timed run as it goes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
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


def main(argv: list[str] | None = None) -> int:
    # torch first: the procs fork from a template process that has then imported it.
    import torch

    sys.path.insert(0, str(ROOT / "benches"))
    from bench_common import loadavg, machine_line, print_rows, save_results

    from monarch.actor import this_host

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "ddp_tensors.json"))
    parser.add_argument("--reps", type=int, default=5, help="timed runs per version (5)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed run (10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width (1024)")
    parser.add_argument("--layers", type=int, default=4, help="linear layers (4)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank (64)")
    parser.add_argument("--quick", action="store_true", help="a small model, 2 short runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup, args.hidden, args.batch = 2, 3, 1, 64, 16
    ex = _load_example()
    cfg = ex.Config(
        in_dim=256,
        hidden=args.hidden,
        out_dim=16,
        layers=args.layers,
        batch_per_rank=args.batch,
        lr=0.01,
    )
    n_params = sum(p.numel() for p in ex.make_model(cfg).parameters())
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    status = "ok"
    check: dict[str, Any] = {}
    mesh = this_host().spawn_procs(per_host={"gpus": PROCS})
    try:
        mesh.initialized.get(timeout=CALL_TIMEOUT_S)
        every = (*MODES, COMPUTE)
        replicas = {m: ex.Replica(mesh, cfg) for m in every}
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
    finally:
        mesh.stop().get(timeout=60)
    elapsed = time.perf_counter() - t_start

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
        f"{mode}: {PROCS} procs, MLP {cfg.in_dim}-{cfg.hidden}x{cfg.layers - 1}-"
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


if __name__ == "__main__":
    sys.exit(main())
