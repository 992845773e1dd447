"""The actor benchmarks of ``actor_bench.py``, measured on Ray with Ray's own public API.

``benches/compare.py`` runs it under the Ray venv (``.bench/venv-ray``, made by
``make bench``). The metrics and their names are those of ``actor_bench.py``, and so are
the iteration counts (``bench_common.FULL`` / ``QUICK``); what each one does in Ray:

* a proc is a Ray actor, which Ray runs in a worker process of its own; ``spawn N procs
  -> first reply`` is ``[Echo.remote() for _ in range(N)]`` then ``ray.get`` of one
  ``ping`` to each (``ray.init`` is done before, outside the timed part, as the monarch
  client's bootstrap is). Actors are stopped with ``ray.kill``, untimed, and their
  processes waited for;
* ``call_one round trip``: ``ray.get(actor.ping.remote(i))``;
* ``call() to N actors``: ``ray.get([a.ping.remote(i) for a in actors])``;
* ``pipelined call_one``: N ``actor.ping.remote(i)`` then one ``ray.get`` of every ref;
* ``echo``: ``ray.get(actor.ping.remote(payload))`` (Ray moves payloads over 100 KiB
  through its object store);
* ``failure detection (SIGKILL)``: the actor's worker process is killed while a
  ``nap`` call is pending; the time until ``ray.get`` raises;
* ``RSS per proc``: the median ``VmRSS`` of the 16 actors' worker processes; Ray's
  daemons (GCS, raylet, idle workers) are given in the note.

Options: ``--quick``, ``--json PATH`` as in ``actor_bench.py``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import asdict

# No usage-statistics upload (there is no network anyway), before Ray reads its config.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
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
    wait_gone,
)


@ray.remote
class Echo:
    """The benchmark actor, as ``actor_bench.Echo``."""

    def ping(self, value: object = 0) -> object:
        return value

    def getpid(self) -> int:
        return os.getpid()

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def spawn_timed(n: int):
    """Start ``n`` actors and wait for a reply from each. Returns ``(actors, seconds)``."""
    gc.collect()
    t0 = time.perf_counter()
    actors = [Echo.remote() for _ in range(n)]
    try:
        replies = ray.get([a.ping.remote(7) for a in actors], timeout=WAIT_TIMEOUT_S)
        seconds = time.perf_counter() - t0
        assert replies == [7] * n, replies
    except BaseException:
        stop(actors)
        raise
    return actors, seconds


def stop(actors) -> bool:
    """Kill the actors and wait (bounded) for their worker processes to exit, so that
    the next measurement does not share the CPUs with their teardown. Whether they all
    exited."""
    try:
        pids = ray.get([a.getpid.remote() for a in actors], timeout=30)
    except Exception:
        pids = []
    for a in actors:
        ray.kill(a)
    if not wait_gone(pids, 30):
        print("warning: Ray actor processes still alive 30 s after ray.kill", file=sys.stderr)
        return False
    return bool(pids)


def measure_calls(issue, warmup: int, iters: int) -> float:
    """The median latency of ``ray.get(issue(i))``, in seconds."""
    for i in range(warmup):
        ray.get(issue(i), timeout=WAIT_TIMEOUT_S)
    gc.collect()
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        ray.get(issue(i), timeout=WAIT_TIMEOUT_S)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_pipelined(actor, p: Params) -> float:
    n = p.pipelined_calls
    rates = []
    for _ in range(p.pipelined_runs):
        gc.collect()
        t0 = time.perf_counter()
        refs = [actor.ping.remote(i) for i in range(n)]
        if ray.get(refs, timeout=WAIT_TIMEOUT_S) != list(range(n)):
            raise AssertionError("pipelined calls answered out of order")
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure_broadcast(actors, n: int) -> float:
    """Rounds per second of ``ping.remote(i)`` to every actor without waiting (Ray has
    no broadcast: a loop), then one call per actor that runs after them."""
    ray.get([a.ping.remote(0) for a in actors], timeout=WAIT_TIMEOUT_S)
    t0 = time.perf_counter()
    for i in range(n):
        for a in actors:
            a.ping.remote(i)
    ray.get([a.ping.remote(0) for a in actors], timeout=WAIT_TIMEOUT_S)
    return n / (time.perf_counter() - t0)


def measure_echo(actor, size: int, iters: int) -> float:
    payload = os.urandom(size)
    ray.get(actor.ping.remote(payload), timeout=WAIT_TIMEOUT_S)
    gc.collect()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        back = ray.get(actor.ping.remote(payload), timeout=WAIT_TIMEOUT_S)
        samples.append(time.perf_counter() - t0)
        if len(back) != size:
            raise AssertionError(f"echo of {size} bytes came back with {len(back)}")
    return statistics.median(samples)


def measure_failure(rec: Recorder) -> None:
    actor = Echo.remote()
    pid = ray.get(actor.getpid.remote(), timeout=WAIT_TIMEOUT_S)
    pending = actor.nap.remote(60.0)
    time.sleep(0.2)  # let the call reach the actor
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    try:
        ray.get(pending, timeout=FAILURE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        rec.fail([FAILURE], f"the pending call did not raise within {FAILURE_TIMEOUT_S:.0f} s")
    except Exception as e:
        seconds = time.perf_counter() - t0
        rec.add(Metric(FAILURE, seconds, note=f"ray.get raised {type(e).__name__}"))
    else:
        rec.fail([FAILURE], "the pending call returned although its process was killed")
    finally:
        ray.kill(actor)


def run(p: Params, rec: Recorder) -> None:
    add_pipe(p, rec)
    add_raw_fanout(p, rec)

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        _run(p, rec)
    finally:
        ray.shutdown()


def _run(p: Params, rec: Recorder) -> None:
    def small() -> None:
        times: list[float] = []
        actors = None
        for _ in range(p.spawn_repeats):
            if actors is not None:
                stop(actors)
            actors, seconds = spawn_timed(4)
            times.append(seconds)
        assert actors is not None
        rec.add(Metric(SPAWN_4, statistics.median(times), f"median of {len(times)}"))
        rec.add(Metric(SPAWN_FIRST, times[0], "the first of them"))
        try:
            actor = actors[0]
            call_one = measure_calls(
                lambda i: actor.ping.remote(i), p.call_one_warmup, p.call_one_iters
            )
            rec.add(Metric(CALL_ONE, call_one * 1e6, f"median of {p.call_one_iters}"))
            pid = ray.get(actor.getpid.remote(), timeout=WAIT_TIMEOUT_S)
            cpu = cpu_per_call(
                lambda i: ray.get(actor.ping.remote(i), timeout=WAIT_TIMEOUT_S),
                p.call_one_iters,
                [os.getpid(), pid],
            )
            note = f"over {p.call_one_iters} calls; the driver and the actor's worker only"
            rec.add(Metric(CALL_ONE_CPU, cpu * 1e6, note))
            call_1 = measure_calls(
                lambda i: [actor.ping.remote(i)], p.call_one_warmup, p.call_one_iters
            )
            rec.add(Metric(CALL_1, call_1 * 1e6, f"median of {p.call_one_iters}"))
            n4 = p.call_iters[4]
            call_4 = measure_calls(lambda i: [a.ping.remote(i) for a in actors], n4 // 10, n4)
            rec.add(Metric(CALL_4, call_4 * 1e6, f"median of {n4}"))
            rate = measure_pipelined(actor, p)
            note = f"{p.pipelined_calls} calls, median of {p.pipelined_runs} runs"
            rec.add(Metric(PIPELINED, rate, note))
            for key, size in ECHO_SIZES.items():
                if key not in p.echo_iters:
                    rec.fail([key], SKIPPED)
                    continue
                iters = p.echo_iters[key]
                rtt = measure_echo(actor, size, iters)
                note = f"round trip {fmt(rtt * 1e6, 'us')}, median of {iters}"
                rec.add(Metric(key, size / rtt / 1e9, note))
        finally:
            stop(actors)

    def many(n: int, spawn_key: str, call_key: str) -> None:
        why = mesh_not_run(p, rec, n)
        if why is not None:
            rec.fail([spawn_key, call_key, *MESH_EXTRA_KEYS.get(n, [])], why)
            return
        actors, seconds = spawn_timed(n)
        try:
            rec.add(Metric(spawn_key, seconds, "once per run"))
            iters = p.call_iters[n]
            call_n = measure_calls(
                lambda i: [a.ping.remote(i) for a in actors], max(iters // 10, 2), iters
            )
            rec.add(Metric(call_key, call_n * 1e6, f"median of {iters}"))
            if n == 16:
                rate = measure_broadcast(actors, p.broadcasts)
                rec.add(Metric(BROADCAST, rate, f"{p.broadcasts} rounds, then one call each"))
                pids = ray.get([a.getpid.remote() for a in actors], timeout=WAIT_TIMEOUT_S)
                rss = [r for r in map(rss_mib, pids) if r is not None]
                other = other_rss_mib(pids)
                note = (
                    f"median of {len(rss)} worker processes; Ray's other processes "
                    f"{other:.0f} MiB in all"
                )
                rec.add(Metric(RSS, statistics.median(rss), note, samples=rss))
            if n == EDGE:
                rate = measure_broadcast(actors, p.broadcasts_edge)
                note = f"{p.broadcasts_edge} rounds, then one call each"
                rec.add(Metric(BROADCAST_256, rate, note))
        finally:
            t0 = time.perf_counter()
            stopped = stop(actors)
            stop_key = STOP_KEYS.get(n)
            if stop_key is not None and stopped:
                note = "ray.kill of each actor, until its worker process exited"
                rec.add(Metric(stop_key, time.perf_counter() - t0, note))
            elif stop_key is not None:
                rec.fail([stop_key], "the worker processes did not all exit within 30 s")

    small_keys = [SPAWN_4, SPAWN_FIRST, CALL_ONE, CALL_ONE_CPU, CALL_1, CALL_4, PIPELINED]
    rec.guard([*small_keys, *ECHO_SIZES], small)
    rec.guard([SPAWN_16, CALL_16, BROADCAST, RSS], lambda: many(16, SPAWN_16, CALL_16))
    rec.guard([SPAWN_64, CALL_64, STOP_64], lambda: many(64, SPAWN_64, CALL_64))
    rec.guard(EDGE_KEYS, lambda: many(EDGE, SPAWN_256, CALL_256))
    rec.guard([FAILURE], lambda: measure_failure(rec))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    params = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"

    rec = Recorder("ray", f"ray {ray.__version__}", mode, asdict(params), args.json)
    run(params, rec)
    elapsed = time.perf_counter() - rec.t0
    rec.flush()

    load = rec.info["machine"]["loadavg_1min_before"]
    print(f"Ray actor benchmarks ({mode} run, {elapsed:.1f} s): ray {ray.__version__}")
    print(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load}\n")
    order = list(CATALOGUE)
    rows = [("metric", "value", "note")]
    for m in sorted(rec.metrics, key=lambda m: order.index(m.key)):
        rows.append((m.name, fmt(m.value, m.unit), m.error or m.note))
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
