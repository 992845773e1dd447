"""``monarch.Selection``: selection expressions over the dimensions of a mesh.

A selection picks points of a mesh, one dimension after the other, in the compact
syntax of upstream Monarch (and of hyperactor's ``sel!``)::

    expression   ::= intersection ( "|" intersection )*
    intersection ::= chain ( "&" chain )*
    chain        ::= group ( "," group )*
    group        ::= "*" | "?" | index | range | "(" expression ")"
    index        ::= number
    range        ::= number? ":" number? ( ":" number )?

``,`` goes down to the next dimension; ``*`` takes every coordinate of its dimension,
``?`` one coordinate chosen at random, ``3`` coordinate 3, ``1:4`` / ``:4`` / ``2:`` /
``::2`` a range (start, stop, step, as Python slices; the stop is clamped to the size);
``|`` is the union and ``&`` the intersection of two selections (``&`` binds tighter,
and both apply to whole chains: ``*,(0|2)`` unites within the second dimension, ``*,0|2``
does not). Dimensions a chain does not reach are taken whole: on ``{"hosts": 2,
"gpus": 4}``, ``"1"`` is host 1's four gpus. Whitespace is ignored.

Evaluated on a mesh (``ProcMesh``, ``HostMesh``...), a ``Shape`` or an ``Extent``,
a selection gives the points (``{"hosts": 1, "gpus": 0}``, usable as
``monarch.inspect(t, **point)`` or ``mesh.slice(**point)``) or the global ranks it picks.
Importing this module imports neither torch nor the actor runtime.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from monarch._src.actor.extent import Extent
    from monarch._src.actor.shape import MeshTrait, Shape

__all__ = ["Selection"]

# --- the nodes of a selection -------------------------------------------------------------


@dataclass(frozen=True)
class _True:
    """Every coordinate of the dimensions left."""


@dataclass(frozen=True)
class _All:
    """Every coordinate of this dimension, then ``inner`` below."""

    inner: _Node


@dataclass(frozen=True)
class _Any:
    """One coordinate of this dimension, chosen at random, then ``inner`` below."""

    inner: _Node


@dataclass(frozen=True)
class _Range:
    """Coordinates ``start:stop:step`` of this dimension (``stop`` ``None``: to its
    end), then ``inner`` below; ``is_index`` for a single index (out of range is an
    error, where a range is clamped)."""

    start: int
    stop: int | None
    step: int
    is_index: bool
    inner: _Node


@dataclass(frozen=True)
class _Union:
    """The points of either side."""

    a: _Node
    b: _Node


@dataclass(frozen=True)
class _Inter:
    """The points of both sides."""

    a: _Node
    b: _Node


_Node = _True | _All | _Any | _Range | _Union | _Inter
_TRUE = _True()

_EXAMPLES = "for example '*', '0,1:3', '*,(0|2)', '?', '(0,*)&(*,1)'"


class Selection:
    """A selection expression over the dimensions of a mesh (see the module's
    documentation for the syntax): ``Selection.from_string("*,0:2")``,
    ``Selection.all()``, ``Selection.any()``, combined with ``|`` and ``&``. Evaluate
    it with :meth:`points` or :meth:`ranks`. Immutable and hashable; equal selections
    have the same structure."""

    __slots__ = ("_node", "_text")

    def __init__(self, node: _Node, text: str) -> None:
        self._node = node
        self._text = text

    # --- making selections ------------------------------------------------------------------

    @classmethod
    def from_string(cls, s: str) -> Selection:
        """Parse a selection expression, such as ``"*"``, ``"0,1:3"`` or ``"(*,0)|(1,?)"``.

        Raises:
            ValueError: ``s`` is not a valid selection expression (the message says where
                and what was expected).
            TypeError: ``s`` is not a string.
        """
        if not isinstance(s, str):
            raise TypeError(f"Selection.from_string: expected a string, got {s!r}")
        text = "".join(s.split())
        parser = _Parser(text, s)
        node = parser.expression()
        if parser.pos != len(text):
            parser.fail("unexpected " + repr(text[parser.pos]))
        return cls(node, text)

    @classmethod
    def all(cls) -> Selection:
        """Every point of the mesh (``"*"``)."""
        return cls(_All(_TRUE), "*")

    @classmethod
    def any(cls) -> Selection:
        """A coordinate of the first dimension chosen at random at each evaluation, and
        everything below it (``"?"``): one point of a one-dimensional mesh; on
        ``{"hosts": 2, "gpus": 4}`` one host's four gpus (``"?,?"`` picks one point)."""
        return cls(_Any(_TRUE), "?")

    def __or__(self, other: Selection) -> Selection:
        """The points of either selection."""
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection(_Union(self._node, other._node), f"({self._text})|({other._text})")

    def __and__(self, other: Selection) -> Selection:
        """The points of both selections."""
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection(_Inter(self._node, other._node), f"({self._text})&({other._text})")

    # --- evaluating ---------------------------------------------------------------------------

    def points(self, mesh: MeshTrait | Shape | Extent) -> list[dict[str, int]]:
        """The points of ``mesh`` this selection picks, as ``{label: coordinate}``, in
        row-major order.

        Args:
            mesh: A mesh (``ProcMesh``, ``HostMesh``, ``ActorMesh``...), a ``Shape`` or an
                ``Extent``.

        Raises:
            ValueError: the selection goes down more dimensions than ``mesh`` has.
            IndexError: an index is outside its dimension.
        """
        labels, sizes, _ = _layout(mesh)
        return [dict(zip(labels, c, strict=True)) for c in self._coordinates(labels, sizes)]

    def ranks(self, mesh: MeshTrait | Shape | Extent) -> list[int]:
        """The global ranks of the points of ``mesh`` this selection picks, ascending
        (for an ``Extent``, the row-major indices).

        Raises:
            ValueError: the selection goes down more dimensions than ``mesh`` has.
            IndexError: an index is outside its dimension.
        """
        labels, sizes, (offset, strides) = _layout(mesh)
        coords = self._coordinates(labels, sizes)
        return sorted(offset + sum(c * s for c, s in zip(p, strides, strict=True)) for p in coords)

    def _coordinates(self, labels: list[str], sizes: list[int]) -> list[tuple[int, ...]]:
        return sorted(_eval(self._node, labels, sizes, 0, self._text))

    # --- values -------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selection) and self._node == other._node

    def __hash__(self) -> int:
        return hash(self._node)

    def __repr__(self) -> str:
        return f"Selection.from_string({self._text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Selection, (self._node, self._text))


def _layout(mesh: Any) -> tuple[list[str], list[int], tuple[int, Sequence[int]]]:
    """Labels, sizes, and (offset, strides) of global ranks, of a mesh, shape or extent."""
    from monarch._src.actor.extent import Extent
    from monarch._src.actor.shape import MeshTrait, Shape

    if isinstance(mesh, MeshTrait):
        mesh = mesh._shape
    if isinstance(mesh, Shape):
        ndslice = mesh.ndslice
        return list(mesh.labels), list(ndslice.sizes), (ndslice.offset, ndslice.strides)
    if isinstance(mesh, Extent):
        sizes = list(mesh.sizes)
        strides = [1] * len(sizes)
        for i in range(len(sizes) - 2, -1, -1):
            strides[i] = strides[i + 1] * sizes[i + 1]
        return list(mesh.labels), sizes, (0, strides)
    raise TypeError(
        f"Selection: expected a mesh (ProcMesh, HostMesh, ...), a Shape or an Extent, got "
        f"{type(mesh).__name__}"
    )


def _eval(
    node: _Node, labels: list[str], sizes: list[int], d: int, text: str
) -> set[tuple[int, ...]]:
    """The coordinates, from dimension ``d`` on, that ``node`` picks."""
    if isinstance(node, _True):
        return set(itertools.product(*(range(s) for s in sizes[d:])))
    if isinstance(node, _Union):
        return _eval(node.a, labels, sizes, d, text) | _eval(node.b, labels, sizes, d, text)
    if isinstance(node, _Inter):
        return _eval(node.a, labels, sizes, d, text) & _eval(node.b, labels, sizes, d, text)
    if d == len(sizes):
        raise ValueError(
            f"Selection {text!r} goes down more dimensions than the mesh has: "
            f"{len(sizes)} ({dict(zip(labels, sizes, strict=True))})"
        )
    size = sizes[d]
    picked: Sequence[int]
    if isinstance(node, _All):
        picked = range(size)
    elif isinstance(node, _Any):
        picked = [random.randrange(size)] if size else []
    else:
        if node.is_index and node.start >= size:
            raise IndexError(
                f"Selection {text!r}: index {node.start} is outside dimension "
                f"{labels[d]!r} of size {size}"
            )
        stop = size if node.stop is None else min(node.stop, size)
        picked = range(node.start, stop, node.step)
    out: set[tuple[int, ...]] = set()
    for i in picked:
        out.update((i, *rest) for rest in _eval(node.inner, labels, sizes, d + 1, text))
    return out


def _nest(dim: _Node, tail: _Node) -> _Node:
    """``dim`` (a group of a chain) with ``tail`` (the rest of the chain) below it."""
    if isinstance(dim, _True):
        return tail
    if isinstance(dim, (_Union, _Inter)):
        return type(dim)(_nest(dim.a, tail), _nest(dim.b, tail))
    return dataclasses.replace(dim, inner=_nest(dim.inner, tail))


class _Parser:
    """Recursive descent over ``text`` (whitespace removed)."""

    def __init__(self, text: str, original: str) -> None:
        self.text = text
        self.original = original
        self.pos = 0

    def fail(self, what: str) -> NoReturn:
        at = f"at position {self.pos} of {self.text!r}" if self.text else "in an empty string"
        raise ValueError(
            f"invalid selection expression {self.original!r}: {what} {at}; expected a "
            f"selection expression, {_EXAMPLES}"
        )

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expression(self) -> _Node:
        node = self.intersection()
        while self.peek() == "|":
            self.pos += 1
            node = _Union(node, self.intersection())
        return node

    def intersection(self) -> _Node:
        node = self.chain()
        while self.peek() == "&":
            self.pos += 1
            node = _Inter(node, self.chain())
        return node

    def chain(self) -> _Node:
        groups = [self.group()]
        while self.peek() == ",":
            self.pos += 1
            groups.append(self.group())
        node: _Node = _TRUE
        for dim in reversed(groups):
            node = _nest(dim, node)
        return node

    def group(self) -> _Node:
        c = self.peek()
        if c == "(":
            self.pos += 1
            node = self.expression()
            if self.peek() != ")":
                self.fail("a missing ')'" if not self.peek() else f"unexpected {self.peek()!r}")
            self.pos += 1
            return node
        if c == "*":
            self.pos += 1
            return _All(_TRUE)
        if c == "?":
            self.pos += 1
            return _Any(_TRUE)
        if c.isdigit() or c == ":":
            return self.range()
        self.fail("unexpected end" if not c else f"unexpected {c!r}")

    def number(self) -> int | None:
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        return int(self.text[start : self.pos]) if self.pos > start else None

    def range(self) -> _Node:
        start = self.number()
        if self.peek() != ":":
            assert start is not None
            return _Range(start, start + 1, 1, True, _TRUE)
        self.pos += 1
        stop = self.number()
        step = 1
        if self.peek() == ":":
            self.pos += 1
            given = self.number()
            if given is None:
                self.fail("a missing step")
            if given == 0:
                self.pos -= 1
                self.fail("a step of 0")
            step = given
        return _Range(start or 0, stop, step, False, _TRUE)
