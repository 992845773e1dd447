"""This project, upstream Monarch and Ray, side by side: the driver of ``make bench``.

It runs ``actor_bench.py`` under this project's venv (``.venv``) and under upstream
Monarch's (``.bench/venv-upstream``, PyPI ``torchmonarch``), and ``ray_bench.py`` under
Ray's (``.bench/venv-ray``), each as a subprocess writing JSON. The implementations
alternate: every repetition runs each of them once, in a rotated order. Each value in the
table is the median over the repetitions; the ratios are this project's value over the
peer's. It writes ``compare.json`` (every run and the medians) and ``latency.png`` (call
latency and spawn time against the number of actors) into ``--out`` (default
``.bench/results``).

A peer whose venv is missing, a run that fails or times out, a metric that cannot run:
the table says so, with the reason; nothing is made up. Every process a run starts
carries a marker in its environment; whatever is left of them after the run is killed
(and reported).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench_common import (
    CALL_1,
    CALL_4,
    CALL_16,
    CALL_64,
    CALL_256,
    CALL_ONE,
    CALL_ONE_CPU,
    CATALOGUE,
    ECHO_64M,
    FAILURE,
    PIPE,
    PIPE_CPU,
    PIPELINED,
    RAW_16,
    RAW_64,
    RAW_256,
    RAW_FANOUT,
    SPAWN_4,
    SPAWN_16,
    SPAWN_64,
    SPAWN_256,
    cpu_busy,
    fmt,
    loadavg,
    print_rows,
    processes_with_env,
)

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ROOT / "benches"
MARKER = "MONARCH_BENCH_RUN"

#: The targets: this project over upstream in the same run (key, bound, "max" = the
#: ratio must stay at or below it, "min" = reach it), or this project's own value
#: ("abs-max": at most the bound, in the metric's unit).
TARGETS = {
    CALL_ONE: (0.2, "max"),
    PIPELINED: (6.0, "min"),
    CALL_16: (0.3, "max"),
    SPAWN_4: (0.5, "max"),
    SPAWN_16: (0.5, "max"),
    ECHO_64M: (3.0, "min"),
    FAILURE: (0.05, "abs-max"),
}


@dataclass
class Impl:
    key: str  # "ours", "upstream", "ray"
    title: str
    python: Path
    script: Path

    def missing(self) -> str | None:
        if not self.python.exists():
            return f"not installed: {self.python} is missing (`make bench-peers` makes it)"
        return None


def implementations(args: argparse.Namespace) -> list[Impl]:
    all_impls = {
        "ours": Impl("ours", "ours", Path(args.ours_python), BENCHES / "actor_bench.py"),
        "upstream": Impl(
            "upstream",
            "upstream",
            Path(args.upstream_venv) / "bin" / "python",
            BENCHES / "actor_bench.py",
        ),
        "ray": Impl("ray", "Ray", Path(args.ray_venv) / "bin" / "python", BENCHES / "ray_bench.py"),
    }
    return [all_impls[k] for k in args.impls.split(",")]


def precompile_ours(python: Path) -> str:
    """Compile this project's Python modules to bytecode, as an installed wheel has them
    (upstream's venv has them from pip). Without it, each proc of ours compiles monarch
    from source (``PYTHONDONTWRITEBYTECODE=1`` here), which shows in the spawn time."""
    code = (
        "import compileall, os, monarch; d = os.path.dirname(monarch.__file__); "
        "print(d, compileall.compile_dir(d, quiet=1))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    return (done.stdout or done.stderr).strip()


def kill_leftovers(run_id: str) -> list[int]:
    """Kill, by pid, every process still carrying this run's marker."""
    pids = processes_with_env(MARKER, run_id)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids


def run_one(impl: Impl, rep: int, args: argparse.Namespace, out: Path) -> dict:
    """Run one implementation once; return its JSON (possibly partial) plus how it went."""
    json_path = out / f"{impl.key}-{rep}.json"
    log_path = out / f"{impl.key}-{rep}.log"
    json_path.unlink(missing_ok=True)
    run_id = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[MARKER] = run_id
    cmd = [str(impl.python), str(impl.script), "--json", str(json_path)]
    if args.quick:
        cmd.append("--quick")
    load = loadavg()
    busy = cpu_busy(0.5)
    t0 = time.perf_counter()
    status = "ok"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=args.run_timeout)
            if rc != 0:
                status = f"run failed (exit {rc}; see {log_path})"
        except subprocess.TimeoutExpired:
            status = f"run timed out after {args.run_timeout} s (see {log_path})"
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    elapsed = time.perf_counter() - t0
    time.sleep(0.5)  # let teardown finish before looking for what is left
    leftovers = kill_leftovers(run_id)
    if leftovers:
        print(f"  warning: killed {len(leftovers)} leftover processes of this run", flush=True)
    try:
        result = json.loads(json_path.read_text())
    except (OSError, ValueError):
        result = {"metrics": []}
        if status == "ok":
            status = f"no JSON written (see {log_path})"
    if status != "ok":
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        if tail:
            status += f": {tail[0][:160]}"
    result.update(
        rep=rep,
        status=status,
        wall_s=elapsed,
        loadavg_1min_before_run=load,
        cpu_busy_before_run=busy,
        leftover_processes_killed=len(leftovers),
    )
    return result


def aggregate(runs: list[dict], unavailable: str | None) -> dict[str, dict]:
    """The median over the runs for every metric, or the reason there is none."""
    agg: dict[str, dict] = {}
    for key in CATALOGUE:
        values, errors = [], []
        for run in runs:
            m = next((m for m in run["metrics"] if m["key"] == key), None)
            if m is None:
                errors.append(run["status"] if run["status"] != "ok" else "not measured")
            elif m["value"] is None:
                errors.append(m["error"] or "not measured")
            else:
                values.append(m["value"])
        if values:
            agg[key] = {
                "value": statistics.median(values),
                "values": values,
                "min": min(values),
                "max": max(values),
            }
        else:
            agg[key] = {"value": None, "error": unavailable or (errors[0] if errors else "not run")}
    return agg


def ratio_text(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or peer == 0:
        return "-"
    r = ours / peer
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def target_text(key: str, ours: float | None, upstream: float | None) -> str:
    if key not in TARGETS:
        return ""
    bound, kind = TARGETS[key]
    if kind == "abs-max":
        want = f"ours <= {bound:g} {CATALOGUE[key][1]}"
        if ours is None:
            return f"{want}: n/a"
        return f"{want}: {'met' if ours <= bound else 'MISSED'}"
    want = f"{'<=' if kind == 'max' else '>='} {bound:g}"
    if ours is None or upstream is None or upstream == 0:
        return f"{want}: n/a"
    r = ours / upstream
    ok = r <= bound if kind == "max" else r >= bound
    return f"{want}: {'met' if ok else 'MISSED'}"


def table(impls: list[Impl], aggs: dict[str, dict[str, dict]]) -> list[tuple[str, ...]]:
    """The rows of the comparison table (with footnote markers), and the footnotes."""
    notes: list[str] = []

    def cell(impl: str, key: str) -> str:
        a = aggs[impl][key]
        if a["value"] is not None:
            return fmt(a["value"], CATALOGUE[key][1])
        if a["error"] not in notes:
            notes.append(a["error"])
        return f"n/a [{notes.index(a['error']) + 1}]"

    keys = [i.key for i in impls]
    header = ["metric", "better"] + [i.title for i in impls]
    peers = [k for k in keys if k != "ours"] if "ours" in keys else []
    header += [f"ours/{'Ray' if p == 'ray' else p}" for p in peers]
    if "ours" in keys and "upstream" in keys:
        header.append("target ours/upstream")
    rows = [tuple(header)]
    for key, (name, _unit, better) in CATALOGUE.items():
        row = [name, better] + [cell(k, key) for k in keys]
        ours = aggs["ours"][key]["value"] if "ours" in keys else None
        row += [ratio_text(ours, aggs[p][key]["value"]) for p in peers]
        if "ours" in keys and "upstream" in keys:
            row.append(target_text(key, ours, aggs["upstream"][key]["value"]))
        rows.append(tuple(row))
    return rows, notes


def growth_text(impls: list[Impl], aggs: dict[str, dict[str, dict]]) -> str | None:
    """How call() latency grows from 16 to 64 actors for each implementation, next to
    the bare fan-out floor (the median over every implementation's runs of it)."""
    parts = []
    for i in impls:
        a, b = aggs[i.key][CALL_16]["value"], aggs[i.key][CALL_64]["value"]
        if a and b:
            parts.append(f"{i.title} {b / a:.1f}x")
    floors = [
        aggs[i.key][RAW_64]["value"] / aggs[i.key][RAW_16]["value"]
        for i in impls
        if aggs[i.key][RAW_16]["value"] and aggs[i.key][RAW_64]["value"]
    ]
    if floors:
        parts.append(f"bare fan-out floor {statistics.median(floors):.1f}x")
    if not parts:
        return None
    text = "growth from 16 to 64 actors (4x; below 4x is sub-linear): " + ", ".join(parts)
    edge = [
        f"{i.title} {aggs[i.key][CALL_256]['value'] / aggs[i.key][CALL_16]['value']:.1f}x"
        for i in impls
        if aggs[i.key][CALL_16]["value"] and aggs[i.key][CALL_256]["value"]
    ]
    edge_floors = [
        aggs[i.key][RAW_256]["value"] / aggs[i.key][RAW_16]["value"]
        for i in impls
        if aggs[i.key][RAW_16]["value"] and aggs[i.key][RAW_256]["value"]
    ]
    if edge and edge_floors:
        edge.append(f"bare fan-out floor {statistics.median(edge_floors):.1f}x")
    if edge:
        text += "; from 16 to 256 actors (16x): " + ", ".join(edge)
    return text


#: The issue's bound on our call_one, in round trips of the Pipe measured beside it.
CALL_ONE_OVER_PIPE = 1.5


def floor_text(impls: list[Impl], aggs: dict[str, dict[str, dict]]) -> str | None:
    """Each implementation's call_one, and its CPU, over the multiprocessing.Pipe round
    trip measured in the same runs (the floor), with our target for the first."""
    clauses = []
    for key, floor, what in (
        (CALL_ONE, PIPE, "call_one"),
        (CALL_ONE_CPU, PIPE_CPU, "CPU per call_one"),
    ):
        parts = [
            f"{i.title} {aggs[i.key][key]['value'] / aggs[i.key][floor]['value']:.2f}x"
            for i in impls
            if aggs[i.key][key]["value"] and aggs[i.key][floor]["value"]
        ]
        if parts:
            clauses.append(f"{what} " + ", ".join(parts))
    if not clauses:
        return None
    text = "over the Pipe round trip of the same runs: " + "; ".join(clauses)
    ours = aggs.get("ours", {})
    if ours.get(CALL_ONE, {}).get("value") and ours.get(PIPE, {}).get("value"):
        over = ours[CALL_ONE]["value"] / ours[PIPE]["value"]
        verdict = "met" if over <= CALL_ONE_OVER_PIPE else "missed"
        text += f" (target for our call_one <= {CALL_ONE_OVER_PIPE}x: {verdict})"
    return text


def plot(labels: dict[str, str], aggs: dict[str, dict[str, dict]], path: Path, title: str) -> None:
    """Call latency and spawn time against the number of actors, one line for each
    implementation (``labels``: implementation key -> legend text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
    calls = [(1, CALL_1), (4, CALL_4), (16, CALL_16), (64, CALL_64), (256, CALL_256)]
    spawns = [(4, SPAWN_4), (16, SPAWN_16), (64, SPAWN_64), (256, SPAWN_256)]
    for key, label in labels.items():
        a = aggs[key]
        for ax, series, scale in ((left, calls, 1e-3), (right, spawns, 1.0)):
            pts = [(n, a[k]["value"] * scale) for n, k in series if a[k]["value"] is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", label=label)
    floor = next((a for a in aggs.values() if a[RAW_16]["value"] and a[RAW_64]["value"]), None)
    if floor is not None:
        points = [(n, floor[k]["value"]) for n, k in RAW_FANOUT.items() if floor[k]["value"]]
        left.plot(
            [n for n, _ in points],
            [v * 1e-3 for _, v in points],
            linestyle="--",
            color="gray",
            marker="x",
            label="bare processes on sockets (floor)",
        )
    left.set_title("call() latency")
    left.set_ylabel("ms, median")
    right.set_title("spawn N procs -> first reply")
    right.set_ylabel("s")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("number of actors (one per proc)")
        ax.set_xticks([1, 4, 16, 64, 256] if ax is left else [4, 16, 64, 256])
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every run")
    parser.add_argument("--impls", default="ours,upstream,ray", help="which to run, in order")
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results"), help="output folder")
    parser.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--upstream-venv", default=str(ROOT / ".bench" / "venv-upstream"))
    parser.add_argument("--ray-venv", default=str(ROOT / ".bench" / "venv-ray"))
    parser.add_argument(
        "--no-precompile",
        action="store_true",
        help="leave this project's bytecode as it is (by default it is compiled first)",
    )
    parser.add_argument(
        "--run-timeout", type=int, default=240, help="seconds one run may take (default 240)"
    )
    parser.add_argument(
        "--replot", metavar="JSON", help="only redraw the plot of a compare.json, into --out"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        out.mkdir(parents=True, exist_ok=True)
        plot(saved["plot_labels"], saved["median"], out / "latency.png", saved["plot_title"])
        print(f"wrote {out / 'latency.png'}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    impls = implementations(args)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = loadavg()
    t_start = time.perf_counter()

    unavailable = {i.key: i.missing() for i in impls}
    ours = next((i for i in impls if i.key == "ours"), None)
    if ours is not None and not unavailable["ours"] and not args.no_precompile:
        print(f"precompiled ours: {precompile_ours(ours.python)}")
    runs: dict[str, list[dict]] = {i.key: [] for i in impls}
    active = [i for i in impls if not unavailable[i.key]]
    for rep in range(args.reps):
        shift = rep % max(len(active), 1)
        for impl in active[shift:] + active[:shift]:
            print(f"rep {rep + 1}/{args.reps}: {impl.title} ...", end=" ", flush=True)
            result = run_one(impl, rep, args, out)
            runs[impl.key].append(result)
            print(f"{result['wall_s']:.0f} s, {result['status']}", flush=True)
        # An implementation that timed out would likely time out again: stop running it.
        active = [i for i in active if "timed out" not in runs[i.key][-1]["status"]]

    aggs = {i.key: aggregate(runs[i.key], unavailable[i.key]) for i in impls}
    versions = {}
    for i in impls:
        v = next((r.get("version") for r in runs[i.key] if r.get("version")), None)
        versions[i.key] = v or unavailable[i.key] or "unknown"
    elapsed = time.perf_counter() - t_start
    load_end = loadavg()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    machine = (
        f"{os.cpu_count()} CPUs, {mem_gib:.0f} GiB, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )
    loads = [r["loadavg_1min_before_run"] for rs in runs.values() for r in rs]
    loads = [x for x in loads if x is not None]
    busy = [r["cpu_busy_before_run"] for rs in runs.values() for r in rs]
    busy = [x for x in busy if x is not None]
    load_text = (
        f"load average (1 min) at the start {load_start}; CPU busy in the 0.5 s before "
        f"each run {100 * min(busy, default=0):.0f}-{100 * max(busy, default=0):.0f}%"
    )

    print(f"\nMonarch vs upstream Monarch vs Ray ({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)")
    print(machine)
    print(load_text)
    for i in impls:
        done = sum(1 for r in runs[i.key] if r["status"] == "ok")
        print(f"  {i.title}: {versions[i.key]}; {done}/{len(runs[i.key])} runs completed")
    mode = "quick" if args.quick else "full"
    print(
        f"median of {args.reps} {mode} runs per implementation, alternating; ratio = ours / "
        "peer (better: lower for times and memory, higher for rates)\n"
    )
    rows, notes = table(impls, aggs)
    print_rows(rows)
    for k, note in enumerate(notes, 1):
        print(f"[{k}] {note}")
    growth = growth_text(impls, aggs)
    if growth:
        print(growth)
    over_floor = floor_text(impls, aggs)
    if over_floor:
        print(over_floor)

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine,
        "load": {
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "loadavg_before_runs": loads,
            "cpu_busy_before_runs": busy,
        },
        "mode": mode,
        "reps": args.reps,
        "versions": versions,
        "targets": {k: {"bound": b, "kind": kind} for k, (b, kind) in TARGETS.items()},
        "metrics": {k: {"name": n, "unit": u, "better": b} for k, (n, u, b) in CATALOGUE.items()},
        "median": aggs,
        "runs": runs,
        "table": rows,
        "plot_labels": {
            i.key: f"{i.title} ({versions[i.key].split(' (')[0]})"
            for i in impls
            if not unavailable[i.key]
        },
        "plot_title": f"{started:%Y-%m-%d}, {machine}; {load_text}",
        "notes": notes,
        "growth": growth,
        "over_floor": over_floor,
    }
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    png = out / "latency.png"
    try:
        plot(result["plot_labels"], aggs, png, result["plot_title"])
        print(f"\nwrote {out / 'compare.json'} and {png}")
    except Exception as e:  # matplotlib missing, say: the table and JSON still stand
        print(f"\nwrote {out / 'compare.json'}; no plot ({type(e).__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
