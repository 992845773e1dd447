"""``Slice``: an n-dimensional strided view of a space of global ranks.

A slice maps each local coordinate ``(c_0, ..., c_{n-1})``, with ``0 <= c_i < sizes[i]``,
to the global rank ``offset + sum(c_i * strides[i])``. Local indices enumerate the
coordinates in row-major order (the last dimension varies fastest), so a dense slice
(:meth:`Slice.new_row_major`) maps local index ``i`` to global rank ``offset + i``.

Invariants: ``offset >= 0``, sizes ``>= 0``, strides ``>= 1``, and ``len(sizes) ==
len(strides)``. Slices made by selecting, splitting and flattening a dense slice (what
:class:`~monarch._src.actor.shape.Shape` does) never map two local indices to the same
rank.

The class is implemented in Rust (``hyperactor_mesh::shape::Slice``); this module is its
Python home.

>>> s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
>>> s.ranks()
[1, 3, 5, 7]
>>> len(s), s.index(5), s[3], 5 in s, s.is_dense()
(4, 2, 7, True, False)
>>> Slice.new_row_major([2, 3])
Slice(offset=0, sizes=[2, 3], strides=[3, 1])
>>> Slice.new_row_major([2, 4], offset=8).ranks()[:3]
[8, 9, 10]
"""

from __future__ import annotations

from monarch._rust_bindings import Slice

__all__ = ["Slice"]
