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
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import importlib
import json
import os
import pickle
import posixpath
import shutil
import site
import socket
import stat
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.workspace import CondaEnvironment, Workspace

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


# --- manifests --------------------------------------------------------------------------

#: path -> (mtime_ns, size, inode, ctime_ns, sha256): contents not read again while the
#: file's stat is the same.
_StatCache = dict[str, tuple[int, int, int, int, str]]
_client_cache: _StatCache = {}


def _digest(path: str, st: os.stat_result, cache: _StatCache) -> str:
    key = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)
    hit = cache.get(path)
    if hit is not None and hit[:4] == key:
        return hit[4]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    cache[path] = (*key, digest)
    return digest


def _join(prefix: str, rel: str) -> str:
    if rel in ("", "."):
        return prefix
    return posixpath.join(prefix, rel) if prefix else rel


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def _scan(
    base: Path,
    prefix: str,
    cache: _StatCache,
    *,
    escaping_links: str,
    sources: dict[str, str] | None = None,
) -> Manifest:
    """The manifest of directory ``base``, its paths under ``prefix``. A link whose
    target leaves ``base``: ``escaping_links="error"`` raises, ``"keep"`` keeps it as it
    is. ``sources`` collects a local path for each file digest."""
    out: Manifest = {}
    real_base = os.path.realpath(base)
    top = not prefix  # mapped to the root itself: the sync's own directory is not ours
    if prefix:
        out[prefix] = ("d", "", stat.S_IMODE(os.stat(base).st_mode), 0)

    def link(path: str, rel: str) -> None:
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        if not _within(resolved, real_base):
            if escaping_links == "error":
                raise WorkspacePathError(
                    f"sync_workspace: {path} is a symbolic link to {target!r}, which is "
                    f"outside the workspace directory {base}; a workspace holds only its "
                    "own files: replace the link by a copy of what it points to, or add "
                    f"{os.path.dirname(resolved)} to the Workspace as a directory of its own"
                )
        elif os.path.isabs(target):
            # Inside: relative, so that it points to the host's copy.
            target = os.path.relpath(resolved, os.path.realpath(os.path.dirname(path)))
        out[_join(prefix, rel)] = ("l", target, 0o777, 0)

    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = os.path.relpath(dirpath, base)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        keep = []
        for name in sorted(dirnames):
            if name in SKIP_DIRS or (top and not rel_dir and name == STATE_DIR):
                continue
            path = os.path.join(dirpath, name)
            rel = _join(rel_dir, name)
            if os.path.islink(path):
                link(path, rel)
                continue
            out[_join(prefix, rel)] = ("d", "", stat.S_IMODE(os.lstat(path).st_mode), 0)
            keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = _join(rel_dir, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we looked
                continue
            if stat.S_ISLNK(st.st_mode):
                link(path, rel)
            elif stat.S_ISREG(st.st_mode):
                digest = _digest(path, st, cache)
                out[_join(prefix, rel)] = ("f", digest, stat.S_IMODE(st.st_mode), st.st_size)
                if sources is not None:
                    sources.setdefault(digest, path)
            # sockets, fifos, devices: not mirrored
    return out


def check_remote_name(name: str, src: Path) -> str:
    """``name`` (a workspace directory's remote name) normalized; raises
    :class:`WorkspacePathError` for one outside the workspace directory."""
    if not isinstance(name, str):
        raise WorkspacePathError(f"sync_workspace: the remote name of {src} is {name!r}, not a str")
    norm = posixpath.normpath(name.replace(os.sep, "/")) if name else ""
    norm = "" if norm == "." else norm
    parts = norm.split("/") if norm else []
    if posixpath.isabs(norm) or ".." in parts or (parts and parts[0] == STATE_DIR):
        raise WorkspacePathError(
            f"sync_workspace: {src} is mapped to {name!r}, outside the hosts' workspace "
            f"directory ($WORKSPACE_DIR) or in the sync's own {STATE_DIR}; expected a path "
            "relative to it without '..', e.g. 'github/torchtitan' ('' for the directory "
            "itself)"
        )
    return norm


def env_site_packages(workspace: Workspace) -> Path:
    """The ``site-packages`` of the environment ``sync_workspace(conda=True)`` mirrors:
    the workspace's ``CondaEnvironment``, else the active one."""
    env = workspace.env if isinstance(workspace.env, CondaEnvironment) else CondaEnvironment()
    prefix = env.conda_prefix
    purelib = sysconfig.get_path("purelib", vars={"base": prefix, "platbase": prefix})
    path = Path(purelib)
    if not path.is_dir():
        raise FileNotFoundError(
            f"sync_workspace(conda=True): the environment at {prefix} has no "
            f"site-packages ({path} does not exist); give the prefix of an environment "
            "(a directory with lib/pythonX.Y/site-packages), e.g. "
            "Workspace(dirs=..., env=CondaEnvironment('/opt/conda/envs/myenv'))"
        )
    return path


@dataclass
class _Local:
    manifest: Manifest
    prefixes: list[str]
    sources: dict[str, str]
    spec: dict[str, Any]


def local_manifest(workspace: Workspace, conda: bool) -> _Local:
    """The client's side of a sync: the merged manifest of the workspace's directories
    (and the environment's), the remote prefixes it owns, a local file per digest."""
    manifest: Manifest = {}
    origin: dict[str, Path] = {}
    sources: dict[str, str] = {}
    prefixes: list[str] = []
    dirs: list[str] = []
    plan: list[tuple[Path, str, str]] = []
    for src, dst in workspace.dirs.items():
        name = check_remote_name(dst, src)
        if not src.is_dir():
            raise FileNotFoundError(
                f"sync_workspace: the workspace directory {src} does not exist or is not "
                "a directory; give existing local directories in Workspace(dirs=...)"
            )
        plan.append((src, name, "error"))
        dirs.append(name)
    if conda:
        plan.append((env_site_packages(workspace), ENV_DIR, "keep"))
    for src, name, links in plan:
        part = _scan(src, name, _client_cache, escaping_links=links, sources=sources)
        for path, entry in part.items():
            had = manifest.get(path)
            if had is not None and had != entry and not (had[0] == entry[0] == "d"):
                raise WorkspacePathError(
                    f"sync_workspace: {origin[path]} and {src} both put {path!r} in the "
                    "hosts' workspace directory, with different contents; map them to "
                    "different names in Workspace(dirs={...})"
                )
            manifest.setdefault(path, entry)
            origin.setdefault(path, src)
        prefixes.append(name)
    spec = {"dirs": dirs, "env": conda}
    return _Local(manifest, prefixes, sources, spec)


# --- the host side -----------------------------------------------------------------------


def _free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _drop_bytecode(path: str) -> None:
    """Remove the cached bytecode of module file ``path`` (``__pycache__/name.*.pyc``):
    Python validates it by mtime and size, which a quick same-size edit can keep."""
    if not path.endswith(".py"):
        return
    folder, name = os.path.split(path)
    cache = os.path.join(folder, "__pycache__")
    try:
        names = os.listdir(cache)
    except OSError:
        return
    stem = name[:-3] + "."
    for entry in names:
        if entry.startswith(stem) and entry.endswith(".pyc"):
            try:
                os.unlink(os.path.join(cache, entry))
            except OSError:
                pass


class WorkspaceHost(Actor):
    """The hidden actor of a host that keeps its copy of the workspace (one per host,
    on the ``code_sync`` proc)."""

    def __init__(self) -> None:
        self._root = workspace_root()
        self._cache: _StatCache = {}
        self._tree: Any = None
        self._rank = 0
        self._size = 1
        self._sync: str | None = None
        self._manifest: Manifest = {}
        self._prefixes: list[str] = []
        self._local: Manifest = {}
        self._needs: dict[int, set[str]] = {}
        self._staging: Path | None = None
        self._staged: dict[str, str] = {}
        #: The last sync applied here: its id, manifest and prefixes (the base of the
        #: next one's delta).
        self._base: tuple[str, Manifest, list[str]] | None = None

    def _where(self) -> str:
        proc = context().actor_instance.proc_id
        return f"host rank {self._rank} ({socket.gethostname()}, proc {proc})"

    @endpoint
    async def setup(self, tree: Any) -> dict[str, Any]:
        """Remember the mesh of every host's actor (flattened to ``rank``), to forward
        down the tree; answer this host's rank and workspace directory."""
        self._tree = tree
        point = context().message_rank
        self._rank = point.rank
        self._size = point.extent.nelements
        return {"rank": self._rank, "root": str(self._root), "where": self._where()}

    def _scan_host(self, prefixes: list[str]) -> Manifest:
        out: Manifest = {}
        for prefix in prefixes:
            base = self._root / prefix if prefix else self._root
            if base.is_dir() and not base.is_symlink():
                out.update(_scan(base, prefix, self._cache, escaping_links="keep"))
            elif os.path.lexists(base):
                out[prefix] = ("?", "", 0, 0)  # not a directory: replaced
        return out

    @endpoint
    async def diff(
        self,
        sync: str,
        manifest: dict[str, Entry | None],
        prefixes: list[str],
        base: str | None = None,
    ) -> dict[str, Any]:
        """Compare the client's manifest with this host's copy: the contents this host
        lacks, and the bytes it will write and has free. With ``base`` (the id of the
        last sync this host applied), ``manifest`` holds only what changed since
        (``None``: deleted); a host that did not apply that sync answers ``need_full``."""
        self._cleanup()
        if base is not None:
            if self._base is None or self._base[0] != base or self._base[2] != prefixes:
                return {"rank": self._rank, "need_full": True}
            full = dict(self._base[1])
            for path, entry in manifest.items():
                if entry is None:
                    full.pop(path, None)
                else:
                    full[path] = entry
            return self._diff(sync, full, prefixes)
        return self._diff(sync, {p: e for p, e in manifest.items() if e is not None}, prefixes)

    def _diff(self, sync: str, manifest: Manifest, prefixes: list[str]) -> dict[str, Any]:
        self._sync = sync
        self._manifest = manifest
        self._prefixes = prefixes
        self._local = local = self._scan_host(prefixes)
        have = {e[1] for e in local.values() if e[0] == "f"}
        missing: dict[str, int] = {}
        write = 0
        for path, entry in manifest.items():
            if entry[0] != "f":
                continue
            cur = local.get(path)
            if cur is not None and cur[0] == "f" and cur[1] == entry[1]:
                continue
            write += entry[3]
            if entry[1] not in have:
                missing[entry[1]] = entry[3]
        need = write + sum(missing.values())
        return {
            "rank": self._rank,
            "root": str(self._root),
            "where": self._where(),
            "missing": sorted(missing),
            "need": need,
            "free": _free_bytes(self._root),
        }

    @endpoint
    async def prepare(self, sync: str, needs: dict[int, list[str]]) -> None:
        """The contents each host lacks (by rank), for forwarding down the tree."""
        self._check(sync)
        self._needs = {rank: set(d) for rank, d in needs.items()}
        self._staging = self._root / STATE_DIR / f"staging-{os.getpid()}-{sync[:8]}"
        self._staged = {}

    def _check(self, sync: str) -> None:
        if sync != self._sync:
            raise RuntimeError(
                f"sync_workspace: {self._where()} got a step of sync {sync} while it "
                f"was in sync {self._sync}: two syncs of the same hosts ran at once; "
                "run one at a time"
            )

    def _subtree(self, rank: int) -> set[str]:
        todo, out = [rank], set()
        while todo:
            r = todo.pop()
            if r < self._size:
                out |= self._needs.get(r, set())
                todo += [2 * r + 1, 2 * r + 2]
        return out

    @endpoint
    async def receive(
        self, sync: str, items: list[tuple[str, int, int, int]], data: bytes
    ) -> list[dict[str, Any]]:
        """A batch of contents: ``items`` are ``(digest, offset in the file, start in
        data, length)``. Stage those this host lacks, forward to each child what its
        subtree lacks; answer the failures (this host's and its subtree's)."""
        self._check(sync)
        failures: list[dict[str, Any]] = []
        mine = self._needs.get(self._rank, set())
        view = memoryview(data)
        try:
            self._stage([it for it in items if it[0] in mine], view)
        except OSError as e:
            failures.append(self._failure(e, staging=True))
        children = [c for c in (2 * self._rank + 1, 2 * self._rank + 2) if c < self._size]
        sends = []
        for child in children:
            wanted = self._subtree(child)
            picked = [it for it in items if it[0] in wanted]
            if not picked:
                continue
            if len(picked) == len(items):
                sub_items, sub_data = items, data
            else:
                parts, sub_items, at = [], [], 0
                for digest, offset, start, length in picked:
                    parts.append(view[start : start + length])
                    sub_items.append((digest, offset, at, length))
                    at += length
                sub_data = b"".join(parts)
            target = self._tree.slice(rank=child)
            sends.append(target.receive.call_one(sync, sub_items, sub_data))
        for sent in sends:
            failures.extend(await sent)
        return failures

    def _failure(self, e: OSError, staging: bool = False) -> dict[str, Any]:
        return {
            "rank": self._rank,
            "where": self._where(),
            "root": str(self._root),
            "nospace": e.errno in (errno.ENOSPC, errno.EDQUOT),
            "staging": staging,
            "error": f"{type(e).__name__}: {e}",
        }

    def _stage(self, items: list[tuple[str, int, int, int]], view: memoryview) -> None:
        if not items:
            return
        assert self._staging is not None
        self._staging.mkdir(parents=True, exist_ok=True)
        for digest, offset, start, length in items:
            path = str(self._staging / digest)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                done = 0
                while done < length:
                    done += os.pwrite(fd, view[start + done : start + length], offset + done)
            finally:
                os.close(fd)
            self._staged[digest] = path

    @endpoint
    async def abort(self, sync: str) -> None:
        """Drop what a sync that failed staged here."""
        if sync == self._sync:
            self._cleanup()

    @endpoint
    async def apply(self, sync: str) -> dict[str, Any]:
        """Make this host's copy the client's manifest; answer the paths written or
        deleted (or the failure)."""
        self._check(sync)
        self._base = None
        try:
            changed = self._apply()
        except OSError as e:
            return {"rank": self._rank, "failure": self._failure(e)}
        finally:
            self._cleanup()
        self._base = (sync, self._manifest, self._prefixes)
        return {"rank": self._rank, "root": str(self._root), "changed": changed}

    def _safe(self, rel: str) -> str:
        """The host path of ``rel``, refusing one whose directory leads outside the
        workspace directory (through a link)."""
        path = os.path.join(self._root, *rel.split("/")) if rel else str(self._root)
        parent = os.path.realpath(os.path.dirname(path))
        if not _within(parent, os.path.realpath(self._root)):
            raise WorkspacePathError(
                f"sync_workspace: on {self._where()}, {path} is reached through a link "
                f"that leaves the workspace directory {self._root}; refusing to write there"
            )
        return path

    def _apply(self) -> list[str]:
        manifest, local, root = self._manifest, self._local, self._root
        root.mkdir(parents=True, exist_ok=True)
        # The contents copied from elsewhere in this host's copy: secured (hard-linked,
        # or copied) into staging first, since deletions and rewrites may remove them.
        by_digest = {e[1]: p for p, e in local.items() if e[0] == "f"}
        sources: dict[str, str] = {}
        for path, entry in manifest.items():
            if entry[0] != "f" or entry[1] in sources:
                continue
            cur = local.get(path)
            if cur is not None and cur[0] == "f" and cur[1] == entry[1]:
                continue
            staged = self._staged.get(entry[1])
            if staged is not None:
                if _file_digest(staged) != entry[1]:
                    raise OSError(
                        errno.EIO,
                        f"the content of {path} arrived damaged (sha256 differs); sync again",
                    )
                sources[entry[1]] = staged
                continue
            have = by_digest.get(entry[1])
            if have is None:
                raise OSError(
                    errno.ENOENT,
                    f"the content of {path} is neither staged nor elsewhere in the copy: "
                    "the host's copy changed during the sync; sync again",
                )
            assert self._staging is not None
            self._staging.mkdir(parents=True, exist_ok=True)
            keep = str(self._staging / entry[1])
            src = self._safe(have)
            try:
                os.link(src, keep)
            except OSError:
                shutil.copyfile(src, keep)
            sources[entry[1]] = keep
        changed: list[str] = []
        # Deletions, deepest first.
        for path in sorted(local, key=lambda p: p.count("/"), reverse=True):
            want = manifest.get(path)
            cur = local[path]
            # Kept: what the client has too, unless a directory (or something else)
            # stands where a file or link goes (files and links are replaced whole).
            if want is not None and cur[0] != "?" and (cur[0] == "d") == (want[0] == "d"):
                continue
            host = self._safe(path)
            _remove(host)
            _drop_bytecode(host)
            if cur[0] != "d":
                changed.append(path)
        # Directories, shallowest first; then files and links.
        for path in sorted(manifest, key=lambda p: p.count("/")):
            entry = manifest[path]
            if entry[0] != "d":
                continue
            host = self._safe(path)
            if os.path.lexists(host) and not os.path.isdir(host):
                _remove(host)
            os.makedirs(host, exist_ok=True)
            cur = local.get(path)
            if cur is None or cur[2] != entry[2]:
                os.chmod(host, entry[2] | stat.S_IRWXU)
        for path, entry in manifest.items():
            kind = entry[0]
            if kind == "d":
                continue
            cur = local.get(path)
            if cur == entry:
                continue
            host = self._safe(path)
            if kind == "f" and cur is not None and cur[0] == "f" and cur[1] == entry[1]:
                os.chmod(host, entry[2])  # the mode alone changed
                continue
            os.makedirs(os.path.dirname(host), exist_ok=True)
            tmp = os.path.join(
                os.path.dirname(host), f".{os.path.basename(host)}.monarch-{uuid.uuid4().hex[:8]}"
            )
            try:
                if kind == "f":
                    shutil.copyfile(sources[entry[1]], tmp)
                    os.chmod(tmp, entry[2])
                else:
                    os.symlink(entry[1], tmp)
                if os.path.isdir(host) and not os.path.islink(host):
                    shutil.rmtree(host)
                os.replace(tmp, host)
            except BaseException:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                raise
            _drop_bytecode(host)
            if kind == "f":  # known content: the next scan need not read it
                st = os.lstat(host)
                self._cache[host] = (
                    st.st_mtime_ns,
                    st.st_size,
                    st.st_ino,
                    st.st_ctime_ns,
                    entry[1],
                )
            changed.append(path)
        return changed

    def _cleanup(self) -> None:
        staging, self._staging = self._staging, None
        self._staged = {}
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
            try:
                staging.parent.rmdir()  # .monarch-sync, when nothing else is there
            except OSError:
                pass


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class WorkspaceReloader(Actor):
    """Put on every proc of a proc mesh by ``sync_workspace(auto_reload=True)``: takes
    the synced directories onto ``sys.path`` and reloads the modules whose files
    changed (upstream's ``AutoReloadActor``)."""

    @endpoint
    def reload(self, spec: dict[str, Any], changed: list[str]) -> list[str]:
        """Use the directories of ``spec``; ``importlib.reload`` every imported module
        whose file is one of ``changed`` (paths under the workspace directory); answer
        their names."""
        _use_synced(spec)
        root = workspace_root()
        files = {os.path.realpath(root / p) for p in changed}
        reloaded = []
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if module is None or not file or os.path.realpath(file) not in files:
                continue
            importlib.reload(module)
            reloaded.append(name)
        return reloaded


# --- the client side ---------------------------------------------------------------------


class _MeshState:
    """What a host mesh keeps of its syncs: the ``code_sync`` procs and their actors,
    the synced directories (for the procs spawned later), the reloaders."""

    def __init__(self) -> None:
        self.procs: Any = None
        self.hosts: Any = None
        self.tree: Any = None
        self.roots: dict[int, str] = {}
        self.spec: dict[str, Any] = {"dirs": [], "env": False}
        self.reloaders: dict[int, tuple[Any, Any]] = {}
        self.busy = False
        self.last: SyncStats | None = None
        #: The last sync every host applied: its id, manifest and prefixes.
        self.base: tuple[str, Manifest, list[str]] | None = None


def _state(mesh: Any) -> _MeshState:
    state: _MeshState | None = mesh.__dict__.get("_workspace_sync")
    if state is None:
        state = _MeshState()
        mesh.__dict__["_workspace_sync"] = state
    return state


def spawn_variables(mesh: Any) -> dict[str, str]:
    """The variables a proc spawned on host mesh ``mesh`` gets from its syncs: what was
    synced (see :func:`apply_to_this_proc`), or nothing before any sync."""
    state = mesh.__dict__.get("_workspace_sync")
    if state is None or not (state.spec["dirs"] or state.spec["env"]):
        return {}
    return {SYNCED_ENV: json.dumps(state.spec)}


async def _hosts(mesh: Any, state: _MeshState) -> Any:
    """The mesh's ``WorkspaceHost`` actors (spawned on first use, and again after the
    mesh's procs were stopped), flattened to one ``rank`` dimension."""
    if state.procs is not None and not state.procs._stopped:
        return state.tree
    procs = mesh.spawn_procs(name="code_sync")
    hosts = procs.spawn("code_sync", WorkspaceHost)
    tree = hosts.flatten("rank") if len(hosts._labels) else hosts
    answers = (await _answer("starting the hosts' side", tree.setup.call(tree))).values()
    state.procs, state.hosts, state.tree = procs, hosts, tree
    state.roots = {a["rank"]: a["root"] for a in answers}
    state.reloaders = {}
    state.base = None
    return tree


#: A batch of contents: ``(digest, offset in the file, start in data, length)`` items,
#: and the data.
_Batch = tuple[list[tuple[str, int, int, int]], bytes]


def _batches(missing: dict[str, int], sources: dict[str, str]) -> Iterator[_Batch]:
    """The contents of ``missing`` (digest -> size), read from ``sources``, in batches
    of at most :data:`BATCH_BYTES` (a large file in pieces)."""
    items: list[tuple[str, int, int, int]] = []
    parts: list[bytes] = []
    size = 0
    for digest in sorted(missing):
        path = sources[digest]
        with open(path, "rb") as f:
            offset = 0
            while True:
                chunk = f.read(min(BATCH_BYTES - size, BATCH_BYTES))
                if not chunk and offset > 0:
                    break
                items.append((digest, offset, size, len(chunk)))
                parts.append(chunk)
                size += len(chunk)
                offset += len(chunk)
                if size >= BATCH_BYTES:
                    yield items, b"".join(parts)
                    items, parts, size = [], [], 0
                if not chunk:
                    break
    if items:
        yield items, b"".join(parts)


def _next_batch(batches: Iterator[_Batch]) -> _Batch | None:
    return next(batches, None)


def _raise_failures(failures: list[dict[str, Any]], need: dict[int, int]) -> None:
    if not failures:
        return
    first = failures[0]
    others = f" ({len(failures) - 1} more hosts failed too)" if len(failures) > 1 else ""
    if first.get("staging"):
        doing = "receiving the files it lacks"
        state = "nothing was applied on any host"
    else:
        doing = "writing the files"
        state = "its copy may be partly updated (each file whole or not at all)"
    if first.get("nospace"):
        raise HostOutOfSpaceError(
            f"sync_workspace: {first['where']} ran out of space (bytes or inodes) "
            f"{doing} into its workspace directory {first['root']} (the sync needs about "
            f"{need.get(first['rank'], 0)} bytes there): {first['error']}{others}; "
            f"{state}: free space on that host (or set WORKSPACE_DIR of its worker to a "
            "larger disk) and sync again"
        )
    raise RuntimeError(
        f"sync_workspace: {first['where']} failed {doing} into its workspace directory "
        f"{first['root']}: {first['error']}{others}; {state}: fix the cause on that host "
        "and sync again"
    )


async def sync_workspace(mesh: Any, workspace: Workspace, conda: bool, auto_reload: bool) -> None:
    """``HostMesh.sync_workspace``: see the module's documentation."""
    if not isinstance(workspace, Workspace):
        raise TypeError(
            f"sync_workspace: expected a monarch.tools.config.Workspace, got "
            f"{type(workspace).__name__} ({workspace!r}); e.g. "
            "Workspace(dirs=['/path/to/project'])"
        )
    if not mesh._owned:
        raise RuntimeError(
            "cannot call sync_workspace on a sliced host mesh or one that was sent over an "
            "actor endpoint"
        )
    state = _state(mesh)
    if state.busy:
        raise RuntimeError(
            f"sync_workspace: a sync of {mesh!r} is already running; await it before "
            "starting another"
        )
    state.busy = True
    try:
        state.last = await _sync(mesh, state, workspace, conda, auto_reload)
    finally:
        state.busy = False


async def _sync(
    mesh: Any, state: _MeshState, workspace: Workspace, conda: bool, auto_reload: bool
) -> SyncStats:
    local = await asyncio.to_thread(local_manifest, workspace, conda)
    stats = SyncStats(files=sum(1 for e in local.manifest.values() if e[0] != "d"))
    tree = await _hosts(mesh, state)
    sync = uuid.uuid4().hex
    base, state.base = state.base, None
    diffs: list[dict[str, Any]] = []
    if base is not None and base[2] == local.prefixes:
        # Only what changed since the last sync, which every host applied.
        delta: dict[str, Entry | None] = {
            p: e for p, e in local.manifest.items() if base[1].get(p) != e
        }
        delta.update({p: None for p in base[1] if p not in local.manifest})
        stats.manifest_bytes = len(pickle.dumps(delta))
        asked = tree.diff.call(sync, delta, local.prefixes, base[0])
        diffs = (await _answer("comparing manifests", asked)).values()
    if not diffs or any(d.get("need_full") for d in diffs):
        stats.manifest_bytes += len(pickle.dumps(local.manifest))
        asked = tree.diff.call(sync, local.manifest, local.prefixes, None)
        diffs = (await _answer("comparing manifests", asked)).values()
    need = {d["rank"]: d["need"] for d in diffs}
    short = [d for d in diffs if d["need"] > d["free"]]
    if short:
        d = short[0]
        others = f" ({len(short) - 1} more hosts lack space too)" if len(short) > 1 else ""
        raise HostOutOfSpaceError(
            f"sync_workspace: {d['where']} has {d['free']} bytes free in its workspace "
            f"directory {d['root']}, and the sync needs {d['need']} bytes there{others}; "
            "nothing was sent: free space on that host (or set WORKSPACE_DIR of its worker "
            "to a larger disk) and sync again"
        )
    try:
        results = await _transfer(tree, sync, local, diffs, need, stats)
    except BaseException:
        try:
            await _answer("dropping what was staged", tree.abort.call(sync))
        except Exception:  # the hosts' next sync drops it anyway
            pass
        raise
    state.base = (sync, local.manifest, local.prefixes)
    stats.changed = {r["rank"]: r["changed"] for r in results}
    stats.roots = {r["rank"]: r["root"] for r in results}
    state.spec = _merged_spec(state.spec, local.spec)
    if auto_reload:
        changed = sorted({p for r in results for p in r["changed"]})
        stats.reloaded = await _reload(mesh, state, changed)
    return stats


async def _transfer(
    tree: Any,
    sync: str,
    local: _Local,
    diffs: list[dict[str, Any]],
    need: dict[int, int],
    stats: SyncStats,
) -> list[dict[str, Any]]:
    """Send what the hosts lack down the host tree, then have every host apply the
    manifest; the hosts' answers to ``apply``."""
    missing: dict[str, int] = {}
    sizes = {e[1]: e[3] for e in local.manifest.values() if e[0] == "f"}
    for d in diffs:
        for digest in d["missing"]:
            missing[digest] = sizes[digest]
    if missing:
        needs = {d["rank"]: d["missing"] for d in diffs}
        await _answer("preparing the transfer", tree.prepare.call(sync, needs))
        root = tree.slice(rank=0) if "rank" in tree._labels else tree
        failures: list[dict[str, Any]] = []
        pending: list[Any] = []
        batches = _batches(missing, local.sources)
        while True:
            batch = await asyncio.to_thread(_next_batch, batches)
            if batch is None:
                break
            items, data = batch
            stats.sent_bytes += len(data)
            pending.append(root.receive.call_one(sync, items, data))
            if len(pending) >= WINDOW:
                failures.extend(await _answer("sending files", pending.pop(0)))
                if failures:
                    break
        for sent in pending:
            failures.extend(await _answer("sending files", sent))
        stats.sent_files = len(missing)
        _raise_failures(failures, need)
    applied = await _answer("applying the manifest", tree.apply.call(sync))
    results: list[dict[str, Any]] = applied.values()
    _raise_failures([r["failure"] for r in results if "failure" in r], need)
    return results


#: The longest a step of a sync waits for the hosts' answers, in seconds (a host that
#: fails or is cut off fails the step sooner, with ``SupervisionError``).
STEP_TIMEOUT = 600.0


async def _answer(step: str, future: Any) -> Any:
    """``await future`` (the hosts' answer to one step of a sync), for at most
    :data:`STEP_TIMEOUT` seconds."""

    async def wait() -> Any:
        return await future

    try:
        return await asyncio.wait_for(wait(), STEP_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(
            f"sync_workspace: {step} got no answer from the hosts within {STEP_TIMEOUT:g} s "
            "while they still answer heartbeats: a host's sync proc (code_sync) is stuck; "
            "see its worker's log, then sync again"
        ) from None


def _merged_spec(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    dirs = list(new["dirs"]) + [d for d in old["dirs"] if d not in new["dirs"]]
    return {"dirs": dirs, "env": bool(old["env"] or new["env"])}


async def _reload(mesh: Any, state: _MeshState, changed: list[str]) -> list[list[list[str]]]:
    """Every running proc mesh spawned on ``mesh`` (but the sync's own): the synced
    directories on ``sys.path``, the changed modules reloaded."""
    out = []
    for procs in list(mesh._spawned):
        if procs is state.procs or procs._stopped:
            continue
        held = state.reloaders.get(id(procs))
        if held is None or held[0] is not procs:
            held = (procs, procs.spawn("workspace_reloader", WorkspaceReloader))
            state.reloaders[id(procs)] = held
        answers = await _answer("reloading modules", held[1].reload.call(state.spec, changed))
        out.append([list(v) for v in answers.values()])
    return out
