"""The client's side of ``HostMesh.sync_workspace`` (see
:mod:`monarch._src.actor.code_sync`): what a host mesh keeps of its syncs, the steps of
one sync (manifests compared, contents sent in batches to the root of the host tree,
the manifest applied, modules reloaded), each bounded by :data:`STEP_TIMEOUT`, and the
errors the client raises for the hosts' failures.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import uuid
from collections.abc import Iterator
from typing import Any

from monarch._src.actor.code_sync_base import (
    BATCH_BYTES,
    SYNCED_ENV,
    WINDOW,
    Entry,
    HostOutOfSpaceError,
    Manifest,
    SyncStats,
)
from monarch._src.actor.code_sync_host import WorkspaceHost, WorkspaceReloader
from monarch._src.actor.code_sync_manifest import _Local, local_manifest
from monarch._src.actor.workspace import Workspace


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
