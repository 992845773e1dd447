"""Shapes of meshes, and the operations every mesh shares (``MeshTrait``).

A :class:`Shape` is the labels plus the :class:`~monarch._src.actor.slice.Slice` of a
mesh view: which global ranks the view covers and how they are laid out along named
dimensions. Every mesh operation is an operation on shapes that returns a new shape:

* ``select(label, i)`` keeps only coordinate ``i`` of a dimension and removes it;
* ``select(label, slice(start, stop, step))`` keeps the dimension, restricted;
* ``split`` replaces dimensions by several (``hosts`` → ``dp``, ``pp``), ``rename``
  relabels, and ``flatten`` merges all dimensions of a dense view into one.

``Shape`` is implemented in Rust (``hyperactor_mesh::shape::Shape``, which the Rust mesh
layer uses too); it is immutable, hashable and picklable.

:class:`MeshTrait` puts these operations on a mesh type: ``HostMesh``, ``ProcMesh``,
``ActorMesh`` and ``ValueMesh`` implement ``_shape`` and ``_new_with_shape`` and get
``slice``, ``split``, ``rename``, ``flatten``, ``size``, ``sizes``, ``extent`` and
``len()``. Meshes have no ``__getitem__``: use ``slice``.

>>> shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
>>> shape
Shape(labels=['hosts', 'gpus'], slice=Slice(offset=0, sizes=[2, 4], strides=[4, 1]))
>>> len(shape), shape.ranks()[:3], shape.extent
(8, [0, 1, 2], Extent({'hosts': 2, 'gpus': 4}))
>>> shape.select("hosts", 1).ranks()
[4, 5, 6, 7]
>>> shape.select("gpus", slice(None, None, 2)).extent
Extent({'hosts': 2, 'gpus': 2})
>>> shape.select("gpus", slice(-3, None)).ranks()
[1, 2, 3, 5, 6, 7]
>>> shape.coordinates(6)
{'hosts': 1/2, 'gpus': 2/4}
>>> shape.split({"gpus": ("tp", "cp"), "cp": 2}).extent
Extent({'hosts': 2, 'tp': 2, 'cp': 2})
>>> shape.rename({"hosts": "nodes"}).flatten("all").extent
Extent({'all': 8})
>>> Shape.unity().ranks(), Shape.unity().extent
([0], Extent({}))
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TypeVar

from monarch._rust_bindings import Shape
from monarch._src.actor.extent import Extent
from monarch._src.actor.point import Point
from monarch._src.actor.slice import Slice

__all__ = ["Extent", "MeshTrait", "Point", "Shape", "Slice"]

#: The errors shape operations raise for a bad argument; ``MeshTrait`` names the mesh in
#: them.
_ARG_ERRORS = (ValueError, IndexError, TypeError)


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
        labels = shape.labels
        unknown = [d for d in dims if d not in labels]
        if unknown:
            raise TypeError(
                f"cannot slice {self._describe()}: no dimension(s) named {unknown}; expected "
                f"keywords among {labels}"
            )
        try:
            for label, index in dims.items():
                shape = shape.select(label, index)
        except _ARG_ERRORS as e:
            raise type(e)(f"cannot slice {self._describe()}: {e}") from None
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
        try:
            shape = self._shape.split(kwargs)
        except _ARG_ERRORS as e:
            raise type(e)(f"cannot split {self._describe()}: {e}") from None
        return self._new_with_shape(shape)

    def rename(self: _M, **old_to_new: str) -> _M:
        """Relabel dimensions, e.g. ``m.rename(hosts="nodes")`` (a one-way ``split``).

        Raises:
            ValueError: a keyword is not a dimension, or a new name clashes with another.
        """
        try:
            shape = self._shape.rename(old_to_new)
        except _ARG_ERRORS as e:
            raise type(e)(f"cannot rename dimensions of {self._describe()}: {e}") from None
        return self._new_with_shape(shape)

    def flatten(self: _M, name: str) -> _M:
        """Merge all dimensions into one named ``name``.

        Raises:
            ValueError: the mesh is not dense (e.g. sliced with a step or partial range
                along an inner dimension).
        """
        try:
            shape = self._shape.flatten(name)
        except _ARG_ERRORS as e:
            raise type(e)(f"cannot flatten {self._describe()}: {e}") from None
        return self._new_with_shape(shape)

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
