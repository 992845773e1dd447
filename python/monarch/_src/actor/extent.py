"""``Extent``: the ordered, named sizes of a mesh.

An extent says how big a mesh is along each of its named dimensions, in order, for
example ``{'hosts': 2, 'gpus': 4}``. It is an immutable, hashable
:class:`collections.abc.Mapping` from label to size. The number of elements is the
product of the sizes (1 for an extent with no dimensions).

Invariants:

* labels are distinct strings, sizes are non-negative ints, one size per label;
* two extents are equal only when they have the same labels, in the same order, with
  the same sizes.

>>> e = Extent(["hosts", "gpus"], [2, 4])
>>> e
Extent({'hosts': 2, 'gpus': 4})
>>> e["gpus"], e.nelements, list(e)
(4, 8, ['hosts', 'gpus'])
"""

from __future__ import annotations

import collections.abc
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    from monarch._src.actor.shape import Shape

__all__ = ["Extent"]


def _check_labels_and_sizes(
    labels: Sequence[str], sizes: Sequence[int], what: str
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Validate and freeze ``labels``/``sizes``; ``what`` names the caller in errors."""
    if isinstance(labels, str):
        raise TypeError(
            f"{what}: labels must be a sequence of strings, got the string {labels!r}; "
            f"wrap it in a list, e.g. [{labels!r}]"
        )
    labels_t = tuple(labels)
    sizes_t = tuple(sizes)
    for label in labels_t:
        if not isinstance(label, str):
            raise TypeError(
                f"{what}: every label must be a str, got {label!r} ({type(label).__name__}); "
                "name dimensions with strings such as 'hosts'"
            )
    if len(labels_t) != len(sizes_t):
        raise ValueError(
            f"{what}: got {len(labels_t)} labels {list(labels_t)} but {len(sizes_t)} sizes "
            f"{list(sizes_t)}; pass exactly one size per label"
        )
    for label, size in zip(labels_t, sizes_t, strict=True):
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(
                f"{what}: the size of dimension {label!r} must be an int, got {size!r} "
                f"({type(size).__name__})"
            )
    for label, size in zip(labels_t, sizes_t, strict=True):
        if size < 0:
            raise ValueError(
                f"{what}: dimension {label!r} has negative size {size}; sizes must be >= 0"
            )
    if len(set(labels_t)) != len(labels_t):
        dups = sorted({label for label in labels_t if labels_t.count(label) > 1})
        raise ValueError(
            f"{what}: duplicate dimension label(s) {dups} in {list(labels_t)}; every "
            "dimension needs a distinct label (rename one of them)"
        )
    return labels_t, sizes_t


@final
class Extent(collections.abc.Mapping[str, int]):
    """The ordered, named sizes of a mesh: a ``Mapping`` from label to size.

    Raises:
        TypeError: a label is not a ``str`` or a size is not an ``int``.
        ValueError: ``labels`` and ``sizes`` differ in length, a size is negative, or a
            label repeats.

    >>> e = Extent(["hosts", "gpus"], [2, 4])
    >>> e.labels, e.sizes, e.nelements
    (['hosts', 'gpus'], [2, 4], 8)
    >>> dict(e) == {"hosts": 2, "gpus": 4}, "gpus" in e, e.get("nodes")
    (True, True, None)
    >>> Extent([], []).nelements
    1
    """

    __slots__ = ("_labels", "_sizes")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        self._labels, self._sizes = _check_labels_and_sizes(labels, sizes, "Extent")

    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a fresh list)."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The dimension sizes, in label order (a fresh list)."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        """The number of points: the product of the sizes (1 with no dimensions)."""
        return math.prod(self._sizes)

    @property
    def region(self) -> Shape:
        """The dense, row-major region this extent spans, as a ``Shape`` at offset 0.

        >>> Extent(["hosts", "gpus"], [2, 2]).region.ranks()
        [0, 1, 2, 3]
        """
        from monarch._src.actor.shape import Shape
        from monarch._src.actor.slice import Slice

        return Shape(self._labels, Slice.new_row_major(self._sizes))

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise ValueError(
                f"dimension {label!r} is not in {self!r}; expected one of {list(self._labels)}"
            ) from None

    def __contains__(self, label: object) -> bool:
        return label in self._labels

    def get(self, label: str, default: Any = None) -> Any:
        """``self[label]``, or ``default`` when there is no such dimension."""
        return self[label] if label in self._labels else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes, strict=True))!r})"

    def __reduce__(self) -> tuple[type[Extent], tuple[list[str], list[int]]]:
        return (Extent, (list(self._labels), list(self._sizes)))
