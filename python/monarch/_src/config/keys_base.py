"""What every table of config keys is made of: the :class:`Key` record, the integer
kinds the tables share, and :func:`in_group`, which files keys under a docs section.

The tables are the ``keys_*`` modules beside this one; :mod:`monarch._src.config.keys`
combines them into the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from monarch._src.config.kinds import Kind, integer


@dataclass(frozen=True)
class Key:
    """One config key."""

    #: The keyword of ``configure()``.
    name: str
    #: The environment variable that overrides it.
    env: str
    kind: Kind
    #: The default, in stored form (durations in nanoseconds).
    default: Any
    #: What the key controls (in upstream Monarch, for keys without an ``effect``).
    doc: str
    #: What it changes in this implementation (empty for an ignored key).
    effect: str = ""
    #: Why it has no meaning in this implementation (empty for a key with an effect):
    #: setting it warns once per process, with this reason.
    ignored: str = ""
    #: Whether a spawned proc inherits the client's value (see ``snapshot_for_children``).
    propagate: bool = True
    #: The docs section it is listed in.
    group: str = ""


#: A count that may be zero.
USIZE = integer()
#: A count of at least one.
POSITIVE = integer(1)


def in_group(group: str, *keys: Key) -> list[Key]:
    """``keys``, each filed under docs section ``group``."""
    return [replace(k, group=group) for k in keys]
