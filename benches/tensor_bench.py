"""Distributed tensors benchmark, this project and upstream Monarch side by side, with
plain ``torch.distributed`` (gloo) as the floor under the collective.

What it measures, on a mesh of 4 procs of this host (``this_host().spawn_procs(per_host=
{"gpus": 4})``, CPU tensors):

- **first activation**: with the mesh already initialized (``pm.initialized`` awaited),
  the time from calling ``pm.activate()`` to the return of the first
  ``monarch.inspect`` of a 4x4 tensor made under it (this starts the tensor engine:
  its workers on the procs); also ``spawn_procs`` to ``initialized``, and the three
  together (spawn, activation, first inspect).
- **inspect latency**: the median of ``--inspects`` (200) ``monarch.inspect(t)`` of a
  4x4 tensor on the active mesh, after a tenth as many warm-up ones, in ms.
- **dispatch**: ``x = x + 1`` on a 4x4 tensor issued N times, then one
  ``monarch.inspect(x)``; N over the time of it all (the final fetch included), in
  operations per second. N is 2,000 for ours and ``--upstream-ops`` (1,000) for
  upstream, which runs about 500 a second at best; 50 untimed operations and a fetch
  come first. The value fetched is checked (N + 50 everywhere).
- **reduce**: ``r = t.reduce("gpus", "sum")`` of a 64 MiB float32 tensor (4096 x 4096)
  on the 4 procs, then ``monarch.inspect(r[0, 0])`` (which waits for the reduce); the
  median of ``--reduce-iters`` (5) after one warm-up (which makes the process group).
  The value fetched is checked (4). Then the same with ``t.reduce_("gpus", "sum")`` (in
  place; ``t.fill_(1.0)`` and a fetch, untimed, before each). Upstream cannot run a
  collective of CPU tensors (its tensor workers fail, "no comm found for stream", and
  the failure ends the client); its run tries once, last, and the table says "cannot
  run on CPU", with what happened under the table.
- **floor**: 4 plain processes (``torch.multiprocessing``, ``spawn``) joined by
  ``init_process_group("gloo")`` through a ``FileStore``, on loopback
  (``GLOO_SOCKET_IFNAME=lo``; ours' gloo binds 127.0.0.1 on one host too);
  ``dist.all_reduce`` of the same 64 MiB tensor in place, timed on rank 0 after a
  barrier; the median of as many after one warm-up (the floor of both reduce rows).
  The ratio ours/floor is what a reduce of ours costs over the collective itself
  (dispatch, the output tensor, the fetch).

How it runs: this driver runs the same file, ``--child ours|upstream|floor``, under this
project's venv (``.venv``; the floor too, with its torch) and under upstream Monarch's
(``.bench/venv-upstream``, PyPI ``torchmonarch`` 0.7.0 with torch), alternating the order
from one repetition to the next, ``--reps`` times each; each value is the median over the
runs of each run's own figure. The harness (child processes, their JSON lines, timeouts,
leftovers killed by pid) is ``rdma_bench.py``'s. Each child imports torch before
``spawn_procs``: ours forks its procs from a template process that has then already
imported it.

Usage: ``.venv/bin/python benches/tensor_bench.py [--reps N] [--impls
ours,upstream,floor] [--quick] [--out FILE]``; ``make bench-tensors``. Writes JSON
(default ``.bench/results/tensors.json``) and per-run logs beside it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
#: Procs of the mesh (and processes of the floor).
PROCS = 4
#: Untimed operations (and a fetch) before the timed dispatch.
DISPATCH_WARMUP = 50
#: The longest a spawn, a fetch or the floor's start may take.
CALL_TIMEOUT_S = 120.0

# key, name, unit, budgets: (bound, kind), kind "min" / "max" (ours' own value, in the
# unit), "ratio-min" (ours/upstream at least bound) or "floor-max" (ours/floor at most).
ROWS: list[tuple[str, str, str, list[tuple[float, str]]]] = [
    ("spawn_s", "spawn_procs (4 procs) -> initialized", "s", []),
    ("activate_s", "first activation -> first inspect", "s", [(3.0, "max")]),
    ("spawn_activate_s", "spawn + first activation + first inspect", "s", []),
    ("inspect_ms", "inspect of a 4x4 tensor (mesh active)", "ms", [(1.0, "max")]),
    (
        "dispatch_ops",
        "dispatch: x = x + 1 (4x4) N times, then inspect",
        "ops/s",
        [(5000.0, "min"), (8.0, "ratio-min")],
    ),
    ("reduce_ms", "reduce sum, 64 MiB float32 over 4 procs", "ms", [(1.15, "floor-max")]),
    ("reduce_inplace_ms", "reduce_ (in place), same tensor", "ms", []),
]
REDUCE_ROW = "reduce_ms"
INPLACE_ROW = "reduce_inplace_ms"
REDUCE_ROWS = (REDUCE_ROW, INPLACE_ROW)
#: Upstream's reduce cell.
NO_CPU_REDUCE = "cannot run on CPU"

# ---------------------------------------------------------------------------------------
# The measuring side: ``--child ours|upstream|floor``, run under each side's python. It
# prints rdma_bench's METRIC / ERROR / INFO lines as it goes, then DONE.


def _monarch_side(args: argparse.Namespace) -> int:
    # torch first: ours forks the procs from a template that has then imported it.
    import torch
    from rdma_bench import fail, info, record

    import monarch
    from monarch.actor import this_host

    info("torch", torch.__version__)
    try:
        t0 = time.perf_counter()
        pm = this_host().spawn_procs(per_host={"gpus": PROCS})
        pm.initialized.get(timeout=CALL_TIMEOUT_S)
        t1 = time.perf_counter()
        with pm.activate():
            x = torch.zeros(4, 4)
            first = monarch.inspect(x)
            t2 = time.perf_counter()
        if not torch.equal(first, torch.zeros(4, 4)):
            raise AssertionError(f"the first inspect gave {first}, not zeros")
        record("spawn_s", t1 - t0)
        record("activate_s", t2 - t1, "pm.activate() -> first inspect returned")
        record("spawn_activate_s", t2 - t0)
    except BaseException as e:
        fail("setup", e)
        print("DONE", flush=True)
        return 1

    try:
        with pm.activate():
            t = torch.ones(4, 4)
            for _ in range(max(args.inspects // 10, 1)):
                monarch.inspect(t)
            samples = []
            for _ in range(args.inspects):
                t0 = time.perf_counter()
                monarch.inspect(t)
                samples.append(time.perf_counter() - t0)
        samples.sort()
        p90 = samples[int(0.9 * (len(samples) - 1))]
        note = f"median of {len(samples)}; p90 {p90 * 1e3:.2f} ms"
        record("inspect_ms", statistics.median(samples) * 1e3, note)
    except BaseException as e:
        fail("inspect_ms", e)

    n = args.upstream_ops if args.impl == "upstream" else args.ops
    try:
        with pm.activate():
            x = torch.zeros(4, 4)
            for _ in range(DISPATCH_WARMUP):
                x = x + 1
            monarch.inspect(x)
            t0 = time.perf_counter()
            for _ in range(n):
                x = x + 1
            got = monarch.inspect(x)
            dt = time.perf_counter() - t0
        if not torch.equal(got, torch.full((4, 4), float(n + DISPATCH_WARMUP))):
            fail("dispatch_ops", f"the value fetched is wrong: {got.flatten()[:4].tolist()}")
        else:
            record("dispatch_ops", n / dt, f"N = {n}: {dt:.2f} s")
    except BaseException as e:
        fail("dispatch_ops", e)

    if args.impl == "upstream":
        _upstream_reduce(pm, args)  # last: the failure ends the client
    else:
        try:
            _reduce_bench(pm, args)
        except BaseException as e:
            fail(REDUCE_ROW, e)
            fail(INPLACE_ROW, e)
        try:
            pm.stop().get(timeout=30)
        except BaseException as e:
            info("stop", f"{type(e).__name__}: {e}")
    print("DONE", flush=True)
    return 0


def _reduce_bench(pm: Any, args: argparse.Namespace) -> None:
    """Time ``t.reduce`` (then ``t.reduce_``) after one warm-up, checking every value
    fetched; record both."""
    import torch
    from rdma_bench import record

    import monarch

    side = int((args.reduce_mib * MIB // 4) ** 0.5)
    timed: dict[str, list[float]] = {REDUCE_ROW: [], INPLACE_ROW: []}
    with pm.activate():
        t = torch.ones(side, side)
        got = [monarch.inspect(t.reduce("gpus", "sum")[0, 0])]  # warm-up: the group
        for _ in range(args.reduce_iters):
            t0 = time.perf_counter()
            r = t.reduce("gpus", "sum")
            got.append(monarch.inspect(r[0, 0]))
            timed[REDUCE_ROW].append(time.perf_counter() - t0)
        del r
        for _ in range(args.reduce_iters):
            t.fill_(1.0)
            monarch.inspect(t[0, 0])  # untimed, as the floor's fill and barrier
            t0 = time.perf_counter()
            t.reduce_("gpus", "sum")
            got.append(monarch.inspect(t[0, 0]))
            timed[INPLACE_ROW].append(time.perf_counter() - t0)
    if any(float(v) != PROCS for v in got):
        raise AssertionError(f"reduce gave {[float(v) for v in got]}, not {PROCS}")
    for key, samples in timed.items():
        record(key, statistics.median(samples) * 1e3, f"median of {len(samples)}")


def _upstream_reduce(pm: Any, args: argparse.Namespace) -> None:
    """Try the reduce once; say what happened (upstream has no CPU collectives)."""
    from rdma_bench import fail, info

    import monarch.actor

    faults: list[str] = []

    def hook(failure: Any) -> None:
        report = getattr(failure, "report", None)
        text = " ".join((report() if callable(report) else str(failure)).split())
        faults.append(text.rsplit("have failed:", 1)[-1].strip())
        raise SystemExit(1)  # upstream's default: the fault ends the client

    monarch.actor.unhandled_fault_hook = hook
    for key in REDUCE_ROWS:  # stands if the attempt takes the process down
        fail(key, NO_CPU_REDUCE)
    info("reduce_attempt", "the client process died during the attempt")
    t0 = time.perf_counter()
    try:
        _reduce_bench(pm, args)
        info("reduce_attempt", "ran")
        return
    except BaseException as e:
        info("reduce_attempt_s", time.perf_counter() - t0)
        outcome = f"{type(e).__name__} in the client"
    cause = f"its tensor workers failed ({faults[0][:90]})" if faults else "it failed"
    info("reduce_attempt", f"{cause}; {outcome}")


def _floor_rank(rank: int, store_path: str, mib: int, iters: int, out: Any) -> None:
    """One rank of the floor: ``iters`` gloo all_reduces of ``mib`` MiB after one."""
    import torch
    import torch.distributed as dist

    store = dist.FileStore(store_path, PROCS)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=PROCS)
    side = int((mib * MIB // 4) ** 0.5)
    t = torch.ones(side, side)
    dist.all_reduce(t)  # warm-up: connects the pairs
    ok = bool((t == PROCS).all())
    samples = []
    for _ in range(iters):
        t.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        samples.append(time.perf_counter() - t0)
        ok = ok and bool((t == PROCS).all())
    dist.barrier()
    if rank == 0:
        out.put({"samples": samples, "ok": ok})
    dist.destroy_process_group()


def _floor_side(args: argparse.Namespace) -> int:
    import tempfile

    import torch
    import torch.multiprocessing as mp
    from rdma_bench import fail, info, record

    info("torch", torch.__version__)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(
                target=_floor_rank,
                args=(r, f"{tmp}/store", args.reduce_mib, args.reduce_iters, out),
                daemon=True,
            )
            for r in range(PROCS)
        ]
        for p in procs:
            p.start()
        try:
            got = _floor_result(out, procs, CALL_TIMEOUT_S + 10 * args.reduce_iters)
            samples = got["samples"]
            for key in REDUCE_ROWS:  # all_reduce is in place: the floor of both
                if not got["ok"]:
                    fail(key, f"all_reduce gave a value other than {PROCS}")
                else:
                    record(key, statistics.median(samples) * 1e3, f"median of {len(samples)}")
        except BaseException as e:
            for key in REDUCE_ROWS:
                fail(key, e)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    print("DONE", flush=True)
    return 0


def _floor_result(out: Any, procs: list[Any], timeout: float) -> dict[str, Any]:
    """Rank 0's result, or an error as soon as a rank exits without it."""
    import queue

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got: dict[str, Any] = out.get(timeout=1.0)
            return got
        except queue.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                rank, code = dead[0]
                raise RuntimeError(f"floor rank {rank} exited with code {code}") from None
    raise TimeoutError(f"no result from the floor's rank 0 within {timeout:g} s")


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["ours", "upstream", "floor"], required=True)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--upstream-ops", type=int, default=1000)
    parser.add_argument("--inspects", type=int, default=200)
    parser.add_argument("--reduce-iters", type=int, default=5)
    parser.add_argument("--reduce-mib", type=int, default=64)
    args = parser.parse_args(argv)
    args.impl = args.child
    rc = _floor_side(args) if args.child == "floor" else _monarch_side(args)
    sys.stdout.flush()
    os._exit(rc)  # the runtime's threads must not hold the exit


# ---------------------------------------------------------------------------------------
# The driver


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:,.0f} ms" if value >= 100 else f"{value:.3g} ms"
    if unit == "s":
        return f"{value:.2f} s" if value >= 10 else f"{value:.3f} s"
    return f"{value:,.0f} {unit}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r < 10 else f"{r:.1f}"


def verdicts(
    budgets: list[tuple[float, str]], unit: str, vals: dict[str, float | None]
) -> tuple[str, str]:
    """The budget text and whether each bound is met, from ``vals`` (side -> median)."""
    ours = vals.get("ours")
    texts, met = [], []
    for bound, kind in budgets:
        if kind in ("ratio-min", "floor-max"):
            peer = vals.get("upstream" if kind == "ratio-min" else "floor")
            name = "upstream" if kind == "ratio-min" else "floor"
            op = ">=" if kind == "ratio-min" else "<="
            texts.append(f"ours/{name} {op} {bound:g}")
            r = None if ours is None or not peer else ours / peer
        else:
            op = ">=" if kind == "min" else "<="
            texts.append(f"{op} {bound:,g} {unit}")
            r = ours
        if r is None:
            met.append("n/a")
        else:
            ok = r >= bound if kind.endswith("min") else r <= bound
            met.append("met" if ok else "NOT MET")
    return "; ".join(texts), "; ".join(met)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return child_main(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benches"))
    from bench_common import (
        NotedCells,
        loadavg,
        machine_line,
        print_rows,
        run_outcome,
        save_results,
        settle,
    )
    from multihost_bench import Side, make_sides
    from rdma_bench import aggregate, kill_leftovers, run_child

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "tensors.json"))
    parser.add_argument("--reps", type=int, default=3, help="runs per side (3)")
    parser.add_argument("--impls", default="ours,upstream,floor", help="which sides, in order")
    parser.add_argument("--ops", type=int, default=2000, help="ours' dispatch N (2000)")
    parser.add_argument(
        "--upstream-ops", type=int, default=1000, help="upstream's dispatch N (1000)"
    )
    parser.add_argument("--inspects", type=int, default=200, help="timed inspects (200)")
    parser.add_argument("--reduce-iters", type=int, default=5, help="timed reduces a run (5)")
    parser.add_argument("--quick", action="store_true", help="small N, few iterations, 4 MiB")
    parser.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--upstream-venv", default=str(ROOT / ".bench" / "venv-upstream"))
    parser.add_argument(
        "--run-timeout", type=float, default=300, help="seconds one run may take (300)"
    )
    args = parser.parse_args(argv)
    reduce_mib = 64
    if args.quick:
        args.ops, args.upstream_ops, args.inspects, args.reduce_iters = 200, 100, 20, 1
        reduce_mib = 4
    out = Path(args.out)
    logs = out.parent / "tensors-logs"
    logs.mkdir(parents=True, exist_ok=True)

    wanted = args.impls.split(",")
    monarch_args = argparse.Namespace(
        **{**vars(args), "impls": ",".join(k for k in wanted if k != "floor")}
    )
    sides = make_sides(parser, monarch_args) if monarch_args.impls else []
    if "floor" in wanted:
        py = Path(args.ours_python)
        missing = None if py.exists() else f"not installed: {py} is missing (`make install`)"
        sides.insert(wanted.index("floor"), Side("floor", py, missing))
    versions = {s.key: s.missing or ("torch" if s.key == "floor" else s.version()) for s in sides}

    child_args = ["--ops", str(args.ops), "--upstream-ops", str(args.upstream_ops)]
    child_args += ["--inspects", str(args.inspects), "--reduce-iters", str(args.reduce_iters)]
    child_args += ["--reduce-mib", str(reduce_mib)]
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {s.key: [] for s in sides}
    active = [s for s in sides if not s.missing]
    for rep in range(args.reps):
        shift = rep % max(len(active), 1)
        for side in active[shift:] + active[:shift]:
            # A quick run is a smoke test, not a measurement: it does not wait for an idle
            # machine (under the test suite that wait was 10 s per run).
            busy = settle(1 if args.quick else 20)
            print(f"rep {rep + 1}/{args.reps}: {side.key} ...", end=" ", flush=True)
            run_id = uuid.uuid4().hex
            argv_ = [str(side.python), str(Path(__file__).resolve()), "--child", side.key]
            log = logs / f"{side.key}-{rep}.log"
            result = run_child(
                side, argv_ + child_args, subprocess.Popen, args.run_timeout, log, run_id
            )
            result["leftover_processes_killed"] = kill_leftovers(run_id)
            result.update(rep=rep, cpu_busy_before_run=busy, loadavg=loadavg())
            runs[side.key].append(result)
            print(run_outcome(result), flush=True)
        active = [s for s in active if "timed out" not in runs[s.key][-1]["status"]]
    elapsed = time.perf_counter() - t_start

    aggs: dict[str, dict[str, Any]] = {}
    for s in sides:
        keys = list(REDUCE_ROWS) if s.key == "floor" else [k for k, *_ in ROWS]
        aggs[s.key] = aggregate(runs[s.key], keys, s.missing)
        torches = {r["info"].get("torch") for r in runs[s.key]} - {None}
        if s.key == "floor" and not s.missing:
            versions[s.key] = f"torch {', '.join(sorted(torches)) or '?'}, gloo"
        elif torches and not s.missing:
            versions[s.key] += f", torch {', '.join(sorted(torches))}"
    cell = NotedCells(aggs, as_is=lambda err: err == NO_CPU_REDUCE, show=fmt)

    def value(side: str, key: str) -> float | None:
        v: float | None = aggs.get(side, {}).get(key, {}).get("value")
        return v

    rows = [("metric", "ours", "upstream", "ours/upstream", "floor", "ours/floor", "budget", "")]
    for key, name, unit, budgets in ROWS:
        if key == REDUCE_ROW:
            name = name.replace("64 MiB", f"{reduce_mib} MiB")
        vals = {s: value(s, key) for s in ("ours", "upstream", "floor")}
        floor = cell(key, unit, "floor") if key in REDUCE_ROWS else ""
        text, met = verdicts(budgets, unit, vals)
        rows.append(
            (
                name,
                cell(key, unit, "ours"),
                cell(key, unit, "upstream"),
                _ratio(vals["ours"], vals["upstream"]),
                floor,
                _ratio(vals["ours"], vals["floor"]) if key in REDUCE_ROWS else "",
                text,
                met,
            )
        )

    machine = machine_line()
    print(
        f"\ndistributed tensors, ours vs upstream ({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)"
    )
    print(machine)
    for s in sides:
        done = sum(1 for r in runs[s.key] if r["status"] == "ok")
        state = s.missing or f"{done}/{len(runs[s.key])} runs completed"
        print(f"  {s.key}: {versions[s.key]}; {state}")
    busy = [r["cpu_busy_before_run"] for rs in runs.values() for r in rs]
    busy = [b for b in busy if b is not None]
    if busy:
        print(
            f"CPU busy in the 0.5 s before each run: {100 * min(busy):.0f}-"
            f"{100 * max(busy):.0f}% (other work on the machine skews the figures)"
        )
    mode = "quick" if args.quick else "full"
    print(
        f"median of {args.reps} {mode} run(s) per side; dispatch N: ours {args.ops}, upstream "
        f"{args.upstream_ops}; floor: torch.distributed gloo all_reduce, 4 processes\n"
    )
    print_rows(rows)
    for k, note in enumerate(cell.notes, 1):
        print(f"[{k}] {note}")
    tried = [r["info"] for r in runs.get("upstream", []) if "reduce_attempt" in r["info"]]
    attempts = sorted({i["reduce_attempt"] for i in tried})
    secs = sorted(i["reduce_attempt_s"] for i in tried if "reduce_attempt_s" in i)
    after = ""
    if secs:
        span = f"{secs[0]:.2f}" if secs[0] == secs[-1] else f"{secs[0]:.2f}-{secs[-1]:.2f}"
        after = f" {span} s after the call"
    for a in attempts:
        runs_with = sum(1 for i in tried if i["reduce_attempt"] == a)
        print(f"upstream's reduce ({runs_with} of {len(tried)} runs): {a}{after}")

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine,
        "mode": mode,
        "reps": args.reps,
        "params": {
            "procs": PROCS,
            "ops": args.ops,
            "upstream_ops": args.upstream_ops,
            "dispatch_warmup": DISPATCH_WARMUP,
            "inspects": args.inspects,
            "reduce_iters": args.reduce_iters,
            "reduce_mib": reduce_mib,
        },
        "versions": versions,
        "median": aggs,
        "runs": runs,
        "table": rows,
        "notes": cell.notes,
        "upstream_reduce": attempts,
    }
    return save_results(out, logs, result, runs.get("ours", []))


if __name__ == "__main__":
    sys.exit(main())
