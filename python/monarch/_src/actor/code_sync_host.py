"""The hosts' side of ``HostMesh.sync_workspace`` (see
:mod:`monarch._src.actor.code_sync`): :class:`WorkspaceHost`, the hidden actor that
keeps a host's copy of the workspace (compares manifests, stages the contents the host
lacks and forwards them down the host tree, applies the manifest), and
:class:`WorkspaceReloader`, which reloads the changed modules in running procs.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import shutil
import socket
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.code_sync_base import (
    STATE_DIR,
    Entry,
    Manifest,
    WorkspacePathError,
    _use_synced,
    workspace_root,
)
from monarch._src.actor.code_sync_manifest import _scan, _StatCache, _within
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import endpoint


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
