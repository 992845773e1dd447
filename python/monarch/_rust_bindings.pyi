"""Typed interface of ``monarch._rust_bindings``, the compiled extension module.

Built from the ``monarch_extension`` crate by maturin; ``make stubtest`` checks this file
against the built module.
"""

from typing import Literal, TypedDict, type_check_only

__all__ = ["__version__", "build_info"]

__version__: str
"""The version of the ``monarch_extension`` crate, equal to the package version."""

@type_check_only
class _BuildInfo(TypedDict):
    version: str
    profile: Literal["debug", "release"]
    target: str
    rustc: str

def build_info() -> _BuildInfo:
    """Describe how this extension was built, for bug reports.

    Returns a new dict with the keys ``version``, ``profile`` (``"debug"`` or
    ``"release"``), ``target`` (the Rust target triple) and ``rustc`` (the compiler
    version).
    """
