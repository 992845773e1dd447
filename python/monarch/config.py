"""Configuration: ``configure(**keys)``, ``configured(**keys)`` (a context manager),
``get_global_config()``, ``get_runtime_config()``, ``clear_runtime_config()``.

Keys (environment variable, default):

- ``cast_fanout`` (``HYPERACTOR_MESH_CAST_FANOUT``, 16): how many procs each node of
  a cast's tree sends to.

An environment variable beats ``configure()``; ``configure()`` beats the default.
"""

from monarch._src.config import (
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
)

__all__ = [
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]
