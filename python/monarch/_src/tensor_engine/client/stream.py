"""Streams and borrows (``monarch.Stream``, ``monarch.get_active_stream``).

A stream is an ordered queue of work on every worker. Operations recorded while a stream
is active run on it; the operations of one stream run in order, those of different
streams of one worker run concurrently (a thread per stream; on CUDA, a CUDA stream
each). The default stream is ``"main"``.

A tensor belongs to the stream it was made on and may be used only there; another stream
uses it through a *borrow* (:meth:`Stream.borrow`), which orders the two streams: the
borrowing stream sees the tensor as the origin stream left it when the borrow was made,
and the origin stream waits, when the borrow is dropped, for the borrowing stream's use
of it to end. Permissions keep that safe:

- a read-only borrow makes the tensor read-only on both streams (writing it raises
  ``TypeError`` ``MUTATING_BORROW``);
- a mutable borrow forbids any use of the tensor on its origin stream (``BORROWED``)
  until the borrow is dropped; the borrowing stream may write it.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from monarch._src.tensor_engine.client.tensor import Tensor

__all__ = [
    "MAIN",
    "Borrow",
    "Stream",
    "StreamActivation",
    "TensorBorrows",
    "get_active_stream",
    "register_tensor_borrows",
]

_sids = itertools.count(1)


@dataclass(frozen=True)
class TensorBorrows:
    """How a borrow is made and ended on the tensors' side: the module of
    ``monarch.Tensor`` registers it when imported (:func:`register_tensor_borrows`; no
    tensor, so no borrow, exists before)."""

    #: ``borrow(to, t, mutable) -> (t_here, borrow)`` (see :meth:`Stream.borrow`).
    borrow: Callable[[Stream, Any, bool], tuple[Tensor, Borrow]]
    #: ``end_borrow(b)`` (see :meth:`Borrow.drop`).
    end_borrow: Callable[[Borrow], None]


_borrows: TensorBorrows | None = None


def register_tensor_borrows(borrows: TensorBorrows) -> None:
    """Register how borrows are made (the tensors' module does, when imported)."""
    global _borrows
    _borrows = borrows


def _tensor_borrows() -> TensorBorrows:
    if _borrows is None:
        raise TypeError("Stream.borrow(t): t must be a monarch tensor (none exists yet)")
    return _borrows


class Stream:
    """An ordered queue of work on every worker of a mesh (see the module docs):
    ``with Stream("comms").activate():`` records operations on it."""

    def __init__(self, name: str, *, _sid: int | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Stream(name): expected a non-empty str, got {name!r}")
        self.name = name
        #: The stream's id on the wire (0 is ``"main"``).
        self.sid = next(_sids) if _sid is None else _sid

    def __repr__(self) -> str:
        return f"<Stream({self.name!r}) at {hex(id(self))}>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{self} cannot be pickled: a stream exists only in the program that made it; "
            "record work on it with `with stream.activate():`"
        )

    def activate(self) -> StreamActivation:
        """Make this the active stream now, until the returned activation ends (use it
        as ``with stream.activate():``, or call ``.deactivate()``)."""
        _stack.append(self)
        return StreamActivation(self)

    def borrow(self, t: torch.Tensor, mutable: bool = False) -> tuple[Tensor, Borrow]:
        """``(t_here, borrow)``: the tensor ``t`` of another stream, usable on this
        one. ``t_here`` sees ``t`` as its stream left it at this call. Until
        ``borrow.drop()``: with ``mutable=False`` neither stream may write ``t``; with
        ``mutable=True`` this stream may write it and ``t``'s own stream may not use it
        at all. ``drop()`` makes ``t``'s stream wait for this stream's use of it."""
        return _tensor_borrows().borrow(self, t, bool(mutable))


#: The default stream.
MAIN = Stream("main", _sid=0)

#: The active streams, innermost last (module-wide: operations recorded on any thread,
#: autograd's included, use the active stream).
_stack: list[Stream] = [MAIN]


def get_active_stream() -> Stream:
    """The stream operations are recorded on now (``"main"`` unless another was
    activated)."""
    return _stack[-1]


class StreamActivation:
    """What ``stream.activate()`` returns: already active; ``with`` (or
    :meth:`deactivate`) ends it."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._active = True

    def __enter__(self) -> Stream:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def deactivate(self) -> None:
        if not self._active:
            return
        if _stack[-1] is not self.stream or len(_stack) == 1:
            raise RuntimeError(
                f"deactivate(): {self.stream} is not the innermost active stream; end the "
                "stream activations made after it first (they nest like `with` blocks)"
            )
        self._active = False
        _stack.pop()


class Borrow:
    """A tensor of one stream lent to another (see :meth:`Stream.borrow`). ``drop()``
    (or the end of ``with borrow:``) gives it back: the borrowed tensor is dropped and
    the origin stream waits for the borrowing stream's use of it."""

    def __init__(
        self, origin: Tensor, borrowed: Tensor, mutable: bool, to: Stream, frames: Any
    ) -> None:
        self.origin = origin
        self.borrowed = borrowed
        self.mutable = mutable
        self.stream = to
        self._frames = frames
        self._dropped = False

    @property
    def dropped(self) -> bool:
        return self._dropped

    @property
    def traceback_string(self) -> str:
        """Where the borrow was made."""
        return "".join(f'  File "{f}", line {n}, in {fn}\n' for f, n, fn in self._frames or ())

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    def __repr__(self) -> str:
        kind = "mutable" if self.mutable else "read-only"
        state = ", dropped" if self._dropped else ""
        return (
            f"<Borrow {kind} of tensor {self.origin._h.ref.id} from {self.origin._stream} "
            f"to {self.stream}{state}>"
        )

    def drop(self) -> None:
        """End the borrow now (a second call does nothing)."""
        if self._dropped:
            return
        self._dropped = True
        _tensor_borrows().end_borrow(self)

    def __del__(self) -> None:
        if getattr(self, "_dropped", True):
            return
        warnings.warn(
            f"{self!r} was garbage-collected without `borrow.drop()`; it is dropped now, "
            f"which makes {self.origin._stream} wait for {self.stream} at this point. Call "
            "`borrow.drop()` (or use `with borrow:`) where the borrowing stream is done "
            f"with the tensor. The borrow was made at:\n{self.traceback_string}",
            stacklevel=2,
        )
        try:
            self.drop()
        except Exception:
            pass  # interpreter exit, or the engine is gone
