"""The ``.monarch/`` directory of a project: contexts, and each context's job.

The ``monarch`` command keeps one *current job* per *context*. A context is a directory
``.monarch/<name>/`` under the working directory, holding:

- ``spec``: the ``module.attr`` the job came from (``monarch apply module.attr``), so
  that ``monarch apply`` alone applies it again;
- ``state.pkl``: the applied job (a pickle, :meth:`JobTrait.dump`), through which any
  process reconnects to its allocation.

``.monarch/job_state.pkl`` (:data:`~monarch._src.job.job.DEFAULT_JOB_PATH`, the
default cache of ``JobTrait.state()``) is a symbolic link to the current context's
``state.pkl``: the link *is* the record of which context is current, and a script's
``job.state()`` reads and writes the current context's job through it. Without the
link the current context is ``default``; a plain file found there (written by a
script before the command was first used) moves into ``default/state.pkl``.

Invariants (tests cite them):

- CTX-1: ``.monarch/job_state.pkl``, once the layout exists, is a relative symbolic
  link ``<context>/state.pkl``, and ``<context>/`` exists.
- CTX-2: every directory directly under ``.monarch/`` whose name is a valid context
  name is a context, except the reserved ``logs``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

__all__ = [
    "MONARCH_DIR",
    "ContextError",
    "check_exists",
    "check_name",
    "contexts",
    "create",
    "current",
    "delete",
    "ensure_layout",
    "read_spec",
    "spec_path",
    "state_path",
    "use",
    "write_spec",
]

#: The directory, under the working directory, that holds the contexts.
MONARCH_DIR = ".monarch"
#: The context used until another is chosen.
DEFAULT_CONTEXT = "default"
_STATE_FILE = "state.pkl"
_SPEC_FILE = "spec"
_LINK = "job_state.pkl"
#: Directory names under ``.monarch/`` that are not contexts (batch-mode logs).
_RESERVED = frozenset({"logs"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ContextError(RuntimeError):
    """A context operation that cannot be done; the message says what to do instead."""


def _root() -> Path:
    return Path(MONARCH_DIR)


def _link() -> Path:
    return _root() / _LINK


def check_name(name: str) -> str:
    """``name`` if it can name a context; :class:`ContextError` otherwise."""
    if not _NAME.fullmatch(name) or name in _RESERVED:
        raise ContextError(
            f"{name!r} is not a valid context name: use letters, digits, '_', '.' and '-' "
            f"(starting with a letter or digit, at most 64 characters), not "
            f"{', '.join(sorted(_RESERVED))}"
        )
    return name


def state_path(name: str) -> Path:
    """Where the context ``name`` keeps its applied job."""
    return _root() / check_name(name) / _STATE_FILE


def spec_path(name: str) -> Path:
    """Where the context ``name`` records its job's ``module.attr``."""
    return _root() / check_name(name) / _SPEC_FILE


def current() -> str:
    """The current context: the one ``.monarch/job_state.pkl`` links to, else
    ``default``."""
    link = _link()
    if link.is_symlink():
        target = Path(os.readlink(link))
        if len(target.parts) == 2 and target.parts[1] == _STATE_FILE:
            return target.parts[0]
        raise ContextError(
            f"{link} links to {target}, not to <context>/{_STATE_FILE}; remove the link "
            "and choose a context with `monarch context use NAME`"
        )
    return DEFAULT_CONTEXT


def contexts() -> list[str]:
    """The names of the contexts, sorted (CTX-2)."""
    root = _root()
    if not root.is_dir():
        return []
    return sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir()
        and not entry.is_symlink()
        and _NAME.fullmatch(entry.name)
        and entry.name not in _RESERVED
    )


def _point_link_at(name: str) -> None:
    """Make ``.monarch/job_state.pkl`` link to ``name``'s state (atomically)."""
    link = _link()
    tmp = _root() / f".{_LINK}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(Path(name) / _STATE_FILE)
    os.replace(tmp, link)


def ensure_layout() -> str:
    """Create ``.monarch/``, the current context's directory and the link (CTX-1);
    the current context's name. A plain ``job_state.pkl`` moves into
    ``default/state.pkl``."""
    root = _root()
    root.mkdir(exist_ok=True)
    link = _link()
    if link.exists() and not link.is_symlink():
        target = state_path(DEFAULT_CONTEXT)
        if target.exists():
            raise ContextError(
                f"both {link} (a file, not a link) and {target} hold a job; kill the one "
                f"you do not need (`monarch kill` kills {target}) and remove its file"
            )
        target.parent.mkdir(exist_ok=True)
        os.replace(link, target)
    name = current()
    (root / check_name(name)).mkdir(exist_ok=True)
    if not link.is_symlink():
        _point_link_at(name)
    return name


def _unknown(name: str) -> ContextError:
    known = ", ".join(contexts()) or "none"
    return ContextError(
        f"no context named {name!r} (contexts: {known}); create it with "
        f"`monarch context create {name}`"
    )


def create(name: str) -> None:
    """Create the context ``name`` (empty; the current context stays current)."""
    check_name(name)
    ensure_layout()
    directory = _root() / name
    if directory.exists():
        raise ContextError(
            f"context {name!r} exists already; switch to it with `monarch context use {name}`"
        )
    directory.mkdir()


def use(name: str) -> None:
    """Make ``name`` the current context."""
    check_name(name)
    ensure_layout()
    if not (_root() / name).is_dir():
        raise _unknown(name)
    _point_link_at(name)


def check_exists(name: str) -> None:
    """Raise :class:`ContextError` unless context ``name`` exists."""
    check_name(name)
    if not (_root() / name).is_dir():
        raise _unknown(name)


def delete(name: str) -> None:
    """Delete the directory of context ``name`` (its job is the caller's business). When
    ``name`` was current, ``default`` becomes current."""
    check_exists(name)
    was_current = current() == name
    shutil.rmtree(_root() / name)
    if was_current:
        (_root() / DEFAULT_CONTEXT).mkdir(exist_ok=True)
        _point_link_at(DEFAULT_CONTEXT)


def read_spec(name: str) -> str | None:
    """The ``module.attr`` recorded for context ``name``, if any."""
    try:
        return spec_path(name).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_spec(name: str, spec: str) -> None:
    """Record ``spec`` as the ``module.attr`` of context ``name``."""
    path = spec_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec + "\n")
