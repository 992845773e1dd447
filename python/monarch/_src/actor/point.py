"""``Point``: one position in a mesh, as named coordinates plus a linear rank.

A point pairs a rank with an :class:`~monarch._src.actor.extent.Extent`. The rank is the
row-major linear index of the point within that extent (the last dimension varies
fastest); the coordinates follow from it. A point is a :class:`collections.abc.Mapping`
from label to coordinate, so ``dict(p)`` gives the coordinates.

Invariant: ``0 <= p.rank < p.extent.nelements``. A zero-dimensional point (the only point
of ``Extent([], [])``) has rank 0 and no coordinates.

>>> p = Point(5, Extent(["hosts", "gpus"], [2, 4]))
>>> p
{'hosts': 1/2, 'gpus': 1/4}
>>> p["hosts"], p.rank, dict(p)
(1, 5, {'hosts': 1, 'gpus': 1})
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator
from typing import Any, final

from monarch._src.actor.extent import Extent

__all__ = ["Point"]


@final
class Point(collections.abc.Mapping[str, int]):
    """A position in a mesh: a ``Mapping`` from dimension label to coordinate.

    Raises:
        TypeError: ``rank`` is not an ``int`` or ``extent`` is not an ``Extent``.
        IndexError: ``rank`` is outside ``[0, extent.nelements)``.

    >>> e = Extent(["hosts", "gpus"], [2, 4])
    >>> p = Point(6, e)
    >>> list(p), len(p), p.size("gpus"), p.extent == e
    (['hosts', 'gpus'], 2, 4, True)
    >>> Point(0, Extent([], []))
    {}
    """

    __slots__ = ("_coords", "_extent", "_rank")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"Point: rank must be an int, got {rank!r} ({type(rank).__name__})")
        if not isinstance(extent, Extent):
            raise TypeError(
                f"Point: extent must be an Extent, got {type(extent).__name__}; build one "
                "with Extent(labels, sizes)"
            )
        if not 0 <= rank < extent.nelements:
            raise IndexError(
                f"Point: rank {rank} is out of range for {extent!r}, which has "
                f"{extent.nelements} point(s); expected 0 <= rank < {extent.nelements}"
            )
        coords = []
        rest = rank
        for size in reversed(extent.sizes):
            rest, coord = divmod(rest, size)
            coords.append(coord)
        self._rank = rank
        self._extent = extent
        self._coords = tuple(reversed(coords))

    @property
    def rank(self) -> int:
        """The row-major linear index of this point within :attr:`extent`."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point lies in."""
        return self._extent

    def size(self, label: str) -> int:
        """The size of dimension ``label`` of :attr:`extent` (``ValueError`` if unknown).

        >>> Point(0, Extent(["gpus"], [8])).size("gpus")
        8
        """
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        labels = self._extent.labels
        if label not in labels:
            raise ValueError(f"point {self!r} has no dimension {label!r}; expected one of {labels}")
        return self._coords[labels.index(label)]

    def __contains__(self, label: object) -> bool:
        return label in self._extent

    def get(self, label: str, default: Any = None) -> Any:
        """``self[label]``, or ``default`` when there is no such dimension."""
        return self[label] if label in self._extent else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __repr__(self) -> str:
        parts = (
            f"{label!r}: {coord}/{size}"
            for label, coord, size in zip(
                self._extent, self._coords, self._extent.sizes, strict=True
            )
        )
        return "{" + ", ".join(parts) + "}"

    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]:
        return (Point, (self._rank, self._extent))
