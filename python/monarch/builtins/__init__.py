"""Ready-made remote functions for distributed tensors: logging on the workers
(:mod:`monarch.builtins.log`) and their random state (:mod:`monarch.builtins.random`).

Call them under ``with mesh.activate():``; each runs on every rank of the active mesh.
Importing this package imports torch.
"""

from __future__ import annotations

from monarch.builtins.log import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]
