"""``Slice``: an n-dimensional strided view of a space of global ranks.

A slice maps each local coordinate ``(c_0, ..., c_{n-1})``, with ``0 <= c_i < sizes[i]``,
to the global rank ``offset + sum(c_i * strides[i])``. Local indices enumerate the
coordinates in row-major order (the last dimension varies fastest), so a dense slice
(:meth:`Slice.new_row_major`) maps local index ``i`` to global rank ``offset + i``.

Invariants: ``offset >= 0``, sizes ``>= 0``, strides ``>= 1``, and ``len(sizes) ==
len(strides)``. Slices made by selecting, splitting and flattening a dense slice (what
:class:`~monarch._src.actor.shape.Shape` does) never map two local indices to the same
rank.

>>> s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
>>> s.ranks()
[1, 3, 5, 7]
>>> len(s), s.index(5), s[3]
(4, 2, 7)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import final

__all__ = ["Slice"]


def _check_ints(name: str, values: Sequence[int], minimum: int) -> tuple[int, ...]:
    out = tuple(values)
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"Slice: {name} must be ints, got {v!r} ({type(v).__name__})")
        if v < minimum:
            raise ValueError(f"Slice: {name} must be >= {minimum}, got {list(out)}")
    return out


@final
class Slice:
    """An ``offset`` plus per-dimension ``sizes`` and ``strides`` over global ranks.

    Raises:
        TypeError: a field is not an int (or a sequence of ints).
        ValueError: ``sizes`` and ``strides`` differ in length, or a value is out of
            range (negative offset or size, stride below 1).

    >>> Slice.new_row_major([2, 3])
    Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    >>> Slice(offset=2, sizes=[3], strides=[2]).ranks()
    [2, 4, 6]
    """

    __slots__ = ("_offset", "_sizes", "_strides")

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        (self._offset,) = _check_ints("offset", [offset], 0)
        self._sizes = _check_ints("sizes", sizes, 0)
        self._strides = _check_ints("strides", strides, 1)
        if len(self._sizes) != len(self._strides):
            raise ValueError(
                f"Slice: got {len(self._sizes)} sizes {list(self._sizes)} but "
                f"{len(self._strides)} strides {list(self._strides)}; pass one stride per size"
            )

    @staticmethod
    def new_row_major(sizes: Sequence[int], offset: int = 0) -> Slice:
        """A dense slice over ``sizes`` starting at ``offset`` (row-major strides).

        >>> Slice.new_row_major([2, 4], offset=8).ranks()[:3]
        [8, 9, 10]
        """
        sizes_t = _check_ints("sizes", sizes, 0)
        strides = []
        acc = 1
        for size in reversed(sizes_t):
            strides.append(acc)
            acc *= max(size, 1)
        return Slice(offset=offset, sizes=sizes_t, strides=strides[::-1])

    @property
    def offset(self) -> int:
        """The global rank of local index 0."""
        return self._offset

    @property
    def sizes(self) -> list[int]:
        """The per-dimension sizes (a fresh list)."""
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        """The per-dimension strides, in global ranks (a fresh list)."""
        return list(self._strides)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._sizes)

    def __len__(self) -> int:
        return math.prod(self._sizes)

    def is_dense(self) -> bool:
        """Whether the slice covers ``len(self)`` consecutive global ranks in order.

        Dimensions of size 1 do not matter; an empty slice is dense.

        >>> Slice.new_row_major([2, 4]).is_dense()
        True
        >>> Slice(offset=0, sizes=[2, 2], strides=[4, 1]).is_dense()
        False
        """
        if len(self) == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def __getitem__(self, index: int) -> int:
        """The global rank at local (row-major) ``index``."""
        n = len(self)
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"Slice indices must be ints, got {type(index).__name__}")
        if not 0 <= index < n:
            raise IndexError(
                f"local index {index} is out of range for {self!r} with {n} rank(s); "
                f"expected 0 <= index < {n}"
            )
        rank = self._offset
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            index, coord = divmod(index, size)
            rank += coord * stride
        return rank

    def __iter__(self) -> Iterator[int]:
        return (self[i] for i in range(len(self)))

    def ranks(self) -> list[int]:
        """The global ranks covered, in local (row-major) order."""
        return list(self)

    def _nested(self) -> bool:
        """Whether each stride exceeds the span of all later dimensions (ignoring size 1).

        For nested slices the coordinates of a rank follow greedily, outermost first.
        """
        span = 0
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            if size <= 1:
                continue
            if stride <= span:
                return False
            span += (size - 1) * stride
        return True

    def index(self, rank: int) -> int:
        """The local (row-major) index of global ``rank``.

        Raises:
            ValueError: ``rank`` is not covered by this slice.

        >>> Slice(offset=1, sizes=[3], strides=[2]).index(5)
        2
        """
        local = self._local_index(rank)
        if local is None:
            raise ValueError(
                f"global rank {rank} is not in {self!r}, which covers {self.ranks()[:16]}"
                f"{' ...' if len(self) > 16 else ''}; pass one of those ranks"
            )
        return local

    def _local_index(self, rank: int) -> int | None:
        if len(self) == 0:
            return None
        if not self._nested():
            try:
                return self.ranks().index(rank)
            except ValueError:
                return None
        rest = rank - self._offset
        if rest < 0:
            return None
        local = 0
        for size, stride in zip(self._sizes, self._strides, strict=True):
            coord = 0 if size == 1 else rest // stride
            if coord >= size:
                return None
            rest -= coord * stride
            local = local * size + coord
        return local if rest == 0 else None

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and self._local_index(rank) is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (self._offset, self._sizes, self._strides) == (
            other._offset,
            other._sizes,
            other._strides,
        )

    def __hash__(self) -> int:
        return hash((self._offset, self._sizes, self._strides))

    def __repr__(self) -> str:
        return (
            f"Slice(offset={self._offset}, sizes={list(self._sizes)}, "
            f"strides={list(self._strides)})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_new_slice, (self._offset, list(self._sizes), list(self._strides)))


def _new_slice(offset: int, sizes: list[int], strides: list[int]) -> Slice:
    """Unpickle a :class:`Slice` (its constructor is keyword-only)."""
    return Slice(offset=offset, sizes=sizes, strides=strides)
