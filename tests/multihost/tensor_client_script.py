"""Client program of the multi-host distributed-tensor tests, run in the client network
namespace: ``python tensor_client_script.py WORKER_ADDRESS WORKER_ADDRESS`` (two workers,
two hosts).

It attaches to the workers, spawns a ``{"hosts": 2, "gpus": 2}`` proc mesh and runs the
tensor engine across the two hosts: ops on every rank, every reduction over one and two
dimensions, reduce-scatter and all-to-all, ``to_mesh`` between the hosts, and a failing
command followed by normal work. Each check's expected values are computed here, in
plain Python; a check records ``""`` when the values match, else what differed. It
prints one ``RESULT <json>`` line and exits 0 whatever the checks found (the test
asserts on them).
"""

from __future__ import annotations

import functools
import json
import operator
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import monarch
import monarch.actor
from monarch import RemoteException, fetch_shard
from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint

#: How long one fetch may take: far beyond a collective's timeout below, so that a
#: stuck collective is reported by the engine (naming its ranks), not by this wait.
FETCH_S = 60
#: The tensor engine's collective timeout in the procs: short, so that a collective
#: that cannot connect fails the check instead of hanging the test.
COLLECTIVE_TIMEOUT = "20s"

HOSTS, GPUS = 2, 2
COORDS = [(h, g) for h in range(HOSTS) for g in range(GPUS)]
REDUCTIONS = ["stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
DIMS: list[tuple[str, ...]] = [("gpus",), ("hosts",), ("hosts", "gpus")]

_OPS: dict[str, Callable[[list[Any]], Any]] = {
    "sum": sum,
    "avg": lambda xs: sum(xs) / len(xs),
    "product": lambda xs: functools.reduce(operator.mul, xs),
    "min": min,
    "max": max,
    "band": lambda xs: functools.reduce(operator.and_, xs),
    "bor": lambda xs: functools.reduce(operator.or_, xs),
    "bxor": lambda xs: functools.reduce(operator.xor, xs),
}


class Where(Actor):
    """Where a proc runs: its monarch proc id and the address its gloo binds."""

    @endpoint
    def where(self) -> dict[str, Any]:
        from monarch._src.actor import process
        from monarch._src.tensor_engine.worker.collectives import _local_address

        return {"proc": process.get().proc_id, "gloo": _local_address()}


def rank_of(h: int, g: int) -> int:
    return h * GPUS + g


def members(h: int, g: int, dims: tuple[str, ...]) -> list[int]:
    """The ranks reduced together with (h, g) over ``dims``, in the mesh's order."""
    return [
        rank_of(h2, g2)
        for h2, g2 in COORDS
        if ("hosts" in dims or h2 == h) and ("gpus" in dims or g2 == g)
    ]


def base(r: int) -> list[int]:
    """The values rank ``r`` holds before a reduction (distinct bits per rank)."""
    return [r + 1, 2 * (r + 1), 7 * r + 3]


def expected_reduction(reduction: str, h: int, g: int, dims: tuple[str, ...]) -> Any:
    rows = [base(m) for m in members(h, g, dims)]
    if reduction == "stack":
        return rows
    return [_OPS[reduction](list(col)) for col in zip(*rows, strict=True)]


def scatter_rows(r: int, n: int) -> list[list[int]]:
    """Rank ``r``'s input of a reduce-scatter among ``n`` ranks: one row per member."""
    return [[100 * r + 2 * i, 100 * r + 2 * i + 1] for i in range(n)]


def expected_scatter(reduction: str, h: int, g: int, dims: tuple[str, ...]) -> Any:
    group = members(h, g, dims)
    i = group.index(rank_of(h, g))
    rows = [scatter_rows(m, len(group))[i] for m in group]
    if reduction == "stack":  # all-to-all: row i of every member, in member order
        return rows
    return [_OPS[reduction](list(col)) for col in zip(*rows, strict=True)]


def fetch(obj: Any, h: int | None = None, g: int | None = None, **coords: int) -> Any:
    if h is not None:
        coords["hosts"] = h
    if g is not None:
        coords["gpus"] = g
    return fetch_shard(obj, **coords).get(timeout=FETCH_S)


def compare(got: Any, expected: Any, where: str) -> str:
    """``""`` when ``got`` (a tensor) holds ``expected`` exactly, else a description."""
    value = got.tolist() if isinstance(got, torch.Tensor) else got
    if value == expected:
        return ""
    return f"{where}: got {value!r}, expected {expected!r}"


class Checks:
    """Named checks: each runs its function and keeps ``""`` or what went wrong."""

    def __init__(self) -> None:
        self.results: dict[str, str] = {}
        self.times: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], list[str]]) -> None:
        start = time.monotonic()
        try:
            problems = [p for p in fn() if p]
            self.results[name] = "; ".join(problems[:5])
        except BaseException as e:  # reported in the RESULT, the test fails on it
            if isinstance(e, KeyboardInterrupt):
                raise
            self.results[name] = f"raised {type(e).__name__}: {e}\n" + "".join(
                traceback.format_exception(type(e), e, e.__traceback__)[-6:]
            )
        self.times[name] = round(time.monotonic() - start, 3)


def check_ops(mesh: Any) -> list[str]:
    """Ops recorded under activate run on every rank, with each rank's own values."""
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        x = torch.ones(2, 3) * r + 1
        y = (x @ torch.ones(3, 1)).squeeze(1).sum()
        h = mesh.rank_tensor("hosts")
    problems = []
    for hh, gg in COORDS:
        rank = rank_of(hh, gg)
        got = fetch({"x": x, "y": y, "h": h}, hh, gg)
        problems.append(compare(got["x"], [[rank + 1.0] * 3] * 2, f"x at {hh},{gg}"))
        problems.append(compare(got["y"], 6.0 * (rank + 1), f"y at {hh},{gg}"))
        problems.append(compare(got["h"], hh, f"hosts rank at {hh},{gg}"))
    return problems


def check_reductions(mesh: Any, dims: tuple[str, ...]) -> list[str]:
    """Every reduction over ``dims``: integers (int64) except avg (float64)."""
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        x = torch.stack([r + 1, 2 * (r + 1), 7 * r + 3])
        xf = x.double()
    outs = {}
    for reduction in REDUCTIONS:
        src = xf if reduction == "avg" else x
        outs[reduction] = src.reduce(dims if len(dims) > 1 else dims[0], reduction)
    problems = []
    for reduction, out in outs.items():
        n = len(members(0, 0, dims))
        shape = (n, 3) if reduction == "stack" else (3,)
        if tuple(out.shape) != shape:
            problems.append(f"{reduction}: shape {tuple(out.shape)}, expected {shape}")
        if reduction == "avg" and out.dtype != torch.float64:
            problems.append(f"avg: dtype {out.dtype}")
        if reduction != "avg" and out.dtype != torch.int64:
            problems.append(f"{reduction}: dtype {out.dtype}")
    for h, g in COORDS:
        try:
            got = fetch(outs, h, g)
        except RemoteException as e:
            problems.append(f"fetch at {h},{g} raised RemoteException: {e}")
            continue
        for reduction in REDUCTIONS:
            want = expected_reduction(reduction, h, g, dims)
            problems.append(compare(got[reduction], want, f"{reduction} at {h},{g}"))
    return problems


def check_scatter(mesh: Any, dims: tuple[str, ...]) -> list[str]:
    """Reduce-scatter (sum, max) and all-to-all (stack) over ``dims``."""
    n = len(members(0, 0, dims))
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        i = torch.arange(n).reshape(n, 1)
        rows = torch.cat([100 * r + 2 * i, 100 * r + 2 * i + 1], dim=1)  # scatter_rows
    key = dims if len(dims) > 1 else dims[0]
    outs = {red: rows.reduce(key, red, scatter=True) for red in ("sum", "max", "stack")}
    problems = []
    if tuple(outs["sum"].shape) != (2,) or tuple(outs["stack"].shape) != (n, 2):
        problems.append(f"shapes {tuple(outs['sum'].shape)}, {tuple(outs['stack'].shape)}")
    for h, g in COORDS:
        inputs = fetch(rows, h, g)
        problems.append(compare(inputs, scatter_rows(rank_of(h, g), n), f"input at {h},{g}"))
        got = fetch(outs, h, g)
        for red, out in got.items():
            problems.append(compare(out, expected_scatter(red, h, g, dims), f"{red} at {h},{g}"))
    return problems


def check_to_mesh(mesh: Any) -> list[str]:
    """Host 0's slice sends to host 1's and back; one rank's shard to a whole slice."""
    stages = [mesh.slice(hosts=0), mesh.slice(hosts=1)]
    with stages[0].activate():
        x = torch.ones(2) * (stages[0].rank_tensor("gpus") + 1) + 100
    y = x.to_mesh(stages[1])
    problems = [] if y.mesh is stages[1] else [f"y.mesh is {y.mesh!r}"]
    with stages[1].activate():
        z = y * 10
    back = z.to_mesh(stages[0])
    with stages[0].activate():
        w = back + 1
    one = monarch.slice_mesh(z, gpus=1).to_mesh(stages[0])
    for g in range(GPUS):
        problems.append(compare(fetch(y, gpus=g), [101.0 + g] * 2, f"y at gpus={g}"))
        problems.append(compare(fetch(z, gpus=g), [1010.0 + 10 * g] * 2, f"z at gpus={g}"))
        problems.append(compare(fetch(w, gpus=g), [1011.0 + 10 * g] * 2, f"back at gpus={g}"))
        problems.append(compare(fetch(one, gpus=g), [1020.0] * 2, f"one-to-many at gpus={g}"))
        problems.append(compare(fetch(x, gpus=g), [101.0 + g] * 2, f"x kept at gpus={g}"))
    return problems


def check_failure_then_work(mesh: Any) -> list[str]:
    """A command that fails on the workers raises RemoteException at the fetch that
    depends on it (on each host), fails a cross-host collective's output only, and the
    work issued after it runs."""
    problems = []
    with mesh.activate():
        a = torch.ones(2, 3)
        bad = a.index_select(0, torch.tensor([7]))  # out of range: only workers can tell
        dependent = bad + 1
        failed_reduce = bad.reduce("hosts", "sum")
        fine_reduce = a.reduce("hosts", "sum")
    for h, g in [(0, 0), (1, 1)]:
        for name, t in (("dependent", dependent), ("failed_reduce", failed_reduce)):
            try:
                fetch(t, h, g)
                problems.append(f"{name} at {h},{g}: no RemoteException")
            except RemoteException as e:
                if e.rank != rank_of(h, g) or e.coords != {"hosts": h, "gpus": g}:
                    problems.append(f"{name} at {h},{g}: raised for {e.rank} {e.coords}")
                if "index_select" not in str(e) or "out of range" not in str(e):
                    problems.append(f"{name} at {h},{g}: message {str(e)[-300:]!r}")
        problems.append(compare(fetch(fine_reduce, h, g), [[2.0] * 3] * 2, f"fine at {h},{g}"))
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        after = (torch.ones(2) * r).reduce(("hosts", "gpus"), "sum") + 1
    for h, g in COORDS:
        problems.append(compare(fetch(after, h, g), [7.0, 7.0], f"after at {h},{g}"))
    return problems


def result(value: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def main(workers: list[str]) -> None:
    started = time.monotonic()
    failures: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: failures.append(str(f))
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    hosts.initialized.get(timeout=60)
    with monarch.configured(tensor_collective_timeout=COLLECTIVE_TIMEOUT):
        procs = hosts.spawn_procs(per_host={"gpus": GPUS})
        procs.initialized.get(timeout=120)
    places = list(procs.spawn("where", Where).where.call().get(timeout=120).values())
    checks = Checks()
    try:
        checks.run("ops", lambda: check_ops(procs))
        for dims in DIMS:
            checks.run(f"reduce/{'+'.join(dims)}", lambda d=dims: check_reductions(procs, d))
        for dims in DIMS:
            checks.run(f"scatter/{'+'.join(dims)}", lambda d=dims: check_scatter(procs, d))
        checks.run("to_mesh", lambda: check_to_mesh(procs))
        checks.run("failure_then_work", lambda: check_failure_then_work(procs))
    finally:
        stop_error = None
        try:
            procs.stop().get(timeout=60)
        except Exception as e:
            stop_error = f"{type(e).__name__}: {e}"
        result(
            {
                "sizes": dict(procs.sizes),
                "places": places,
                "checks": checks.results,
                "times": checks.times,
                "stop_error": stop_error,
                "failures": failures[:3],
                "elapsed_s": round(time.monotonic() - started, 3),
            }
        )


if __name__ == "__main__":
    main(sys.argv[1:])
