"""``HostMesh.sync_workspace``: the client's directories (and, with ``conda=True``, its
environment's packages) mirrored to every host of a host mesh.

Where the files land: under each host's workspace directory, ``$WORKSPACE_DIR`` of its
worker (upstream's variable; :func:`workspace_root`), else
``<tempdir>/monarch-workspace-<uid>``. A workspace directory mapped to ``name`` is
``$WORKSPACE_DIR/name`` there; the environment's ``site-packages`` is
``$WORKSPACE_DIR/.monarch-sync/env/site-packages``. Procs spawned on the mesh after a
sync have those directories at the front of ``sys.path`` (the workspace's first) and
``WORKSPACE_DIR`` in their environment (:func:`apply_to_this_proc`, run as each proc
starts); with ``auto_reload=True`` the procs already running get them too, and reload the
modules whose files changed.

How: one hidden proc per host (``code_sync``, spawned on first use, stopped with the
mesh's procs) runs a :class:`WorkspaceHost` actor that keeps the manifest of the host's
copy (path -> sha256, mode; re-read from disk by size and mtime). A sync is

1. the client's manifest, cast to every host, which answers which contents it lacks
   (content-addressed: a file renamed or copied on the client is copied on the host,
   not sent) and how much space it needs; a host short of space fails the sync before
   anything is sent (:class:`HostOutOfSpaceError`);
2. the missing contents, in batches of at most :data:`BATCH_BYTES`, sent once by the
   client to host 0 and forwarded down a binary tree over the host ranks (host ``i``
   forwards to ``2i+1`` and ``2i+2`` what their subtrees lack), over the mesh's
   authenticated channels; each host stages what it needs;
3. each host applies the manifest: new and changed files written to a temporary file
   beside their place, then renamed over it (a reader never sees half a file),
   permissions set, files and directories that the client no longer has deleted, the
   bytecode of changed modules removed.

A path that would leave the workspace (a symbolic link pointing outside its directory,
a remote name with ``..``) raises :class:`WorkspacePathError` before anything is sent.

This module is the face of the implementation, which lives beside it, bottom to top:
``code_sync_base`` (the shared names, the errors, where a host's workspace is),
``code_sync_manifest`` (manifests and the client's view of a workspace),
``code_sync_host`` (the hosts' actors) and ``code_sync_client`` (the steps of a sync).
"""

from __future__ import annotations

from monarch._src.actor.code_sync_base import (
    BATCH_BYTES,
    ENV_DIR,
    STATE_DIR,
    SYNCED_ENV,
    WORKSPACE_DIR_ENV,
    HostOutOfSpaceError,
    SyncStats,
    WorkspacePathError,
    apply_to_this_proc,
    workspace_root,
)
from monarch._src.actor.code_sync_client import (
    STEP_TIMEOUT,
    spawn_variables,
    sync_workspace,
)
from monarch._src.actor.code_sync_client import (
    _raise_failures as _raise_failures,  # tests/actor/test_workspace.py calls it
)
from monarch._src.actor.code_sync_host import WorkspaceHost

__all__ = [
    "BATCH_BYTES",
    "ENV_DIR",
    "STATE_DIR",
    "STEP_TIMEOUT",
    "SYNCED_ENV",
    "WORKSPACE_DIR_ENV",
    "HostOutOfSpaceError",
    "SyncStats",
    "WorkspaceHost",
    "WorkspacePathError",
    "apply_to_this_proc",
    "spawn_variables",
    "sync_workspace",
    "workspace_root",
]
