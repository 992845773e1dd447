"""Smoke tests of the benchmarks run by ``make bench``: a ``--quick`` run of
``benches/actor_bench.py`` exits 0 and reports every metric (a value, or the reason there
is none), and the comparison driver ``benches/compare.py``, limited to this project,
prints its table and writes its JSON and plot. Timings are not checked; they depend on
the machine and on the build (debug or release)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"

METRICS = (
    "spawn 4 procs -> first reply",
    "spawn 16 procs -> first reply",
    "spawn 64 procs -> first reply",
    "call_one round trip",
    "call() to 4 actors",
    "call() to 16 actors",
    "call() to 64 actors",
    "pipelined call_one",
    "echo 1 KiB",
    "echo 1 MiB",
    "echo 64 MiB",
    "failure detection (SIGKILL)",
    "RSS per proc",
    "multiprocessing.Pipe round trip",
    "bare fan-out to 16 procs",
    "bare fan-out to 64 procs",
)

#: Metrics a quick run must measure (the others it may skip).
MEASURED_WHEN_QUICK = {
    "spawn_4",
    "spawn_16",
    "call_one",
    "call_4",
    "call_16",
    "pipelined",
    "echo_1k",
    "echo_1m",
    "rss",
    "pipe",
    "raw_fanout_16",
}


@pytest.mark.timeout(240)
def test_actor_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHES / "actor_bench.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for name in METRICS:
        assert name in proc.stdout, f"{name!r} missing from:\n{proc.stdout}"
    result = json.loads(out.read_text())
    by_name = {m["name"]: m for m in result["metrics"]}
    assert set(by_name) >= set(METRICS)
    for m in result["metrics"]:
        # Every metric has a value or says why not.
        assert (m["value"] is None) != (m["error"] is None), m
        if m["key"] in MEASURED_WHEN_QUICK:
            assert m["value"] is not None, m


@pytest.mark.timeout(240)
def test_compare_quick_ours_only(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHES / "compare.py"),
            "--quick",
            "--reps",
            "1",
            "--impls",
            "ours",
            "--no-precompile",
            "--ours-python",
            sys.executable,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for name in METRICS:
        assert name in proc.stdout, f"{name!r} missing from:\n{proc.stdout}"
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["median"]["ours"]["call_one"]["value"] > 0
    assert (tmp_path / "latency.png").stat().st_size > 0


def _compare_fixture() -> tuple[Any, list[Any], Callable[..., dict[str, dict]]]:
    """compare.py as a module, two implementations (ours and Ray), and a maker of one
    implementation's medians (every metric ``None`` but those given)."""
    sys.path.insert(0, str(BENCHES))
    try:
        import compare
    finally:
        sys.path.remove(str(BENCHES))

    def agg(**values: float | None) -> dict[str, dict]:
        out: dict[str, dict] = {key: {"value": None} for key in compare.CATALOGUE}
        out.update({k: {"value": v} for k, v in values.items()})
        return out

    impls = [
        compare.Impl("ours", "Monarch (this)", Path("x"), Path("y")),
        compare.Impl("ray", "Ray", Path("x"), Path("y")),
    ]
    return compare, impls, agg


def test_growth_line_compares_each_implementation_with_the_floor() -> None:
    compare, impls, agg = _compare_fixture()
    aggs = {
        "ours": agg(call_16=1000.0, call_64=3000.0, raw_fanout_16=200.0, raw_fanout_64=900.0),
        "ray": agg(call_16=10.0, call_64=None, raw_fanout_16=200.0, raw_fanout_64=700.0),
    }
    line = compare.growth_text(impls, aggs)
    assert line is not None
    assert "Monarch (this) 3.0x" in line
    assert "Ray" not in line.split("floor")[0]  # no 64-actor value: left out
    assert "bare fan-out floor 4.0x" in line  # the median of 4.5x and 3.5x
    assert "256" not in line  # no 256-actor value: no such clause
    aggs["ours"]["call_256"] = {"value": 12000.0}
    line = compare.growth_text(impls, aggs)
    assert line is not None
    assert line.endswith("from 16 to 256 actors (16x): Monarch (this) 12.0x"), line
    aggs["ray"]["raw_fanout_256"] = {"value": 4000.0}
    line = compare.growth_text(impls, aggs)
    assert line is not None
    assert line.endswith("Monarch (this) 12.0x, bare fan-out floor 20.0x"), line
    assert compare.growth_text(impls, {"ours": agg(), "ray": agg()}) is None


def test_floor_line_divides_call_one_by_the_pipe_of_the_same_runs() -> None:
    compare, impls, agg = _compare_fixture()
    aggs = {
        "ours": agg(call_one=140.0, pipe=100.0, call_one_cpu=300.0, pipe_cpu=100.0),
        "ray": agg(call_one=1000.0, pipe=125.0),
    }
    line = compare.floor_text(impls, aggs)
    assert line is not None
    assert "call_one Monarch (this) 1.40x, Ray 8.00x" in line, line
    assert "CPU per call_one Monarch (this) 3.00x;" not in line  # the last clause
    assert "CPU per call_one Monarch (this) 3.00x" in line, line
    assert line.endswith("(target for our call_one <= 1.5x: met)"), line
    aggs["ours"]["call_one"] = {"value": 151.0}
    line = compare.floor_text(impls, aggs)
    assert line is not None and line.endswith("<= 1.5x: missed)"), line
    assert compare.floor_text(impls, {"ours": agg(), "ray": agg()}) is None


@pytest.mark.timeout(120)
def test_log_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "log.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHES / "log_bench.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "log line latency: median" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["latency"]["samples"] == 50
    assert result["load"]["lines_per_s_received"] > 0


UPSTREAM_PYTHON = BENCHES.parent / ".bench" / "venv-upstream" / "bin" / "python"


def _tensor_bench_quick(tmp_path: Path, impls: str) -> tuple[str, dict]:
    """A ``--quick`` one-run ``tensor_bench.py`` of ``impls``: its stdout and JSON."""
    out = tmp_path / "tensors.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHES / "tensor_bench.py"),
            "--quick",
            "--reps",
            "1",
            "--impls",
            impls,
            "--ours-python",
            sys.executable,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    sys.path.insert(0, str(BENCHES))
    try:
        import tensor_bench
    finally:
        sys.path.remove(str(BENCHES))
    for _, name, _, _ in tensor_bench.ROWS:
        assert name.replace("64 MiB", "4 MiB") in proc.stdout, f"{name!r} missing"
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.timeout(240)
def test_tensor_bench_quick_ours_and_floor(tmp_path: Path) -> None:
    _, result = _tensor_bench_quick(tmp_path, "ours,floor")
    ours = result["median"]["ours"]
    for key, agg in ours.items():
        assert agg["value"] is not None and agg["value"] > 0, (key, agg)
    for key in ("reduce_ms", "reduce_inplace_ms"):
        assert result["median"]["floor"][key]["value"] > 0


@pytest.mark.timeout(240)
@pytest.mark.skipif(not UPSTREAM_PYTHON.exists(), reason="upstream venv missing (make bench-peers)")
def test_tensor_bench_quick_upstream(tmp_path: Path) -> None:
    stdout, result = _tensor_bench_quick(tmp_path, "upstream")
    up = result["median"]["upstream"]
    assert up["dispatch_ops"]["value"] > 0
    assert up["reduce_ms"] == {"value": None, "values": [], "error": "cannot run on CPU"}
    assert "upstream's reduce (1 of 1 runs)" in stdout


def test_the_edge_mesh_runs_only_where_it_fits_in_memory() -> None:
    sys.path.insert(0, str(BENCHES))
    try:
        import bench_common
    finally:
        sys.path.remove(str(BENCHES))

    assert bench_common.edge_unfit(0.001) is None  # 256 procs of 1 KiB fit anywhere
    huge = bench_common.edge_unfit(1024.0 * 1024)  # 256 procs of 1 TiB do not
    assert huge is not None and huge.startswith("not run: 256 procs of"), huge
    unknown = bench_common.edge_unfit(None)
    assert unknown is not None and "no RSS" in unknown, unknown
