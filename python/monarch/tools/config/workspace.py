"""``Workspace`` (upstream's module path): see :mod:`monarch.tools.config`."""

from monarch._src.actor.workspace import Workspace

__all__ = ["Workspace"]
