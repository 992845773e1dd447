"""The top-level names of upstream Monarch's tensor API that need more than an import:
``monarch.Future``, ``function_resolvers``, ``Selection``, ``set_meta``, and the
``world_mesh`` / ``mast_reserve`` that say what to use instead (docs/tensors.md,
"Other names of upstream's tensor API")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import monarch
import monarch.actor
from monarch import RemoteException
from monarch.actor import Extent, ProcMesh

NAMES = ["Future", "Selection", "function_resolvers", "mast_reserve", "set_meta", "world_mesh"]


def test_the_names_are_exported_without_importing_torch() -> None:
    code = (
        "import sys, monarch\n"
        f"for name in {NAMES!r}:\n"
        "    assert name in monarch.__all__ and name in dir(monarch), name\n"
        "    getattr(monarch, name)\n"
        "assert 'torch' not in sys.modules, 'the names imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


# --- monarch.Future -------------------------------------------------------------------------


def _read_fifo(path: str) -> str:
    """On a worker: block until the client writes a line into the FIFO ``path``."""
    with open(path) as f:
        return f.readline().strip()


def test_future_of_a_fetch_done_result_exception_and_callbacks(
    mesh: ProcMesh, tmp_path: Path
) -> None:
    assert monarch.Future is not monarch.actor.Future
    assert issubclass(monarch.Future, monarch.actor.Future)
    # The worker blocks on a FIFO until this test writes into it, so the future is
    # certainly pending until then.
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a FIFO opened read-write does not block
    try:
        with mesh.activate():
            fut = monarch.call_on_shard_and_fetch(
                monarch.remote(_read_fifo), str(fifo), shard={"hosts": 1, "gpus": 1}
            )
        assert isinstance(fut, monarch.Future)
        ran = threading.Event()
        seen: list[Any] = []

        def callback(f: monarch.Future[Any]) -> None:
            seen.append((f, f.result(timeout=0)))
            ran.set()

        fut.add_callback(callback)
        assert not fut.done()
        with pytest.raises(TimeoutError):
            fut.result(timeout=0)
        assert not ran.is_set()
        os.write(writer, b"go\n")
        # Nobody waits for the future: the callback runs when the reply arrives.
        assert ran.wait(timeout=60), "the callback did not run"
    finally:
        os.close(writer)  # unblocks the worker, whatever happened
    assert seen == [(fut, "go")]
    assert fut.done() and fut.result(timeout=0) == "go" and fut.exception(timeout=0) is None
    # A callback added to a finished future runs at once, on this thread.
    late: list[str] = []
    fut.add_callback(lambda f: late.append(threading.current_thread().name))
    assert late == [threading.current_thread().name]
    with pytest.raises(TypeError, match="expected a function"):
        fut.add_callback("not callable")  # type: ignore[arg-type]


def test_future_of_a_failed_fetch_and_a_failing_callback(
    mesh: ProcMesh, caplog: pytest.LogCaptureFixture
) -> None:
    with mesh.activate():
        x = torch.ones(2, 3) * (mesh.rank_tensor("gpus") + 1)
        bad = x.index_select(0, torch.tensor([7]))  # fails on the workers
    good = monarch.fetch_shard(x, gpus=1)
    failed = monarch.fetch_shard(bad)
    assert isinstance(good, monarch.Future) and isinstance(failed, monarch.Future)
    errors: list[BaseException | None] = []
    failed_seen, good_seen = threading.Event(), threading.Event()
    failed.add_callback(lambda f: (errors.append(f.exception(timeout=0)), failed_seen.set()))

    def broken(f: monarch.Future[Any]) -> None:
        raise RuntimeError("a broken callback")

    with caplog.at_level(logging.ERROR):
        good.add_callback(broken)
        good.add_callback(lambda f: good_seen.set())  # callbacks run in order
        assert good.result(timeout=60).tolist() == [[2.0] * 3] * 2  # not the callback's error
        assert good_seen.wait(timeout=60)
    assert "a broken callback" in caplog.text  # logged
    error = failed.exception(timeout=60)
    assert isinstance(error, RemoteException) and "IndexError" in str(error)
    assert failed.done()
    with pytest.raises(RemoteException):
        failed.result(timeout=0)
    assert failed_seen.wait(timeout=60)
    assert errors == [error]  # once
    # Nothing to fetch: a finished future.
    local = monarch.fetch_shard({"n": 1})
    assert isinstance(local, monarch.Future) and local.done() and local.result() == {"n": 1}


# --- monarch.function_resolvers ---------------------------------------------------------------


def test_function_resolvers_decide_how_remote_names_a_function(mesh: ProcMesh) -> None:
    def stand_in() -> str:
        return "sent by value"

    def by_getpid(fn: Any) -> str | None:
        return "os.getpid" if fn is stand_in else None

    class Upstream:  # upstream Monarch's resolvers return an object with a path
        path = "os:getppid"

    assert monarch.function_resolvers[-1](os.getcwd) == "posix:getcwd"
    saved = list(monarch.function_resolvers)
    try:
        monarch.function_resolvers.insert(0, by_getpid)
        renamed = monarch.remote(stand_in)
        untouched = monarch.remote(os.getcwd)  # the next resolver names it
        monarch.function_resolvers.insert(0, lambda fn: Upstream() if fn is len else None)
        parent = monarch.remote(len)
        monarch.function_resolvers.insert(0, lambda fn: 42)
        with pytest.raises(TypeError, match="answered 42"):
            monarch.remote(stand_in)
        monarch.function_resolvers[0] = lambda fn: "no_dots"
        with pytest.raises(ValueError, match="'no_dots' is not a function's path"):
            monarch.remote(stand_in)
    finally:
        monarch.function_resolvers[:] = saved
    by_value = monarch.remote(stand_in)  # no resolver answers: pickled
    with mesh.activate():
        pids = renamed.call().get(timeout=60)
        ppids = parent.call().get(timeout=60)
        cwds = untouched.call().get(timeout=60)
        values = by_value.call().get(timeout=60)
    worker_pids = {pid for _, pid in pids.items()}
    assert len(worker_pids) == 4 and os.getpid() not in worker_pids
    assert all(isinstance(pid, int) for pid in worker_pids)
    assert {ppid for _, ppid in ppids.items()} != worker_pids
    assert {cwd for _, cwd in cwds.items()} and all(isinstance(c, str) for _, c in cwds.items())
    assert [v for _, v in values.items()] == ["sent by value"] * 4


# --- monarch.Selection ------------------------------------------------------------------------


def test_selection_parses_and_evaluates_on_meshes(mesh: ProcMesh) -> None:
    grid = Extent(["hosts", "gpus"], [2, 4])
    cases = {
        "*": list(range(8)),
        "1": [4, 5, 6, 7],  # the dimensions not reached are taken whole
        "*,0": [0, 4],
        "*,(0|2)": [0, 2, 4, 6],  # the union within the second dimension
        "*,0|1": [0, 4, 5, 6, 7],  # the union of two chains
        "0,1:3": [1, 2],
        " * , 1 : 4 : 2 ": [1, 3, 5, 7],  # whitespace is ignored
        ":,2:": [2, 3, 6, 7],
        "(0,*)&(*,1)": [1],
        "0,9:20": [],  # a range is clamped to the dimension
    }
    for text, ranks in cases.items():
        assert monarch.Selection.from_string(text).ranks(grid) == ranks, text
    sel = monarch.Selection.from_string("*,1")
    assert sel.points(grid) == [{"hosts": 0, "gpus": 1}, {"hosts": 1, "gpus": 1}]
    assert sel == monarch.Selection.from_string("*, 1") and hash(sel) == hash(
        monarch.Selection.from_string("*,1")
    )
    assert repr(sel) == "Selection.from_string('*,1')"
    assert monarch.Selection.all().ranks(grid) == list(range(8))
    assert (monarch.Selection.from_string("0") | monarch.Selection.from_string("1,0")).ranks(
        grid
    ) == [0, 1, 2, 3, 4]
    one = monarch.Selection.from_string("?,?").ranks(grid)
    assert len(one) == 1 and one[0] in range(8)
    host = monarch.Selection.any().points(grid)
    assert len(host) == 4 and len({p["hosts"] for p in host}) == 1
    # On a mesh: its labels, and the global ranks of a slice.
    assert monarch.Selection.from_string("1,0").ranks(mesh) == [2]
    assert monarch.Selection.from_string("*").ranks(mesh.slice(hosts=1)) == [2, 3]
    for point in monarch.Selection.from_string("*,1").points(mesh):
        assert mesh.slice(**point).extent.nelements == 1


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "unexpected end in an empty string"),
        ("*,", "unexpected end at position 2"),
        ("(*", "a missing ')' at position 2"),
        ("*)", "unexpected ')' at position 1"),
        ("a", "unexpected 'a' at position 0"),
        ("1:2:0", "a step of 0"),
        ("1::", "a missing step"),
    ],
)
def test_a_bad_selection_expression_says_where(text: str, where: str) -> None:
    with pytest.raises(ValueError, match="invalid selection expression") as info:
        monarch.Selection.from_string(text)
    assert where in str(info.value) and "for example '*'" in str(info.value)


def test_a_selection_that_does_not_fit_the_mesh() -> None:
    grid = Extent(["hosts", "gpus"], [2, 4])
    with pytest.raises(ValueError, match="more dimensions than the mesh has: 2"):
        monarch.Selection.from_string("*,*,*").ranks(grid)
    with pytest.raises(IndexError, match="index 5 is outside dimension 'hosts' of size 2"):
        monarch.Selection.from_string("5").points(grid)
    with pytest.raises(TypeError, match="expected a mesh"):
        monarch.Selection.all().ranks([2, 4])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a string"):
        monarch.Selection.from_string(3)  # type: ignore[arg-type]


# --- monarch.set_meta -------------------------------------------------------------------------


def test_set_meta_labels_the_commands_in_the_simulators_trace(tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.json"
    with monarch.Simulator(hosts=1, gpus=2, trace_path=str(trace_path)) as sim:
        first, second = sim.mesh.slice(gpu=0), sim.mesh.slice(gpu=1)
        with sim.mesh.activate():
            x = torch.randn(64, 64)
            with monarch.set_meta("forward"):
                y = x @ x
                with monarch.set_meta("layer 1"):
                    z = y.reduce("gpu", "sum")
            after = z + 1
        with first.activate():
            h = torch.ones(8)
        with monarch.set_meta("pipeline"):
            h.to_mesh(second)
        fetched = monarch.fetch_shard(after)
        assert isinstance(fetched, monarch.Future) and fetched.done()
    events = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e)
    assert len(by_name["aten.mm forward"]) == 2  # both ranks
    assert all(e["args"]["meta"] == ["forward"] for e in by_name["aten.mm forward"])
    reduces = by_name["all_reduce(sum) forward layer 1"]
    assert len(reduces) == 2 and reduces[0]["args"]["meta"] == ["forward", "layer 1"]
    assert [e["args"]["meta"] for e in by_name["send pipeline"]] == [["pipeline"]]
    assert [e["args"]["meta"] for e in by_name["recv pipeline"]] == [["pipeline"]]
    unlabelled = [e for e in events if "meta" not in e.get("args", {})]
    assert {e["name"] for e in unlabelled} >= {"aten.randn", "aten.add.Tensor"}  # outside
    assert all(" " not in e["name"] for e in unlabelled), unlabelled


def test_set_meta_takes_a_string_and_ends_with_its_block() -> None:
    from monarch._src.tensor_engine.sim_config import current_meta

    with pytest.raises(TypeError, match="expected a string label"):
        with monarch.set_meta(3):  # type: ignore[arg-type]
            pass
    with monarch.set_meta("a"):
        with monarch.set_meta("b"):
            assert current_meta() == ("a", "b")
        seen: list[tuple[str, ...]] = []
        other = threading.Thread(target=lambda: seen.append(current_meta()))
        other.start()
        other.join(timeout=30)
        assert seen == [()]  # the labels belong to the thread that set them
    assert current_meta() == ()


# --- world_mesh and mast_reserve --------------------------------------------------------------


def test_world_mesh_says_to_spawn_procs_and_activate_them() -> None:
    with pytest.raises(NotImplementedError) as info:
        monarch.world_mesh(object(), ["host-a", "host-b"], 8)
    message = str(info.value)
    assert "world_mesh(ctx, hosts, gpu_per_host=8) is not supported" in message
    assert "a host mesh of 2 hosts" in message
    assert "hosts.spawn_procs(per_host={'gpus': 8})" in message
    assert "with procs.activate()" in message
    assert monarch.world_mesh.__doc__ and "Not supported" in monarch.world_mesh.__doc__


def test_mast_reserve_says_which_schedulers_to_use() -> None:
    with pytest.raises(NotImplementedError) as info:
        monarch.mast_reserve(4, torchx_workspace_path="/tmp")
    message = str(info.value)
    assert "mast_reserve(hosts=4) is not supported" in message
    assert "Meta's internal cluster scheduler" in message
    assert "SlurmJob({'trainers': 4}" in message and "attach_to_workers" in message
    assert monarch.mast_reserve.__doc__ and "MAST" in monarch.mast_reserve.__doc__
