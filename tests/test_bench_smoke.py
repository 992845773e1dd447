"""Smoke test of the actor benchmark (``benches/actor_bench.py``, run by ``make bench``):
a ``--quick`` run exits 0 and prints every metric. Timings are not checked; they depend
on the machine and on the build (debug or release)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benches" / "actor_bench.py"

METRICS = (
    "spawn 4 procs -> first reply",
    "call_one round trip",
    "call to 4 ranks",
    "pipelined call_one",
    "multiprocessing.Pipe round trip",
)


@pytest.mark.timeout(240)
def test_actor_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for name in METRICS:
        assert name in proc.stdout, f"{name!r} missing from:\n{proc.stdout}"
    result = json.loads(out.read_text())
    assert {m["name"] for m in result["metrics"]} >= set(METRICS)
