"""Log forwarding benchmark: how fast a proc's line reaches the client, and what a
steady stream of lines costs the client's calls (``docs/logging.md``).

Run it with ``python benches/log_bench.py``; ``make bench`` runs it after the others.
It measures, on this machine's host:

* ``log line latency``: an actor prints a line that carries ``time.monotonic()``
  (``CLOCK_MONOTONIC`` is one clock for every process of a machine); the client's
  ``sys.stdout``, replaced by a recorder, notes when the forwarded line is written.
  One line at a time (the next is printed once the previous arrived), so the figure is
  the latency of an idle path: proc pipe -> host -> batch (10 ms window) -> client
  agent -> writer thread -> ``sys.stdout``. Median and 99th percentile; the budget is
  100 ms.
* ``call_one under log load``: ``call_one`` round trips per second to an actor on a
  proc of its own, for a few seconds, alternately without and with 4 other procs
  printing 2,500 lines/s each (10,000 lines/s forwarded to the client and written to
  its ``sys.stdout``, a recorder that counts them); the median of each, and their
  ratio. The budget is a ratio of at least 0.9 (at most 10% fewer calls). The lines
  per second that reached the client are reported with it. The load includes the
  printing procs' own CPU use, which forwarding does not cause.

Options: ``--quick`` (fewer samples and shorter runs, for smoke tests), ``--json PATH``
(also write the results as JSON), ``--check`` (exit 1 when a result is over budget; by
default the exit status does not depend on the timings).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from monarch.actor import Actor, current_rank, endpoint, this_host

LATENCY_BUDGET_S = 0.100
THROUGHPUT_RATIO_BUDGET = 0.9
LOAD_PROCS = 4
LOAD_LINES_PER_S = 10_000


class Printer(Actor):
    """Prints on request, or at a steady rate from a thread of its own."""

    @endpoint
    def stamp(self, seq: int) -> None:
        print(f"LAT {seq} {time.monotonic():.9f}", flush=True)

    @endpoint
    def start_load(self, lines_per_s: int, seconds: float) -> None:
        rank = current_rank().rank
        threading.Thread(
            target=self._load, args=(rank, lines_per_s, seconds), name="load", daemon=True
        ).start()

    def _load(self, rank: int, lines_per_s: int, seconds: float) -> None:
        tick = 0.01
        per_tick = max(1, round(lines_per_s * tick))
        start = time.monotonic()
        n = 0
        while time.monotonic() < start + seconds:
            for _ in range(per_tick):
                print(f"load rank {rank} line {n}: step 1234 loss 0.5678 lr 3e-4")
                n += 1
            time.sleep(max(0.0, start + (n / per_tick) * tick - time.monotonic()))


class Ping(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i


class Recorder:
    """A ``sys.stdout`` that counts lines and notes when ``LAT`` lines arrive."""

    def __init__(self) -> None:
        self.lines = 0
        self.arrivals: dict[int, float] = {}
        self.sent: dict[int, float] = {}
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        now = time.monotonic()
        self.lines += text.count("\n")
        if "LAT " in text:
            with self.changed:
                for line in text.splitlines():
                    _, _, rest = line.partition("LAT ")
                    if rest:
                        seq, sent = rest.split()
                        self.arrivals[int(seq)] = now
                        self.sent[int(seq)] = float(sent)
                self.changed.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def wait_for(self, seq: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: seq in self.arrivals, timeout)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_latency(recorder: Recorder, samples: int) -> dict[str, Any]:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="lat")
    try:
        printer = procs.spawn("p", Printer)
        printer.stamp.call_one(-1).get(timeout=60)  # warm up
        recorder.wait_for(-1, 10)
        latencies = []
        for seq in range(samples):
            printer.stamp.call_one(seq).get(timeout=30)
            if not recorder.wait_for(seq, 5):
                raise RuntimeError(f"line {seq} did not reach the client within 5 s")
            latencies.append(recorder.arrivals[seq] - recorder.sent[seq])
    finally:
        procs.stop().get(timeout=30)
    return {
        "samples": len(latencies),
        "median_ms": statistics.median(latencies) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


def calls_per_second(ping: Any, seconds: float) -> float:
    n = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        ping.ping.call_one(n).get(timeout=30)
        n += 1
    return n / elapsed


def measure_load(recorder: Recorder, rounds: int, seconds: float) -> dict[str, Any]:
    ping_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="ping")
    load_procs = this_host().spawn_procs(per_host={"gpus": LOAD_PROCS}, name="load")
    try:
        ping = ping_procs.spawn("p", Ping)
        printers = load_procs.spawn("p", Printer)
        calls_per_second(ping, 0.5)  # warm up
        printers.stamp.call(-2).get(timeout=60)
        quiet, loaded, rates = [], [], []
        for _ in range(rounds):
            quiet.append(calls_per_second(ping, seconds))
            printers.start_load.call(LOAD_LINES_PER_S // LOAD_PROCS, seconds + 1.0).get()
            time.sleep(0.5)  # let the load reach its rate
            before = recorder.lines
            t0 = time.monotonic()
            loaded.append(calls_per_second(ping, seconds))
            rates.append((recorder.lines - before) / (time.monotonic() - t0))
            time.sleep(1.0)  # the load ends; its last lines drain
    finally:
        load_procs.stop().get(timeout=30)
        ping_procs.stop().get(timeout=30)
    q, lo = statistics.median(quiet), statistics.median(loaded)
    return {
        "calls_per_s_quiet": q,
        "calls_per_s_loaded": lo,
        "ratio": lo / q,
        "lines_per_s_received": statistics.median(rates),
        "rounds": rounds,
        "seconds_each": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter runs")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--check", action="store_true", help="exit 1 when over budget")
    args = parser.parse_args()
    out = sys.stdout
    recorder = Recorder()
    sys.stdout = recorder
    try:
        latency = measure_latency(recorder, 50 if args.quick else 300)
        load = measure_load(recorder, 1 if args.quick else 3, 1.0 if args.quick else 3.0)
    finally:
        sys.stdout = out
    results = {"latency": latency, "load": load, "pid": os.getpid()}
    print("log forwarding (this machine's host):")
    print(
        f"  log line latency: median {latency['median_ms']:.1f} ms, p99 "
        f"{latency['p99_ms']:.1f} ms, max {latency['max_ms']:.1f} ms "
        f"({latency['samples']} lines; budget {LATENCY_BUDGET_S * 1e3:.0f} ms)"
    )
    print(
        f"  call_one under log load: {load['calls_per_s_quiet']:.0f} calls/s quiet, "
        f"{load['calls_per_s_loaded']:.0f} calls/s with {LOAD_LINES_PER_S} lines/s from "
        f"{LOAD_PROCS} procs (ratio {load['ratio']:.2f}; budget >= "
        f"{THROUGHPUT_RATIO_BUDGET}); {load['lines_per_s_received']:.0f} lines/s reached "
        "the client"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    over = latency["p99_ms"] > LATENCY_BUDGET_S * 1e3 or load["ratio"] < THROUGHPUT_RATIO_BUDGET
    if over:
        print("  over budget", file=sys.stderr)
    return 1 if over and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
