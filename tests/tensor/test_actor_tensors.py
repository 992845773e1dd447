"""Distributed tensors and actor endpoints: monarch tensors passed to an endpoint of
actors on the same procs arrive as each actor's local shard, in program order;
``endpoint.rref`` makes an endpoint's results distributed tensors (see docs/tensors.md).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch

import monarch
from monarch import RemoteException, fetch_shard
from monarch.actor import Actor, ProcMesh, as_endpoint, context, endpoint

T = 30  # seconds: the bound on every wait


class Shards(Actor):
    """Reports what it receives, with its own rank."""

    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def got(self, x: torch.Tensor, scale: int = 1, extra: Any = None) -> Any:
        rank = context().actor_instance.rank.rank
        if extra is not None:
            return rank, (x * scale).tolist(), extra
        return rank, (x * scale).tolist()

    @endpoint(explicit_response_port=True)
    def via_port(self, port: Any, x: torch.Tensor) -> None:
        port.send((context().actor_instance.rank.rank, x.tolist()))

    @endpoint
    def scribble(self, x: torch.Tensor) -> list[float]:
        x.add_(1)  # the actor's copy only
        return x.tolist()

    @endpoint
    def keep(self, x: torch.Tensor) -> None:
        self.kept.append(x.tolist())

    @endpoint
    def kept_then(self, x: torch.Tensor) -> Any:
        return self.kept, x.tolist()

    @endpoint(propagate=lambda: torch.zeros((), dtype=torch.int64))
    def thread_id(self) -> torch.Tensor:
        return torch.tensor(threading.get_ident(), dtype=torch.int64)

    @endpoint(propagate=lambda x: (x.sum(0), {"twice": x * 2}))
    def summed(self, x: torch.Tensor) -> Any:
        return x.sum(0), {"twice": x * 2}

    @endpoint(propagate=lambda n: torch.zeros(n))
    def ranked(self, n: int) -> torch.Tensor:
        return torch.full((n,), float(context().actor_instance.rank.rank))

    @endpoint(propagate=lambda x: x)
    def refuse_on_rank_2(self, x: torch.Tensor) -> torch.Tensor:
        if context().actor_instance.rank.rank == 2:
            raise ValueError("rank 2 refuses")
        return x + 1

    @endpoint(propagate=lambda x: x)
    def wrong_shape(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(7)

    @endpoint(propagate=lambda x: x)
    def wrong_count(self, x: torch.Tensor) -> Any:
        return x, x

    @endpoint
    def no_propagate(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def plain_double(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Stateful(Actor):
    """Holds the tensors given to its constructor."""

    def __init__(self, state: torch.Tensor, *, more: Any = None) -> None:
        self.state = state
        self.more = more

    @endpoint
    def read(self) -> Any:
        rank = context().actor_instance.rank.rank
        more = None if self.more is None else {k: v.tolist() for k, v in self.more.items()}
        return rank, self.state.tolist(), more

    @endpoint
    def scribble(self) -> None:
        self.state.add_(1000)  # the actor's copy only


class Counter(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def incr(self, x: Any) -> int:
        self.count += 1
        return self.count - 1


class Weights(Actor):
    def __init__(self) -> None:
        self.weight = torch.zeros(2)

    def times(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight

    @endpoint(propagate="inspect")
    def update(self, w: torch.Tensor) -> None:
        self.weight += w


class AsyncShards(Actor):
    @endpoint(propagate=lambda x: x)
    async def inc(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.fixture(scope="module")
def actors(mesh: ProcMesh) -> Any:
    a = mesh.spawn("shards", Shards)
    a.initialized.get(timeout=60)
    return a


def _by_rank(values: Any) -> dict[int, Any]:
    out = {}
    for _, (rank, *rest) in values.items():
        out[rank] = rest
    return out


def _rank_values(mesh: ProcMesh) -> Any:
    """Inside an active block: a (2,)-tensor holding ``[10 r + 1, 10 r + 2]`` on rank r."""
    r = mesh.rank_tensor(("hosts", "gpus")).float()
    return r * 10 + torch.tensor([1.0, 2.0])


def _expected(r: int, plus: float = 0.0) -> list[float]:
    return [10.0 * r + 1 + plus, 10.0 * r + 2 + plus]


# --- tensors to endpoints -------------------------------------------------------------------


def test_each_actor_gets_its_own_shard(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        got = actors.got.call(x, scale=2, extra={"plain": torch.ones(1), "n": 3}).get(timeout=T)
    assert len(got) == 4
    for point, (rank, value, extra) in got.items():
        assert rank == 2 * point["hosts"] + point["gpus"]
        assert value == [2 * v for v in _expected(rank)]
        assert extra["n"] == 3 and torch.equal(extra["plain"], torch.ones(1))
    # Outside an active block the tensors' own mesh is used; tensors nested in
    # containers are delivered too.
    got2 = actors.got.call(x, extra=[x, {"y": x}]).get(timeout=T)
    for _, (rank, value, extra) in got2.items():
        assert value == _expected(rank)
        assert extra[0].tolist() == _expected(rank) and extra[1]["y"].tolist() == _expected(rank)


def test_the_call_runs_after_the_ops_that_produced_its_tensors(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        y = x
        for _ in range(200):
            y = y + 1
        x.add_(1000)  # in place, before the call: visible to it
        fut_y = actors.got.call(y)
        fut_x = actors.got.call(x)
        x.add_(5)  # after the call: the actor got its shard as it was at the call
        fut_x2 = actors.got.call(x)
    assert _by_rank(fut_y.get(timeout=T)) == {r: [_expected(r, 200)] for r in range(4)}
    assert _by_rank(fut_x.get(timeout=T)) == {r: [_expected(r, 1000)] for r in range(4)}
    assert _by_rank(fut_x2.get(timeout=T)) == {r: [_expected(r, 1005)] for r in range(4)}


def test_call_one_choose_stream_and_broadcast(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        # A slice of the actors gets the shards of its own procs.
        one = actors.slice(hosts=1, gpus=0).got.call_one(x).get(timeout=T)
        assert one == (2, _expected(2))
        rank, value = actors.got.choose(x).get(timeout=T)
        assert value == _expected(rank)
        streamed = [f.get(timeout=T) for f in actors.got.stream(x)]
        assert sorted(streamed) == [(r, _expected(r)) for r in range(4)]
        sliced = actors.slice(gpus=1).got.call(x).get(timeout=T)
        assert _by_rank(sliced) == {1: [_expected(1)], 3: [_expected(3)]}
        # broadcast: nothing comes back; a later tensor call is delivered after it.
        assert actors.keep.broadcast(x) is None
        kept = actors.kept_then.call(x + 1).get(timeout=T)
    for _, (kept_values, now) in kept.items():
        assert now[0] % 10 == 2  # 10 r + 2
        r = int(now[0]) // 10
        assert kept_values[-1] == _expected(r)
    with pytest.raises(ValueError, match="exactly 1 actor"):
        actors.got.call_one(x)


def test_explicit_port_endpoints_and_the_actors_copy(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        via_port = actors.via_port.call(x).get(timeout=T)
        scribbled = actors.scribble.call(x).get(timeout=T)
    assert _by_rank(via_port) == {r: [_expected(r)] for r in range(4)}
    assert sorted(scribbled.values()) == [_expected(r, 1) for r in range(4)]
    # The actor changed its copy, not the distributed tensor.
    assert fetch_shard(x, hosts=1, gpus=1).get(timeout=T).tolist() == _expected(3)


def test_awaiting_a_tensor_call(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)

    async def main() -> Any:
        return await asyncio.wait_for(actors.got.call(x), T)

    assert _by_rank(asyncio.run(main())) == {r: [_expected(r)] for r in range(4)}


def test_tensors_of_other_procs_are_refused(
    mesh: ProcMesh, own_mesh: ProcMesh, actors: Any
) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
    elsewhere = own_mesh.spawn("elsewhere", Shards)
    with pytest.raises(ValueError, match="an actor receives the shards of tensors on its own"):
        elsewhere.got.call(x)
    # Actors on procs the tensors' mesh does not have.
    with mesh.slice(hosts=0).activate():
        half = torch.ones(2)
    with pytest.raises(ValueError, match=r"global ranks \[0, 1, 2, 3\]\) must be on procs"):
        actors.got.call(half)
    # Other arguments are still checked against the signature.
    with pytest.raises(TypeError, match="wrong arguments for endpoint"):
        actors.got.call(x, 1, 2, 3)


def test_a_failed_input_fails_the_call(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        bad = torch.ones(2, 3).index_select(0, torch.tensor([7]))  # fails on the workers
    with pytest.raises(RemoteException, match="out of range"):
        actors.got.call(bad).get(timeout=T)
    with mesh.activate():
        x = _rank_values(mesh)
    assert _by_rank(actors.got.call(x).get(timeout=T)) == {r: [_expected(r)] for r in range(4)}


# --- rref -----------------------------------------------------------------------------------


def test_rref_makes_distributed_tensors(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        total, rest = actors.summed.rref(x)
        ranked = actors.ranked.rref(3)
        later = total * 2 + ranked.sum()  # used as any monarch tensor
    assert isinstance(total, monarch.Tensor) and total.shape == ()
    assert isinstance(rest["twice"], monarch.Tensor) and rest["twice"].shape == (2,)
    assert isinstance(ranked, monarch.Tensor) and ranked.shape == (3,)
    for h in range(2):
        for g in range(2):
            r = 2 * h + g
            got_total, got_rest, got_ranked, got_later = fetch_shard(
                (total, rest, ranked, later), hosts=h, gpus=g
            ).get(timeout=T)
            assert got_total.item() == sum(_expected(r))
            assert got_rest["twice"].tolist() == [2 * v for v in _expected(r)]
            assert got_ranked.tolist() == [float(r)] * 3
            assert got_later.item() == 2 * sum(_expected(r)) + 3 * r


def test_rref_on_an_async_actor_does_not_deadlock(mesh: ProcMesh) -> None:
    a = mesh.spawn("async_shards", AsyncShards)
    with mesh.activate():
        x = _rank_values(mesh)
        y = a.inc.rref(a.inc.rref(x))
    assert fetch_shard(y, hosts=1, gpus=1).get(timeout=T).tolist() == _expected(3, 2)


def test_an_endpoint_raising_under_rref_fails_its_outputs(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        y = actors.refuse_on_rank_2.rref(x)
        z = y + 1
        wrong = actors.wrong_count.rref(x)
        after = x + 1
    assert fetch_shard(y, hosts=0, gpus=1).get(timeout=T).tolist() == _expected(1, 1)
    with pytest.raises(RemoteException, match="rank 2 refuses") as info:
        fetch_shard(z, hosts=1, gpus=0).get(timeout=T)
    assert info.value.rank == 2
    assert "refuse_on_rank_2.rref(x)" in str(info.value)  # the client line
    # A result with another number of tensors than propagate said fails the outputs.
    with pytest.raises(RemoteException, match="returned 2 tensors, but its propagate"):
        fetch_shard(wrong).get(timeout=T)
    # The workers go on.
    assert fetch_shard(after, hosts=1, gpus=0).get(timeout=T).tolist() == _expected(2, 1)
    # A failed rref output passed to an endpoint fails that call.
    with pytest.raises(RemoteException, match="rank 2 refuses"):
        actors.got.call(y).get(timeout=T)


def test_rref_needs_propagate_and_the_actors_procs(mesh: ProcMesh, actors: Any) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        with pytest.raises(ValueError, match=r"@endpoint\(propagate=fn\)"):
            actors.no_propagate.rref(x)
        with pytest.raises(ValueError, match="must be on the same procs as"):
            actors.slice(hosts=0).summed.rref(x)
        # as_endpoint(..., propagate=) gives a plain method one.
        doubled = as_endpoint(actors.plain_double, propagate=lambda x: x).rref(x)
    assert fetch_shard(doubled, hosts=1, gpus=0).get(timeout=T).tolist() == [
        2 * v for v in _expected(2)
    ]
    with pytest.raises(ValueError, match="no mesh is active"):
        actors.ranked.rref(3)


def test_the_endpoint_runs_on_another_thread_than_the_worker(mesh: ProcMesh, actors: Any) -> None:
    # The worker waits for an rref's result on its own thread: the actor must answer on
    # another one.
    @monarch.remote(propagate=lambda: torch.zeros((), dtype=torch.int64))
    def worker_thread() -> torch.Tensor:
        return torch.tensor(threading.get_ident(), dtype=torch.int64)

    with mesh.activate():
        on_worker = worker_thread()
        on_actor = actors.thread_id.rref()
    for g in range(2):
        w, a = fetch_shard((on_worker, on_actor), hosts=1, gpus=g).get(timeout=T)
        assert w.item() != a.item()


def test_import_monarch_actor_does_not_import_torch() -> None:
    code = "import sys, monarch.actor; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_calls_run_on_their_tensors_stream_and_rref_on_the_active_one(
    mesh: ProcMesh, actors: Any
) -> None:
    other = monarch.Stream("actor_side")
    with mesh.activate():
        x = _rank_values(mesh)
        with other.activate():
            y = _rank_values(mesh) + 100
            # A call goes on its tensors' stream (here "actor_side", whatever is active).
            got = actors.got.call(y)
            z = actors.summed.rref(y)[0]
            with pytest.raises(TypeError, match="WRONG_STREAM"):
                actors.summed.rref(x)
        with pytest.raises(TypeError, match="WRONG_STREAM"):
            actors.got.call(x, extra=y)
    assert _by_rank(got.get(timeout=T)) == {r: [_expected(r, 100)] for r in range(4)}
    assert z.stream is other
    assert fetch_shard(z, hosts=1, gpus=1).get(timeout=T).item() == sum(_expected(3, 100))


def test_a_result_of_another_shape_than_propagate_said_is_kept_with_a_warning(
    mesh: ProcMesh, actors: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """As upstream, the endpoint's real result becomes the tensor's shard; each rank
    warns on its stderr (forwarded to the client), naming both shapes."""
    with mesh.activate():
        x = _rank_values(mesh)
        wrong = actors.wrong_shape.rref(x)
        total = wrong.sum()
    assert wrong.shape == (2,)  # what propagate said, on the client
    assert fetch_shard(wrong, hosts=1, gpus=0).get(timeout=T).tolist() == [0.0] * 7
    assert fetch_shard(total, hosts=0, gpus=1).get(timeout=T).item() == 0.0
    said = "tensor 0 of the endpoint's result is (7,) torch.float32, but its propagate"
    err = ""
    deadline = time.monotonic() + T
    while err.count(said) < 4 and time.monotonic() < deadline:
        err += capsys.readouterr().err
        time.sleep(0.05)
    assert err.count(said) >= 4, err  # once per rank
    assert "function said (2,) torch.float32" in err


def test_rref_of_an_endpoint_with_propagate_inspect_runs_it_in_order(mesh: ProcMesh) -> None:
    weights = mesh.spawn("weights", Weights)
    with mesh.activate():
        times = as_endpoint(weights.times, propagate=lambda x: x)
        x = _rank_values(mesh)
        before = times.rref(x)
        assert weights.update.rref(torch.ones(2)) is None  # run for its effect
        after = times.rref(x)
    assert fetch_shard(before, hosts=1, gpus=1).get(timeout=T).tolist() == [0.0, 0.0]
    assert fetch_shard(after, hosts=1, gpus=1).get(timeout=T).tolist() == _expected(3)


# --- tensors to constructors ------------------------------------------------------------------


def test_spawn_gives_each_actor_its_own_shard(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
        actors = mesh.spawn("stateful", Stateful, x, more={"twice": x * 2})
        x.add_(100)  # after the spawn: the actors got their shards as they were
        # A spawn on a slice of the tensors' procs gets the shards of its own procs.
        half = mesh.slice(hosts=1).spawn("stateful_half", Stateful, x)
    got = actors.read.call().get(timeout=T)
    assert len(got) == 4
    for point, (rank, state, more) in got.items():
        assert rank == 2 * point["hosts"] + point["gpus"]
        assert state == _expected(rank)
        assert more == {"twice": [2 * v for v in _expected(rank)]}
    # Its actors' ranks are in their own mesh: 0 and 1 stand on global ranks 2 and 3.
    assert _by_rank(half.read.call().get(timeout=T)) == {
        r: [_expected(r + 2, 100), None] for r in (0, 1)
    }
    # Each actor holds a copy: changing it leaves the distributed tensor alone.
    actors.scribble.call().get(timeout=T)
    assert fetch_shard(x, hosts=1, gpus=1).get(timeout=T).tolist() == _expected(3, 100)
    after = actors.read.call().get(timeout=T).values()
    assert sorted(state for _, state, _ in after) == [_expected(r, 1000) for r in range(4)]


def test_spawn_refuses_tensors_of_other_procs(mesh: ProcMesh, own_mesh: ProcMesh) -> None:
    with mesh.activate():
        x = _rank_values(mesh)
    with pytest.raises(ValueError, match="an actor receives the shards of tensors on its own"):
        own_mesh.spawn("elsewhere", Stateful, x)
    with mesh.slice(hosts=0).activate():
        half = torch.ones(2)
    with pytest.raises(ValueError, match=r"must be among those of the mesh the tensors"):
        mesh.spawn("too_wide", Stateful, half)


def test_tensor_calls_and_plain_calls_keep_the_order_they_were_issued_in(
    mesh: ProcMesh,
) -> None:
    counter = mesh.spawn("counter", Counter)
    results = []
    with mesh.activate():
        for _ in range(10):
            results.append(counter.incr.call(torch.ones(())))  # through the workers
            results.append(counter.incr.call(1))  # no tensor: the same way, after it
    one = counter.slice(hosts=1, gpus=1)
    for i, fut in enumerate(results):
        values = fut.get(timeout=T)
        assert sorted(values.values()) == [i] * 4, (i, values)
    # The other adverbs too, and later, outside the active block.
    assert one.incr.call_one(0).get(timeout=T) == 20
    assert sorted(f.get(timeout=T) for f in counter.incr.stream(0)) == [20, 20, 20, 21]
    counter.incr.broadcast(0)
    assert sorted(counter.incr.call(0).get(timeout=T).values()) == [22, 22, 22, 23]
