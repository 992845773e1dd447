"""``Point``: one position in a mesh, as named coordinates plus a linear rank.

A point pairs a rank with an :class:`~monarch._src.actor.extent.Extent`. The rank is the
row-major linear index of the point within that extent (the last dimension varies
fastest); the coordinates follow from it. A point is an immutable, hashable, picklable
:class:`collections.abc.Mapping` from label to coordinate, so ``dict(p)`` gives the
coordinates; an unknown label raises ``ValueError``.

Invariant: ``0 <= p.rank < p.extent.nelements``. A zero-dimensional point (the only point
of ``Extent([], [])``) has rank 0 and no coordinates.

The class is implemented in Rust (``hyperactor_mesh::shape::Point``); this module is its
Python home.

>>> from monarch._src.actor.extent import Extent
>>> p = Point(5, Extent(["hosts", "gpus"], [2, 4]))
>>> p
{'hosts': 1/2, 'gpus': 1/4}
>>> p["hosts"], p.rank, dict(p), p.size("gpus")
(1, 5, {'hosts': 1, 'gpus': 1}, 4)
>>> Point(0, Extent([], []))
{}
>>> Point(8, p.extent)  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
IndexError: rank 8 is out of range for extent {'hosts': 2, 'gpus': 4}, which has 8 point(s); ...
"""

from __future__ import annotations

from monarch._rust_bindings import Point

__all__ = ["Point"]
