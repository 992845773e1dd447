"""Monarch: a distributed programming framework for PyTorch on scalable actor messaging.

This module only re-exports; the implementation lives in ``monarch._src`` and in the
compiled extension ``monarch._rust_bindings``. Importing it must stay cheap: nothing
here imports ``torch``.
"""

import atexit as _atexit

from monarch._rust_bindings import __version__ as __version__
from monarch._rust_bindings import _prepare_exit
from monarch._src.config import Encoding as Encoding
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

__all__ = [
    "Encoding",
    "__version__",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
