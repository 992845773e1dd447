"""``Extent``: the ordered, named sizes of a mesh.

An extent says how big a mesh is along each of its named dimensions, in order, for
example ``{'hosts': 2, 'gpus': 4}``. It is an immutable, hashable, picklable
:class:`collections.abc.Mapping` from label to size. The number of elements is the
product of the sizes (1 for an extent with no dimensions).

Invariants:

* labels are distinct strings, sizes are non-negative ints, one size per label;
* two extents are equal only when they have the same labels, in the same order, with
  the same sizes.

The class is implemented in Rust (``hyperactor_mesh::shape::Extent``); this module is
its Python home. Unlike a ``dict``, looking up an unknown label raises ``ValueError``.

>>> e = Extent(["hosts", "gpus"], [2, 4])
>>> e
Extent({'hosts': 2, 'gpus': 4})
>>> e["gpus"], e.nelements, list(e)
(4, 8, ['hosts', 'gpus'])
>>> e.labels, e.sizes, dict(e) == {"hosts": 2, "gpus": 4}, e.get("nodes")
(['hosts', 'gpus'], [2, 4], True, None)
>>> Extent([], []).nelements, Extent(["hosts", "gpus"], [2, 2]).region.ranks()
(1, [0, 1, 2, 3])
>>> e["nodes"]
Traceback (most recent call last):
    ...
ValueError: no such dimension: there is no dimension 'nodes'; expected one of ['hosts', 'gpus']
"""

from __future__ import annotations

from monarch._rust_bindings import Extent

__all__ = ["Extent"]
