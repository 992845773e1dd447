"""Actor benchmarks: the latency and throughput of the Python actor API on one host.

Run it with ``python benches/actor_bench.py`` (``make bench`` does, after a release build
of the extension). It measures, in one run and on this machine:

* ``spawn 4 procs -> first reply``: ``this_host().spawn_procs(per_host={"procs": 4})``,
  ``spawn("bench", Echo)`` and ``mesh.ping.call().get()``; the median of a few spawns
  (each proc mesh is stopped afterwards, outside the timed part), and the first of them
  on its own;
* ``call_one round trip``: ``actor.ping.call_one(i).get()`` on a 1-actor slice, one call
  at a time; the median of many calls, after a warm-up;
* ``call to 4 ranks``: ``mesh.ping.call(i).get()`` on the 4-actor mesh; the median;
* ``pipelined call_one``: N ``call_one`` calls issued back to back, then every Future
  ``get()``; calls per second, the median of a few runs;
* ``multiprocessing.Pipe round trip``: a raw Python reference, a child process echoing
  objects over a ``multiprocessing.Pipe``; the median.

It uses only the public ``monarch.actor`` API, so it runs unchanged against upstream
Monarch (the ``torchmonarch`` package). Options: ``--quick`` (fewer iterations, for smoke
tests), ``--json PATH`` (also write the results as JSON), ``--check`` (exit 1 when a
metric is over its budget; by default the exit status does not depend on the timings).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    """The benchmark actor: one endpoint that sends its argument back."""

    @endpoint
    def ping(self, value: int = 0) -> int:
        return value


@dataclass
class Params:
    """How much work each measurement does."""

    spawn_repeats: int
    call_one_warmup: int
    call_one_iters: int
    call_warmup: int
    call_iters: int
    pipelined_calls: int
    pipelined_runs: int
    pipe_warmup: int
    pipe_iters: int


FULL = Params(
    spawn_repeats=5,
    call_one_warmup=500,
    call_one_iters=5000,
    call_warmup=200,
    call_iters=2000,
    pipelined_calls=10000,
    pipelined_runs=5,
    pipe_warmup=500,
    pipe_iters=5000,
)
QUICK = Params(
    spawn_repeats=2,
    call_one_warmup=50,
    call_one_iters=300,
    call_warmup=20,
    call_iters=100,
    pipelined_calls=1000,
    pipelined_runs=2,
    pipe_warmup=50,
    pipe_iters=300,
)


@dataclass
class Metric:
    """One row of the table. ``direction`` is ``"max"`` when the value must stay at or
    below the budget, ``"min"`` when it must reach it, ``None`` when there is no budget."""

    name: str
    value: float
    unit: str
    budget: float | None = None
    direction: str | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """The value divided by the budget (``None`` without a budget)."""
        return None if self.budget is None else self.value / self.budget

    @property
    def verdict(self) -> str:
        if self.budget is None:
            return "info"
        ok = self.value <= self.budget if self.direction == "max" else self.value >= self.budget
        return "OK" if ok else "OVER"


# Metric names, also what the smoke test looks for in the output.
SPAWN = "spawn 4 procs -> first reply"
SPAWN_COLD = "first spawn (cold)"
CALL_ONE = "call_one round trip"
CALL_4 = "call to 4 ranks"
PIPELINED = "pipelined call_one"
PIPE = "multiprocessing.Pipe round trip"
METRIC_NAMES = (SPAWN, CALL_ONE, CALL_4, PIPELINED, PIPE)


def _pipe_echo(conn: Connection) -> None:
    """The reference child: echo every object back until ``None``."""
    while True:
        obj = conn.recv()
        if obj is None:
            break
        conn.send(obj)
    conn.close()


def measure_pipe(p: Params) -> float:
    """The median ``multiprocessing.Pipe`` round trip to a child process, in seconds.

    The child is started with the ``spawn`` method, so it does not inherit the monarch
    runtime's threads (``fork`` after they start is unsafe)."""
    mp = multiprocessing.get_context("spawn")
    parent, child = mp.Pipe()
    proc = mp.Process(target=_pipe_echo, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        for i in range(p.pipe_warmup):
            parent.send(i)
            parent.recv()
        samples = []
        for i in range(p.pipe_iters):
            t0 = time.perf_counter()
            parent.send(i)
            parent.recv()
            samples.append(time.perf_counter() - t0)
    finally:
        parent.send(None)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    return statistics.median(samples)


def measure_spawn(p: Params) -> list[float]:
    """Seconds from ``spawn_procs`` to the first reply of all 4 actors, per repeat."""
    times = []
    for _ in range(p.spawn_repeats):
        gc.collect()
        t0 = time.perf_counter()
        procs = this_host().spawn_procs(per_host={"procs": 4})
        try:
            mesh = procs.spawn("bench", Echo)
            replies = mesh.ping.call(7).get()
            times.append(time.perf_counter() - t0)
            assert list(replies.values()) == [7] * 4, replies
        finally:
            procs.stop().get()
    return times


def measure_call_one(actor: Echo, p: Params) -> float:
    """The median ``call_one(...).get()`` round trip, in seconds."""
    for i in range(p.call_one_warmup):
        actor.ping.call_one(i).get()
    gc.collect()
    samples = []
    for i in range(p.call_one_iters):
        t0 = time.perf_counter()
        actor.ping.call_one(i).get()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_call(mesh: Echo, p: Params) -> float:
    """The median ``call(...).get()`` latency to every rank of ``mesh``, in seconds."""
    for i in range(p.call_warmup):
        mesh.ping.call(i).get()
    gc.collect()
    samples = []
    for i in range(p.call_iters):
        t0 = time.perf_counter()
        mesh.ping.call(i).get()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_pipelined(actor: Echo, p: Params) -> float:
    """The median rate, in calls per second, of ``pipelined_calls`` ``call_one`` calls
    issued back to back and then collected."""
    n = p.pipelined_calls
    rates = []
    for _ in range(p.pipelined_runs):
        gc.collect()
        t0 = time.perf_counter()
        futures = [actor.ping.call_one(i) for i in range(n)]
        for i, fut in enumerate(futures):
            if fut.get() != i:
                raise AssertionError(f"pipelined call {i} answered out of order")
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def run(p: Params) -> list[Metric]:
    # The reference first, while the process has no monarch runtime yet.
    pipe = measure_pipe(p)

    this_host()  # bootstrap the client outside the timed part
    spawn_times = measure_spawn(p)
    spawn = statistics.median(spawn_times)

    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        mesh = procs.spawn("bench", Echo)
        mesh.ping.call().get()
        actor = mesh.slice(procs=0)
        call_one = measure_call_one(actor, p)
        call_4 = measure_call(mesh, p)
        pipelined = measure_pipelined(actor, p)
    finally:
        procs.stop().get()

    return [
        Metric(
            SPAWN,
            spawn,
            "s",
            0.3,
            "max",
            f"median of {len(spawn_times)} spawns",
        ),
        Metric(SPAWN_COLD, spawn_times[0], "s", note="the first of them"),
        Metric(CALL_ONE, call_one * 1e6, "us", 150.0, "max", f"median of {p.call_one_iters}"),
        Metric(CALL_4, call_4 * 1e6, "us", note=f"median of {p.call_iters}"),
        Metric(
            PIPELINED,
            pipelined,
            "calls/s",
            20000.0,
            "min",
            f"{p.pipelined_calls} calls, median of {p.pipelined_runs} runs",
        ),
        Metric(PIPE, pipe * 1e6, "us", note=f"reference; median of {p.pipe_iters}"),
    ]


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "us":
        return f"{value:.1f} us"
    return f"{value:,.0f} {unit}"


def print_table(metrics: list[Metric]) -> None:
    rows = [("metric", "value", "budget", "value/budget", "verdict", "note")]
    for m in metrics:
        if m.budget is None:
            budget = ratio = "-"
        else:
            budget = ("<= " if m.direction == "max" else ">= ") + _fmt(m.budget, m.unit)
            ratio = f"{m.ratio:.2f}"
        name = f"  {m.name}" if m.name == SPAWN_COLD else m.name  # a detail of SPAWN
        rows.append((name, _fmt(m.value, m.unit), budget, ratio, m.verdict, m.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    pipe = next(m for m in metrics if m.name == PIPE)
    call_one = next(m for m in metrics if m.name == CALL_ONE)
    print(f"\ncall_one round trip = {call_one.value / pipe.value:.1f}x the Pipe round trip")


def _loadavg() -> float | None:
    """The 1-minute load average, a hint that other work shared the CPUs (timings on a
    loaded machine are not comparable)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _bytecode_cached() -> bool | None:
    """Whether monarch's modules have cached bytecode. Without it (for example with
    ``PYTHONDONTWRITEBYTECODE=1`` on a fresh checkout) every spawned proc compiles them
    from source, which shows in the spawn time."""
    try:
        import importlib.util

        import monarch.actor

        return os.path.exists(importlib.util.cache_from_source(monarch.actor.__file__))
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a metric is over its budget"
    )
    args = parser.parse_args(argv)
    params = QUICK if args.quick else FULL

    started = datetime.datetime.now(datetime.timezone.utc)
    load = _loadavg()
    cached = _bytecode_cached()
    t0 = time.perf_counter()
    metrics = run(params)
    elapsed = time.perf_counter() - t0

    mode = "quick" if args.quick else "full"
    load_text = "unknown" if load is None else f"{load:.2f}"
    cached_text = "unknown" if cached is None else "yes" if cached else "no"
    print(f"monarch actor benchmarks ({mode} run, {elapsed:.1f} s)")
    print(
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average before "
        f"the run {load_text}, monarch bytecode cached: {cached_text}\n"
    )
    print_table(metrics)

    if args.json:
        result = {
            "date": started.isoformat(timespec="seconds"),
            "mode": mode,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_1min_before": load,
                "monarch_bytecode_cached": cached,
            },
            "params": asdict(params),
            "elapsed_s": elapsed,
            "metrics": [{**asdict(m), "ratio": m.ratio, "verdict": m.verdict} for m in metrics],
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    over = [m.name for m in metrics if m.verdict == "OVER"]
    if over and args.check:
        print(f"\nover budget: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
