"""Actor benchmarks: the latency, throughput and footprint of the Python actor API on one
host.

Run it with ``python benches/actor_bench.py``; ``make bench`` runs it through
``benches/compare.py``, which alternates it with upstream Monarch and Ray. It uses only
the public ``monarch.actor`` API, so the same file runs unchanged against upstream
Monarch (the ``torchmonarch`` package). It measures, in one run:

* ``spawn N procs -> first reply`` (N = 4, 16, 64):
  ``this_host().spawn_procs(per_host={"procs": N})``, ``spawn("bench", Echo)`` and
  ``mesh.ping.call().get()``. For N = 4 the median of a few spawns, and the first of them
  (cold) on its own; 16 and 64 once each (their meshes then serve the calls below);
* ``call_one round trip``: ``actor.ping.call_one(i).get()`` on a 1-actor slice, one call
  at a time; the median of many calls, after a warm-up;
* ``call() to N actors`` (N = 1, 4, 16, 64): ``mesh.ping.call(i).get()``; the median;
* ``broadcast to 16 actors``: ``mesh.ping.broadcast(i)`` issued back to back, then one
  ``call()`` that every actor handles after them; broadcasts per second;
* ``pipelined call_one``: many ``call_one`` calls issued back to back, then every
  Future's ``get()``; calls per second, the median of a few runs;
* ``echo`` of a 1 KiB, 1 MiB and 64 MiB ``bytes`` payload: ``call_one(payload)`` to an
  actor that returns it; the payload size over the median round trip, in GB/s;
* ``failure detection (SIGKILL)``: a call is pending on each of 10 procs (the endpoint
  sleeps); the procs are killed with SIGKILL one after another, 0.1 s apart, and the
  median time from a kill until its call's ``get()`` raises is taken; no error within
  20 s is reported as not supported;
* ``RSS per proc``: the median ``VmRSS`` of the 16 proc processes (from ``/proc``),
  after the actor is spawned and has answered calls;
* ``multiprocessing.Pipe round trip``: a raw Python reference, a child process echoing
  objects over a ``multiprocessing.Pipe``; the median.

Every wait has a timeout, and a metric that fails or cannot run is reported with the
reason instead of a value. Options: ``--quick`` (fewer iterations and no 64-proc mesh or
64 MiB payload, for smoke tests), ``--json PATH`` (also write the results as JSON,
updated after every metric), ``--check`` (exit 1 when a metric is over this project's
budget; by default the exit status does not depend on the timings).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import asdict

from bench_common import (
    BROADCAST,
    BROADCAST_256,
    CALL_1,
    CALL_4,
    CALL_16,
    CALL_64,
    CALL_256,
    CALL_ONE,
    CALL_ONE_CPU,
    CATALOGUE,
    ECHO_SIZES,
    EDGE,
    EDGE_KEYS,
    FAILURE,
    FAILURE_TIMEOUT_S,
    FULL,
    MESH_EXTRA_KEYS,
    PIPE,
    PIPELINED,
    QUICK,
    RSS,
    SKIPPED,
    SPAWN_4,
    SPAWN_16,
    SPAWN_64,
    SPAWN_256,
    SPAWN_FIRST,
    STOP_64,
    STOP_KEYS,
    WAIT_TIMEOUT_S,
    Metric,
    Params,
    Recorder,
    add_pipe,
    add_raw_fanout,
    cpu_per_call,
    fmt,
    mesh_not_run,
    other_rss_mib,
    print_rows,
    rss_mib,
)

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    """The benchmark actor."""

    @endpoint
    def ping(self, value: object = 0) -> object:
        """Send the argument back."""
        return value

    @endpoint
    def getpid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> float:
        """Sleep, so that a call stays pending (failure detection)."""
        time.sleep(seconds)
        return seconds


#: This project's own budgets (not the comparison targets, which compare.py holds).
BUDGETS = {SPAWN_4: 0.3, CALL_ONE: 150.0, PIPELINED: 20000.0, FAILURE: 1.0}


def spawn_timed(n: int):
    """Spawn ``n`` procs with an ``Echo`` each and wait for every first reply. Returns
    ``(procs, mesh, seconds)``; the caller stops ``procs``."""
    gc.collect()
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": n})
    try:
        mesh = procs.spawn("bench", Echo)
        replies = mesh.ping.call(7).get(timeout=WAIT_TIMEOUT_S)
        seconds = time.perf_counter() - t0
        assert list(replies.values()) == [7] * n, replies
    except BaseException:
        stop(procs)
        raise
    return procs, mesh, seconds


def stop(procs) -> bool:
    """Stop a proc mesh, waiting a bounded time (what is left, the driver cleans up).
    Whether the stop completed."""
    try:
        procs.stop().get(timeout=30)
    except Exception as e:
        print(f"warning: stopping a proc mesh failed: {type(e).__name__}: {e}", file=sys.stderr)
        return False
    return True


def measure_calls(endpoint_call, warmup: int, iters: int) -> float:
    """The median latency of ``endpoint_call(i).get()``, in seconds."""
    for i in range(warmup):
        endpoint_call(i).get(timeout=WAIT_TIMEOUT_S)
    gc.collect()
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        endpoint_call(i).get(timeout=WAIT_TIMEOUT_S)
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
            if fut.get(timeout=WAIT_TIMEOUT_S) != i:
                raise AssertionError(f"pipelined call {i} answered out of order")
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure_broadcast(mesh: Echo, n: int) -> float:
    """Broadcasts per second: ``n`` ``broadcast()`` calls to the mesh back to back, then
    one ``call()``, which every actor handles after them (per-sender order)."""
    mesh.ping.call(0).get(timeout=WAIT_TIMEOUT_S)
    gc.collect()
    t0 = time.perf_counter()
    for i in range(n):
        mesh.ping.broadcast(i)
    mesh.ping.call(0).get(timeout=WAIT_TIMEOUT_S)
    return n / (time.perf_counter() - t0)


def measure_echo(actor: Echo, size: int, iters: int) -> float:
    """The median round trip, in seconds, of echoing a ``size``-byte payload."""
    payload = os.urandom(size)
    actor.ping.call_one(payload).get(timeout=WAIT_TIMEOUT_S)
    gc.collect()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        back = actor.ping.call_one(payload).get(timeout=WAIT_TIMEOUT_S)
        samples.append(time.perf_counter() - t0)
        if len(back) != size:
            raise AssertionError(f"echo of {size} bytes came back with {len(back)}")
    return statistics.median(samples)


def measure_failure(rec: Recorder, kills: int) -> None:
    """Kill ``kills`` procs, 0.1 s apart, each with a call pending on it; the median
    time from a kill to its pending call raising."""
    import threading

    import monarch.actor as api

    failures: list[float] = []
    # The default hook ends the client; the benchmark handles the failures itself.
    api.unhandled_fault_hook = lambda failure: failures.append(time.perf_counter())
    procs = this_host().spawn_procs(per_host={"procs": kills})
    try:
        mesh = procs.spawn("victims", Echo)
        pids = mesh.getpid.call().get(timeout=WAIT_TIMEOUT_S).values()
        pending = [mesh.slice(procs=i).nap.call_one(60.0) for i in range(kills)]
        time.sleep(0.2)  # let the calls reach the actors
        killed_at: list[float] = []

        def killer() -> None:
            for pid in pids:
                killed_at.append(time.perf_counter())
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        latencies: list[float] = []
        # In kill order: each call raises no earlier than the one killed before it.
        for i, fut in enumerate(pending):
            try:
                fut.get(timeout=FAILURE_TIMEOUT_S)
            except TimeoutError:
                rec.fail(
                    [FAILURE],
                    f"not supported yet: a pending call did not raise within "
                    f"{FAILURE_TIMEOUT_S:.0f} s of its proc's SIGKILL",
                )
                return
            except Exception:
                latencies.append(time.perf_counter() - killed_at[i])
            else:
                rec.fail([FAILURE], "a pending call returned although its proc was killed")
                return
        thread.join(10)
        rec.add(
            Metric(
                FAILURE,
                statistics.median(latencies),
                note=f"median of {kills} kills; max {max(latencies):.3f} s",
                budget=BUDGETS[FAILURE],
            )
        )
    finally:
        stop(procs)
        time.sleep(0.2)  # late failure reports still find the benchmark's hook


def run(p: Params, rec: Recorder) -> None:
    # The reference first, while the process has no monarch runtime yet.
    add_pipe(p, rec)
    add_raw_fanout(p, rec)

    this_host()  # bootstrap the client outside the timed part

    def small_mesh() -> None:
        times: list[float] = []
        procs = None
        for _ in range(p.spawn_repeats):
            if procs is not None:
                stop(procs)
            procs, mesh, seconds = spawn_timed(4)
            times.append(seconds)
        assert procs is not None
        rec.add(Metric(SPAWN_4, statistics.median(times), f"median of {len(times)}",
                       budget=BUDGETS[SPAWN_4], samples=times))  # fmt: skip
        rec.add(Metric(SPAWN_FIRST, times[0], "the first of them"))
        try:
            actor = mesh.slice(procs=0)
            call_one = measure_calls(actor.ping.call_one, p.call_one_warmup, p.call_one_iters)
            rec.add(Metric(CALL_ONE, call_one * 1e6, f"median of {p.call_one_iters}",
                           budget=BUDGETS[CALL_ONE]))  # fmt: skip
            pid = actor.getpid.call_one().get(timeout=WAIT_TIMEOUT_S)
            cpu = cpu_per_call(
                lambda i: actor.ping.call_one(i).get(timeout=WAIT_TIMEOUT_S),
                p.call_one_iters,
                [os.getpid(), pid],
            )
            rec.add(Metric(CALL_ONE_CPU, cpu * 1e6, f"over {p.call_one_iters} calls"))
            call_1 = measure_calls(actor.ping.call, p.call_one_warmup, p.call_one_iters)
            rec.add(Metric(CALL_1, call_1 * 1e6, f"median of {p.call_one_iters}"))
            n4 = p.call_iters[4]
            call_4 = measure_calls(mesh.ping.call, n4 // 10, n4)
            rec.add(Metric(CALL_4, call_4 * 1e6, f"median of {n4}"))
            rate = measure_pipelined(actor, p)
            note = f"{p.pipelined_calls} calls, median of {p.pipelined_runs} runs"
            rec.add(Metric(PIPELINED, rate, note, budget=BUDGETS[PIPELINED]))
            for key, size in ECHO_SIZES.items():
                if key not in p.echo_iters:
                    rec.fail([key], SKIPPED)
                    continue
                iters = p.echo_iters[key]
                rtt = measure_echo(actor, size, iters)
                note = f"round trip {fmt(rtt * 1e6, 'us')}, median of {iters}"
                rec.add(Metric(key, size / rtt / 1e9, note))
        finally:
            stop(procs)

    def mesh_of(n: int, spawn_key: str, call_key: str) -> None:
        why = mesh_not_run(p, rec, n)
        if why is not None:
            rec.fail([spawn_key, call_key, *MESH_EXTRA_KEYS.get(n, [])], why)
            return
        procs, mesh, seconds = spawn_timed(n)
        try:
            rec.add(Metric(spawn_key, seconds, "once per run"))
            iters = p.call_iters[n]
            call_n = measure_calls(mesh.ping.call, max(iters // 10, 2), iters)
            rec.add(Metric(call_key, call_n * 1e6, f"median of {iters}"))
            if n == 16:
                rate = measure_broadcast(mesh, p.broadcasts)
                rec.add(Metric(BROADCAST, rate, f"{p.broadcasts} broadcasts, then one call()"))
                pids = list(mesh.getpid.call().get(timeout=WAIT_TIMEOUT_S).values())
                rss = [r for r in map(rss_mib, pids) if r is not None]
                other = other_rss_mib(pids)
                note = f"median of {len(rss)} procs; other child processes {other:.0f} MiB in all"
                rec.add(Metric(RSS, statistics.median(rss), note, samples=rss))
            if n == EDGE:
                rate = measure_broadcast(mesh, p.broadcasts_edge)
                note = f"{p.broadcasts_edge} broadcasts, then one call()"
                rec.add(Metric(BROADCAST_256, rate, note))
        finally:
            t0 = time.perf_counter()
            stopped = stop(procs)
            stop_key = STOP_KEYS.get(n)
            if stop_key is not None and stopped:
                rec.add(Metric(stop_key, time.perf_counter() - t0, "until every proc exited"))
            elif stop_key is not None:
                rec.fail([stop_key], "the stop did not complete within 30 s")

    small_keys = [SPAWN_4, SPAWN_FIRST, CALL_ONE, CALL_ONE_CPU, CALL_1, CALL_4, PIPELINED]
    rec.guard([*small_keys, *ECHO_SIZES], small_mesh)
    rec.guard([SPAWN_16, CALL_16, BROADCAST, RSS], lambda: mesh_of(16, SPAWN_16, CALL_16))
    rec.guard([SPAWN_64, CALL_64, STOP_64], lambda: mesh_of(64, SPAWN_64, CALL_64))
    rec.guard(EDGE_KEYS, lambda: mesh_of(EDGE, SPAWN_256, CALL_256))
    # Last: a killed proc may leave the runtime in a worse state than the others need.
    rec.guard([FAILURE], lambda: measure_failure(rec, p.failure_kills))


def print_table(metrics: list[Metric]) -> None:
    rows = [("metric", "value", "budget", "value/budget", "verdict", "note")]
    order = list(CATALOGUE)
    for m in sorted(metrics, key=lambda m: order.index(m.key)):
        if m.budget is None or m.value is None:
            budget = ratio = "-"
        else:
            budget = ("<= " if m.better == "lower" else ">= ") + fmt(m.budget, m.unit)
            ratio = f"{m.ratio:.2f}"
        name = f"  {m.name}" if m.key == SPAWN_FIRST else m.name  # a detail of SPAWN_4
        note = m.error if m.error else m.note
        rows.append((name, fmt(m.value, m.unit), budget, ratio, m.verdict, note))
    print_rows(rows)
    by_key = {m.key: m for m in metrics}
    pipe, call_one = by_key.get(PIPE), by_key.get(CALL_ONE)
    if pipe and call_one and pipe.value and call_one.value:
        print(f"\ncall_one round trip = {call_one.value / pipe.value:.1f}x the Pipe round trip")


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


def _implementation() -> tuple[str, str]:
    """Which monarch this is: upstream's ``torchmonarch`` or this repository's."""
    import importlib.metadata

    import monarch

    for dist in ("torchmonarch", "monarch"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return dist, f"{dist} {version} ({os.path.dirname(monarch.__file__)})"
    return "monarch", f"unknown version ({os.path.dirname(monarch.__file__)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a metric is over its budget"
    )
    args = parser.parse_args(argv)
    params = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"

    dist, version = _implementation()
    cached = _bytecode_cached()
    rec = Recorder(dist, version, mode, asdict(params), args.json)
    rec.flush(bytecode_cached=cached)
    load = rec.info["machine"]["loadavg_1min_before"]
    try:
        run(params, rec)
    except KeyboardInterrupt:
        # The runtime interrupts the main thread on an unhandled supervision event.
        rec.flush(interrupted=True)
        raise
    elapsed = time.perf_counter() - rec.t0
    rec.flush()

    load_text = "unknown" if load is None else f"{load:.2f}"
    cached_text = "unknown" if cached is None else "yes" if cached else "no"
    print(f"monarch actor benchmarks ({mode} run, {elapsed:.1f} s): {version}")
    print(
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average before "
        f"the run {load_text}, monarch bytecode cached: {cached_text}\n"
    )
    print_table(rec.metrics)

    over = [m.name for m in rec.metrics if m.verdict == "OVER"]
    if over and args.check:
        print(f"\nover budget: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
