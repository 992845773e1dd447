"""The manifests of ``HostMesh.sync_workspace`` (see
:mod:`monarch._src.actor.code_sync`): a directory's files as path -> (kind, digest,
mode, size), read with a cache keyed by each file's stat; the checks of the workspace's
remote names and links; the client's merged manifest of a :class:`Workspace`.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch._src.actor.code_sync_base import (
    ENV_DIR,
    SKIP_DIRS,
    STATE_DIR,
    Manifest,
    WorkspacePathError,
)
from monarch._src.actor.workspace import CondaEnvironment, Workspace

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
