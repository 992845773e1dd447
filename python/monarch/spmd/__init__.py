"""SPMD (torchrun-style) programs on monarch meshes.

- :class:`SPMDActor`: sets the torch elastic variables (``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ...) in its proc and runs torchrun-style scripts
  there (``main``).
- :func:`setup_torch_elastic_env` / :func:`setup_torch_elastic_env_async`: set them on
  every proc of a mesh, so that actors spawned there can call
  ``torch.distributed.init_process_group()``.

Guide: [SPMD](../spmd.md). Importing this module does not import torch.
"""

from monarch._src.spmd import setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch._src.spmd.actor import SPMDActor

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
