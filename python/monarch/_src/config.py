"""The config registry behind :mod:`monarch.config`.

Every key has a type, a default and an environment variable. A value is looked up,
first match wins, in: the environment variable, the runtime layer (``configure``), the
default. (An exported variable beats ``configure()``, as in upstream Monarch.)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    name: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    check: Callable[[Any], str | None]
    doc: str


def _positive_int(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"expected an int, got {type(v).__name__}"
    return None if v >= 1 else f"expected an int >= 1, got {v}"


KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key(
            "cast_fanout",
            "HYPERACTOR_MESH_CAST_FANOUT",
            16,
            int,
            _positive_int,
            "How many procs a cast is sent to from each node of its tree (the sender "
            "included): a cast to n actors takes about log_fanout(n) hops.",
        ),
    ]
}

_lock = threading.Lock()
_runtime: dict[str, Any] = {}
#: Values looked up by :func:`cached` (hot paths), dropped whenever the runtime layer
#: changes.
_cache: dict[str, Any] = {}


def _key(name: str) -> Key:
    key = KEYS.get(name)
    if key is None:
        raise ValueError(f"unknown config key {name!r}; known keys: {sorted(KEYS)}")
    return key


def _checked(key: Key, value: Any) -> Any:
    problem = key.check(value)
    if problem is not None:
        raise TypeError(f"config key {key.name!r}: {problem}")
    return value


def get(name: str) -> Any:
    """The value of ``name`` (environment, then runtime layer, then default)."""
    key = _key(name)
    raw = os.environ.get(key.env)
    if raw is not None:
        try:
            return _checked(key, key.parse(raw))
        except (TypeError, ValueError) as e:
            raise ValueError(f"environment variable {key.env}={raw!r} is invalid: {e}") from None
    value = _runtime.get(name, _runtime)
    return key.default if value is _runtime else value


def cached(name: str) -> Any:
    """:func:`get`, remembered until the next ``configure`` (for hot paths: an
    environment variable changed later in the process is not seen until then)."""
    try:
        return _cache[name]
    except KeyError:
        value = _cache[name] = get(name)
        return value


def configure(**kwargs: Any) -> None:
    """Set keys in the runtime layer (``ValueError`` for an unknown key, ``TypeError``
    for a wrong type)."""
    checked = {name: _checked(_key(name), v) for name, v in kwargs.items()}
    with _lock:
        _runtime.update(checked)
        _cache.clear()


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply ``kwargs`` for the duration of the block; yields the merged config."""
    with _lock:
        saved = dict(_runtime)
    configure(**kwargs)
    try:
        yield get_global_config()
    finally:
        with _lock:
            _runtime.clear()
            _runtime.update(saved)
            _cache.clear()


def get_global_config() -> dict[str, Any]:
    """Every key's current value."""
    return {name: get(name) for name in KEYS}


def get_runtime_config() -> dict[str, Any]:
    """The keys set with ``configure``."""
    with _lock:
        return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget everything set with ``configure``."""
    with _lock:
        _runtime.clear()
        _cache.clear()
