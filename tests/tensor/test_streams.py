"""Streams, borrows and ``coalescing()`` of distributed tensors (see docs/tensors.md,
"Streams and borrows")."""

from __future__ import annotations

import gc
import threading
import warnings

import pytest
import torch

import monarch
from monarch import RemoteException, Stream, get_active_stream, inspect, remote
from monarch.actor import ProcMesh

# --- streams --------------------------------------------------------------------------------


def test_the_default_stream_is_main_and_activation_nests() -> None:
    main = get_active_stream()
    assert main.name == "main"
    a, b = Stream("a"), Stream("b")
    with a.activate() as s:
        assert s is a and get_active_stream() is a
        with b.activate():
            assert get_active_stream() is b
        assert get_active_stream() is a
    assert get_active_stream() is main
    act = a.activate()  # takes effect at once
    assert get_active_stream() is a
    inner = b.activate()
    with pytest.raises(RuntimeError, match="not the innermost active stream"):
        act.deactivate()
    inner.deactivate()
    act.deactivate()
    assert get_active_stream() is main
    assert "'a'" in repr(a) and str(a) == "stream 'a'"
    with pytest.raises(TypeError, match="non-empty str"):
        Stream("")


def test_work_on_a_stream_runs_there_and_fetches_wait_for_it(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        with side.activate():
            r = mesh.rank_tensor(("hosts", "gpus"))
            x = torch.ones(3) * r
            for _ in range(50):
                x = x + 1
        assert x.stream is side
        assert torch.zeros(1).stream is get_active_stream()
    for h in range(2):
        for g in range(2):
            assert torch.equal(inspect(x, hosts=h, gpus=g), torch.full((3,), 2 * h + g + 50.0))


def test_a_tensor_of_another_stream_is_refused_with_wrong_stream(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        t = torch.ones(2)
        with side.activate():
            with pytest.raises(TypeError) as info:
                t + 1
            assert "WRONG_STREAM" in str(info.value)
            assert "stream 'main'" in str(info.value) and "borrow" in str(info.value)
            with pytest.raises(TypeError, match="WRONG_STREAM"):
                t.reduce("gpus")
            with pytest.raises(TypeError, match="WRONG_STREAM"):
                remote(torch.neg)(t)
        assert inspect(t + 1).tolist() == [2.0, 2.0]  # still fine on its own stream


def test_streams_of_one_worker_run_concurrently(mesh: ProcMesh) -> None:
    """A barrier of two threads that only two streams running at once can pass: if
    streams ran one after the other, the first would wait alone and fail."""
    meet = remote("tests_tensor_helpers.meet_on_two_streams", propagate=lambda x, n, t: x)
    side = Stream("side")
    with mesh.activate():
        a = torch.zeros(2)
        with side.activate():
            b = torch.zeros(2)
            got_b = meet(b, "concurrency", 30.0)
        got_a = meet(a, "concurrency", 30.0)
    for h in range(2):
        for g in range(2):
            assert inspect(got_a, hosts=h, gpus=g).tolist() == [1.0, 1.0]
            assert inspect(got_b, hosts=h, gpus=g).tolist() == [1.0, 1.0]


def test_remote_functions_on_a_stream_see_the_actor_context(mesh: ProcMesh) -> None:
    rank_of = remote("tests_tensor_helpers.my_actor_rank", propagate=lambda x: x)
    with mesh.activate():
        with Stream("side").activate():
            got = rank_of(torch.zeros(1))
    assert inspect(got, hosts=1, gpus=1).tolist() == [3.0]


def test_a_collective_on_its_own_stream_while_main_computes(mesh: ProcMesh) -> None:
    comms = Stream("comms")
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus")).float()
        g = torch.ones(1000) * r
        comm_g, borrow = comms.borrow(g, mutable=True)
        with comms.activate():
            comm_g.reduce_(("hosts", "gpus"), "sum")
        busy = torch.ones(64, 64)
        for _ in range(20):
            busy = busy @ torch.eye(64)
        borrow.drop()
        after = g * 2
    assert torch.equal(inspect(g, hosts=1, gpus=0), torch.full((1000,), 6.0))
    assert torch.equal(inspect(after, hosts=0, gpus=1), torch.full((1000,), 12.0))
    assert torch.equal(inspect(busy), torch.ones(64, 64))


def test_to_mesh_on_a_stream(mesh: ProcMesh) -> None:
    side = Stream("side")
    stages = [mesh.slice(hosts=i) for i in range(2)]
    with side.activate():
        with stages[0].activate():
            h = torch.arange(3.0) + 1
        moved = h.to_mesh(stages[1])
        assert moved.stream is side
        with stages[1].activate():
            moved = moved * 10
    assert inspect(moved, gpus=1).tolist() == [10.0, 20.0, 30.0]


def test_to_mesh_sends_on_one_stream_and_receives_on_another(mesh: ProcMesh) -> None:
    """Upstream cannot run this: rank 1 both sends (on main) and receives (on side)."""
    side = Stream("side")
    with mesh.activate():
        r = mesh.rank_tensor(("hosts", "gpus")).float() + 1
    source = monarch.slice_mesh(r, gpus=1)  # global ranks 1 and 3
    got = source.to_mesh(mesh.slice(hosts=0), stream=side)  # to global ranks 0 and 1
    assert got.stream is side
    same = monarch.to_mesh(r, mesh, stream=side)  # same ranks: a copy received on side
    with side.activate():
        got = got * 10
        same.add_(100)  # a copy: the original stays as it was
    assert inspect(got, gpus=0).item() == 20.0  # from global rank 1
    assert inspect(got, gpus=1).item() == 40.0  # from global rank 3
    assert inspect(same, hosts=1, gpus=1).item() == 104.0
    assert inspect(r, hosts=1, gpus=1).item() == 4.0
    with pytest.raises(TypeError, match=r"expected a monarch\.Stream"):
        r.to_mesh(mesh, stream="side")  # type: ignore[arg-type]


# --- borrows --------------------------------------------------------------------------------


def test_a_read_only_borrow_sees_the_origin_and_forbids_writes_on_both(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        t = torch.arange(4.0) * 2
        view = t[1:]
        t_side, borrow = side.borrow(t)
        assert t_side.stream is side and t_side.shape == t.shape
        with side.activate():
            doubled = t_side * 2  # reading is fine
            with pytest.raises(TypeError, match="MUTATING_BORROW"):
                t_side.add_(1)
        read = t + 1  # the origin may still be read
        with pytest.raises(TypeError, match="MUTATING_BORROW") as info:
            t.add_(1)
        assert "read-only borrow to stream 'side'" in str(info.value)
        with pytest.raises(TypeError, match="MUTATING_BORROW"):
            view.mul_(2)  # a view shares the storage's permissions
        with borrow:
            pass  # `with borrow:` drops it at the end
        assert borrow.dropped
        t.add_(1)  # writable again
        with side.activate():
            with pytest.raises(TypeError, match="DROPPED"):
                t_side + 1
    assert inspect(doubled).tolist() == [0.0, 4.0, 8.0, 12.0]
    assert inspect(read).tolist() == [1.0, 3.0, 5.0, 7.0]
    assert inspect(t).tolist() == [1.0, 3.0, 5.0, 7.0]


def test_a_mutable_borrow_locks_the_origin_until_dropped(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        t = torch.zeros(3)
        t_side, borrow = side.borrow(t, mutable=True)
        with pytest.raises(TypeError, match="BORROWED"):
            t + 1
        with pytest.raises(TypeError, match="BORROWED"):
            side.borrow(t)
        with side.activate():
            for _ in range(30):
                t_side.add_(1)  # written on the side stream
        borrow.drop()
        borrow.drop()  # twice is fine
        seen = t * 1  # main waits for the side stream's writes
    assert inspect(seen, hosts=1, gpus=1).tolist() == [30.0, 30.0, 30.0]


def test_borrow_argument_errors(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        t = torch.ones(2)
        with pytest.raises(ValueError, match="already on stream 'main'"):
            get_active_stream().borrow(t)
        with monarch.no_mesh.activate():
            local = torch.ones(2)
        with pytest.raises(TypeError, match="LOCAL_TENSOR"):
            side.borrow(local)
        _, read = side.borrow(t)
        with pytest.raises(TypeError, match="MUTATING_BORROW"):
            Stream("other").borrow(t, mutable=True)
        read.drop()
        t.drop()
        with pytest.raises(TypeError, match="DROPPED"):
            side.borrow(t)


def test_a_borrow_collected_without_drop_warns_and_drops(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        t = torch.ones(2)
        t_side, borrow = side.borrow(t, mutable=True)
        del t_side
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del borrow
            gc.collect()
        assert any("without `borrow.drop()`" in str(w.message) for w in caught)
        u = t + 1  # the origin is usable again
    assert inspect(u).tolist() == [2.0, 2.0]


def test_a_failure_on_a_stream_is_reported_and_the_stream_goes_on(mesh: ProcMesh) -> None:
    side = Stream("side")
    with mesh.activate():
        with side.activate():
            a = torch.ones(2, 3)
            bad = a.index_select(0, torch.tensor([7]))
            fine = a + 1
    with pytest.raises(RemoteException):
        inspect(bad)
    assert inspect(fine).tolist() == [[2.0] * 3] * 2


# --- coalescing -----------------------------------------------------------------------------


def test_coalescing_sends_the_block_once_and_refuses_fetches_inside(mesh: ProcMesh) -> None:
    from monarch._src.tensor_engine.client.engine import engine_of

    engine = engine_of(mesh)
    sent: list[int] = []
    original = engine._send

    def counting(view: object, cmds: list[object]) -> None:
        sent.append(len(cmds))
        original(view, cmds)  # type: ignore[arg-type]

    with mesh.activate():
        x = torch.zeros(4)
        inspect(x)
        engine._send = counting  # type: ignore[method-assign]
        try:
            with monarch.coalescing():
                for _ in range(200):
                    x = x + 1
                # Well past the flush delay: nothing may have been sent by the timer.
                threading.Event().wait(0.1)
                assert sent == []
                with pytest.raises(NotImplementedError, match="coalescing"):
                    inspect(x)
                with pytest.raises(NotImplementedError, match="coalescing"):
                    remote(torch.sum).call(x)
            assert len(sent) == 1 and sent[0] >= 200
        finally:
            del engine._send
    assert inspect(x).tolist() == [200.0] * 4
