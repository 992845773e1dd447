"""The config keys: upstream Monarch's documented keys, with their environment variables,
types and defaults, plus this implementation's own (``cast_fanout``, ``host_*``,
``spawn_*``, ...).

Every :class:`Key` either takes effect here or is refused with a reason:

- ``effect`` says what it changes in this implementation (code reads it with
  :func:`monarch._src.config.get` or, on hot paths, ``cached``);
- ``ignored`` says, in one sentence, why it has no meaning in this design: the key is
  still accepted (scripts written for upstream Monarch run), and setting it warns once
  per process (:class:`monarch._src.config.IgnoredSettingWarning`).

Exactly one of the two is set (checked below). docs/config.md is generated from this
table.

The keys themselves are in one module per docs section, in docs order:
``keys_mesh``, ``keys_messages``, ``keys_logging``, ``keys_admin``, ``keys_python``,
``keys_rdma``, ``keys_tensors`` and ``keys_tls``; the :class:`Key` record is in
``keys_base``. This module combines them and checks the whole.
"""

from __future__ import annotations

from monarch._src.config import (
    keys_admin,
    keys_logging,
    keys_mesh,
    keys_messages,
    keys_python,
    keys_rdma,
    keys_tensors,
    keys_tls,
)
from monarch._src.config.keys_base import POSITIVE, USIZE, Key

__all__ = ["GROUPS", "KEYS", "POSITIVE", "USIZE", "Key"]

#: The sections, in docs order.
_SECTIONS = [
    keys_mesh,
    keys_messages,
    keys_logging,
    keys_admin,
    keys_python,
    keys_rdma,
    keys_tensors,
    keys_tls,
]
_ALL: list[Key] = [key for section in _SECTIONS for key in section.KEYS]

#: Every key, by name, in docs order.
KEYS: dict[str, Key] = {k.name: k for k in _ALL}
#: The docs sections, in order.
GROUPS = [section.GROUP for section in _SECTIONS]

assert len(KEYS) == len(_ALL), "duplicate config key"
assert all(bool(k.effect) != bool(k.ignored) for k in _ALL), (
    "every config key has an effect or a reason it is ignored, not both: "
    + ", ".join(k.name for k in _ALL if bool(k.effect) == bool(k.ignored))
)
assert len({k.env for k in _ALL}) == len(_ALL), "duplicate config environment variable"
