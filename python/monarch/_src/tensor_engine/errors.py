"""Errors of the tensor engine.

:class:`RemoteException`: a command failed on a worker. Workers never die of it: the
command's outputs are marked failed, and the first fetch that depends on them raises
this, naming the rank, with the worker's traceback and the client line that issued the
command. Later work runs normally.

Bad arguments raise one ``TypeError`` that lists every bad argument with a named
explanation (:data:`EXPLANATIONS`).
"""

from __future__ import annotations

import linecache
import traceback
from typing import Any

__all__ = [
    "BORROWED",
    "CROSS_DEVICE_REQUIRES_CUDA",
    "DROPPED",
    "EXPLANATIONS",
    "LOCAL_TENSOR",
    "MUTATING_BORROW",
    "REQUIRES_GRAD",
    "WRONG_MESH",
    "WRONG_STREAM",
    "RemoteException",
    "bad_arguments",
]

LOCAL_TENSOR = "LOCAL_TENSOR"
WRONG_MESH = "WRONG_MESH"
DROPPED = "DROPPED"
REQUIRES_GRAD = "REQUIRES_GRAD"
CROSS_DEVICE_REQUIRES_CUDA = "CROSS_DEVICE_REQUIRES_CUDA"
WRONG_STREAM = "WRONG_STREAM"
BORROWED = "BORROWED"
MUTATING_BORROW = "MUTATING_BORROW"

#: What each kind of bad argument means, and how to fix it.
EXPLANATIONS = {
    LOCAL_TENSOR: (
        "a local torch tensor (one that lives in this process) was passed while a mesh "
        "is active; distributed and local tensors cannot be mixed. Create the tensor "
        "under `mesh.activate()` so every rank has it, or compute locally inside "
        "`with monarch.no_mesh.activate():`"
    ),
    WRONG_MESH: (
        "a monarch tensor that lives on a different mesh than the one the operation "
        "runs on was passed; move it first with `t.to_mesh(mesh)` (or "
        "`monarch.slice_mesh(t, ...).to_mesh(mesh)`)"
    ),
    DROPPED: (
        "a monarch tensor that was dropped (`t.drop()`) was passed; its memory on the "
        "workers is freed, so it cannot be used again"
    ),
    REQUIRES_GRAD: (
        "a tensor that requires grad was passed to a remote function, which has no "
        "autograd support; pass `t.detach()` or call it under `torch.no_grad()`"
    ),
    CROSS_DEVICE_REQUIRES_CUDA: (
        "tensors on different devices (CPU and CUDA) were mixed in one collective or "
        "transfer; move them to one device first (`t.cuda()` or `t.cpu()`)"
    ),
    WRONG_STREAM: (
        "a monarch tensor of another stream than the active one was passed; switch "
        "streams with `with stream.activate():`, or bring the tensor to this stream "
        "with `stream.borrow(t)`"
    ),
    BORROWED: (
        "the tensor cannot be read: another stream borrowed it mutably "
        "(`stream.borrow(t, mutable=True)`); drop that borrow first (`borrow.drop()`)"
    ),
    MUTATING_BORROW: (
        "the operation would write the tensor, which is read-only while it is borrowed "
        "(a borrowed tensor, or the origin of a read-only borrow); drop the borrow first, "
        "or borrow it with `mutable=True`"
    ),
}


def bad_arguments(what: str, problems: list[tuple[str, str]]) -> TypeError:
    """One ``TypeError`` for the call ``what``, listing each ``(argument, kind)``."""
    lines = [f"incorrect arguments to {what}:"]
    for where, kind in problems:
        lines.append(f"  {where}: {kind}: {EXPLANATIONS[kind]}")
    return TypeError("\n".join(lines))


def _format_frames(frames: list[tuple[str, int, str]]) -> str:
    out = []
    for filename, lineno, name in frames:
        out.append(f'  File "{filename}", line {lineno}, in {name}\n')
        line = linecache.getline(filename, lineno).strip()
        if line:
            out.append(f"    {line}\n")
    return "".join(out)


class RemoteException(Exception):
    """A command failed on a worker (the worker keeps going).

    ``rank`` is the global rank of the proc where it failed and ``coords`` its
    coordinates in the mesh the failed tensor lives on; ``worker_error`` is the
    worker's traceback text, ``worker_frames`` its frames (``traceback.FrameSummary``),
    ``controller_frames`` where the client issued the command (``None`` when it is no
    longer recorded), and ``message`` the last line of the worker's error.
    """

    def __init__(
        self,
        rank: int,
        coords: dict[str, int] | None,
        worker_error: str,
        worker_frames: list[tuple[str, int, str]],
        controller_frames: list[tuple[str, int, str]] | None,
        seq: int = -1,
    ) -> None:
        self.rank = rank
        self.coords = coords
        self.worker_error = worker_error
        self.worker_error_string = worker_error
        self.worker_frames = [
            traceback.FrameSummary(f, n, name, lookup_line=False) for f, n, name in worker_frames
        ]
        self.controller_frames = controller_frames
        self.seq = seq
        lines = worker_error.strip().splitlines()
        self.message = lines[-1] if lines else "unknown error"
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"rank {self.rank}"
        if self.coords:
            where += f" ({', '.join(f'{k}={v}' for k, v in self.coords.items())})"
        parts = [f"A remote function has failed asynchronously on {where}: {self.message}"]
        if self.controller_frames:
            parts.append(
                "Traceback of where the remote function was issued on the controller "
                "(most recent call last):\n" + _format_frames(self.controller_frames).rstrip()
            )
        else:
            parts.append("(where the command was issued on the controller is no longer recorded)")
        parts.append(
            "Traceback of where the remote function failed on the worker:\n"
            + self.worker_error.rstrip()
        )
        return "\n".join(parts)

    def __reduce__(self) -> tuple[Any, ...]:
        frames = [(f.filename, f.lineno or 0, f.name) for f in self.worker_frames]
        return (
            RemoteException,
            (self.rank, self.coords, self.worker_error, frames, self.controller_frames, self.seq),
        )
