"""The config registry behind :mod:`monarch.config`.

Every key (see :mod:`.keys`) has a kind, a default and an environment variable. A value
is looked up, first match wins, in:

1. the environment variable (an exported variable beats ``configure()``, as in upstream
   Monarch);
2. the runtime layer, set with :func:`configure`;
3. the snapshot layer: the spawning process's config, installed at bootstrap by
   :func:`apply_snapshot_from_env` from what :func:`snapshot_for_children` produced;
4. the default.

Code that uses a key reads it with :func:`get` (or :func:`cached` on hot paths), which
returns durations as float seconds; :func:`get_global_config` shows them as humantime
strings, as upstream Monarch does.

A key with no meaning in this implementation (its ``ignored`` reason in :mod:`.keys`) is
still accepted, but setting it warns, once per key and process, with an
:class:`IgnoredSettingWarning` that says why: with :func:`configure` (and so
:func:`configured`), or with its environment variable, seen when this module is first
read when the client or a worker starts its runtime (not in spawned procs, whose
variables the spawning process already saw).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from monarch._src.config.keys import KEYS, Key
from monarch._src.config.kinds import ConfigValueError, Encoding

__all__ = [
    "KEYS",
    "SNAPSHOT_ENV",
    "ConfigValueError",
    "Encoding",
    "IgnoredSettingWarning",
    "Key",
    "apply_snapshot_from_env",
    "cached",
    "clear_runtime_config",
    "clear_snapshot_config",
    "configure",
    "configured",
    "get",
    "get_global_config",
    "get_runtime_config",
    "get_snapshot_config",
    "is_set",
    "snapshot_for_children",
]

#: The variable that carries the client's config to a spawned proc (JSON: key name to
#: environment text).
SNAPSHOT_ENV = "MONARCH_CONFIG_SNAPSHOT"

_lock = threading.Lock()
#: Stored values set with ``configure``.
_runtime: dict[str, Any] = {}
#: Stored values inherited from the spawning process.
_snapshot: dict[str, Any] = {}
#: Values looked up by :func:`cached` (hot paths), dropped whenever a layer changes.
_cache: dict[str, Any] = {}
#: The ignored keys this process has warned about (once each).
_warned: set[str] = set()
_MISSING = object()


class IgnoredSettingWarning(UserWarning):
    """A config key that upstream Monarch has but that means nothing in this
    implementation was set: it is accepted (so scripts written for upstream Monarch
    run) and changes nothing. The message names the key and says why. Shown once per
    key and process."""


def _warn_ignored(names: list[str], how: str, stacklevel: int) -> None:
    """Warn (once per key and process) that the ignored keys among ``names`` were set
    ``how`` ("with configure()", "by the environment"); ``stacklevel`` as
    ``warnings.warn`` counts it from this function."""
    for name in names:
        key = KEYS[name]
        if not key.ignored:
            continue
        with _lock:
            if name in _warned:
                continue
            _warned.add(name)
        warnings.warn(
            f"config key {name!r} ({key.env}) was set {how}: it is accepted for "
            f"compatibility with upstream Monarch but has no effect in this implementation. "
            f"{key.ignored} (This warning is shown once per process.)",
            IgnoredSettingWarning,
            stacklevel=stacklevel,
        )


def _forget_warnings() -> None:
    """Warn again about keys already warned about (for tests)."""
    with _lock:
        _warned.clear()


def warn_ignored_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Warn about the ignored keys whose environment variables are set in ``environ``
    (default ``os.environ``). The client and workers call it when they start their
    runtime; spawned procs do not (their variables are their spawner's)."""
    env = os.environ if environ is None else environ
    names = [name for name, key in KEYS.items() if key.ignored and key.env in env]
    _warn_ignored(names, "by the environment", stacklevel=3)


def _key(name: str) -> Key:
    key = KEYS.get(name)
    if key is None:
        raise ValueError(_unknown(name))
    return key


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, KEYS, n=3, cutoff=0.75)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        hint = f"known keys: {', '.join(sorted(KEYS))}"
    return f"unknown config key {name!r}: {hint}"


def _coerce(key: Key, value: Any) -> Any:
    try:
        return key.kind.coerce(value)
    except TypeError as e:  # ConfigValueError included
        raise type(e)(f"config key {key.name!r}: {e}") from None


def _stored(key: Key) -> Any:
    raw = os.environ.get(key.env)
    if raw is not None:
        try:
            return key.kind.parse(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"environment variable {key.env}={raw!r} (config key {key.name!r}) is "
                f"invalid: {e}; set it to a {key.kind.label} or unset it"
            ) from None
    value = _runtime.get(key.name, _MISSING)
    if value is _MISSING:
        value = _snapshot.get(key.name, _MISSING)
    return key.default if value is _MISSING else value


def is_set(name: str) -> bool:
    """Whether ``name`` is set rather than at its default: by its environment variable,
    :func:`configure`, or the spawning process's snapshot. (For aliases that apply only
    when set.)

    Raises:
        ValueError: ``name`` is unknown.
    """
    key = _key(name)
    if key.env in os.environ:
        return True
    with _lock:
        return name in _runtime or name in _snapshot


def get(name: str) -> Any:
    """The value of ``name`` for code that uses it: durations as float seconds,
    ``default_encoding`` as an :class:`Encoding`, everything else as stored.

    Raises:
        ValueError: ``name`` is unknown, or its environment variable is invalid.
    """
    key = _key(name)
    return key.kind.native(_stored(key))


def cached(name: str) -> Any:
    """:func:`get`, remembered until a layer changes (``configure``, ``configured``,
    ``clear_runtime_config``, a snapshot). For hot paths: an environment variable
    changed later in the process is not seen until then."""
    try:
        return _cache[name]
    except KeyError:
        value = _cache[name] = get(name)
        return value


def _checked(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    checked = {}
    for name, value in kwargs.items():
        key = _key(name)
        if value is None and not key.kind.optional:
            continue  # upstream Monarch: None leaves the key as it is
        checked[name] = _coerce(key, value)
    return checked


def configure(**kwargs: Any) -> None:
    """Set keys in the runtime layer of this process.

    All keys are checked before any is set. ``None`` leaves a key unchanged, unless the
    key's type admits ``None`` (then it sets ``None``). Setting a key that has no effect
    in this implementation warns once (:class:`IgnoredSettingWarning`, saying why).

    Raises:
        ValueError: a key is unknown (the message suggests close matches).
        TypeError: a value has the wrong type; a value of the right type that the key
            rejects raises :class:`ConfigValueError` (both a TypeError and a ValueError).
    """
    _configure(kwargs, stacklevel=3)


def _configure(kwargs: Mapping[str, Any], stacklevel: int) -> None:
    checked = _checked(kwargs)
    with _lock:
        _runtime.update(checked)
        _cache.clear()
    _warn_ignored(list(checked), "with configure()", stacklevel + 1)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply ``kwargs`` with :func:`configure` for the duration of the block and yield
    the merged config (:func:`get_global_config`); on exit the runtime layer is
    restored to what it was. The change is process-wide: other threads see it too."""
    with _lock:
        saved = dict(_runtime)
    # The caller's frame: this generator, contextlib's __enter__, the `with`.
    _configure(kwargs, stacklevel=4)
    try:
        yield get_global_config()
    finally:
        with _lock:
            _runtime.clear()
            _runtime.update(saved)
            _cache.clear()


def get_global_config() -> dict[str, Any]:
    """Every key's current value (environment, runtime, snapshot, default), durations
    as humantime strings. Changing the dict changes nothing.

    Raises:
        ValueError: an environment variable of a key is invalid.
    """
    return {name: key.kind.show(_stored(key)) for name, key in KEYS.items()}


def get_runtime_config() -> dict[str, Any]:
    """The keys set with :func:`configure`, shown as in :func:`get_global_config`
    (``configure(**get_runtime_config())`` sets them again)."""
    with _lock:
        layer = dict(_runtime)
    return {name: KEYS[name].kind.show(value) for name, value in layer.items()}


def clear_runtime_config() -> None:
    """Forget everything set with :func:`configure` (environment variables, the
    snapshot and defaults are untouched)."""
    with _lock:
        _runtime.clear()
        _cache.clear()


def snapshot_for_children() -> dict[str, str]:
    """The environment additions that give a process spawned by this one this one's
    config: one variable, :data:`SNAPSHOT_ENV`, holding the runtime layer over the
    snapshot layer as JSON (keys that do not propagate, such as the TLS files, are left
    out). Environment variables reach children the ordinary way, by inheritance."""
    with _lock:
        layer = {**_snapshot, **_runtime}
    doc = {
        name: KEYS[name].kind.text(value)
        for name, value in sorted(layer.items())
        if KEYS[name].propagate
    }
    return {SNAPSHOT_ENV: json.dumps(doc, separators=(",", ":"))}


def apply_snapshot_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Install the snapshot that :func:`snapshot_for_children` put in ``environ``
    (default ``os.environ``) as this process's snapshot layer, below its own
    environment variables and ``configure()``. Call it once, at proc bootstrap.

    Returns the installed keys, shown as in :func:`get_global_config` (empty when the
    variable is absent; the layer is then left as it was).

    Raises:
        ValueError: the variable is not a JSON object of key names to values, names an
            unknown key, or holds an invalid value.
    """
    env = os.environ if environ is None else environ
    raw = env.get(SNAPSHOT_ENV)
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{SNAPSHOT_ENV} is not valid JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ValueError(f"{SNAPSHOT_ENV} must map key names to strings, got {raw[:200]!r}")
    values = {}
    for name, text in doc.items():
        key = KEYS.get(name)
        if key is None:
            raise ValueError(
                f"{SNAPSHOT_ENV} sets unknown config key {name!r}: the spawning process "
                "runs a different version of monarch"
            )
        try:
            values[name] = key.kind.parse(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{SNAPSHOT_ENV}: config key {name!r}={text!r}: {e}") from None
    with _lock:
        _snapshot.clear()
        _snapshot.update(values)
        _cache.clear()
    return {name: KEYS[name].kind.show(value) for name, value in values.items()}


def get_snapshot_config() -> dict[str, Any]:
    """The snapshot layer, shown as in :func:`get_global_config`."""
    with _lock:
        layer = dict(_snapshot)
    return {name: KEYS[name].kind.show(value) for name, value in layer.items()}


def clear_snapshot_config() -> None:
    """Forget the snapshot layer (for tests)."""
    with _lock:
        _snapshot.clear()
        _cache.clear()
