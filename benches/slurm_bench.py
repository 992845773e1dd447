"""Slurm benchmark: how long a ``SlurmJob`` takes to give its first answer and to end,
on the real-Slurm harness of ``tests/slurm`` (a 3-node cluster over network-namespace
hosts; root, Slurm and munge needed: ``make slurm-deps``).

Run it with ``python benches/slurm_bench.py`` (as root). Each run is the ``meshes``
client of ``tests/slurm/test_slurm_job.py``: a job of two meshes (2 and 1 nodes),
``state()`` until a proc of the first mesh answered a call, then ``kill()`` until the
job is gone. It reports the medians of ``--runs`` runs (5; 2 with ``--quick``).
Budgets of the issue: 5 s to the first answer, 5 s for ``kill()``. It also times the
harness itself: a 2-node cluster up (daemons answering) and torn down, once (budget
10 s together).

Options: ``--quick``, ``--json PATH`` (also write the results as JSON), ``--check``
(exit 1 when a median is over budget).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_CALL_BUDGET_S = 5.0
KILL_BUDGET_S = 5.0
HARNESS_BUDGET_S = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    runs = args.runs or (2 if args.quick else 5)

    # The harness and the client runner of the Slurm tests.
    sys.path.insert(0, str(REPO / "tests"))
    from multihost.netns import Cluster, cleanup_stale
    from multihost.netns import available as netns_available
    from slurm.harness import SlurmCluster, available
    from slurm.test_slurm_job import run_client

    for ok, reason in (netns_available(), available()):
        if not ok:
            print(f"slurm bench: skipped: {reason}", flush=True)
            return 0
    cleanup_stale()
    start = time.monotonic()
    small = Cluster.create(2)
    try:
        up = SlurmCluster.start(small)
        harness_up = time.monotonic() - start
        t1 = time.monotonic()
        up.stop()
        harness_down = time.monotonic() - t1
    finally:
        small.destroy()
    net = Cluster.create(3)
    try:
        slurm = SlurmCluster.start(net)
        try:
            first, kill = [], []
            for _ in range(runs):
                with tempfile.TemporaryDirectory(prefix="monarch-slurm-bench-") as d:
                    result = run_client(slurm, "meshes", Path(d))
                first.append(result["first_call_s"])
                kill.append(result["kill_s"])
        finally:
            slurm.stop()
    finally:
        net.destroy()
    out = {
        "first_call_s": statistics.median(first),
        "kill_s": statistics.median(kill),
        "harness_up_s": harness_up,
        "harness_down_s": harness_down,
        "samples": {"first_call_s": first, "kill_s": kill},
    }
    over = [
        what
        for what, value, budget in (
            ("first answer", out["first_call_s"], FIRST_CALL_BUDGET_S),
            ("kill", out["kill_s"], KILL_BUDGET_S),
            ("harness up and down", harness_up + harness_down, HARNESS_BUDGET_S),
        )
        if value > budget
    ]
    print(
        f"slurm job, {runs} runs: state() to the first answer {out['first_call_s']:.2f} s "
        f"(budget {FIRST_CALL_BUDGET_S:g}); kill() to the job gone {out['kill_s']:.2f} s "
        f"(budget {KILL_BUDGET_S:g}); harness up {harness_up:.2f} s, down {harness_down:.2f} s "
        f"(budget {HARNESS_BUDGET_S:g} together)",
        flush=True,
    )
    print("over budget: " + (", ".join(over) if over else "none"), flush=True)
    out["over_budget"] = over
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
