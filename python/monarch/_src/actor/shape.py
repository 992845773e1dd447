"""Shapes of meshes, and the operations every mesh shares (``MeshTrait``).

A :class:`Shape` is the labels plus the :class:`~monarch._src.actor.slice.Slice` of a
mesh view: which global ranks the view covers and how they are laid out along named
dimensions. Every mesh operation is an operation on shapes that returns a new shape:

* ``select(label, i)`` keeps only coordinate ``i`` of a dimension and removes it;
* ``select(label, slice(start, stop, step))`` keeps the dimension, restricted;
* ``split`` replaces dimensions by several (``hosts`` → ``dp``, ``pp``), ``rename``
  relabels, and ``flatten`` merges all dimensions of a dense view into one.

:class:`MeshTrait` puts these operations on a mesh type: ``HostMesh``, ``ProcMesh``,
``ActorMesh`` and ``ValueMesh`` implement ``_shape`` and ``_new_with_shape`` and get
``slice``, ``split``, ``rename``, ``flatten``, ``size``, ``sizes``, ``extent`` and
``len()``. Meshes have no ``__getitem__``: use ``slice``.

>>> shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
>>> shape.select("hosts", 1).ranks()
[4, 5, 6, 7]
>>> shape.select("gpus", slice(None, None, 2)).extent
Extent({'hosts': 2, 'gpus': 2})
>>> shape.split({"gpus": ("tp", "cp"), "cp": 2}).extent
Extent({'hosts': 2, 'tp': 2, 'cp': 2})
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, final

from monarch._src.actor.extent import Extent, _check_labels_and_sizes
from monarch._src.actor.point import Point
from monarch._src.actor.slice import Slice

__all__ = ["Extent", "MeshTrait", "Point", "Shape", "Slice"]


@final
class Shape:
    """The labels and :class:`Slice` of a mesh view: which global ranks, laid out how.

    Raises:
        TypeError: ``slice`` is not a :class:`Slice` or a label is not a ``str``.
        ValueError: the number of labels differs from the slice's dimensions, or a
            label repeats.

    >>> shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 2]))
    >>> shape
    Shape(labels=['hosts', 'gpus'], slice=Slice(offset=0, sizes=[2, 2], strides=[2, 1]))
    >>> len(shape), shape.ranks(), shape.extent
    (4, [0, 1, 2, 3], Extent({'hosts': 2, 'gpus': 2}))
    """

    __slots__ = ("_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: Slice

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        if not isinstance(slice, Slice):
            raise TypeError(
                f"Shape: slice must be a Slice, got {type(slice).__name__}; build one with "
                "Slice(offset=..., sizes=..., strides=...) or Slice.new_row_major(sizes)"
            )
        self._labels, _ = _check_labels_and_sizes(labels, slice.sizes, "Shape")
        self._slice = slice

    @staticmethod
    def unity() -> Shape:
        """The zero-dimensional shape of the single rank 0.

        >>> Shape.unity().ranks(), Shape.unity().extent
        ([0], Extent({}))
        """
        return Shape([], Slice(offset=0, sizes=[], strides=[]))

    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a fresh list)."""
        return list(self._labels)

    @property
    def ndslice(self) -> Slice:
        """The :class:`Slice` mapping local coordinates to global ranks."""
        return self._slice

    @property
    def extent(self) -> Extent:
        """The extent of this view: its labels with their sizes."""
        return Extent(self._labels, self._slice.sizes)

    def ranks(self) -> list[int]:
        """The global ranks of this view, in row-major order of its coordinates."""
        return self._slice.ranks()

    def __len__(self) -> int:
        return len(self._slice)

    def coordinates(self, rank: int) -> Point:
        """The :class:`Point` (relative to :attr:`extent`) of global ``rank``.

        >>> Shape(["gpus"], Slice(offset=4, sizes=[4], strides=[1])).coordinates(6)
        {'gpus': 2/4}
        """
        return Point(self._slice.index(rank), self.extent)

    def select(self, label: str, index: int | builtins.slice) -> Shape:
        """Restrict dimension ``label``: an int selects one coordinate and removes the
        dimension; a ``slice`` keeps it, restricted (positive steps only).

        Raises:
            ValueError: no dimension ``label``, or a slice step is not positive.
            IndexError: an int index is outside ``[0, size)``.
            TypeError: ``index`` is neither an int nor a slice.

        >>> shape = Shape(["gpus"], Slice.new_row_major([8]))
        >>> shape.select("gpus", slice(-3, None)).ranks()
        [5, 6, 7]
        >>> shape.select("gpus", 2).ranks()
        [2]
        """
        if label not in self._labels:
            raise ValueError(
                f"cannot select dimension {label!r} of {self.extent!r}: no such dimension; "
                f"expected one of {list(self._labels)}"
            )
        return _select(self, label, index, f"{self.extent!r}")

    def split(self, spec: Mapping[str, Sequence[str] | int]) -> Shape:
        """Split dimensions into several; see :meth:`MeshTrait.split`.

        >>> shape = Shape(["hosts"], Slice.new_row_major([6]))
        >>> shape.split({"hosts": ("dp", "pp"), "pp": 3}).extent
        Extent({'dp': 2, 'pp': 3})
        """
        return _split(self, dict(spec), f"{self.extent!r}")

    def rename(self, old_to_new: Mapping[str, str]) -> Shape:
        """Relabel dimensions; see :meth:`MeshTrait.rename`.

        >>> Shape(["hosts"], Slice.new_row_major([2])).rename({"hosts": "nodes"}).extent
        Extent({'nodes': 2})
        """
        return _rename(self, dict(old_to_new), f"{self.extent!r}")

    def flatten(self, name: str) -> Shape:
        """Merge all dimensions of a dense view into one named ``name``.

        Raises:
            ValueError: the view is not dense (its ranks are not consecutive).

        >>> Shape(["a", "b"], Slice.new_row_major([2, 3])).flatten("ab").extent
        Extent({'ab': 6})
        """
        return _flatten(self, name, f"{self.extent!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((self._labels, self._slice))

    def __repr__(self) -> str:
        return f"Shape(labels={list(self._labels)}, slice={self._slice!r})"

    def __reduce__(self) -> tuple[type[Shape], tuple[list[str], Slice]]:
        return (Shape, (list(self._labels), self._slice))


def _select(shape: Shape, label: str, index: int | builtins.slice, where: str) -> Shape:
    """``shape.select``; ``label`` must exist; ``where`` names the mesh in errors."""
    labels = shape.labels
    sl = shape.ndslice
    sizes, strides, offset = sl.sizes, sl.strides, sl.offset
    dim = labels.index(label)
    size, stride = sizes[dim], strides[dim]
    if isinstance(index, builtins.slice):
        if index.step is not None and (not isinstance(index.step, int) or index.step <= 0):
            raise ValueError(
                f"cannot slice dimension {label!r} of {where} with step {index.step!r}: "
                "steps must be positive ints; select in increasing order, e.g. "
                f"{label}=slice(None, None, 2)"
            )
        start, stop, step = index.indices(size)
        new_size = len(range(start, stop, step))
        if new_size > 0:
            offset += start * stride
        sizes[dim], strides[dim] = new_size, stride * step
        return Shape(labels, Slice(offset=offset, sizes=sizes, strides=strides))
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(
            f"cannot select dimension {label!r} of {where} with {index!r} "
            f"({type(index).__name__}): expected an int (selects and removes the dimension) "
            f"or a slice (keeps it), e.g. {label}=0 or {label}=slice(0, 2)"
        )
    if not 0 <= index < size:
        raise IndexError(
            f"index {index} is out of range for dimension {label!r} of size {size} in "
            f"{where}; expected 0 <= {label} < {size} (negative indices are not allowed)"
        )
    offset += index * stride
    del labels[dim], sizes[dim], strides[dim]
    return Shape(labels, Slice(offset=offset, sizes=sizes, strides=strides))


def _split(shape: Shape, spec: dict[str, Any], where: str) -> Shape:
    """``shape.split``; ``where`` names the mesh in errors."""
    labels = shape.labels
    splits = {k: v for k, v in spec.items() if k in labels}
    constraints = {k: v for k, v in spec.items() if k not in labels}
    for name, value in splits.items():
        if isinstance(value, int):
            raise ValueError(
                f"cannot split {where}: {name}={value!r} names an existing dimension; give "
                f"its new names as a tuple, e.g. {name}=('a', 'b'), and constrain the size "
                "of a new name instead, e.g. b=2"
            )
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise TypeError(
                f"cannot split dimension {name!r} of {where}: expected a tuple of new "
                f"dimension names, got {value!r}; write e.g. {name}=('a', 'b') "
                f"(or {name}=({value!r},) to rename it)"
            )
        if not value:
            raise ValueError(
                f"cannot split dimension {name!r} of {where} into no dimensions; give at "
                f"least one new name, e.g. {name}=({name!r},)"
            )
    for name, value in constraints.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(
                f"cannot split {where}: {name!r} is not a dimension (expected one of "
                f"{labels}), so {name}={value!r} must be the int size of a new dimension"
            )
        if value < 1:
            raise ValueError(
                f"cannot split {where}: new dimension {name!r} has size {value}; sizes of "
                "new dimensions must be >= 1"
            )
    used: set[str] = set()
    sl = shape.ndslice
    new_labels: list[str] = []
    new_sizes: list[int] = []
    new_strides: list[int] = []
    for label, size, stride in zip(labels, sl.sizes, sl.strides, strict=True):
        if label not in splits:
            new_labels.append(label)
            new_sizes.append(size)
            new_strides.append(stride)
            continue
        to_names = list(splits[label])
        unknown = [n for n in to_names if n not in constraints]
        known = 1
        for n in to_names:
            if n in constraints:
                known *= constraints[n]
                used.add(n)
        if len(unknown) > 1:
            raise ValueError(
                f"cannot split dimension {label!r} (size {size}) of {where} into {to_names}: "
                f"the sizes of {unknown} are all unknown and only one can be inferred; give "
                f"all but one, e.g. {unknown[0]}=2"
            )
        if unknown:
            if size % known != 0:
                raise ValueError(
                    f"cannot split dimension {label!r} (size {size}) of {where} into "
                    f"{to_names}: the given sizes multiply to {known}, which does not divide "
                    f"{size}; choose sizes whose product divides {size}"
                )
            sizes_here = [constraints.get(n, size // known) for n in to_names]
        else:
            if known != size:
                raise ValueError(
                    f"cannot split dimension {label!r} (size {size}) of {where} into "
                    f"{to_names}: the given sizes multiply to {known}, not {size}; make "
                    f"their product {size} or leave one size out to infer it"
                )
            sizes_here = [constraints[n] for n in to_names]
        inner = stride
        strides_here = []
        for s in reversed(sizes_here):
            strides_here.append(inner)
            inner *= s
        new_labels.extend(to_names)
        new_sizes.extend(sizes_here)
        new_strides.extend(reversed(strides_here))
    unused = sorted(set(constraints) - used)
    if unused:
        raise ValueError(
            f"cannot split {where}: size constraint(s) {unused} name no new dimension of "
            f"this split and no existing dimension (existing: {labels}); remove them or add "
            "them to a split tuple"
        )
    return Shape(new_labels, Slice(offset=sl.offset, sizes=new_sizes, strides=new_strides))


def _rename(shape: Shape, old_to_new: dict[str, Any], where: str) -> Shape:
    labels = shape.labels
    for old, new in old_to_new.items():
        if old not in labels:
            raise ValueError(
                f"cannot rename dimension {old!r} of {where}: no such dimension; expected "
                f"one of {labels}"
            )
        if not isinstance(new, str):
            raise TypeError(
                f"cannot rename dimension {old!r} of {where} to {new!r}: the new name must "
                f"be a str, e.g. {old}='nodes'"
            )
    return _split(shape, {old: (new,) for old, new in old_to_new.items()}, where)


def _flatten(shape: Shape, name: str, where: str) -> Shape:
    if not isinstance(name, str):
        raise TypeError(f"cannot flatten {where}: the new dimension name must be a str")
    sl = shape.ndslice
    if not sl.is_dense():
        raise ValueError(
            f"cannot flatten {where}: it is not dense (slice {sl!r} does not cover "
            "consecutive ranks), and only dense views can be flattened; flatten the mesh "
            "before slicing it with steps or partial ranges, or split/rename instead"
        )
    return Shape([name], Slice(offset=sl.offset, sizes=[len(sl)], strides=[1]))


_M = TypeVar("_M", bound="MeshTrait")


class MeshTrait(ABC):
    """Mesh operations shared by ``HostMesh``, ``ProcMesh``, ``ActorMesh`` and ``ValueMesh``.

    Subclasses implement the ``_shape`` property and ``_new_with_shape(shape)``, which
    returns a mesh of the same kind over ``shape`` (sharing the underlying resources).

    >>> class Grid(MeshTrait):
    ...     def __init__(self, shape):
    ...         self._s = shape
    ...     @property
    ...     def _shape(self):
    ...         return self._s
    ...     def _new_with_shape(self, shape):
    ...         return Grid(shape)
    >>> g = Grid(Shape(["hosts", "gpus"], Slice.new_row_major([2, 4])))
    >>> g.slice(hosts=1, gpus=slice(0, 2)).sizes
    {'gpus': 2}
    >>> g.split(gpus=("tp", "cp"), cp=2).extent
    Extent({'hosts': 2, 'tp': 2, 'cp': 2})
    >>> len(g), g.size("gpus"), g.size(), g.flatten("ranks").sizes
    (8, 4, 8, {'ranks': 8})
    """

    __slots__ = ()

    @property
    @abstractmethod
    def _shape(self) -> Shape:
        """The shape of this mesh view."""

    @abstractmethod
    def _new_with_shape(self: _M, shape: Shape) -> _M:
        """A mesh of the same kind over ``shape``, sharing this mesh's resources."""

    @property
    def _labels(self) -> list[str]:
        return self._shape.labels

    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    def _describe(self) -> str:
        """How errors name this mesh: its type and extent."""
        return f"{type(self).__name__} with extent {dict(self._shape.extent)}"

    def slice(self: _M, **dims: int | builtins.slice) -> _M:
        """Select part of the mesh: ``dim=i`` keeps coordinate ``i`` and removes the
        dimension; ``dim=slice(...)`` keeps the dimension, restricted (steps allowed).

        Raises:
            TypeError: a keyword is not a dimension of this mesh, or a value is neither
                an int nor a slice.
            IndexError: an int is outside ``[0, size)`` (negative ints included).
            ValueError: a slice step is not positive.
        """
        shape = self._shape
        unknown = [d for d in dims if d not in shape.labels]
        if unknown:
            raise TypeError(
                f"cannot slice {self._describe()}: no dimension(s) named {unknown}; expected "
                f"keywords among {shape.labels}"
            )
        for label, index in dims.items():
            shape = _select(shape, label, index, self._describe())
        return self._new_with_shape(shape)

    def split(self: _M, **kwargs: Sequence[str] | int) -> _M:
        """Split dimensions into several, e.g.
        ``m.split(hosts=("dp", "pp"), gpus=("tp",), pp=2)``.

        A keyword naming an existing dimension gives its new names, outermost first; any
        other keyword gives the size of a new name. In each split at most one size may be
        left out; it is inferred. Dimensions not named are kept.

        Raises:
            ValueError: the sizes do not divide (or multiply to) the dimension's size, more
                than one size is unknown, or a size constraint names no new dimension.
            TypeError: new names are not given as a tuple of strings.
        """
        return self._new_with_shape(_split(self._shape, kwargs, self._describe()))

    def rename(self: _M, **old_to_new: str) -> _M:
        """Relabel dimensions, e.g. ``m.rename(hosts="nodes")`` (a one-way ``split``).

        Raises:
            ValueError: a keyword is not a dimension, or a new name clashes with another.
        """
        return self._new_with_shape(_rename(self._shape, old_to_new, self._describe()))

    def flatten(self: _M, name: str) -> _M:
        """Merge all dimensions into one named ``name``.

        Raises:
            ValueError: the mesh is not dense (e.g. sliced with a step or partial range
                along an inner dimension).
        """
        return self._new_with_shape(_flatten(self._shape, name, self._describe()))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """The number of ranks: in total (``None``), along ``dim``, or along several dims.

        Raises:
            KeyError: a dimension is not in this mesh.
        """
        if dim is None:
            return len(self._shape)
        if isinstance(dim, str):
            extent = self._shape.extent
            if dim not in extent:
                raise KeyError(
                    f"{self._describe()} has no dimension {dim!r}; expected one of {extent.labels}"
                )
            return extent[dim]
        total = 1
        for d in dim:
            total *= self.size(d)
        return total

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dimension, in order."""
        return dict(self._shape.extent)

    @property
    def extent(self) -> Extent:
        """The :class:`Extent` of this mesh."""
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)
