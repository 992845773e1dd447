"""Logging on the tensor workers: ``log_remote`` and ``set_logging_level_remote``
(both use the ``"monarch.builtins.log"`` logger of each worker)."""

from __future__ import annotations

from monarch._src.tensor_engine.client.builtins_impl import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]
