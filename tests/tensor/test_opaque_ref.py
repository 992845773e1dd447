"""``monarch.OpaqueRef``: Python values that live on the tensor workers, one per rank,
returned by remote functions and passed to later ones; freed with the client's handle."""

from __future__ import annotations

import gc

import pytest
import torch

import monarch
from monarch import OpaqueRef, RemoteException, inspect, remote
from monarch.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)

RANKS = [(h, g) for h in range(2) for g in range(2)]


# --- functions the workers run (imported by name) ---------------------------------------------


def make_linear(seed: int, rank: torch.Tensor) -> OpaqueRef:
    torch.manual_seed(seed + int(rank))
    return OpaqueRef(torch.nn.Linear(4, 3))


def run_linear(model: OpaqueRef, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model.value(x)
    return out


def make_counter(start: int) -> OpaqueRef:
    return OpaqueRef(start)


def bump(counter: OpaqueRef, by: int) -> None:
    counter.value = counter.value + by


def read_counter(counter: OpaqueRef) -> torch.Tensor:
    return torch.tensor(float(counter.value))


def pass_through(counter: OpaqueRef) -> OpaqueRef:
    return counter


def live_opaque_values() -> int:
    from monarch._src.tensor_engine.client import opaque

    gc.collect()
    return len(opaque._table)


def fails_to_create() -> OpaqueRef:
    raise ValueError("no model for you")


# ---------------------------------------------------------------------------------------------


def _local_linear(seed: int, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.no_grad():
        out: torch.Tensor = torch.nn.Linear(4, 3)(x)
    return out


def _x_of(rank: int) -> torch.Tensor:
    return torch.arange(8, dtype=torch.float32).reshape(2, 4) * (rank + 1)


@pytest.mark.parametrize("how", ["cached", "callable", "inspect"])
def test_a_model_lives_on_each_rank_and_runs_on_monarch_tensors(mesh: ProcMesh, how: str) -> None:
    """Each rank builds its own model (seeded by rank); a later remote function runs
    it on that rank's shard, whichever way the output shapes are learned."""
    if how == "cached":
        make, run = remote(make_linear), remote(run_linear)
    elif how == "callable":
        make = remote(make_linear, propagate=lambda seed, rank: OpaqueRef(None))
        run = remote(run_linear, propagate=lambda m, x: torch.empty(x.shape[0], 3))
    else:
        make = remote(make_linear, propagate="inspect")
        run = remote(run_linear, propagate="inspect")
    with mesh.activate():
        rank = mesh.rank_tensor(("hosts", "gpus"))
        model = make(10, rank)
        x = torch.arange(8, dtype=torch.float32).reshape(2, 4) * (rank + 1)
        y = run(model, x)
    assert isinstance(model, OpaqueRef)
    assert isinstance(model._key, monarch.Tensor)
    assert y.shape == (2, 3)
    for r, (h, g) in enumerate(RANKS):
        expected = _local_linear(10 + r, _x_of(r))
        got = inspect(y, hosts=h, gpus=g)
        assert torch.allclose(got, expected), (r, got, expected)
    # the ranks' models differ (seeded by rank), so the outputs do
    assert not torch.allclose(inspect(y, hosts=0, gpus=0), _local_linear(11, _x_of(0)))


def test_values_are_set_and_a_returned_handle_shares_the_value(mesh: ProcMesh) -> None:
    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    add = remote(bump, propagate=lambda counter, by: None)
    add_shapes_on_rank_0 = remote(bump)  # the rank-0 run to learn shapes sets nothing
    read = remote(read_counter, propagate=lambda counter: torch.empty(()))
    same = remote(pass_through, propagate=lambda counter: OpaqueRef(None))
    with mesh.activate():
        counter = make(5)
        add(counter, 2)
        other = same(counter)
        add(other, 10)
        add_shapes_on_rank_0(other, 100)
        a, b = read(counter), read(other)
    assert other._key.ref != counter._key.ref  # two handles, one value
    for h, g in RANKS:
        assert inspect(a, hosts=h, gpus=g).item() == 117.0
    assert inspect(b, hosts=0, gpus=1).item() == 117.0


def test_a_value_is_freed_with_the_clients_handle(mesh: ProcMesh) -> None:
    count = remote(live_opaque_values)
    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    gc.collect()  # handles left by earlier tests: their drops go with the next call
    with mesh.activate():
        before = list(count.call().get(timeout=60).values())
        counter = make(1)
        dropped = make(2)
        during = list(count.call().get(timeout=60).values())
        dropped.drop()
        assert dropped.dropped and "dropped" in repr(dropped)
        after_drop = list(count.call().get(timeout=60).values())
        del counter
        gc.collect()
        after = list(count.call().get(timeout=60).values())
    assert len(before) == 4
    assert during == [b + 2 for b in before]
    assert after_drop == [b + 1 for b in before]
    assert after == before


def test_the_client_cannot_create_or_read_values(mesh: ProcMesh) -> None:
    with pytest.raises(RuntimeError, match="only be created inside a remote function"):
        OpaqueRef(torch.nn.Linear(2, 2))
    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    with mesh.activate():
        counter = make(3)
        with pytest.raises(RuntimeError, match="only a remote function running there"):
            _ = counter.value
        with pytest.raises(RuntimeError, match="only a remote function running there"):
            counter.value = 4
        with pytest.raises(TypeError, match="unhashable"):
            hash(counter)
        # an endpoint adverb gives back a handle that cannot be read here either
        values = remote(make_counter).call(7).get(timeout=60)
    handle = next(iter(values.values()))
    assert isinstance(handle, OpaqueRef)
    with pytest.raises(RuntimeError, match="only a remote function running there"):
        _ = handle.value


def test_a_dropped_or_failed_handle_fails_its_users_clearly(mesh: ProcMesh) -> None:
    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    bad = remote(fails_to_create, propagate=lambda: OpaqueRef(None))
    read = remote(read_counter, propagate=lambda counter: torch.empty(()))
    read_now = remote(read_counter, propagate="inspect")
    count = remote(live_opaque_values)
    with mesh.activate():
        counter = make(3)
        last_use = read(counter)
        counter.drop()  # after its last use: fine
        with pytest.raises(TypeError, match="was dropped"):
            read(counter)
        count.call().get(timeout=60)  # the drop has reached the workers
        with pytest.raises(RemoteException, match=r"has no value on rank \d: it was dropped"):
            read_now(counter)
        failed = bad()
        from_failed = read(failed)
        fine = read(make(4))
    assert inspect(last_use, hosts=1, gpus=1).item() == 3.0
    with pytest.raises(RemoteException, match=r"should have created it failed(.|\n)*no model"):
        inspect(from_failed)
    assert inspect(fine, hosts=1, gpus=0).item() == 4.0


def test_propagate_functions_get_placeholders(mesh: ProcMesh) -> None:
    seen: list[str] = []

    def shapes(counter: OpaqueRef) -> torch.Tensor:
        seen.append(type(counter).__name__)
        with pytest.raises(RuntimeError, match="placeholder OpaqueRef"):
            _ = counter.value
        return torch.empty(())

    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    read = remote(read_counter, propagate=shapes)
    with mesh.activate():
        out = read(make(9))
    assert seen == ["OpaqueRef"]
    assert inspect(out).item() == 9.0


def test_handles_on_another_stream(mesh: ProcMesh) -> None:
    """A handle made on a stream is used there, shapes learned by running the function
    on rank 0 (which waits for that stream to make the value)."""
    side = monarch.Stream("opaque_side")
    make = remote(make_counter, propagate=lambda start: OpaqueRef(None))
    with mesh.activate():
        with side.activate():
            counter = make(6)
            assert counter._key.stream is side
            first = remote(read_counter)(counter)  # cached propagation, on rank 0
            remote(bump, propagate=lambda c, by: None)(counter, 1)
            second = remote(read_counter, propagate=lambda c: torch.empty(()))(counter)
    assert inspect(first, hosts=1, gpus=1).item() == 6.0
    assert inspect(second, hosts=0, gpus=0).item() == 7.0
