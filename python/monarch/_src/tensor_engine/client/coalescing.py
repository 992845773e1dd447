"""``monarch.coalescing()``: record a block of work and send it as few messages.

Inside the block the engine does not send recorded work on its timer; the whole block
goes out in as few batches as its size and mesh changes allow when the block ends. The
results are ordinary tensors, fetchable after the block. Fetching inside the block
raises, as it would need the block's work to run first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from monarch._src.tensor_engine.client import engine as _engine

__all__ = ["coalescing", "in_coalescing", "no_coalescing"]


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Batch the work recorded in the block (see the module docs). Blocks nest; the
    outermost one sends the work when it ends."""
    depth = _engine.coalescing_depth
    depth[0] += 1
    try:
        yield
    finally:
        depth[0] -= 1
        if depth[0] == 0:
            _engine.flush_all()


def in_coalescing() -> bool:
    """Whether a ``coalescing()`` block is open."""
    return _engine.coalescing_depth[0] > 0


def no_coalescing(what: str) -> None:
    """Raise if a ``coalescing()`` block is open: ``what`` needs the results now."""
    if _engine.coalescing_depth[0] > 0:
        raise NotImplementedError(
            f"{what} inside a `monarch.coalescing()` block: the block's work is sent when "
            "the block ends, so its results cannot be waited for inside it. Fetch after "
            "the block"
        )
