"""``monarch.Simulator``: a simulated mesh, its cost model and its Chrome trace."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
import torch

import monarch
from monarch._src.tensor_engine.sim_model import CostModel


@pytest.fixture
def trace_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "trace.json"


def _load(path: Path) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def _tracks(trace: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(process name, thread name) -> its X events, by start time."""
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    out: dict[tuple[str, str], list[dict[str, Any]]] = {
        (procs[pid], name): [] for (pid, _), name in threads.items()
    }
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] in procs and (e["pid"], e["tid"]) in threads:
            out[(procs[e["pid"]], threads[(e["pid"], e["tid"])])].append(e)
    for events in out.values():
        events.sort(key=lambda e: e["ts"])
    return out


def _check_in_order(events: list[dict[str, Any]]) -> None:
    for a, b in itertools.pairwise(events):
        assert a["dur"] >= 0
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-6, (a, b)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_single_stream_trace(trace_path: Path) -> None:
    before = _children()
    sim = monarch.Simulator(hosts=1, gpus=4, trace_path=str(trace_path))
    mesh = sim.mesh
    assert mesh.sizes == {"host": 1, "gpu": 4}
    with mesh.activate():
        w: Any = torch.randn(512, 512)
        x: Any = torch.randn(256, 512)
        for _ in range(2):
            y = x @ w
            g = y.reduce("gpu", "sum")
            w = w - 0.01 * (x.t() @ g)
        value = monarch.inspect(w)
        rank = monarch.inspect(mesh.rank_tensor("gpu"), gpu=2)
    # The simulator models time, not values: fetches give zeros of the right metadata.
    assert value.shape == (512, 512) and value.dtype == torch.float32
    assert not value.any()
    assert rank.shape == () and rank.dtype == torch.int64
    mesh.exit()
    sim.exit()  # a second exit does nothing
    assert _children() <= before, "the simulator must not start processes"

    trace = _load(trace_path)
    # Perfetto: no pid 0, and no thread id shared by two processes.
    threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"]}
    assert min(pid for pid, _ in threads) >= 1
    assert len({tid for _, tid in threads}) == len(threads)
    tracks = _tracks(trace)
    assert set(tracks) == {(f"rank {r}", "main") for r in range(4)}
    for events in tracks.values():
        names = [e["name"] for e in events]
        assert names.count("aten.mm") == 4, names
        assert names.count("all_reduce(sum)") == 2, names
        _check_in_order(events)
    # Every rank's all-reduces start together (a collective waits for all members).
    starts = {
        tuple(e["ts"] for e in events if e["cat"] == "collective") for events in tracks.values()
    }
    assert len(starts) == 1

    stats = sim.stats()
    assert stats["elapsed_us"] > 0 and not stats["stuck"]
    assert [(s["rank"], s["stream"]) for s in stats["streams"]] == [(r, "main") for r in range(4)]


def test_durations_scale_with_sizes(trace_path: Path) -> None:
    sim = monarch.Simulator(hosts=1, gpus=2, simulate_mode="simulate_with_report_only")
    with sim.mesh.activate():
        a: Any = torch.randn(1024, 1024, dtype=torch.bfloat16)
        b: Any = torch.randn(2048, 2048, dtype=torch.bfloat16)
        a @ a
        b @ b
        a.reduce("gpu")
        b.reduce("gpu")
    sim.write_trace(str(trace_path))
    sim.exit()
    events = _tracks(_load(trace_path))[("rank 0", "main")]
    mms = [e for e in events if e["name"] == "aten.mm"]
    reduces = [e for e in events if e["cat"] == "collective"]
    assert len(mms) == 2 and len(reduces) == 2
    # 8x the flops, at least 2x the time (the overhead is constant).
    assert mms[1]["args"]["flops"] == 8 * mms[0]["args"]["flops"]
    assert mms[1]["dur"] > 2 * mms[0]["dur"]
    assert reduces[1]["dur"] > 2 * reduces[0]["dur"]


def test_cuda_tensors_need_no_gpu(trace_path: Path) -> None:
    # A program written for GPUs records on a host without any.
    with monarch.Simulator(hosts=1, gpus=2, trace_path=str(trace_path)) as sim:
        with sim.mesh.activate():
            w: Any = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
            y = torch.relu(w @ w).sum()
            assert y.device.type == "cuda"
            value = monarch.inspect(y)
        assert value.dtype == torch.bfloat16 and value.device.type == "cpu"
    names = [e["name"] for e in _tracks(_load(trace_path))[("rank 0", "main")]]
    assert names[:3] == ["aten.randn", "aten.mm", "aten.relu"], names


def test_cost_model_settings() -> None:
    model = CostModel.of({"memory_gb_per_s": 1000.0, "matmul_tflops": {"float32": 100.0}})
    assert model.memory_gb_per_s == 1000.0
    assert model.matmul_tflops["float32"] == 100.0 and model.matmul_tflops["bfloat16"] == 989.0
    # A ring all-reduce moves 2(n-1)/n of the bytes; across hosts it is slower.
    intra = model.collective_us("all_reduce", 1e9, 8, inter_host=False)
    inter = model.collective_us("all_reduce", 1e9, 8, inter_host=True)
    assert intra == pytest.approx(5.0 + 2 * 7 / 8 * 1e9 / 450e3)
    assert inter > intra
    with pytest.raises(ValueError, match="unknown settings"):
        CostModel.of({"tflops": 1})
    with pytest.raises(ValueError, match="memory_gb_per_s"):
        CostModel(memory_gb_per_s=-1)


def test_inter_host_collectives_are_slower(trace_path: Path) -> None:
    with monarch.Simulator(hosts=2, gpus=2, trace_path=str(trace_path)) as sim:
        with sim.mesh.activate():
            t: Any = torch.randn(1024, 1024)
            t.reduce("gpu")  # within a host
            t.reduce("host")  # across hosts
    tracks = _tracks(_load(trace_path))
    assert len(tracks) == 4
    reduces = [e for e in tracks[("rank 0", "main")] if e["cat"] == "collective"]
    assert [e["args"]["ranks"] for e in reduces] == [[0, 1], [0, 2]]
    assert reduces[1]["dur"] > reduces[0]["dur"]


def test_moves_between_slices_and_gathers(trace_path: Path) -> None:
    with monarch.Simulator(hosts=2, gpus=2, trace_path=str(trace_path)) as sim:
        first, second = sim.mesh.slice(host=0), sim.mesh.slice(host=1)
        with first.activate():
            x: Any = torch.randn(128, 128)
        y = x.to_mesh(second)
        assert monarch.inspect(y, gpu=1).shape == (128, 128)
        with sim.mesh.activate():
            t: Any = torch.randn(16, 16)
            assert tuple(t.reduce(("host", "gpu"), "stack").shape) == (4, 16, 16)
        total = monarch.call_on_shard_and_fetch(monarch.remote(torch.sum), t, shard={"host": 1})
        assert total.get() == 0
    tracks = _tracks(_load(trace_path))
    for rank, kind in ((0, "send"), (1, "send"), (2, "recv"), (3, "recv")):
        events = tracks[(f"rank {rank}", "main")]
        p2p = [e for e in events if e["cat"] == "p2p"]
        assert [e["name"] for e in p2p] == [kind], (rank, events)
        assert [e["name"] for e in events if e["cat"] == "collective"] == ["all_gather"]
    # A send and its receive run at the same time.
    send = next(e for e in tracks[("rank 0", "main")] if e["cat"] == "p2p")
    recv = next(e for e in tracks[("rank 2", "main")] if e["cat"] == "p2p")
    assert (send["ts"], send["dur"]) == (recv["ts"], recv["dur"])


def test_controller_trace_modes(tmp_path: Path) -> None:
    for mode, streams, controller in (
        ("everything", True, True),
        ("controller_trace_only", False, True),
        ("STREAM_ONLY", True, False),
    ):
        path = tmp_path / f"{mode}.json"
        with monarch.Simulator(hosts=1, gpus=2, trace_mode=mode, trace_path=str(path)) as sim:
            with sim.mesh.activate():
                torch.randn(64, 64) @ torch.randn(64, 64)
        names = {
            e["args"]["name"] for e in _load(path)["traceEvents"] if e["name"] == "process_name"
        }
        assert ("rank 0" in names) == streams, (mode, names)
        assert ("controller" in names) == controller, (mode, names)


def test_remote_functions_on_the_simulator(trace_path: Path) -> None:
    @monarch.remote(propagate=lambda x: x.sum(0))
    def total(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)

    def double(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x])

    cached = monarch.remote(double)
    sim = monarch.Simulator(hosts=1, gpus=2, simulate_mode="simulate_with_report_only")
    with sim.mesh.activate():
        x = torch.randn(8, 3)
        y = total(x)
        z = cached(x)  # propagate="cached": shapes learned in this process
        assert tuple(y.shape) == (3,) and tuple(z.shape) == (16, 3)
        assert monarch.inspect(z).shape == (16, 3)
    sim.write_trace(str(trace_path))
    sim.exit()
    events = _tracks(_load(trace_path))[("rank 1", "main")]
    calls = [e["name"] for e in events if e["cat"] == "remote"]
    assert len(calls) == 2 and calls[1].endswith("double"), calls
    # The propagate function ran on fake tensors only: its sum is not a command.
    assert not any("sum" in e["name"] for e in events if e["cat"] != "remote"), events


def test_simulated_mesh_has_no_procs() -> None:
    sim = monarch.Simulator(hosts=1, gpus=2, simulate_mode="simulate_with_report_only")
    with pytest.raises(NotImplementedError, match="no processes"):
        sim.mesh.spawn("a", object)  # type: ignore[arg-type]
    sub = sim.mesh.slice(gpu=1)
    with sub.activate():
        t = torch.ones(4)
    assert monarch.inspect(t).shape == (4,)
    sim.exit()
    with pytest.raises(RuntimeError, match=r"simulation .* has ended"), sim.mesh.activate():
        pass


def test_display_prints_a_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sim = monarch.Simulator(hosts=1, gpus=2, trace_path=str(tmp_path / "t.json"))
    with sim.mesh.activate():
        torch.randn(128, 128) @ torch.randn(128, 128)
    sim.display()
    out = capsys.readouterr().out
    assert "simulated 2 ranks" in out and "overlap" in out and "main" in out
    assert str(tmp_path / "t.json") in out
    sim.exit()
    assert os.path.exists(tmp_path / "t.json")


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="hosts"):
        monarch.Simulator(hosts="2", gpus=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpus=0"):
        monarch.Simulator(hosts=1, gpus=0)
    with pytest.raises(ValueError, match=r"trace_mode='streams'.*stream_only"):
        monarch.Simulator(hosts=1, gpus=1, trace_mode="streams")
    with pytest.raises(NotImplementedError, match="replay"):
        monarch.Simulator(hosts=1, gpus=1, simulate_mode="command_history")
    with pytest.raises(NotImplementedError, match="upload"):
        monarch.Simulator(hosts=1, gpus=1, upload_trace=True)
    with pytest.raises(NotImplementedError, match="IR"):
        monarch.Simulator(hosts=1, gpus=1, build_ir=True)
    with pytest.raises(ValueError, match="does not exist"):
        monarch.Simulator(hosts=1, gpus=1, trace_path="/nonexistent-folder/trace.json")
    with pytest.raises(TypeError, match="cost_model"):
        monarch.Simulator(hosts=1, gpus=1, cost_model=3)  # type: ignore[arg-type]


def test_two_streams_overlap(trace_path: Path) -> None:
    sim = monarch.Simulator(hosts=1, gpus=4, trace_path=str(trace_path))
    comms = monarch.Stream("comms")
    with sim.mesh.activate():
        w: Any = torch.randn(1024, 1024)
        x: Any = torch.randn(1024, 1024)
        for _ in range(2):
            g: Any = x @ w
            g_comms, borrow = comms.borrow(g, mutable=True)
            with comms.activate():
                g_comms.reduce_("gpu", "sum")
            y = x @ w  # runs on main while the reduce runs on comms
            borrow.drop()
            w = w - 0.01 * g + 0 * y
        monarch.inspect(w)
    sim.exit()

    tracks = _tracks(_load(trace_path))
    assert set(tracks) == {(f"rank {r}", s) for r in range(4) for s in ("main", "comms")}
    for events in tracks.values():
        _check_in_order(events)
    main = tracks[("rank 0", "main")]
    reduces = tracks[("rank 0", "comms")]
    assert [e["name"] for e in reduces] == ["all_reduce(sum)"] * 2
    for r in reduces:
        # Compute on main overlaps the reduce in time...
        assert any(
            e["ts"] < r["ts"] + r["dur"] and r["ts"] < e["ts"] + e["dur"]
            for e in main
            if e["name"] == "aten.mm"
        )
        # ... and main uses the result (after the borrow is dropped) only once it is done.
        after = [e for e in main if e["name"] == "aten.mul.Tensor" and e["ts"] >= r["ts"]]
        assert after and after[0]["ts"] >= r["ts"] + r["dur"] - 1e-6
    stats = {(s["rank"], s["stream"]): s for s in sim.stats()["streams"]}
    assert stats[(0, "comms")]["overlap_us"] > 0
