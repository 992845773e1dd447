"""The wire pickler (``monarch._src.actor.pickling.dumps``): references into ``__main__``
(a script's classes and functions) travel by value, small and large pickles alike, and
the search it uses for large pickles (``monarch._rust_bindings.find``) agrees with
``bytes.find``."""

from __future__ import annotations

import pickle
import sys

import pytest

from monarch._rust_bindings import find
from monarch._src.actor import pickling


@pytest.mark.parametrize(
    ("haystack", "needle"),
    [
        (b"", b"a"),
        (b"abc", b""),
        (b"xx__main__yy__main__", b"__main__"),
        (b"__main_", b"__main__"),
        (bytes(range(256)) * 4096 + b"__main__", b"__main__"),
        (bytes(3 << 20), b"\x00\x01"),
    ],
)
def test_find_agrees_with_bytes_find(haystack: bytes, needle: bytes) -> None:
    assert find(haystack, needle) == haystack.find(needle)


class ScriptThing:
    """Stands for a class a user's script defines (registered in ``__main__`` below)."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


@pytest.fixture
def in_main() -> type:
    main = sys.modules["__main__"]
    ScriptThing.__module__ = "__main__"
    main.ScriptThing = ScriptThing  # type: ignore[attr-defined]
    try:
        yield ScriptThing
    finally:
        ScriptThing.__module__ = __name__
        del main.ScriptThing  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [10, 1 << 20], ids=["small", "large"])
def test_a_reference_into_main_travels_by_value(in_main: type, size: int) -> None:
    obj = in_main(b"x" * size)
    by_reference = pickle.dumps(obj, protocol=5)
    assert b"__main__" in by_reference  # what the standard pickler would send
    data = pickling.dumps(obj)
    assert data != by_reference  # cloudpickle instead: by value
    back = pickling.loads(data)
    assert back.payload == obj.payload


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [10, 1 << 20], ids=["small", "large"])
def test_other_objects_use_the_standard_pickler(size: int) -> None:
    obj = {"payload": b"y" * size, "n": 3}
    assert pickling.dumps(obj) == pickle.dumps(obj, protocol=5)
