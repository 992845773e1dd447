"""Tests of the Rust-backed shape classes of ``monarch._rust_bindings``: ``Extent``,
``Point``, ``Slice`` and ``Shape``.

``tests/actor/test_shape.py`` checks the shape algebra through its Python homes; these
tests check what the binding adds: pickling under every protocol, equality and hashing
across separately built objects, the ``Mapping`` protocol of ``Extent`` and ``Point``,
the errors for Python-only misuse (wrong types, negative numbers), and how mesh
operations name the mesh in their errors.
"""

from __future__ import annotations

import collections.abc
import pickle

import pytest

from monarch._rust_bindings import Extent, Point, Shape, Slice
from monarch._src.actor.shape import MeshTrait


def _samples() -> list[object]:
    extent = Extent(["hosts", "gpus"], [2, 4])
    sliced = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
    return [
        extent,
        Extent([], []),
        Point(5, extent),
        Point(0, Extent([], [])),
        sliced,
        Slice.new_row_major([3], offset=2),
        Shape(["a", "b"], sliced),
        Shape.unity(),
    ]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_class_pickles_under_every_protocol(protocol: int) -> None:
    for obj in _samples():
        back = pickle.loads(pickle.dumps(obj, protocol=protocol))
        assert type(back) is type(obj)
        assert back == obj and hash(back) == hash(obj) and repr(back) == repr(obj)


def test_equality_hash_and_inequality_are_by_value() -> None:
    for a, b in zip(_samples(), _samples(), strict=True):
        assert a is not b and a == b and not (a != b) and hash(a) == hash(b)
    extent = Extent(["hosts"], [2])
    assert extent != Extent(["hosts"], [3]) and extent != {"hosts": 2}
    assert Point(1, extent) != {"hosts": 1} and Point(1, extent) != Point(0, extent)
    assert len(set(_samples() + _samples())) == len(_samples())


def test_extent_and_point_are_mappings() -> None:
    extent = Extent(("hosts", "gpus"), [2, 4])
    point = Point(6, extent)
    for m, values in ((extent, [2, 4]), (point, [1, 2])):
        assert isinstance(m, collections.abc.Mapping)
        assert m.keys() == {"hosts", "gpus"} and isinstance(m.keys(), collections.abc.KeysView)
        assert list(m.values()) == values
        assert list(m.items()) == list(zip(["hosts", "gpus"], values, strict=True))
        assert dict(m) == dict(zip(["hosts", "gpus"], values, strict=True))
        assert 1 not in m and "gpus" in m
    assert issubclass(Extent, collections.abc.Mapping)
    assert issubclass(Point, collections.abc.Mapping)
    # A point keeps the extent object it was made with.
    assert point.extent is extent


def test_classes_are_immutable() -> None:
    for obj in _samples():
        with pytest.raises(AttributeError):
            obj.anything = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda: Extent(["a"], [True]), TypeError, "size of dimension 'a' must be an int"),
        (lambda: Extent(["a"], [-2]), ValueError, "dimension 'a' has negative size -2"),
        (lambda: Extent(["a", "b"], [2**40, 2**40]), ValueError, "use smaller sizes"),
        (lambda: Extent(["a"], [2**70]), ValueError, "too large"),
        (lambda: Point(True, Extent(["a"], [2])), TypeError, "rank must be an int"),
        (lambda: Point(-1, Extent(["a"], [2])), IndexError, r"rank -1 is out of range"),
        (lambda: Point(0, Shape.unity()), TypeError, r"build one with Extent\(labels"),
        (lambda: Slice(offset=-1, sizes=[], strides=[]), ValueError, "offset must be >= 0"),
        (lambda: Slice(offset=0, sizes=[2], strides=[-1]), ValueError, r"strides must be >= 1"),
        (lambda: Slice(offset=0, sizes=[2], strides=[0]), ValueError, r"strides must be >= 1"),
        (lambda: Slice(offset=0, sizes=[2.0], strides=[1]), TypeError, "sizes must be an int"),
        (lambda: Slice.new_row_major([2], offset=-3), ValueError, "offset must be >= 0"),
        (lambda: Shape(["a"], Slice.new_row_major([2, 2])), ValueError, "one size per label"),
    ],
)
def test_constructor_errors(make, exc, match) -> None:
    with pytest.raises(exc, match=match):
        make()


def test_lookup_errors() -> None:
    extent = Extent(["hosts"], [2])
    with pytest.raises(ValueError, match=r"no dimension '1'; expected one of \['hosts'\]"):
        extent[1]  # type: ignore[index]
    s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
    with pytest.raises(IndexError, match="negative indices are not allowed"):
        s[-1]
    with pytest.raises(TypeError, match="Slice indices must be ints, got str"):
        s["0"]  # type: ignore[index]
    with pytest.raises(ValueError, match=r"which covers \[1, 3, 5, 7\]"):
        s.index(2)
    with pytest.raises(ValueError, match="ranks are never negative"):
        s.index(-1)
    assert -1 not in s and "1" not in s and True in s  # True == 1, like any int
    shape = Shape(["gpus"], Slice.new_row_major([4]))
    with pytest.raises(ValueError, match="ranks are never negative"):
        shape.coordinates(-1)
    with pytest.raises(ValueError, match="global rank 4 is not in"):
        shape.coordinates(4)


def test_shape_select_python_arguments() -> None:
    shape = Shape(["gpus"], Slice.new_row_major([8]))
    assert shape.select("gpus", slice(-3, None)).ranks() == [5, 6, 7]
    assert shape.select("gpus", slice(1, 10**30, 3)).ranks() == [1, 4, 7]
    with pytest.raises(IndexError, match="negative indices are not allowed"):
        shape.select("gpus", -1)
    with pytest.raises(TypeError, match=r"with 1.5 \(float\): expected an int"):
        shape.select("gpus", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"step 1\.5: steps must be positive ints"):
        shape.select("gpus", slice(0, 2, 1.5))
    # The label is checked first.
    with pytest.raises(ValueError, match="no such dimension"):
        shape.select("hosts", "x")  # type: ignore[arg-type]


def test_shape_split_rename_flatten_python_arguments() -> None:
    shape = Shape(["hosts"], Slice.new_row_major([4]))
    assert shape.split({"hosts": ["a", "b"], "b": 2}).labels == ["a", "b"]
    with pytest.raises(TypeError, match="expected a tuple of new dimension names"):
        shape.split({"hosts": ("a", 1)})
    with pytest.raises(ValueError, match="new dimension 'b' has size -1"):
        shape.split({"hosts": ("a", "b"), "b": -1})
    with pytest.raises(TypeError, match="must be a str"):
        shape.rename({"hosts": None})
    with pytest.raises(TypeError, match="must be a str"):
        shape.flatten(3)  # type: ignore[arg-type]


class _Mesh(MeshTrait):
    def __init__(self, shape: Shape) -> None:
        self._s = shape

    @property
    def _shape(self) -> Shape:
        return self._s

    def _new_with_shape(self, shape: Shape) -> _Mesh:
        return _Mesh(shape)


@pytest.mark.parametrize(
    ("op", "exc", "prefix"),
    [
        (lambda m: m.slice(hosts=5), IndexError, "cannot slice"),
        (lambda m: m.slice(gpus=slice(None, None, -1)), ValueError, "cannot slice"),
        (lambda m: m.split(hosts=("a", "b"), a=3), ValueError, "cannot split"),
        (lambda m: m.rename(nodes="x"), ValueError, "cannot rename dimensions of"),
        (lambda m: m.slice(gpus=slice(0, 2)).flatten("r"), ValueError, "cannot flatten"),
    ],
)
def test_mesh_errors_name_the_mesh(op, exc, prefix) -> None:
    mesh = _Mesh(Shape(["hosts", "gpus"], Slice.new_row_major([2, 4])))
    with pytest.raises(exc) as info:
        op(mesh)
    message = str(info.value)
    assert message.startswith(f"{prefix} _Mesh with extent {{"), message
