"""Bulk data on the message path: NumPy arrays and CPU tensors anywhere in a call's
arguments or a reply's value travel out of band (pickle protocol 5 buffers), as parts of
their own: snapshotted once into a reused buffer when sent (later changes to the array do
not reach the message), and received as a writable ``bytearray`` that the rebuilt array or
tensor shares, not copies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from monarch._src.actor import pickling
from monarch.actor import Actor, ProcMesh, endpoint, this_host

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)

BIG = pickling.OUT_OF_BAND_MIN


class Store(Actor):
    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def describe(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """How each array arrived: its type, whether it is writable, and what its
        memory belongs to."""
        out = {}
        for name, a in arrays.items():
            if isinstance(a, np.ndarray):
                base: Any = a
                while isinstance(base, np.ndarray) and base.base is not None:
                    base = base.base
                if isinstance(base, memoryview):
                    base = base.obj
                out[name] = ("ndarray", a.flags.writeable, type(base).__name__, a.sum())
            else:
                a.add_(0)  # raises if not writable
                out[name] = ("tensor", str(a.dtype), tuple(a.shape), float(a.double().sum()))
        return out

    @endpoint
    def double_in_place(self, a: Any) -> Any:
        a *= 2  # the received array is writable
        return a


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    assert procs.initialized.get(timeout=60)
    yield procs
    procs.stop().get(timeout=30)


def test_arrays_anywhere_are_out_of_band_and_snapshotted() -> None:
    a = np.arange(BIG // 8, dtype=np.float64)  # exactly BIG bytes
    small = np.arange(10)
    parts = pickling.dumps_parts({"nested": [a], "small": small})
    assert parts[1] == b"w" and len(parts) == 3, "one writable buffer out of band"
    assert len(parts[0]) < 1024, "not in the pickle"
    assert isinstance(parts[2], bytearray) and len(parts[2]) == a.nbytes
    a[:] = -1  # after the send: the message keeps what was sent
    back = pickling.loads_parts(parts)
    assert back["nested"][0][5] == 5.0 and (back["small"] == small).all()
    assert back["nested"][0].flags.writeable


def test_tensors_are_out_of_band_with_dtype_shape_and_grad() -> None:
    tensors = {
        "f32": torch.randn(64, 512),
        "bf16": torch.randn(256, 256).to(torch.bfloat16),
        "grad": torch.randn(128, 128, requires_grad=True),
        "strided": torch.randn(512, 256).t(),  # not contiguous
        "small": torch.arange(4),
    }
    parts = pickling.dumps_parts(tensors)
    assert parts[1] == b"wwww", "the four large tensors travel out of band"
    back = pickling.loads_parts(parts)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name].detach(), t.detach()), name
    assert back["grad"].requires_grad and not back["f32"].requires_grad
    # A Parameter is pickled torch's own way, around its data, which is a plain tensor:
    # out of band too, and the Parameter comes back a Parameter.
    p = torch.nn.Parameter(torch.randn(128, 128))
    parts = pickling.dumps_parts(p)
    assert parts[1] == b"w"
    q = pickling.loads_parts(parts)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and torch.equal(q, p)


def test_tensors_travel_out_of_band_beside_what_only_cloudpickle_pickles() -> None:
    """A payload the standard pickler refuses (a lambda) goes through cloudpickle: its
    tensors still travel out of band, and cloudpickle's own reducers still apply. The
    pickler with the tensor reducer is made once per pickler class, not per message."""
    t = torch.randn(128, 256)
    scale = 3
    payload = {"t": t, "f": lambda x: x * scale, "m": memoryview(b"abc")}
    parts = pickling.dumps_parts(payload)
    assert parts[1] == b"w" and len(parts[0]) < 4096, "the tensor is not in the pickle"
    back = pickling.loads_parts(parts)
    assert torch.equal(back["t"], t) and back["f"](2) == 6 and bytes(back["m"]) == b"abc"
    import pickle

    import cloudpickle

    for base in (pickle.Pickler, cloudpickle.Pickler):
        made = pickling._tensor_pickler(base, torch)
        assert made is pickling._tensor_pickler(base, torch)
        assert issubclass(made, base)
        assert made.dispatch_table[torch.Tensor] is pickling._reduce_tensor
    assert memoryview in pickling._tensor_pickler(cloudpickle.Pickler, torch).dispatch_table


def test_arrays_and_tensors_reach_an_actor_and_come_back(procs: ProcMesh) -> None:
    store = procs.spawn("bulk_store", Store)
    a = np.random.default_rng(0).standard_normal((256, 256))
    t = torch.randn(300, 300)
    got = store.describe.call_one({"a": a, "t": t}).get(timeout=60)
    kind, writable, owner, total = got["a"]
    assert (kind, writable, owner) == ("ndarray", True, "bytearray"), got["a"]
    assert total == pytest.approx(a.sum())
    assert got["t"][:3] == ("tensor", "torch.float32", (300, 300))
    assert got["t"][3] == pytest.approx(float(t.double().sum()))
    # Writable on arrival, and the reply travels the same way.
    doubled = store.double_in_place.call_one(a).get(timeout=60)
    assert np.array_equal(doubled, a * 2) and doubled.flags.writeable
    back = store.echo.call_one({"t": t, "list": [a, a]}).get(timeout=60)
    assert torch.equal(back["t"], t) and all(np.array_equal(x, a) for x in back["list"])


def test_large_arrays_round_trip_repeatedly_with_recycled_buffers(procs: ProcMesh) -> None:
    """Buffers of 1 MiB and more are recycled on both sides: what a caller holds never
    changes when later messages reuse memory that is free."""
    store = procs.spawn("bulk_recycle", Store)
    sent = [np.full((512, 512), float(i)) for i in range(6)]  # 2 MiB each
    held = [store.echo.call_one(x).get(timeout=60) for x in sent]
    for i, h in enumerate(held):
        assert (h == float(i)).all(), f"array {i} changed after later messages"
