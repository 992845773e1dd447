"""The names both sides of ``HostMesh.sync_workspace`` share (see
:mod:`monarch._src.actor.code_sync`): the environment variables, the directories the
sync keeps on a host, the manifest's types, the errors a sync raises and its
statistics, and where a host's workspace directory is (with what a proc spawned after a
sync does with it, :func:`apply_to_this_proc`).
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import site
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The variable naming a host's workspace directory (upstream's name).
WORKSPACE_DIR_ENV = "WORKSPACE_DIR"
#: The variable telling a spawned proc what was synced to its host (JSON: the remote
#: names of the workspace's directories, and whether the environment was).
SYNCED_ENV = "MONARCH_WORKSPACE_SYNCED"
#: The directory under a host's workspace directory that the sync keeps for itself: a
#: workspace directory mapped to ``""`` never has it deleted or mirrored.
STATE_DIR = ".monarch-sync"
#: Where the environment's ``site-packages`` lands, under the workspace directory.
ENV_DIR = f"{STATE_DIR}/env/site-packages"
#: The most file bytes one message carries (larger files go in pieces).
BATCH_BYTES = 8 << 20
#: How many batches the client has in flight at once.
WINDOW = 2
#: Directories never mirrored (bytecode; each host writes its own).
SKIP_DIRS = frozenset({"__pycache__"})

#: A manifest entry: ``(kind, digest, mode, size)``; kind ``f`` a file (digest: its
#: sha256), ``l`` a symbolic link (digest: its target), ``d`` a directory.
Entry = tuple[str, str, int, int]
Manifest = dict[str, Entry]


class WorkspacePathError(ValueError):
    """A path of the workspace would leave it: a symbolic link whose target is outside
    its directory, or a remote name that is absolute or has ``..``."""


class HostOutOfSpaceError(OSError):
    """A host has too little free space for what a sync writes there (``errno`` is
    ``ENOSPC``); the message names the host, its directory, the bytes needed and free."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.args[1])


@dataclass
class SyncStats:
    """What the last ``sync_workspace`` of a host mesh did (``HostMesh`` keeps it as
    ``_workspace_sync.last``, for tests and the bench)."""

    #: Files (and links) in the client's manifest.
    files: int = 0
    #: Distinct contents some host lacked, and their bytes.
    sent_files: int = 0
    #: File bytes the client sent (each once, to the root of the host tree).
    sent_bytes: int = 0
    #: Bytes of the manifest the client cast to the hosts (after the first sync, only
    #: what changed since the last one).
    manifest_bytes: int = 0
    #: Per host rank: the paths written or deleted there.
    changed: dict[int, list[str]] = field(default_factory=dict)
    #: Per host rank: its workspace directory.
    roots: dict[int, str] = field(default_factory=dict)
    #: Per proc mesh reloaded (``auto_reload``): the modules each proc reloaded.
    reloaded: list[list[list[str]]] = field(default_factory=list)


# --- where things are on a host --------------------------------------------------------


def workspace_root() -> Path:
    """This host's workspace directory: ``$WORKSPACE_DIR``, else
    ``<tempdir>/monarch-workspace-<uid>``."""
    given = os.environ.get(WORKSPACE_DIR_ENV)
    if given:
        return Path(given)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"monarch-workspace-{uid}"


def _synced_paths(spec: dict[str, Any], root: Path) -> list[str]:
    paths = [str(root / d) if d else str(root) for d in spec.get("dirs", [])]
    if spec.get("env"):
        paths.append(str(root / ENV_DIR))
    return paths


def _use_synced(spec: dict[str, Any]) -> list[str]:
    """Put the synced directories of ``spec`` at the front of ``sys.path`` (the
    environment's ``.pth`` files processed), set ``WORKSPACE_DIR``; the directories."""
    root = workspace_root()
    os.environ.setdefault(WORKSPACE_DIR_ENV, str(root))
    paths = _synced_paths(spec, root)
    for p in reversed(paths):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    if spec.get("env"):
        site.addsitedir(str(root / ENV_DIR))
    importlib.invalidate_caches()
    return paths


def apply_to_this_proc() -> None:
    """In a proc spawned after a sync (its ``MONARCH_WORKSPACE_SYNCED`` set): the synced
    directories at the front of ``sys.path`` and ``WORKSPACE_DIR`` set. The runtime
    calls this as a proc starts, before its bootstrap function and its first actor."""
    raw = os.environ.get(SYNCED_ENV)
    if not raw:
        return
    try:
        spec = json.loads(raw)
    except ValueError:
        sys.stderr.write(f"monarch: ignoring a malformed {SYNCED_ENV}={raw!r}\n")
        return
    _use_synced(spec)
