"""What ``HostMesh.sync_workspace`` mirrors to the hosts: a :class:`Workspace` (local
directories, each mapped to a name under the hosts' workspace directory) and the
:class:`Environment` whose packages go along with ``conda=True``.

These are upstream Monarch's ``monarch.tools.config.Workspace`` and
``monarch.tools.config.environment.CondaEnvironment``, with the same constructor
arguments and attributes; the public modules re-export them from here (the actor layer,
which ``sync_workspace`` belongs to). The syncing itself is
:mod:`monarch._src.actor.code_sync`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ACTIVE_CONDA_ENV", "CondaEnvironment", "Environment", "Workspace"]


class Environment:
    """The packages the projects of a :class:`Workspace` run with. With
    ``sync_workspace(..., conda=True)`` the environment's ``site-packages`` is mirrored
    to the hosts too."""


class CondaEnvironment(Environment):
    """A conda environment (or a virtual environment) by its prefix, the directory that
    holds its ``lib/pythonX.Y/site-packages``; without ``conda_prefix``, the active one:
    ``$CONDA_PREFIX`` when set, else this interpreter's ``sys.prefix`` (a venv's
    directory)."""

    def __init__(self, conda_prefix: str | os.PathLike[str] | None = None) -> None:
        self._conda_prefix = None if conda_prefix is None else str(conda_prefix)

    @property
    def conda_prefix(self) -> str:
        """The prefix given to the constructor, else the active environment's."""
        if self._conda_prefix:
            return self._conda_prefix
        return os.environ.get("CONDA_PREFIX") or sys.prefix

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CondaEnvironment):
            return False
        return self._conda_prefix == other._conda_prefix

    def __hash__(self) -> int:
        return hash(self._conda_prefix)

    def __repr__(self) -> str:
        given = "" if self._conda_prefix is None else repr(self._conda_prefix)
        return f"CondaEnvironment({given})"


#: The active environment (``CondaEnvironment()``): a :class:`Workspace`'s default.
ACTIVE_CONDA_ENV = CondaEnvironment()


def _check_dir(value: object, what: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError(
            f"Workspace({what}): {value!r} is not a directory; expected a non-empty path "
            "(an empty one would mean the current directory by accident: write '.' for it)"
        )
    return Path(value)


class Workspace:
    """One or more local directories that hold your project(s), and the environment
    they run with. ``HostMesh.sync_workspace(workspace)`` mirrors them to every host,
    under the host's workspace directory (``$WORKSPACE_DIR`` of its worker).

    ``dirs`` is a list of directories, each mirrored to a directory of its own name
    (``~/github/torchtitan`` to ``$WORKSPACE_DIR/torchtitan``), or a dict mapping each
    local directory to its name under ``$WORKSPACE_DIR`` (``"github/torchtitan"``;
    ``""`` mirrors the directory's contents to ``$WORKSPACE_DIR`` itself). ``env`` is
    the environment mirrored by ``sync_workspace(..., conda=True)`` (default: the
    active one; ``None`` in :meth:`null`).

    ```python notest
    from pathlib import Path
    from monarch.tools.config import Workspace

    Workspace(dirs=[Path.home() / "github" / "torchtitan"])  # -> $WORKSPACE_DIR/torchtitan
    Workspace(dirs={Path.home() / "torch": "github/pytorch"})  # -> $WORKSPACE_DIR/github/pytorch
    Workspace(dirs={Path.home() / "github" / "torchtitan": ""})  # -> $WORKSPACE_DIR
    ```

    Raises:
        ValueError: A directory is empty (``""``), or a name is not a string.
        TypeError: ``dirs`` is neither a list nor a dict.
    """

    def __init__(
        self,
        dirs: Sequence[Path | str] | Mapping[Path | str, str] | None = None,
        env: Environment | None = ACTIVE_CONDA_ENV,
    ) -> None:
        self.env = env
        #: Local directory -> its name under the hosts' workspace directory.
        self.dirs: dict[Path, str] = {}
        if dirs is None:
            return
        if isinstance(dirs, Mapping):
            for src, dst in dirs.items():
                if not isinstance(dst, str):
                    raise ValueError(
                        f"Workspace(dirs={{{src!r}: {dst!r}}}): the remote name must be a "
                        "string (a path relative to $WORKSPACE_DIR, '' for the directory "
                        "itself)"
                    )
                self.dirs[_check_dir(src, f"dirs={{{src!r}: ...}}")] = dst
        elif isinstance(dirs, (list, tuple)):
            for d in dirs:
                path = _check_dir(d, f"dirs=[..., {d!r}, ...]")
                self.dirs[path] = path.resolve().name if path.name in ("", ".", "..") else path.name
        else:
            raise TypeError(
                f"Workspace(dirs={dirs!r}): expected a list of directories or a dict of "
                "directory -> remote name"
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workspace):
            return False
        return self.env == other.env and self.dirs == other.dirs

    __hash__ = None  # type: ignore[assignment]  # mutable, like upstream's

    def __repr__(self) -> str:
        dirs = {str(k): v for k, v in self.dirs.items()}
        return f"Workspace(dirs={dirs!r}, env={self.env!r})"

    def merge(self, outdir: str | Path) -> None:
        """Copy the directories of this workspace into ``outdir``, each to its remote
        name (what ``sync_workspace`` makes of ``$WORKSPACE_DIR``, without deleting)."""
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        for src, dst in self.dirs.items():
            shutil.copytree(src, out / dst, dirs_exist_ok=True, symlinks=True)

    @staticmethod
    def null() -> Workspace:
        """A workspace with no directories and no environment."""
        return Workspace(env=None)
