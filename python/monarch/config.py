"""Configuration of Monarch: the keys of upstream Monarch, with their types, defaults and
environment variables (the full list, and which keys take effect here, is in
[Configuration](../config.md)).

- ``configure(**keys)`` sets keys for this process; ``configured(**keys)`` does so for
  a ``with`` block and yields the merged config;
- ``get_global_config()`` is every key's value, ``get_runtime_config()`` the keys set
  with ``configure``, ``clear_runtime_config()`` forgets them;
- ``Encoding`` is the type of ``default_encoding``;
- ``IgnoredSettingWarning`` is warned (once per key and process) when a key that has no
  effect in this implementation is set, saying why;
- ``parametrize_config`` / ``parametrize_config_pointwise`` run a pytest test under
  several configs.

A key's environment variable beats ``configure()``, which beats the config a spawned
proc inherits from its client, which beats the default. Durations are humantime strings
(``"30s"``, ``"1h 30m"``, ``"500ms"``), numbers of seconds or ``datetime.timedelta``.
"""

from monarch._src.config import (
    Encoding,
    IgnoredSettingWarning,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
)
from monarch._src.config.testing import parametrize_config, parametrize_config_pointwise

__all__ = [
    "Encoding",
    "IgnoredSettingWarning",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
