"""The records of a job's mounts (``JobTrait.remote_mount``, ``gather_mount``), checked
when they are declared; :mod:`monarch._src.job.mounts` makes the copies at ``state()``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SUBDIR", "GatherMount", "RemoteMount", "gather_mount", "remote_mount"]

#: Replaced, in a gather mount's remote path, by each host's sub-directory name.
SUBDIR = "$SUBDIR"


@dataclass(frozen=True)
class RemoteMount:
    """``remote_mount(source, mntpoint, meshes, python_exe)``, with absolute paths."""

    source: str
    mntpoint: str
    meshes: tuple[str, ...] | None
    python_exe: str | None


@dataclass(frozen=True)
class GatherMount:
    """``gather_mount(remote, local, meshes)``; ``local`` absolute."""

    remote: str
    local: str
    meshes: tuple[str, ...] | None


def remote_mount(
    source: str,
    mntpoint: str | None,
    meshes: Sequence[str] | None,
    python_exe: str | None,
) -> RemoteMount:
    """The checked record of a remote mount (``ValueError`` for a source that is not a
    directory, or a ``python_exe`` that is not a file inside it)."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"remote_mount: source must be a path, got {type(source).__name__}")
    src = os.path.abspath(os.fspath(source))
    if not os.path.isdir(src):
        raise ValueError(f"remote_mount: source {src!r} is not a directory on this machine")
    exe = None
    if python_exe is not None:
        local_exe = os.path.join(src, python_exe)
        if not os.path.isfile(local_exe):
            raise ValueError(
                f"remote_mount: python_exe {python_exe!r} not found at {local_exe!r}; create "
                f"the virtual environment in {src!r} first, or pass python_exe=None"
            )
        exe = python_exe
    dst = os.path.abspath(os.fspath(mntpoint)) if mntpoint is not None else src
    return RemoteMount(src, dst, _names(meshes, "remote_mount"), exe)


def gather_mount(remote: str, local: str, meshes: Sequence[str] | None) -> GatherMount:
    """The checked record of a gather mount."""
    if not isinstance(remote, str) or not remote:
        raise ValueError(f"gather_mount: remote must be a path on the hosts, got {remote!r}")
    if not isinstance(local, (str, os.PathLike)):
        raise TypeError(f"gather_mount: local must be a path, got {type(local).__name__}")
    return GatherMount(remote, os.path.abspath(os.fspath(local)), _names(meshes, "gather_mount"))


def _names(meshes: Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    if meshes is None:
        return None
    if isinstance(meshes, str) or not all(isinstance(m, str) for m in meshes):
        raise TypeError(f"{what}: meshes must be a list of mesh names, got {meshes!r}")
    return tuple(meshes)
