"""Micro-benchmarks of the shape algebra's hot operations (run per message or per call).

``python benches/shape_bench.py`` prints the best of several ``timeit`` repeats, in
microseconds per operation, for:

* a message's rank: ``Point(index, Extent(labels, sizes))`` then ``p.rank`` and
  ``p["gpus"]`` (what ``context().message_rank`` does, plus a typical use);
* ``Point(index, extent)`` over a shared extent, and ``dict(p)``;
* ``Shape.ranks()`` and iteration of the slice of a 64-rank shape;
* ``list(vm.items())`` of a 64-value ``ValueMesh``;
* ``mesh.slice(hosts=1)`` and ``mesh.slice(gpus=slice(0, 4))`` on an 8 x 8 mesh.
"""

from __future__ import annotations

import argparse
import timeit

from monarch._src.actor.extent import Extent
from monarch._src.actor.point import Point
from monarch._src.actor.shape import MeshTrait, Shape
from monarch._src.actor.slice import Slice
from monarch._src.actor.value_mesh import ValueMesh


class _Mesh(MeshTrait):
    def __init__(self, shape: Shape) -> None:
        self._s = shape

    @property
    def _shape(self) -> Shape:
        return self._s

    def _new_with_shape(self, shape: Shape) -> _Mesh:
        return _Mesh(shape)


def _cases() -> dict[str, tuple[object, int]]:
    """name -> (a zero-argument callable, how many operations one call does)."""
    labels, sizes = ("hosts", "gpus"), (8, 8)
    extent = Extent(labels, sizes)
    shape = Shape(list(labels), Slice.new_row_major(list(sizes)))
    vm = ValueMesh(shape, list(range(64)))
    mesh = _Mesh(shape)
    point = Point(13, extent)

    def message_rank() -> None:
        for i in range(64):
            p = Point(i, Extent(labels, sizes))
            p.rank  # noqa: B018
            p["gpus"]

    def shared_extent() -> None:
        for i in range(64):
            Point(i, extent)

    return {
        "Point(i, Extent(labels, sizes)) + .rank + ['gpus']": (message_rank, 64),
        "Point(i, extent)": (shared_extent, 64),
        "dict(point)": (lambda: dict(point), 1),
        "Shape.ranks(), 64 ranks": (shape.ranks, 1),
        "list(enumerate(shape.ndslice)), 64 ranks": (
            lambda: list(enumerate(shape.ndslice)),
            1,
        ),
        "list(vm.items()), 64 values": (lambda: list(vm.items()), 1),
        "mesh.slice(hosts=1)": (lambda: mesh.slice(hosts=1), 1),
        "mesh.slice(gpus=slice(0, 4))": (lambda: mesh.slice(gpus=slice(0, 4)), 1),
        "Shape.extent": (lambda: shape.extent, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=7, help="repeats (best is kept)")
    args = parser.parse_args()
    for name, (fn, ops) in _cases().items():
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat))  # type: ignore[arg-type]
        print(f"{best / args.number / ops * 1e6:9.3f} us  {name}")


if __name__ == "__main__":
    main()
