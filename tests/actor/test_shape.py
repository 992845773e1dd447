"""Tests for the shape algebra: Extent, Point, Slice, Shape, MeshTrait, ValueMesh.

``Extent``, ``Point``, ``Slice`` and ``Shape`` are implemented in Rust
(``hyperactor_mesh::shape``, bound in ``monarch._rust_bindings``); ``MeshTrait`` and
``ValueMesh`` are Python over them. These tests check the Python API; the Rust crate has
its own unit tests.
"""

from __future__ import annotations

import doctest
import importlib
import pickle
import sys

import pytest

from monarch._src.actor.extent import Extent
from monarch._src.actor.point import Point
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.slice import Slice
from monarch._src.actor.value_mesh import ValueMesh

MODULES = ["extent", "point", "slice", "shape", "value_mesh"]


class Mesh(MeshTrait):
    """A minimal MeshTrait implementation over a bare Shape."""

    def __init__(self, shape: Shape) -> None:
        self._s = shape

    @property
    def _shape(self) -> Shape:
        return self._s

    def _new_with_shape(self, shape: Shape) -> Mesh:
        return Mesh(shape)


def mesh(**sizes: int) -> Mesh:
    return Mesh(Shape(list(sizes), Slice.new_row_major(list(sizes.values()))))


def vmesh(**sizes: int) -> ValueMesh[int]:
    shape = Shape(list(sizes), Slice.new_row_major(list(sizes.values())))
    return ValueMesh(shape, list(range(len(shape))))


# --- module hygiene -------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name: str) -> None:
    module = importlib.import_module(f"monarch._src.actor.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_are_documented(name: str) -> None:
    module = importlib.import_module(f"monarch._src.actor.{name}")
    assert module.__all__
    for public in module.__all__:
        assert getattr(module, public).__doc__, f"{name}.{public} lacks a docstring"


def test_import_does_not_pull_torch() -> None:
    import subprocess

    code = (
        "import sys\n"
        "import monarch._src.actor.shape, monarch._src.actor.value_mesh\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- Extent ---------------------------------------------------------------------------------


def test_extent_mapping_api() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert e.labels == ["hosts", "gpus"]
    assert e.sizes == [2, 4]
    assert e.nelements == 8
    assert list(e.keys()) == ["hosts", "gpus"]
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert e["gpus"] == 4 and len(e) == 2
    assert "hosts" in e and "nodes" not in e
    assert e.get("nodes", 7) == 7
    assert repr(e) == "Extent({'hosts': 2, 'gpus': 4})"


def test_extent_equality_is_ordered_and_hashable() -> None:
    a = Extent(["hosts", "gpus"], [2, 4])
    assert a == Extent(["hosts", "gpus"], [2, 4])
    assert a != Extent(["gpus", "hosts"], [4, 2])
    assert a != Extent(["hosts", "gpus"], [2, 5])
    assert len({a, Extent(["hosts", "gpus"], [2, 4])}) == 1
    assert pickle.loads(pickle.dumps(a)) == a


def test_extent_is_immutable() -> None:
    e = Extent(["hosts"], [2])
    e.labels.append("x")
    e.sizes[0] = 9
    assert e == Extent(["hosts"], [2])
    with pytest.raises(AttributeError):
        e.foo = 1  # type: ignore[attr-defined]


def test_extent_empty() -> None:
    e = Extent([], [])
    assert e.nelements == 1 and len(e) == 0 and repr(e) == "Extent({})"


def test_extent_unknown_label_is_value_error() -> None:
    with pytest.raises(ValueError, match=r"'nodes'.*expected one of \['hosts'\]"):
        Extent(["hosts"], [2])["nodes"]


@pytest.mark.parametrize(
    ("labels", "sizes", "exc", "match"),
    [
        (["a", "b"], [1], ValueError, "one size per label"),
        (["a"], [-1], ValueError, "negative size"),
        (["a", "a"], [1, 2], ValueError, "duplicate"),
        ([1], [1], TypeError, "must be a str"),
        (["a"], [1.5], TypeError, "must be an int"),
        ("ab", [1, 2], TypeError, "wrap it in a list"),
    ],
)
def test_extent_rejects_bad_input(labels, sizes, exc, match) -> None:
    with pytest.raises(exc, match=match):
        Extent(labels, sizes)


def test_extent_region() -> None:
    region = Extent(["a", "b"], [2, 3]).region
    assert region.ranks() == list(range(6)) and region.labels == ["a", "b"]


# --- Point ----------------------------------------------------------------------------------


def test_point_coordinates_and_rank() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    for rank in range(8):
        p = Point(rank, e)
        assert dict(p) == {"hosts": rank // 4, "gpus": rank % 4}
        assert p.rank == rank and p.extent == e


def test_point_mapping_api_and_repr() -> None:
    p = Point(1, Extent(["hosts", "gpus"], [1, 2]))
    assert repr(p) == "{'hosts': 0/1, 'gpus': 1/2}"
    assert list(p) == ["hosts", "gpus"] and list(p.keys()) == ["hosts", "gpus"]
    assert len(p) == 2 and p["gpus"] == 1 and p.size("gpus") == 2
    assert "gpus" in p and "x" not in p and p.get("x") is None


def test_point_unknown_label_is_value_error() -> None:
    p = Point(0, Extent(["hosts"], [2]))
    with pytest.raises(ValueError, match="no dimension 'gpus'"):
        p["gpus"]
    with pytest.raises(ValueError, match="'gpus'"):
        p.size("gpus")


def test_point_zero_dimensional() -> None:
    p = Point(0, Extent([], []))
    assert p.rank == 0 and len(p) == 0 and dict(p) == {} and repr(p) == "{}"


def test_point_rank_out_of_range() -> None:
    e = Extent(["hosts"], [2])
    for bad in (2, -1):
        with pytest.raises(IndexError, match="out of range"):
            Point(bad, e)
    with pytest.raises(TypeError):
        Point("0", e)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Point(0, {"hosts": 2})  # type: ignore[arg-type]


def test_point_pickle_eq_hash() -> None:
    p = Point(3, Extent(["a", "b"], [2, 2]))
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and dict(q) == {"a": 1, "b": 1}
    assert p != Point(3, Extent(["a", "b"], [4, 1]))


# --- Slice ----------------------------------------------------------------------------------


def test_slice_row_major() -> None:
    s = Slice.new_row_major([2, 3])
    assert s.strides == [3, 1] and s.offset == 0
    assert s.ranks() == list(range(6)) and len(s) == 6
    assert s.is_dense()


def test_slice_strided_ranks_and_index() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
    assert s.ranks() == [1, 3, 5, 7]
    assert [s.index(r) for r in s.ranks()] == [0, 1, 2, 3]
    assert [s[i] for i in range(4)] == s.ranks()
    assert 5 in s and 4 not in s and not s.is_dense()
    with pytest.raises(ValueError, match="global rank 4 is not in"):
        s.index(4)
    with pytest.raises(IndexError):
        s[4]


def test_slice_index_non_nested_falls_back() -> None:
    s = Slice(offset=0, sizes=[2, 2], strides=[1, 2])  # column-major
    assert s.ranks() == [0, 2, 1, 3]
    assert [s.index(r) for r in (0, 2, 1, 3)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"offset": -1, "sizes": [1], "strides": [1]},
        {"offset": 0, "sizes": [-1], "strides": [1]},
        {"offset": 0, "sizes": [1], "strides": [0]},
        {"offset": 0, "sizes": [1, 2], "strides": [1]},
    ],
)
def test_slice_rejects_bad_input(kwargs) -> None:
    with pytest.raises(ValueError):
        Slice(**kwargs)


def test_slice_pickle_and_eq() -> None:
    s = Slice(offset=3, sizes=[2], strides=[5])
    back = pickle.loads(pickle.dumps(s))
    assert back == s and hash(back) == hash(s)
    assert s != Slice.new_row_major([2], 3)


# --- Shape ----------------------------------------------------------------------------------


def test_shape_basics() -> None:
    shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
    assert shape.extent == Extent(["hosts", "gpus"], [2, 4])
    assert len(shape) == 8 and shape.ranks() == list(range(8))
    assert shape.coordinates(6) == Point(6, shape.extent)
    assert pickle.loads(pickle.dumps(shape)) == shape
    assert Shape.unity().ranks() == [0]


def test_shape_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one size per label"):
        Shape(["a"], Slice.new_row_major([1, 2]))
    with pytest.raises(ValueError, match="duplicate"):
        Shape(["a", "a"], Slice.new_row_major([1, 2]))
    with pytest.raises(TypeError, match="must be a Slice"):
        Shape(["a"], [1])  # type: ignore[arg-type]


def test_shape_select_int_and_slice() -> None:
    shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
    assert shape.select("hosts", 1).ranks() == [4, 5, 6, 7]
    assert shape.select("hosts", 1).labels == ["gpus"]
    sub = shape.select("gpus", slice(1, None, 2))
    assert sub.labels == ["hosts", "gpus"] and sub.ranks() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="no such dimension"):
        shape.select("nodes", 0)


def test_shape_at_selects_and_removes_a_dimension() -> None:
    shape = Shape(["batch", "height", "width"], Slice.new_row_major([2, 3, 4]))
    middle = shape.at("height", 2)
    assert middle.labels == ["batch", "width"]
    assert (middle.ndslice.sizes, middle.ndslice.strides, middle.ndslice.offset) == (
        [2, 4],
        [12, 1],
        8,
    )
    assert middle == shape.select("height", 2)
    assert shape.select("width", slice(1, 4)).at("batch", 0).ndslice.sizes == [3, 3]
    with pytest.raises(ValueError, match="no such dimension"):
        shape.at("nodes", 0)
    with pytest.raises(ValueError, match="index 5 is out of range for dimension 'batch'"):
        shape.at("batch", 5)
    with pytest.raises(OverflowError):
        shape.at("batch", -1)


# --- MeshTrait.slice ------------------------------------------------------------------------


def test_slice_int_removes_dim() -> None:
    m = mesh(hosts=2, gpus=4).slice(hosts=1)
    assert m.sizes == {"gpus": 4} and m._shape.ranks() == [4, 5, 6, 7]


def test_slice_all_ints_gives_zero_dim() -> None:
    m = mesh(hosts=2, gpus=4).slice(hosts=1, gpus=2)
    assert m.sizes == {} and len(m) == 1 and m._shape.ranks() == [6]


def test_slice_object_keeps_dim() -> None:
    m = mesh(hosts=2, gpus=4).slice(gpus=slice(0, 2))
    assert m.sizes == {"hosts": 2, "gpus": 2}
    assert m._shape.ranks() == [0, 1, 4, 5]


def test_slice_with_steps_and_uneven_length() -> None:
    m = mesh(gpus=5).slice(gpus=slice(None, None, 2))
    assert m.sizes == {"gpus": 3} and m._shape.ranks() == [0, 2, 4]


def test_slice_negative_and_none_bounds_like_python() -> None:
    m = mesh(gpus=8)
    for s in (slice(-3, None), slice(None, -2), slice(-6, -1, 2), slice(2, 100), slice(5, 2)):
        assert m.slice(gpus=s)._shape.ranks() == list(range(8))[s]


def test_slice_of_a_slice() -> None:
    m = mesh(hosts=4, gpus=8).slice(hosts=slice(1, 4), gpus=slice(1, None, 2))
    assert m._shape.ranks() == [9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31]
    mm = m.slice(hosts=slice(1, None, 1), gpus=slice(2, 4))
    assert mm.sizes == {"hosts": 2, "gpus": 2}
    assert mm._shape.ranks() == [21, 23, 29, 31]
    assert mm.slice(hosts=1, gpus=0)._shape.ranks() == [29]


def test_slice_unknown_dim_is_type_error() -> None:
    with pytest.raises(TypeError, match=r"no dimension\(s\) named \['nodes'\]"):
        mesh(hosts=2).slice(nodes=0)


@pytest.mark.parametrize("bad", [2, -1])
def test_slice_int_out_of_range_is_index_error(bad: int) -> None:
    with pytest.raises(IndexError, match="dimension 'hosts' of size 2"):
        mesh(hosts=2).slice(hosts=bad)


def test_slice_bad_step_and_type() -> None:
    with pytest.raises(ValueError, match="steps must be positive"):
        mesh(hosts=2).slice(hosts=slice(None, None, -1))
    with pytest.raises(ValueError, match="steps must be positive"):
        mesh(hosts=2).slice(hosts=slice(None, None, 0))
    with pytest.raises(TypeError, match="expected an int"):
        mesh(hosts=2).slice(hosts="0")  # type: ignore[arg-type]


def test_no_getitem() -> None:
    with pytest.raises(TypeError):
        mesh(hosts=2)[0]  # type: ignore[index]


# --- split / rename / flatten ---------------------------------------------------------------


def test_split_with_inference() -> None:
    m = mesh(hosts=4, gpus=8).split(hosts=("dp", "pp"), gpus=("tp",), pp=2)
    assert m.sizes == {"dp": 2, "pp": 2, "tp": 8}
    assert m._shape.ranks() == list(range(32))
    assert m._shape.ndslice.strides == [16, 8, 1]


def test_split_all_sizes_given() -> None:
    m = mesh(gpus=8).split(gpus=("a", "b", "c"), a=2, b=2, c=2)
    assert m.sizes == {"a": 2, "b": 2, "c": 2}
    assert m.slice(b=1)._shape.ranks() == [2, 3, 6, 7]


def test_split_a_strided_view() -> None:
    m = mesh(gpus=8).slice(gpus=slice(1, None, 2)).split(gpus=("a", "b"), b=2)
    assert m.sizes == {"a": 2, "b": 2} and m._shape.ranks() == [1, 3, 5, 7]
    assert m.slice(a=1)._shape.ranks() == [5, 7]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hosts": ("a", "b"), "a": 3}, "does not divide 4"),
        ({"hosts": ("a", "b"), "a": 2, "b": 3}, "multiply to 6, not 4"),
        ({"hosts": ("a", "b")}, "only one can be inferred"),
        ({"hosts": ("a",), "z": 2}, r"\['z'\] name no new dimension"),
        ({"hosts": 2}, "names an existing dimension"),
        ({"hosts": ()}, "at least one new name"),
        ({"hosts": ("a", "b"), "b": 0}, "must be >= 1"),
        ({"nodes": ("a", "b")}, "'nodes' is not a dimension"),
        ({"hosts": ("gpus",)}, "duplicate"),
    ],
)
def test_split_errors(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        mesh(hosts=4, gpus=2).split(**kwargs)


def test_split_string_instead_of_tuple_is_type_error() -> None:
    with pytest.raises(TypeError, match=r"hosts=\('dp',\)"):
        mesh(hosts=4).split(hosts="dp")  # type: ignore[arg-type]


def test_rename() -> None:
    m = mesh(hosts=2, gpus=4).rename(hosts="nodes", gpus="devices")
    assert m.sizes == {"nodes": 2, "devices": 4} and m._shape.ranks() == list(range(8))
    with pytest.raises(ValueError, match="no such dimension"):
        mesh(hosts=2).rename(nodes="x")
    with pytest.raises(TypeError, match="must be a str"):
        mesh(hosts=2).rename(hosts=1)  # type: ignore[arg-type]


def test_flatten_dense_views() -> None:
    m = mesh(hosts=2, gpus=4)
    assert m.flatten("r").sizes == {"r": 8}
    row = m.slice(hosts=1).flatten("r")
    assert row.sizes == {"r": 4} and row._shape.ranks() == [4, 5, 6, 7]
    outer = m.slice(hosts=slice(1, 2)).flatten("r")
    assert outer._shape.ranks() == [4, 5, 6, 7]
    assert mesh().flatten("r").sizes == {"r": 1}


@pytest.mark.parametrize(
    "dims",
    [{"gpus": slice(0, 2)}, {"gpus": slice(None, None, 2)}, {"hosts": 0, "gpus": slice(0, 4, 3)}],
)
def test_flatten_non_dense_view_is_value_error(dims) -> None:
    with pytest.raises(ValueError, match="not dense"):
        mesh(hosts=2, gpus=4).slice(**dims).flatten("r")


# --- size / sizes / extent / len ------------------------------------------------------------


def test_size_sizes_extent_len() -> None:
    m = mesh(hosts=2, gpus=4, cores=3)
    assert m.size() == 24 == len(m)
    assert m.size("gpus") == 4
    assert m.size(["hosts", "cores"]) == 6
    assert m.size(()) == 1
    assert m.sizes == {"hosts": 2, "gpus": 4, "cores": 3}
    assert m.extent == Extent(["hosts", "gpus", "cores"], [2, 4, 3])
    with pytest.raises(KeyError, match="no dimension 'nodes'"):
        m.size("nodes")


# --- ValueMesh ------------------------------------------------------------------------------


def test_value_mesh_items_and_iter() -> None:
    vm = vmesh(hosts=2, gpus=2)
    items = list(vm.items())
    assert [v for _, v in items] == [0, 1, 2, 3]
    assert [dict(p) for p, _ in items][2] == {"hosts": 1, "gpus": 0}
    assert all(isinstance(p, Point) and p.extent == vm.extent for p, _ in items)
    assert list(vm) == items
    assert [p.rank for p, _ in vm] == [0, 1, 2, 3]
    assert vm.values() == [0, 1, 2, 3] and len(vm) == 4


def test_value_mesh_item() -> None:
    vm = vmesh(hosts=2, gpus=3)
    assert vm.item(hosts=1, gpus=2) == 5
    with pytest.raises(KeyError, match=r"missing \['gpus'\]"):
        vm.item(hosts=1)
    with pytest.raises(KeyError, match=r"unknown \['cores'\]"):
        vm.item(hosts=1, gpus=0, cores=0)
    with pytest.raises(IndexError, match="gpus=3 is out of range"):
        vm.item(hosts=0, gpus=3)
    with pytest.raises(KeyError):
        vm.item()


def test_value_mesh_zero_dim_item() -> None:
    vm = ValueMesh(Shape.unity(), ["x"])
    assert vm.item() == "x" and len(vm) == 1
    assert [(dict(p), v) for p, v in vm] == [({}, "x")]
    assert vmesh(hosts=2, gpus=2).slice(hosts=1, gpus=0).item() == 2


def test_value_mesh_get() -> None:
    vm = vmesh(gpus=3)
    assert [vm.get(i) for i in range(3)] == [0, 1, 2]
    for bad in (3, -1):
        with pytest.raises(IndexError, match="out of range"):
            vm.get(bad)


def test_value_mesh_subscripted_is_the_class_at_run_time() -> None:
    assert ValueMesh[int] is ValueMesh
    assert isinstance(vmesh(gpus=2), ValueMesh[int])


def test_value_mesh_shape_is_its_shape() -> None:
    shape = Shape(["x", "y"], Slice.new_row_major([2, 3]))
    vm = ValueMesh(shape, list(range(6)))
    assert vm.shape == shape and vm.shape.labels == ["x", "y"]
    assert vm.slice(x=1).shape.ndslice.offset == 3


def test_value_mesh_slice_keeps_selected_values_and_relative_points() -> None:
    vm = vmesh(hosts=2, gpus=4)
    sub = vm.slice(hosts=1, gpus=slice(1, None, 2))
    assert isinstance(sub, ValueMesh)
    assert sub.values() == [5, 7]
    assert [(p.rank, dict(p)) for p, _ in sub] == [(0, {"gpus": 0}), (1, {"gpus": 1})]
    assert sub.item(gpus=1) == 7
    assert sub.slice(gpus=1).values() == [7]


def test_value_mesh_split_flatten_rename() -> None:
    vm = vmesh(hosts=2, gpus=4)
    assert vm.flatten("r").values() == list(range(8))
    split = vm.split(gpus=("a", "b"), b=2)
    assert split.item(hosts=1, a=1, b=0) == 6
    assert vm.rename(hosts="nodes").item(nodes=1, gpus=3) == 7


def test_value_mesh_over_non_dense_shape() -> None:
    shape = Shape(["gpus"], Slice(offset=10, sizes=[3], strides=[5]))
    vm = ValueMesh(shape, ["a", "b", "c"])
    assert vm.slice(gpus=slice(1, None)).values() == ["b", "c"]
    with pytest.raises(ValueError, match="not dense"):
        vm.flatten("r")


def test_value_mesh_pickle() -> None:
    vm = vmesh(hosts=2, gpus=2).slice(gpus=1)
    back = pickle.loads(pickle.dumps(vm))
    assert back.values() == vm.values() and back.extent == vm.extent
    assert back._shape == vm._shape


def test_value_mesh_repr() -> None:
    vm = ValueMesh(Shape(["hosts", "gpus"], Slice.new_row_major([1, 2])), ["a", "b"])
    expected = (
        "ValueMesh({'hosts': 1, 'gpus': 2}):\n"
        "  {'hosts': 0/1, 'gpus': 0/2}: 'a'\n"
        "  {'hosts': 0/1, 'gpus': 1/2}: 'b'"
    )
    assert repr(vm) == expected == str(vm)
    big = repr(vmesh(gpus=40))
    assert big.endswith("... (8 more)") and big.count("\n") == 33


def test_value_mesh_generic_and_constructor_errors() -> None:
    assert ValueMesh[int] is not None
    typed = ValueMesh[int](Shape.unity(), [1])
    assert typed.item() == 1
    with pytest.raises(ValueError, match="1 value"):
        ValueMesh(Shape(["a"], Slice.new_row_major([2])), [1])
    with pytest.raises(TypeError, match="must be a Shape"):
        ValueMesh(None, [])  # type: ignore[arg-type]
