"""The warnings of ``monarch.rdma`` (each emitted once per process)."""

from __future__ import annotations

import threading
import warnings

__all__ = [
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "warn_once",
]


class RDMATcpFallbackWarning(UserWarning):
    """A transfer went over the TCP path: the two hosts have no common RDMA device.
    Emitted once per process."""


class RDMAReadTransferWarning(UserWarning):
    """A read needed an extra staging copy (e.g. CPU memory of the owner into a CUDA
    destination). Emitted once per process."""


class RDMAWriteTransferWarning(UserWarning):
    """A write needed an extra staging copy (e.g. a CUDA source into CPU memory of the
    owner). Emitted once per process."""


_lock = threading.Lock()
_warned: set[type[Warning]] = set()


def warn_once(category: type[Warning], message: str) -> None:
    """Warn with ``category`` the first time this process asks, never again."""
    with _lock:
        if category in _warned:
            return
        _warned.add(category)
    warnings.warn(message, category, stacklevel=4)
