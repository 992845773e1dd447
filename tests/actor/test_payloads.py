"""Large ``bytes`` arguments and return values travel out of band
(``pickling.dumps_call``, ``pickling.dumps_value``): as message parts of their own,
arriving as ``bytes`` equal to what was sent, through every adverb, explicit ports and
a cast tree whose heads reduce replies; small ones stay in the pickle."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest

from monarch._src.actor import pickling
from monarch.actor import Actor, Channel, Port, ProcMesh, endpoint, send, this_host

pytestmark = pytest.mark.timeout(120)

BIG = pickling.OUT_OF_BAND_MIN


def digest(v: object) -> tuple[str, int, str]:
    data = v if isinstance(v, bytes) else b""
    return (type(v).__name__, len(data), hashlib.sha256(data).hexdigest())


class Sink(Actor):
    @endpoint
    def describe(self, a: object, b: object = None, *, k: object = None) -> list[object]:
        return [digest(a), digest(b), digest(k), a is b]

    @endpoint
    def echo(self, v: object) -> object:
        return v

    @endpoint
    def hash_is_fresh(self, v: bytes) -> bool:
        """Whether ``v``'s hash is its content's (a recycled object's cached hash is
        reset)."""
        return hash(v) == hash(bytes(bytearray(v)))

    @endpoint(explicit_response_port=True)
    def echo_to(self, port: Port[object], v: object) -> None:
        port.send(v)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"procs": 3})
    assert procs.initialized.get(timeout=60)
    yield procs
    procs.stop().get(timeout=30)


def test_the_parts_of_a_call_with_large_bytes() -> None:
    big, other = os.urandom(BIG), os.urandom(BIG + 1)
    parts = pickling.dumps_call((big, 1, b"small"), {"k": other})
    assert parts[1] == b"rr"  # two read-only buffers
    assert parts[2] is big and parts[3] is other  # shared, not copied
    assert len(parts[0]) < 1024
    (a, n, s), kw = pickling.loads_parts(parts)
    assert (a, n, s, kw) == (big, 1, b"small", {"k": other})
    # Below the threshold, or passed twice: in the pickle, as before.
    assert len(pickling.dumps_call((os.urandom(BIG - 1),), {})) == 1
    twice = pickling.dumps_call((big, big), {})
    assert len(twice) == 1
    (x, y), _ = pickling.loads_parts(twice)
    assert x is y and x == big


def test_plain_scalars_travel_marshalled_and_everything_else_pickled() -> None:
    """A call whose arguments are all plain scalars of their exact types, and a value
    that is one, travel as the plain tag and a marshal; anything else (a container, a
    subclass, a bytearray, which marshal would turn into bytes) is a pickle, and both
    come back equal and of the same types."""
    import enum

    class Color(enum.IntEnum):
        RED = 1

    class Name(str):
        pass

    plain_calls = [
        ((), {}),
        ((7,), {}),
        ((1.5, "é\ud800", None, True, b"ab", 10**40, -0.0), {"k": "v", "n": None}),
    ]
    for args, kwargs in plain_calls:
        parts = pickling.dumps_call(args, kwargs)
        assert len(parts) == 1 and parts[0][:1] == pickling._PLAIN_TAG, (args, kwargs)
        back = pickling.loads_parts(parts)
        assert back == (args, kwargs)
        assert [type(v) for v in back[0]] == [type(v) for v in args]
    pickled_calls = [
        (([1, 2],), {}),
        ((Color.RED,), {}),
        ((Name("x"),), {}),
        ((bytearray(b"ab"),), {}),
        ((1,), {"k": (2,)}),
    ]
    for args, kwargs in pickled_calls:
        parts = pickling.dumps_call(args, kwargs)
        assert parts[0][:1] == b"\x80", (args, kwargs)
        back = pickling.loads_parts(parts)
        assert back == (args, kwargs) and type(back[0][0]) is type(args[0])
    for value in [0, 2.5, "s", None, False, b"x" * 100]:
        parts = pickling.dumps_value(value)
        assert parts[0][:1] == pickling._PLAIN_TAG
        assert pickling.loads_parts(parts) == value
    for value in [Color.RED, bytearray(b"ab"), (1,), {"a": 1}]:
        parts = pickling.dumps_value(value)
        assert parts[0][:1] == b"\x80"
        back = pickling.loads_parts(parts)
        assert back == value and type(back) is type(value)
    # A large bytes value still travels out of band, as itself.
    big = os.urandom(BIG)
    parts = pickling.dumps_value(big)
    assert len(parts) == 3 and parts[2] is big


def test_large_bytes_arguments_reach_the_endpoint_intact(procs: ProcMesh) -> None:
    mesh = procs.spawn("payload_sink", Sink)
    big, other = os.urandom(3 * BIG), os.urandom(BIG)
    expected = [digest(big), digest(b"tiny"), digest(other), False]
    one = mesh.slice(procs=1).describe.call_one(big, b"tiny", k=other).get(timeout=60)
    assert one == expected
    every = mesh.describe.call(big, b"tiny", k=other).get(timeout=60)
    assert list(every.values()) == [expected] * 3
    streamed = [f.get(timeout=60) for f in mesh.describe.stream(big, b"tiny", k=other)]
    assert streamed == [expected] * 3
    assert mesh.describe.choose(big, b"tiny", k=other).get(timeout=60) == expected
    port, receiver = Channel.open()
    send(mesh.describe, (big, b"tiny"), {"k": other}, port=port)
    assert [receiver.recv().get(timeout=60) for _ in range(3)] == [expected] * 3
    same = mesh.slice(procs=0).describe.call_one(big, big).get(timeout=60)
    assert same == [digest(big), digest(big), digest(None), True]


def test_large_bytes_through_a_cast_tree(procs: ProcMesh) -> None:
    import monarch

    mesh = procs.spawn("payload_tree", Sink)
    big = os.urandom(2 * BIG)
    with monarch.configured(cast_fanout=2):  # rank 0's proc relays to ranks 1 and 2
        got = mesh.describe.call(big).get(timeout=60)
    assert list(got.values()) == [[digest(big), digest(None), digest(None), False]] * 3


def test_the_parts_of_a_large_bytes_value() -> None:
    big = os.urandom(BIG)
    parts = pickling.dumps_value(big)
    assert len(parts) == 3 and parts[1] == b"r" and parts[2] is big and len(parts[0]) < 1024
    assert pickling.loads_parts(parts) == big
    assert len(pickling.dumps_value(b"small")) == 1
    assert pickling.loads_parts(pickling.dumps_value(b"small")) == b"small"


def test_large_bytes_results_come_back_intact(procs: ProcMesh) -> None:
    import monarch

    mesh = procs.spawn("payload_echo", Sink)
    big = os.urandom(2 * BIG)
    assert mesh.slice(procs=2).echo.call_one(big).get(timeout=60) == big
    assert mesh.echo.choose(big).get(timeout=60) == big
    for fanout in (2, 16):  # reduced by a relaying head, and straight to the caller
        with monarch.configured(cast_fanout=fanout):
            assert list(mesh.echo.call(big).get(timeout=60).values()) == [big] * 3
    assert [f.get(timeout=60) for f in mesh.echo.stream(big)] == [big] * 3
    assert mesh.slice(procs=1).echo_to.call_one(big).get(timeout=60) == big
    mixed = [b"s", big, None]
    assert mesh.echo.call(mixed).get(timeout=60).values() == [mixed] * 3


def test_received_large_bytes_are_recycled_only_once_unreferenced(procs: ProcMesh) -> None:
    """The extension refills a received ``bytes`` object of 1 MiB or more that nothing
    references any more, for the next part of its length: what a caller holds never
    changes, and a refilled object has its new content's hash."""
    one = procs.spawn("payload_recycle", Sink).slice(procs=0)
    size = 2 << 20
    first = [os.urandom(size) for _ in range(4)]
    kept = []
    for p in first:
        back = one.echo.call_one(p).get(timeout=60)
        kept.append((back, hash(back)))  # hashed: a stale cached hash would show
    del back
    for (back, h), p in zip(kept, first, strict=True):
        assert back == p and h == hash(p), "a held result changed"
    held_ids = {id(back) for back, _ in kept}
    del kept
    second = [os.urandom(size) for _ in range(4)]
    reused = set()
    for p in second:
        back = one.echo.call_one(p).get(timeout=60)
        assert back == p and hash(back) == hash(p)
        reused.add(id(back))
        del back
    assert reused & held_ids, "no received object was recycled"
    # On the actor's side: an argument hashed by one call, refilled for the next.
    assert all(one.hash_is_fresh.call_one(p).get(timeout=60) for p in first + second)
