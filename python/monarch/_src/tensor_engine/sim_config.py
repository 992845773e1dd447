"""``monarch.set_meta``: labels for the commands the simulator shows.

``with monarch.set_meta("forward"):`` labels every command recorded in the block, on
this thread (or asyncio task); blocks nest, and the labels of the enclosing blocks come
first. A ``monarch.Simulator`` puts a command's labels after its name in the trace
(``"aten.mm forward"``, as upstream Monarch's simulator did) and lists them in the
event's ``meta`` argument, so a phase of the program can be found, or its time summed,
in Perfetto. On proc meshes the labels have no effect (nothing is traced there).

Importing this module is cheap: it imports neither torch nor the engine.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["current_meta", "set_meta"]

_labels: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "monarch_simulator_meta", default=()
)


@contextlib.contextmanager
def set_meta(new_value: str) -> Iterator[None]:
    """Label the tensor commands recorded in the block with ``new_value`` for the
    simulator: in a ``monarch.Simulator``'s trace each such command is named
    ``"<op> <labels...>"`` and carries ``"meta": [labels...]`` in its arguments. Blocks
    nest (outer labels first); the labels belong to this thread or asyncio task. Without
    a simulator the labels have no effect.

    Args:
        new_value: The label, such as ``"forward"`` or ``"layer 3"``.

    Raises:
        TypeError: ``new_value`` is not a string.
    """
    if not isinstance(new_value, str):
        raise TypeError(
            f"set_meta({new_value!r}): expected a string label (such as 'forward'), got "
            f"{type(new_value).__name__}"
        )
    token = _labels.set((*_labels.get(), new_value))
    try:
        yield
    finally:
        _labels.reset(token)


def current_meta() -> tuple[str, ...]:
    """The labels of the ``set_meta`` blocks around this point, outermost first."""
    return _labels.get()
