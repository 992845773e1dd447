"""``ValueMesh``: one value per rank of a mesh, what ``endpoint.call()`` returns.

A value mesh pairs a :class:`~monarch._src.actor.shape.Shape` with one value per rank of
that shape, stored in local row-major order. Points handed out by :meth:`ValueMesh.items`
are relative to the value mesh's own extent, not to the mesh it came from. As a
:class:`~monarch._src.actor.shape.MeshTrait` it can be sliced, split, renamed and
flattened like any mesh; slicing keeps the selected values.

>>> from monarch import NDSlice, Shape
>>> vm = ValueMesh(Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 2])), ["a", "b", "c", "d"])
>>> vm.item(hosts=1, gpus=0)
'c'
>>> [(p.rank, v) for p, v in vm.slice(gpus=1)]
[(0, 'b'), (1, 'd')]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, Generic, TypeVar, final

from monarch._src.actor.point import Point
from monarch._src.actor.shape import MeshTrait, Shape

__all__ = ["ValueMesh"]

R = TypeVar("R")

#: How many rows ``repr(ValueMesh)`` shows before eliding the rest.
_REPR_MAX_ROWS = 32


@final
class ValueMesh(MeshTrait, Generic[R]):
    """One value per rank of ``shape``, in local row-major order.

    Raises:
        TypeError: ``shape`` is not a :class:`Shape`.
        ValueError: the number of values differs from the number of ranks in ``shape``.

    >>> from monarch import NDSlice, Shape
    >>> vm = ValueMesh(Shape(["gpus"], NDSlice.new_row_major([3])), [10, 11, 12])
    >>> vm
    ValueMesh({'gpus': 3}):
      {'gpus': 0/3}: 10
      {'gpus': 1/3}: 11
      {'gpus': 2/3}: 12
    >>> vm.values(), vm.get(2), len(vm)
    ([10, 11, 12], 12, 3)
    >>> ValueMesh(Shape.unity(), ["only"]).item()
    'only'
    """

    __slots__ = ("_vm_shape", "_vm_values")

    _vm_shape: Shape
    _vm_values: list[R]

    def __class_getitem__(cls, item: Any) -> Any:
        """``ValueMesh[int]`` is ``ValueMesh`` itself at run time (as upstream Monarch's
        is), so ``isinstance(x, ValueMesh[int])`` works; type checkers still read the
        parameter."""
        return cls

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if not isinstance(shape, Shape):
            raise TypeError(
                f"ValueMesh: shape must be a Shape, got {type(shape).__name__}; build one "
                "with Shape(labels, Slice.new_row_major(sizes))"
            )
        values = list(values)
        if len(values) != len(shape):
            raise ValueError(
                f"ValueMesh: {len(values)} value(s) given for a shape with extent "
                f"{dict(shape.extent)} of {len(shape)} rank(s); pass exactly one value per "
                "rank, in row-major order"
            )
        self._vm_shape = shape
        self._vm_values = values

    @property
    def _shape(self) -> Shape:
        return self._vm_shape

    @property
    def shape(self) -> Shape:
        """The shape of the mesh the values came from: its ``labels`` and ``ndslice``
        (the ranks each value belongs to)."""
        return self._vm_shape

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        index = self._vm_shape.ndslice.index
        return ValueMesh(shape, [self._vm_values[index(rank)] for rank in shape.ranks()])

    def items(self) -> Iterator[tuple[Point, R]]:
        """``(point, value)`` pairs in row-major order; points are relative to
        :attr:`extent`."""
        values = self._vm_values
        return zip(
            map(Point, range(len(values)), repeat(self._vm_shape.extent)), values, strict=True
        )

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def values(self) -> list[R]:
        """The values, in row-major order (a fresh list)."""
        return list(self._vm_values)

    def get(self, index: int) -> R:
        """The value at local row-major ``index``.

        Raises:
            IndexError: ``index`` is outside ``[0, len(self))`` (negative included).
        """
        n = len(self._vm_values)
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"ValueMesh.get: index must be an int, got {type(index).__name__}")
        if not 0 <= index < n:
            raise IndexError(
                f"ValueMesh.get({index}): index out of range for {self._describe()} "
                f"({n} value(s)); expected 0 <= index < {n}"
            )
        return self._vm_values[index]

    def item(self, **coords: int) -> R:
        """The value at ``coords``, which must name every dimension exactly once.

        Raises:
            KeyError: a dimension is missing or not in this mesh.
            IndexError: a coordinate is out of range.

        >>> from monarch import NDSlice, Shape
        >>> vm = ValueMesh(Shape(["x", "y"], NDSlice.new_row_major([2, 3])), list(range(6)))
        >>> vm.item(x=1, y=2)
        5
        """
        extent = self._vm_shape.extent
        labels = extent.labels
        missing = [label for label in labels if label not in coords]
        extra = [label for label in coords if label not in extent]
        if missing or extra:
            problems = []
            if missing:
                problems.append(f"missing {missing}")
            if extra:
                problems.append(f"unknown {extra}")
            example = ", ".join(f"{label}=0" for label in labels)
            raise KeyError(
                f"ValueMesh.item on {self._describe()}: {' and '.join(problems)} "
                f"dimension(s); give every dimension exactly once, e.g. item({example})"
            )
        local = 0
        for label, size in zip(labels, extent.sizes, strict=True):
            coord = coords[label]
            if isinstance(coord, bool) or not isinstance(coord, int) or not 0 <= coord < size:
                raise IndexError(
                    f"ValueMesh.item on {self._describe()}: {label}={coord!r} is out of "
                    f"range; expected an int with 0 <= {label} < {size}"
                )
            local = local * size + coord
        return self._vm_values[local]

    def __repr__(self) -> str:
        rows = [f"  {point!r}: {value!r}" for point, value in self._head(_REPR_MAX_ROWS)]
        if len(self._vm_values) > _REPR_MAX_ROWS:
            rows.append(f"  ... ({len(self._vm_values) - _REPR_MAX_ROWS} more)")
        return "\n".join([f"ValueMesh({dict(self._vm_shape.extent)}):", *rows])

    def _head(self, n: int) -> Iterator[tuple[Point, R]]:
        for i, pair in enumerate(self.items()):
            if i >= n:
                return
            yield pair

    def __reduce__(self) -> tuple[type[ValueMesh[R]], tuple[Shape, list[R]]]:
        return (ValueMesh, (self._vm_shape, self._vm_values))
