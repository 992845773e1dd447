"""``Environment`` and ``CondaEnvironment`` (upstream's module path): see
:mod:`monarch.tools.config`."""

from monarch._src.actor.workspace import CondaEnvironment, Environment

__all__ = ["CondaEnvironment", "Environment"]
