"""How a host starts each proc: :class:`BootstrapCommand` and the default one.

A module of its own, below both :mod:`~monarch._src.actor.proc_mesh` (which spawns with
it) and :mod:`~monarch._src.actor.workers` (which re-exports it), so neither imports the
other for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

__all__ = ["BootstrapCommand", "default_bootstrap_cmd"]


@dataclass
class BootstrapCommand:
    """How a host starts each proc: ``program`` run with ``args`` (``arg0`` as its
    name) and ``env`` added to the host's environment."""

    program: str
    arg0: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def with_env(self, env: dict[str, str]) -> BootstrapCommand:
        """The same command with ``env`` added (later values win)."""
        return BootstrapCommand(self.program, self.arg0, list(self.args), {**self.env, **env})


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command hosts run for each proc: this interpreter running monarch's proc
    entry point."""
    return BootstrapCommand(
        program=sys.executable,
        arg0=sys.executable,
        args=["-m", "monarch._src.actor.bootstrap"],
        env={},
    )
