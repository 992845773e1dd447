"""Monarch: a distributed programming framework for PyTorch on scalable actor messaging.

This module only re-exports; the implementation lives in ``monarch._src`` and in the
compiled extension ``monarch._rust_bindings``. Importing it must stay cheap: nothing
here imports ``torch``.
"""

from monarch._rust_bindings import __version__ as __version__

__all__ = ["__version__"]
