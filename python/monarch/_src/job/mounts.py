"""A job's mounts: ``JobTrait.remote_mount`` and ``JobTrait.gather_mount``.

Both are configuration: they take effect on each ``state()`` of the job, on the host
meshes it returns.

- A **remote mount** copies a directory of the client's machine to ``mntpoint`` on
  every host of the chosen meshes, read-only: files, links and modes, the tree replaced
  as a whole (a new copy is written beside the old one and swapped in). A host where
  ``mntpoint`` is the source directory itself (the client's own machine, same path) is
  left alone. With ``python_exe``, the meshes ``state()`` returns start their procs with
  that interpreter inside the mount (a virtual environment carried to the hosts).
- A **gather mount** copies a directory of every host of the chosen meshes to the
  client, under ``local``: one read-only sub-directory per host, named after its
  coordinates (``hosts_0``), or ``local`` itself for a mesh of one host without
  dimensions. ``$SUBDIR`` in the remote path is that name, on each host.

Upstream Monarch serves both through FUSE file systems that stay live; here they are
copies made at ``state()``: what changes afterwards is seen at the next ``state()``.
The copies travel as tar archives through actors on one proc per host, spawned for the
copy and stopped after it.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import socket
import stat
import tarfile
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from monarch._src.actor.actor import Actor
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import endpoint
from monarch._src.job.mount_spec import SUBDIR, GatherMount, RemoteMount

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import HostMesh

__all__ = ["MountHost", "apply_mounts"]

#: The size of the pieces a remote mount's archive travels in.
CHUNK_BYTES = 32 * 1024 * 1024
#: How long each step of a copy may take, in seconds.
STEP_TIMEOUT = 600.0


def _chosen(hosts: Mapping[str, HostMesh], meshes: tuple[str, ...] | None, what: str) -> list[str]:
    names = list(hosts) if meshes is None else list(meshes)
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise ValueError(
            f"{what}: the job has no mesh named {', '.join(map(repr, unknown))}; its meshes "
            f"are {sorted(hosts)}"
        )
    return names


def _same_dir_key(path: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (socket.gethostname(), st.st_dev, st.st_ino)


def _host_key() -> str:
    """This host's sub-directory name: its coordinates in its mesh (``hosts_0``)."""
    rank = context().actor_instance.rank
    return "_".join(f"{label}_{index}" for label, index in rank.items())


def _writable(path: str) -> None:
    """Make the read-only tree at ``path`` removable."""
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o755)


def _read_only(path: str) -> None:
    """Take the write bits off every file and directory under ``path``."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222)
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o555)
    os.chmod(path, 0o555)


def _remove(path: str) -> None:
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            _writable(path)
            shutil.rmtree(path)
        else:
            os.remove(path)


def _extract_replacing(archive: tarfile.TarFile, dest: str) -> None:
    """Unpack ``archive`` as the new tree at ``dest``, read-only, swapped in whole."""
    parent = os.path.dirname(dest) or "/"
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".monarch-mount-", dir=parent)
    try:
        archive.extractall(staging, filter="tar")  # links as they are (a venv's python)
        _read_only(staging)
        old = staging + "-old"  # staging's name is unique, so is this one
        if os.path.lexists(dest):
            os.rename(dest, old)
        os.rename(staging, dest)
        _remove(old)
    except BaseException:
        _remove(staging)
        raise


class MountHost(Actor):
    """The host side of the copies: receives a remote mount's archive in pieces and
    swaps the tree in; packs a directory for a gather mount."""

    def __init__(self) -> None:
        self._incoming: tempfile.SpooledTemporaryFile[bytes] | None = None
        self._dest: str | None = None
        self._copy = ""

    @endpoint
    def begin(self, mntpoint: str, source_key: tuple[str, int, int] | None, copy: str) -> bool:
        """Start receiving copy ``copy`` for ``mntpoint``; ``False`` when ``mntpoint``
        is the source directory itself (nothing to copy)."""
        self._copy = copy
        if source_key is not None and _same_dir_key(mntpoint) == source_key:
            self._incoming = self._dest = None  # the pieces that follow are dropped
            return False
        self._incoming = tempfile.SpooledTemporaryFile(max_size=CHUNK_BYTES)
        self._dest = mntpoint
        return True

    @endpoint
    def put(self, piece: bytes) -> None:
        if self._incoming is not None:
            self._incoming.write(piece)

    @endpoint
    def commit(self) -> int:
        """Swap the received tree in; the number of entries it holds."""
        incoming, dest = self._incoming, self._dest
        if incoming is None or dest is None:  # this host has the source itself
            return 0
        self._incoming = self._dest = None
        parent, name = os.path.split(dest)
        os.makedirs(parent, exist_ok=True)
        # Hosts that share a machine (or a file system) write it once: the first to
        # take the lock, the others find its copy's mark.
        mark = os.path.join(parent, f".{name}.monarch-mount")
        with incoming, open(mark + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(mark) as f:
                    if f.read() == self._copy:
                        return 0
            except FileNotFoundError:
                pass
            incoming.seek(0)
            with tarfile.open(fileobj=incoming, mode="r") as archive:
                count = len(archive.getmembers())
                _extract_replacing(archive, dest)
            with open(mark, "w") as f:
                f.write(self._copy)
        return count

    @endpoint
    def pack(self, remote: str) -> tuple[str, bytes]:
        """This host's sub-directory name and the archive of ``remote`` (``$SUBDIR``
        replaced by that name)."""
        key = _host_key()
        path = remote.replace(SUBDIR, key)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"gather_mount: {path!r} is not a directory on host {socket.gethostname()}"
            )
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as archive:
            archive.add(path, arcname=".")
        return key, buf.getvalue()


def _pieces(source: str) -> Iterator[bytes]:
    """The archive of ``source``, in pieces of at most :data:`CHUNK_BYTES`."""
    with tempfile.TemporaryFile() as tmp:
        with tarfile.open(fileobj=tmp, mode="w") as archive:
            archive.add(source, arcname=".")
        tmp.seek(0)
        while True:
            piece = tmp.read(CHUNK_BYTES)
            if not piece:
                return
            yield piece


def _copy_to_hosts(mount: RemoteMount, host_mesh: HostMesh) -> None:
    procs = host_mesh.spawn_procs(name="remote_mount")
    try:
        hosts = procs.spawn("remote_mount", MountHost)
        copy = uuid.uuid4().hex
        wanted = hosts.begin.call(mount.mntpoint, _same_dir_key(mount.source), copy).get(
            timeout=STEP_TIMEOUT
        )
        if not any(wanted.values()):
            return
        for piece in _pieces(mount.source):
            hosts.put.call(piece).get(timeout=STEP_TIMEOUT)
        hosts.commit.call().get(timeout=STEP_TIMEOUT)
    finally:
        procs.stop().get(timeout=STEP_TIMEOUT)


def _copy_from_hosts(mount: GatherMount, host_mesh: HostMesh) -> None:
    procs = host_mesh.spawn_procs(name="gather_mount")
    try:
        hosts = procs.spawn("gather_mount", MountHost)
        archives = hosts.pack.call(mount.remote).get(timeout=STEP_TIMEOUT)
    finally:
        procs.stop().get(timeout=STEP_TIMEOUT)
    for key, data in archives.values():
        dest = os.path.join(mount.local, key) if key else mount.local
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
            _extract_replacing(archive, dest)


def apply_mounts(
    hosts: Mapping[str, HostMesh],
    remotes: Sequence[RemoteMount],
    gathers: Sequence[GatherMount],
) -> dict[str, HostMesh]:
    """Make the copies of ``remotes`` and ``gathers`` on ``hosts`` (a job's meshes by
    name) and return the meshes, those with a mounted ``python_exe`` starting their
    procs with it."""
    out = dict(hosts)
    for mount in remotes:
        for name in _chosen(hosts, mount.meshes, "remote_mount"):
            _copy_to_hosts(mount, hosts[name])
            if mount.python_exe is not None:
                exe = os.path.join(mount.mntpoint, mount.python_exe)
                out[name] = out[name].with_python_executable(exe)
    for gather in gathers:
        for name in _chosen(hosts, gather.meshes, "gather_mount"):
            _copy_from_hosts(gather, hosts[name])
    return out
