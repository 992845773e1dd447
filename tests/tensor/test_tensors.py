"""Distributed tensors on one host: activation, recording, fetch, errors, collectives,
to_mesh, remote functions (see docs/tensors.md)."""

from __future__ import annotations

import asyncio
import gc

import pytest
import torch

import monarch
from monarch import RemoteException, fetch_shard, inspect, no_mesh, reduce, remote
from monarch.actor import ProcMesh, SupervisionError

# --- activation and recording ----------------------------------------------------------


def test_ops_run_on_every_rank_and_come_back_by_coordinates(mesh: ProcMesh) -> None:
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        x = torch.ones(2, 3) * r + 1
        y = x.sum()
    for h in range(2):
        for g in range(2):
            rank = 2 * h + g
            assert torch.equal(inspect(x, hosts=h, gpus=g), torch.full((2, 3), rank + 1.0))
            assert inspect(y, {"hosts": h, "gpus": g}).item() == 6 * (rank + 1)


def test_procs_are_forked_from_a_template_that_imported_torch(mesh: ProcMesh) -> None:
    from monarch.actor import Actor, endpoint

    class Parent(Actor):
        @endpoint
        def parent_cmdline(self) -> str:
            import os

            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode()

    cmdline = (
        mesh.spawn("parent", Parent).parent_cmdline.call().get(timeout=60).item(hosts=0, gpus=0)
    )
    assert "monarch._src.actor.forkserver --preload torch" in cmdline


def test_activate_takes_effect_without_with_and_deactivates(mesh: ProcMesh) -> None:
    mesh.activate()
    try:
        t = torch.zeros(3)
        assert isinstance(t, monarch.Tensor)
        assert monarch.get_active_mesh() is mesh
    finally:
        mesh.deactivate()
    assert not isinstance(torch.zeros(3), monarch.Tensor)
    with pytest.raises(ValueError, match="no mesh is active"):
        monarch.get_active_mesh()


def test_ops_on_monarch_tensors_outside_activate_use_their_mesh(mesh: ProcMesh) -> None:
    with mesh.activate():
        t = torch.arange(4.0)
    u = (t * 2).relu()  # no active mesh: the mesh comes from the tensor
    assert isinstance(u, monarch.Tensor)
    assert u.mesh is mesh
    assert torch.equal(inspect(u, hosts=1, gpus=1), torch.arange(4.0) * 2)


def test_no_mesh_runs_local_torch_inside_an_active_block(mesh: ProcMesh) -> None:
    with mesh.activate():
        remote_t = torch.ones(2)
        with no_mesh.activate():
            local = torch.ones(2) + 1
        assert not isinstance(local, monarch.Tensor)
        assert isinstance(remote_t, monarch.Tensor)
    assert torch.equal(local, torch.full((2,), 2.0))


def test_rank_tensor_without_activation_and_rank_tensors(mesh: ProcMesh) -> None:
    g = mesh.rank_tensor("gpus")
    ranks = mesh.rank_tensors()
    assert set(ranks) == {"hosts", "gpus"}
    assert inspect(g, hosts=1, gpus=1).item() == 1
    assert inspect(ranks["hosts"], hosts=1, gpus=0).item() == 1
    assert inspect(mesh.rank(("hosts", "gpus")), hosts=1, gpus=0).item() == 2


def test_views_activate_whichever_first(own_mesh: ProcMesh) -> None:
    # A slice before its root, then renamed, split and flattened views.
    one = own_mesh.slice(gpus=1)
    with one.activate():
        a = torch.full((2,), 5.0)
    assert inspect(a).tolist() == [5.0, 5.0]
    with own_mesh.rename(gpus="dp").activate():
        b = torch.ones(1) * own_mesh.rename(gpus="dp").rank_tensor("dp")
    assert inspect(b, dp=1).item() == 1.0
    with own_mesh.flatten("all").activate():
        c = torch.ones(1)
    assert inspect(c, all=1).item() == 1.0
    with own_mesh.split(gpus=("a", "b"), b=1).activate():
        d = torch.ones(1) * 3
    assert inspect(d, a=1, b=0).item() == 3.0
    table = own_mesh.to_table()
    assert "gpus" in table and "rank" in table


def test_factories_dtypes_views_and_in_place(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
        v = x[1]  # a view: writing it writes x
        v.add_(100)
        t = x.t().contiguous()
        f = torch.tensor([1.5, 2.5])  # local data, sent with the command
        m = torch.randn(4, 4) @ torch.eye(4)
    assert inspect(x)[1].tolist() == [104, 105, 106, 107]
    assert inspect(t).shape == (4, 3)
    assert x.dtype == torch.int32 and t.stride() == (3, 1)
    assert inspect(f).tolist() == [1.5, 2.5]
    assert inspect(m).shape == (4, 4)


def test_modules_and_autograd_run_on_the_workers(mesh: ProcMesh) -> None:
    with mesh.activate():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        x = torch.ones(3, 4)
        loss = model(x).pow(2).sum()
        loss.backward()
        grad = model.weight.grad
    assert isinstance(grad, monarch.Tensor)
    w, b = inspect((model.weight, model.bias))
    out = torch.ones(3, 4) @ w.T + b
    expected = (2 * out).T @ torch.ones(3, 4)
    assert torch.allclose(inspect(grad), expected, atol=1e-5)


def test_the_profiler_runs_locally_under_an_active_mesh(mesh: ProcMesh) -> None:
    with mesh.activate():
        with torch.autograd.profiler.record_function("step"):
            t = torch.ones(2) + 1
    assert inspect(t).tolist() == [2.0, 2.0]


def test_values_cannot_be_read_on_the_client(mesh: ProcMesh) -> None:
    with mesh.activate():
        t = torch.ones(2)
        with pytest.raises(RuntimeError, match="inspect"):
            t.sum().item()
        with pytest.raises(RuntimeError, match="inspect"):
            bool(t.sum() > 0)
    assert "monarch.Tensor" in repr(t)


# --- errors --------------------------------------------------------------------------------


def test_a_shape_error_raises_at_the_call(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="must have same reduction dim"):
            a @ a  # shapes are checked on the client, at once


def test_a_failed_op_raises_at_fetch_and_later_work_runs(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(2, 3)
        index = torch.tensor([7])
        bad = a.index_select(0, index)  # out of range: only the workers can tell
        dependent = bad + 1
        good = a + 1
    with pytest.raises(RemoteException) as info:
        inspect(dependent)
    e = info.value
    assert e.rank == 0 and e.coords == {"hosts": 0, "gpus": 0}
    text = str(e)
    assert "bad = a.index_select(0, index)" in text  # the client line
    assert "out of range" in text  # the worker error
    assert torch.equal(inspect(good), torch.full((2, 3), 2.0))
    with mesh.activate():
        again = torch.ones(1) + 1
    assert inspect(again).item() == 2.0


def test_a_remote_function_failing_on_one_rank(mesh: ProcMesh) -> None:
    @remote(propagate=lambda x: x)
    def fail_on_rank_3(x: torch.Tensor) -> torch.Tensor:
        from monarch.actor import context

        if context().actor_instance.rank.rank == 3:
            raise ValueError("rank 3 refuses")
        return x + 1

    with mesh.activate():
        y = fail_on_rank_3(torch.zeros(2))
    assert inspect(y, hosts=0, gpus=0).tolist() == [1.0, 1.0]
    with pytest.raises(RemoteException, match="rank 3 refuses") as info:
        inspect(y, hosts=1, gpus=1)
    assert info.value.rank == 3
    assert "fail_on_rank_3" in str(info.value)


def test_bad_arguments_are_named(mesh: ProcMesh, own_mesh: ProcMesh) -> None:
    local = torch.ones(2)
    with own_mesh.activate():
        other = torch.ones(2)
    with mesh.activate():
        mine = torch.ones(2)
        # Local tensors alone (fetched values) compute locally; mixed, they are an error.
        assert (inspect(mine) + local).sum().item() == 4.0
        with pytest.raises(TypeError) as info:
            torch.add(mine, local)
        assert "LOCAL_TENSOR" in str(info.value) and "argument 1" in str(info.value)
        with pytest.raises(TypeError, match="WRONG_MESH"):
            torch.cat([mine, other])
        gone = torch.ones(2)
        gone.drop()
        with pytest.raises(TypeError, match="DROPPED"):
            mine + gone
        with pytest.raises(TypeError, match="REQUIRES_GRAD"):
            remote(torch.relu)(torch.ones(2, requires_grad=True))
    with pytest.raises(TypeError, match="DROPPED"):
        inspect(gone)


def test_a_killed_proc_is_a_supervision_error_at_the_next_use(
    own_mesh: ProcMesh, faults: object
) -> None:
    import os
    import signal

    from monarch.actor import Actor, endpoint

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    with own_mesh.activate():
        t = torch.ones(2)
    assert inspect(t).tolist() == [1.0, 1.0]
    pids = own_mesh.spawn("pid", Pid).pid.call().get(timeout=30)
    os.kill(pids.item(gpus=1), signal.SIGKILL)
    with pytest.raises(SupervisionError):
        for _ in range(600):  # until the death is known: every use raises then
            with own_mesh.activate():
                t = t + 1
            inspect(t, gpus=1)


# --- memory --------------------------------------------------------------------------------


def test_temporaries_are_freed_on_the_workers(mesh: ProcMesh) -> None:
    @remote(propagate=lambda: torch.zeros(()))
    def live_values() -> torch.Tensor:
        from monarch.actor import context

        del context  # the worker is the current actor; count its table
        import gc as _gc

        from monarch._src.tensor_engine.worker.actor import TensorWorker

        workers = [o for o in _gc.get_objects() if isinstance(o, TensorWorker)]
        return torch.tensor(float(max(len(w.values) for w in workers)))

    with mesh.activate():
        x = torch.zeros(4, 4)
        for _ in range(100_000):
            x = x + 1
        before = live_values()
    assert inspect(x)[0, 0].item() == 100_000
    gc.collect()
    assert inspect(before).item() < 5_000


# --- collectives ---------------------------------------------------------------------------


def _rank_values(mesh: ProcMesh) -> monarch.Tensor:
    """Per rank r (row-major over hosts, gpus): [r + 1, 2 (r + 1)], int64."""
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus")) + 1
        return torch.stack([r, 2 * r])


EXPECTED_ALL = {
    # over both dims: ranks 1..4
    "sum": [10, 20],
    "avg": [2, 5],  # integer average of [1..4]=2 (floor), of [2..8]=5
    "product": [24, 384],
    "min": [1, 2],
    "max": [4, 8],
    "band": [1 & 2 & 3 & 4, 2 & 4 & 6 & 8],
    "bor": [1 | 2 | 3 | 4, 2 | 4 | 6 | 8],
    "bxor": [1 ^ 2 ^ 3 ^ 4, 2 ^ 4 ^ 6 ^ 8],
}


@pytest.mark.parametrize("reduction", sorted(EXPECTED_ALL))
def test_every_reduction_over_two_dims(mesh: ProcMesh, reduction: str) -> None:
    x = _rank_values(mesh)
    if reduction == "avg":
        x = x.double()
    out = x.reduce(("hosts", "gpus"), reduction)
    expected = torch.tensor(EXPECTED_ALL[reduction], dtype=out.dtype)
    if reduction == "avg":
        expected = torch.tensor([2.5, 5.0], dtype=torch.float64)
    for h in range(2):
        for g in range(2):
            assert torch.equal(inspect(out, hosts=h, gpus=g), expected), (h, g)


@pytest.mark.parametrize("reduction", ["sum", "product", "min", "max", "band", "bor", "bxor"])
def test_every_reduction_over_one_dim(mesh: ProcMesh, reduction: str) -> None:
    import functools
    import operator

    ops = {
        "sum": operator.add,
        "product": operator.mul,
        "min": min,
        "max": max,
        "band": operator.and_,
        "bor": operator.or_,
        "bxor": operator.xor,
    }
    x = _rank_values(mesh)
    out = x.reduce("gpus", reduction)
    for h in range(2):
        members = [2 * h + g + 1 for g in range(2)]
        expected = [
            functools.reduce(ops[reduction], members),
            functools.reduce(ops[reduction], [2 * m for m in members]),
        ]
        for g in range(2):
            assert inspect(out, hosts=h, gpus=g).tolist() == expected


def test_avg_over_one_dim_and_in_place_and_pytrees(mesh: ProcMesh) -> None:
    x = _rank_values(mesh).float()
    avg = x.reduce("hosts", "avg")
    # hosts pairs: gpus=0 -> ranks 1, 3; gpus=1 -> ranks 2, 4
    assert inspect(avg, hosts=1, gpus=0).tolist() == [2.0, 4.0]
    y = x.clone()
    same = y.reduce_("gpus", "max")
    assert same is y
    assert inspect(y, hosts=1, gpus=0).tolist() == [4.0, 8.0]
    both = reduce({"a": x, "b": [x * 10]}, "gpus", "sum")
    assert inspect(both["b"][0], hosts=0, gpus=1).tolist() == [30.0, 60.0]
    out = torch.zeros(2)
    with mesh.activate():
        out = torch.zeros(2)
    x.reduce("gpus", "sum", out=out)
    assert inspect(out, hosts=1, gpus=1).tolist() == [7.0, 14.0]


def test_stack_gathers_and_scatter_splits(mesh: ProcMesh) -> None:
    x = _rank_values(mesh)
    gathered = x.reduce("gpus", "stack")
    assert gathered.shape == (2, 2)
    assert inspect(gathered, hosts=1, gpus=0).tolist() == [[3, 6], [4, 8]]
    everything = x.reduce(("hosts", "gpus"), "stack")
    assert inspect(everything, hosts=0, gpus=1)[:, 0].tolist() == [1, 2, 3, 4]
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus"))
        rows = torch.arange(4).reshape(2, 2) + 10 * r  # per rank: [[0, 1], [2, 3]] + 10 r
    rs = rows.reduce("gpus", "sum", scatter=True)  # each gpu keeps its row of the sum
    assert rs.shape == (2,)
    # hosts=0: ranks 0, 1 -> sum of rows = [[0+10, 1+10+...]]
    assert inspect(rs, hosts=0, gpus=0).tolist() == [0 + 10, 2 + 10]
    assert inspect(rs, hosts=0, gpus=1).tolist() == [4 + 10, 6 + 10]
    a2a = rows.reduce("gpus", "stack", scatter=True)  # all-to-all: row i from rank i
    assert inspect(a2a, hosts=1, gpus=1).tolist() == [[22, 23], [32, 33]]


def test_reduce_checks_its_arguments(mesh: ProcMesh) -> None:
    x = _rank_values(mesh)
    with pytest.raises(ValueError, match="unknown reduction"):
        x.reduce("gpus", "median")
    with pytest.raises(ValueError, match="not dimensions"):
        x.reduce("nodes")
    with pytest.raises(NotImplementedError):
        x.reduce("gpus", mesh=mesh)
    with pytest.raises(TypeError, match="bitwise"):
        x.float().reduce("gpus", "bxor")
    with pytest.raises(ValueError, match="first dimension"):
        x.reduce(("hosts", "gpus"), "sum", scatter=True)


def test_a_failed_input_fails_the_collective_output_only(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(2, 3)
        bad = a.index_select(0, torch.tensor([9]))  # fails on the workers
        out = bad.reduce("gpus", "sum")
        fine = a.reduce("gpus", "sum")
    with pytest.raises(RemoteException):
        inspect(out)
    assert inspect(fine).tolist() == [[2.0] * 3] * 2
    with pytest.raises(RemoteException):
        inspect(bad)


# --- moving between meshes ------------------------------------------------------------------


def test_to_mesh_between_slices_and_pipelines(mesh: ProcMesh) -> None:
    stages = [mesh.slice(hosts=i) for i in range(2)]
    with stages[0].activate():
        x = torch.ones(2) * (stages[0].rank_tensor("gpus") + 1)
    y = x.to_mesh(stages[1])
    assert y.mesh is stages[1]
    with stages[1].activate():
        z = y * 10
    assert inspect(z, gpus=1).tolist() == [20.0, 20.0]
    # one rank to many
    single = monarch.slice_mesh(z, gpus=1).to_mesh(stages[0])
    assert inspect(single, gpus=0).tolist() == [20.0, 20.0]
    # Ranks that both send and receive: ranks 0, 1 send to ranks 1, 2.
    flat = mesh.flatten("all")
    with flat.activate():
        w = torch.ones(1) * flat.rank_tensor("all")
    moved = monarch.slice_mesh(w, all=slice(0, 2)).to_mesh(flat.slice(all=slice(1, 3)))
    assert inspect(moved, all=0).item() == 0.0  # rank 1 got rank 0's shard
    assert inspect(moved, all=1).item() == 1.0  # rank 2 got rank 1's shard
    assert inspect(w, all=1).item() == 1.0  # and rank 1 kept its own


def test_to_mesh_checks_sizes(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = torch.ones(1)
    with pytest.raises(ValueError, match="same number of ranks"):
        x.to_mesh(mesh.slice(hosts=0))


# --- remote functions -------------------------------------------------------------------------


def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x.sum()


def test_remote_functions_in_every_form(mesh: ProcMesh) -> None:
    cached = remote(scale)
    by_path = remote("tests_tensor_helpers.scale_by_path", propagate=lambda x, f: x)
    inspected = remote(pair, propagate="inspect")

    @remote(propagate=lambda x: (x, x.sum()))
    def decorated(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 3, x.sum() * 3

    with mesh.activate():
        x = torch.ones(3) * (mesh.rank_tensor("gpus") + 1)
        a = cached(x, 2.0)
        a2 = cached(x, 4.0)  # cached propagation, new values
        b = by_path(x, 5.0)
        c, d = inspected(x)
        e, f = decorated(x)
    assert inspect(a, hosts=0, gpus=1).tolist() == [4.0] * 3
    assert inspect(a2, hosts=0, gpus=1).tolist() == [8.0] * 3
    assert inspect(b, hosts=1, gpus=0).tolist() == [5.0] * 3
    assert inspect(c, gpus=1).tolist() == [3.0] * 3 and inspect(d, gpus=1).item() == 6.0
    assert inspect(f, gpus=1).item() == 18.0 and e.shape == (3,)


def test_remote_adverbs_return_values(mesh: ProcMesh) -> None:
    def where(x: torch.Tensor) -> float:
        return float(x.sum())

    fn = remote(where)
    with mesh.activate():
        x = torch.ones(2) * mesh.rank_tensor(("hosts", "gpus"))
        values = fn.call(x).get(timeout=60)
        assert sorted(v for _, v in values.items()) == [0.0, 2.0, 4.0, 6.0]
        fn.broadcast(x)
    with mesh.slice(hosts=1, gpus=1).activate():
        assert fn.call_one(torch.ones(3)).get(timeout=60) == 3.0
    got = monarch.call_on_shard_and_fetch(fn, x, shard={"hosts": 1, "gpus": 0}).get(timeout=60)
    assert got == 4.0


def test_remote_choose_stream_and_send_to_a_port(mesh: ProcMesh) -> None:
    from monarch.actor import Channel, send

    def rank_of(x: torch.Tensor) -> int:
        from monarch.actor import context

        return context().actor_instance.rank.rank

    fn = remote(rank_of)
    with mesh.activate():
        x = torch.ones(1)
        assert fn.choose(x).get(timeout=60) in range(4)
        streamed = sorted(f.get(timeout=60) for f in fn.stream(x))
        assert streamed == [0, 1, 2, 3]
        port, receiver = Channel.open()
        send(fn, (x,), {}, port=port)
        got = sorted(receiver.recv().get(timeout=60) for _ in range(4))
    assert got == [0, 1, 2, 3]


def test_an_argument_that_cannot_be_sent_fails_only_its_command(mesh: ProcMesh) -> None:
    import threading

    def takes(x: torch.Tensor, anything: object) -> torch.Tensor:
        return x + 1

    fn = remote(takes, propagate=lambda x, anything: x)
    with mesh.activate():
        x = torch.ones(2)
        bad = fn(x, threading.Lock())  # a lock cannot be pickled
        good = fn(x, 1)
    with pytest.raises(RemoteException, match="cannot be sent to the workers"):
        inspect(bad)
    assert inspect(good).tolist() == [2.0, 2.0]


def test_remote_without_an_active_mesh_is_an_error() -> None:
    with pytest.raises(ValueError, match="no mesh is active"):
        remote(scale)(1, 2)


def test_process_groups_inside_remote_functions(mesh: ProcMesh) -> None:
    def all_reduce(x: torch.Tensor, group: object) -> torch.Tensor:
        import torch.distributed as dist

        y = x.clone()
        dist.all_reduce(y, group=group)  # type: ignore[arg-type]
        return y

    fn = remote(all_reduce, propagate=lambda x, group: x)
    with mesh.activate():
        x = torch.ones(2) * (mesh.rank_tensor(("hosts", "gpus")) + 1)
        pg = mesh.process_group("gpus")
        y = fn(x, pg)
    assert inspect(y, hosts=1, gpus=1).tolist() == [7.0, 7.0]


# --- async code -------------------------------------------------------------------------------


def test_fetch_from_async_code(mesh: ProcMesh) -> None:
    async def main() -> list[float]:
        with mesh.activate():
            t = torch.arange(3.0) + 1
        values = await fetch_shard(t, hosts=1)
        return values.tolist()  # type: ignore[no-any-return]

    assert asyncio.run(main()) == [1.0, 2.0, 3.0]


def test_show_names_its_optional_package(mesh: ProcMesh) -> None:
    with mesh.activate():
        t = torch.ones(2)
    try:
        import torchshow  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="torchshow"):
            monarch.show(t)


@pytest.mark.parametrize("warm", [False, True], ids=["at-set-up", "at-a-barrier"])
def test_a_collective_with_a_missing_rank_fails_within_the_timeout(warm: bool) -> None:
    # Cold, the stall hits the group's set-up (through the controller's store); warm, the
    # first barrier of the shared segment's all-reduce.
    import time

    from tests_tensor_helpers import preloading_torch

    from monarch.actor import this_host

    with monarch.configured(tensor_collective_timeout="2s"), preloading_torch():
        pm = this_host().spawn_procs(per_host={"gpus": 2})

    # Rank 1 is busy far longer than the collective's timeout: rank 0 must give up and
    # say which rank never came.
    @remote(propagate=lambda x: x)
    def stall_rank_1(x: torch.Tensor) -> torch.Tensor:
        import time as _time

        from monarch.actor import context

        if context().actor_instance.rank.rank == 1:
            _time.sleep(6)
        return x

    try:
        with pm.activate():
            if warm:
                ready = torch.ones(2).reduce("gpus", "sum")  # sets the group up
                assert inspect(ready, gpus=0).tolist() == [2.0, 2.0]
            y = stall_rank_1(torch.ones(2)).reduce("gpus", "sum")
            start = time.monotonic()
            with pytest.raises(RemoteException) as info:
                inspect(y, gpus=0)
            assert time.monotonic() - start < 5.5  # the timeout, not rank 1's stall
            text = str(info.value)
            assert "ranks [1] did not join it within 2" in text
            if warm:
                assert "heard nothing from ranks [1] within 2" in text  # the barrier's
            # Both ranks go on afterwards.
            z = torch.ones(1) + 1
            assert inspect(z, gpus=1).item() == 2.0
    finally:
        pm.stop().get(timeout=60)


def test_large_all_reduces_on_one_host_read_peer_memory(mesh: ProcMesh) -> None:
    # All-reduces among procs of one host go through a shared segment
    # (monarch._src.tensor_engine.worker.shm); an odd size leaves uneven chunks.
    n = (4 << 20) // 4 + 3
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus")) + 1
        x = torch.ones(n) * r
        xi = torch.ones(n, dtype=torch.int64) * r
        results = {red: x.reduce(("hosts", "gpus"), red) for red in ("sum", "avg", "max", "min")}
        results["product"] = x.reduce(("hosts", "gpus"), "product")
        bits = xi.reduce(("hosts", "gpus"), "bxor")
        pairs = x.reduce("gpus", "sum")
        z = x.clone()
        z.reduce_(("hosts", "gpus"), "sum")
    expected = {"sum": 10.0, "avg": 2.5, "max": 4.0, "min": 1.0, "product": 24.0}
    for red, value in expected.items():
        got = inspect(results[red], hosts=1, gpus=1)
        assert got.shape == (n,) and bool((got == value).all()), red
    assert bool((inspect(bits, gpus=1) == 1 ^ 2 ^ 3 ^ 4).all())
    assert bool((inspect(pairs, hosts=1, gpus=0) == 3 + 4).all())
    assert bool((inspect(z, hosts=0, gpus=1) == 10.0).all())
    assert bool((inspect(x, hosts=1, gpus=1) == 4.0).all())  # the input is untouched

    @remote(propagate=lambda: torch.zeros(()))
    def used_shared_memory() -> torch.Tensor:
        import gc as _gc

        from monarch._src.tensor_engine.worker.actor import TensorWorker

        workers = [o for o in _gc.get_objects() if isinstance(o, TensorWorker)]
        return torch.tensor(float(any(any(w.collectives.shm_groups.values()) for w in workers)))

    with mesh.activate():
        used = used_shared_memory()
    assert inspect(used).item() == 1.0
