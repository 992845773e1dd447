"""Monarch: a distributed programming framework for PyTorch on scalable actor messaging.

This package holds the distributed tensors API (``Tensor``, ``reduce``, ``Stream``,
``Simulator``, ...; guide: [Distributed tensors](../tensors.md)), the shapes of meshes
and the configuration functions of ``monarch.config``. Actors live in ``monarch.actor``
([Getting started](../getting_started.md)). Importing ``monarch`` is cheap and never
imports ``torch``: the tensor names are imported on first use.
"""

import atexit as _atexit
from typing import TYPE_CHECKING as _TYPE_CHECKING

from monarch._rust_bindings import __version__ as __version__
from monarch._rust_bindings import _prepare_exit
from monarch._src import wiring as _wiring  # noqa: F401  (connects the layers)
from monarch._src.config import Encoding as Encoding
from monarch._src.config import IgnoredSettingWarning as IgnoredSettingWarning
from monarch._src.config import clear_runtime_config as clear_runtime_config
from monarch._src.config import configure as configure
from monarch._src.config import configured as configured
from monarch._src.config import get_global_config as get_global_config
from monarch._src.config import get_runtime_config as get_runtime_config
from monarch._src.config.testing import parametrize_config as parametrize_config
from monarch._src.config.testing import (
    parametrize_config_pointwise as parametrize_config_pointwise,
)


def _exit_status() -> None:
    """The last exit hook: end with the exit status an unhandled failure set, if any
    (see ``monarch._src.actor.supervision``)."""
    import os
    import sys

    process = sys.modules.get("monarch._src.actor.process")
    status = getattr(process, "exit_status", None)
    if status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


# Registered first, so they run after every other monarch exit hook (atexit runs hooks in
# reverse order): from then on no thread of the Rust runtime enters Python, which
# CPython would end abruptly while finalizing (see monarch_extension/src/runtime.rs);
# then the program ends with the status an unhandled failure set.
_atexit.register(_exit_status)
_atexit.register(_prepare_exit)

if _TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from monarch._src.actor.extent import Extent as Extent
    from monarch._src.actor.shape import Shape as Shape
    from monarch._src.actor.slice import Slice as NDSlice
    from monarch._src.tensor_engine.client.api import RemoteProcessGroup as RemoteProcessGroup
    from monarch._src.tensor_engine.client.api import (
        call_on_shard_and_fetch as call_on_shard_and_fetch,
    )
    from monarch._src.tensor_engine.client.api import fetch_shard as fetch_shard
    from monarch._src.tensor_engine.client.api import inspect as inspect
    from monarch._src.tensor_engine.client.api import reduce as reduce
    from monarch._src.tensor_engine.client.api import reduce_ as reduce_
    from monarch._src.tensor_engine.client.api import remote as remote
    from monarch._src.tensor_engine.client.api import show as show
    from monarch._src.tensor_engine.client.api import slice_mesh as slice_mesh
    from monarch._src.tensor_engine.client.api import to_mesh as to_mesh
    from monarch._src.tensor_engine.client.coalescing import coalescing as coalescing
    from monarch._src.tensor_engine.client.future import Future as Future
    from monarch._src.tensor_engine.client.grad import grad_function as grad_function
    from monarch._src.tensor_engine.client.grad import grad_generator as grad_generator
    from monarch._src.tensor_engine.client.opaque import OpaqueRef as OpaqueRef
    from monarch._src.tensor_engine.client.resolvers import (
        function_resolvers as function_resolvers,
    )
    from monarch._src.tensor_engine.client.stream import Stream as Stream
    from monarch._src.tensor_engine.client.stream import get_active_stream as get_active_stream
    from monarch._src.tensor_engine.client.tensor import Tensor as Tensor
    from monarch._src.tensor_engine.client.tensor import get_active_mesh as get_active_mesh
    from monarch._src.tensor_engine.client.tensor import no_mesh as no_mesh
    from monarch._src.tensor_engine.errors import RemoteException as RemoteException
    from monarch._src.tensor_engine.legacy import mast_reserve as mast_reserve
    from monarch._src.tensor_engine.legacy import world_mesh as world_mesh
    from monarch._src.tensor_engine.selection import Selection as Selection
    from monarch._src.tensor_engine.sim_config import set_meta as set_meta
    from monarch._src.tensor_engine.simulator import Simulator as Simulator

#: Distributed tensors (``monarch._src.tensor_engine``), imported on first access so that
#: ``import monarch`` does not import torch: name -> (module, attribute).
_LAZY = {
    "Tensor": ("monarch._src.tensor_engine.client.tensor", "Tensor"),
    "get_active_mesh": ("monarch._src.tensor_engine.client.tensor", "get_active_mesh"),
    "no_mesh": ("monarch._src.tensor_engine.client.tensor", "no_mesh"),
    "RemoteException": ("monarch._src.tensor_engine.errors", "RemoteException"),
    "RemoteProcessGroup": ("monarch._src.tensor_engine.client.api", "RemoteProcessGroup"),
    "call_on_shard_and_fetch": ("monarch._src.tensor_engine.client.api", "call_on_shard_and_fetch"),
    "fetch_shard": ("monarch._src.tensor_engine.client.api", "fetch_shard"),
    "inspect": ("monarch._src.tensor_engine.client.api", "inspect"),
    "reduce": ("monarch._src.tensor_engine.client.api", "reduce"),
    "reduce_": ("monarch._src.tensor_engine.client.api", "reduce_"),
    "remote": ("monarch._src.tensor_engine.client.api", "remote"),
    "show": ("monarch._src.tensor_engine.client.api", "show"),
    "slice_mesh": ("monarch._src.tensor_engine.client.api", "slice_mesh"),
    "to_mesh": ("monarch._src.tensor_engine.client.api", "to_mesh"),
    "Stream": ("monarch._src.tensor_engine.client.stream", "Stream"),
    "get_active_stream": ("monarch._src.tensor_engine.client.stream", "get_active_stream"),
    "coalescing": ("monarch._src.tensor_engine.client.coalescing", "coalescing"),
    "grad_generator": ("monarch._src.tensor_engine.client.grad", "grad_generator"),
    "grad_function": ("monarch._src.tensor_engine.client.grad", "grad_function"),
    "Simulator": ("monarch._src.tensor_engine.simulator", "Simulator"),
    "set_meta": ("monarch._src.tensor_engine.sim_config", "set_meta"),
    "OpaqueRef": ("monarch._src.tensor_engine.client.opaque", "OpaqueRef"),
    "Future": ("monarch._src.tensor_engine.client.future", "Future"),
    "function_resolvers": ("monarch._src.tensor_engine.client.resolvers", "function_resolvers"),
    "Selection": ("monarch._src.tensor_engine.selection", "Selection"),
    # Upstream names with no equivalent here: calling them says what to use instead.
    "world_mesh": ("monarch._src.tensor_engine.legacy", "world_mesh"),
    "mast_reserve": ("monarch._src.tensor_engine.legacy", "mast_reserve"),
    "Extent": ("monarch._src.actor.extent", "Extent"),
    "Shape": ("monarch._src.actor.shape", "Shape"),
    "NDSlice": ("monarch._src.actor.slice", "Slice"),
}


def __getattr__(name: str) -> object:
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(entry[0]), entry[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Encoding",
    "Extent",
    "Future",
    "IgnoredSettingWarning",
    "NDSlice",
    "OpaqueRef",
    "RemoteException",
    "RemoteProcessGroup",
    "Selection",
    "Shape",
    "Simulator",
    "Stream",
    "Tensor",
    "__version__",
    "call_on_shard_and_fetch",
    "clear_runtime_config",
    "coalescing",
    "configure",
    "configured",
    "fetch_shard",
    "function_resolvers",
    "get_active_mesh",
    "get_active_stream",
    "get_global_config",
    "get_runtime_config",
    "grad_function",
    "grad_generator",
    "inspect",
    "mast_reserve",
    "no_mesh",
    "parametrize_config",
    "parametrize_config_pointwise",
    "reduce",
    "reduce_",
    "remote",
    "set_meta",
    "show",
    "slice_mesh",
    "to_mesh",
    "world_mesh",
]
