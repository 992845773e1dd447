"""The job contract: :class:`JobTrait` (apply, state, kill, and saving a job to a file),
the :class:`JobState` its ``state()`` returns, and the state cache behind ``state()``
(:data:`DEFAULT_JOB_PATH`, :func:`job_load`, :func:`job_loads`).

The invariants JOB-1 and JOB-2 of :mod:`monarch._src.job.job` are kept here; the job
types (:mod:`monarch._src.job.local`, :mod:`monarch._src.job.process`, Slurm,
Kubernetes) build on this module.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import uuid
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from monarch._src.job import mount_spec
from monarch._src.job.telemetry import (
    MeshAdminConfig,
    TelemetryConfig,
    config_from_kwargs,
    start_for_state,
)

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import HostMesh

__all__ = ["DEFAULT_JOB_PATH", "JobState", "JobTrait", "job_load", "job_loads"]

#: Where ``state()`` caches the applied job, relative to the working directory.
DEFAULT_JOB_PATH: str = ".monarch/job_state.pkl"

#: The logger of ``monarch._src.job.job``, where this code lived: one name for every
#: part of the job module, so that logging settings made for it keep applying.
logger = logging.getLogger("monarch._src.job.job")


class JobState:
    """The host meshes of an applied job, by name: ``state.trainers`` (or
    ``state["trainers"]``) is the :class:`~monarch.actor.HostMesh` named ``trainers``.
    Iterating gives the names; ``in`` tests one."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts: dict[str, HostMesh] = dict(hosts)
        #: The admin server's URL (with its token) when ``enable_admin()`` or
        #: ``enable_telemetry()`` is on: ``monarch top URL`` and the JSON API.
        self.admin_url: str | None = None
        #: The web dashboard's URL (with its token), when monitoring is on.
        self.dashboard_url: str | None = None
        #: The admin server's base URL, when monitoring is on.
        self.telemetry_url: str | None = None
        #: Upstream's SQL query engine over telemetry tables: not provided (``None``).
        self.query_engine: object | None = None
        self.query_engine_client: object | None = None

    def __getattr__(self, name: str) -> HostMesh:
        # Only reached for names that are not real attributes. Dunder lookups (copy,
        # pickle) and a half-built object must not recurse into ``_hosts``.
        hosts: dict[str, HostMesh] | None = self.__dict__.get("_hosts")
        if hosts is None or name.startswith("__"):
            raise AttributeError(name)
        try:
            return hosts[name]
        except KeyError:
            raise AttributeError(self._unknown(name)) from None

    def __getitem__(self, name: str) -> HostMesh:
        try:
            return self._hosts[name]
        except KeyError:
            raise KeyError(self._unknown(name)) from None

    def _unknown(self, name: str) -> str:
        available = ", ".join(repr(n) for n in self._hosts) or "none"
        return f"this job has no host mesh named {name!r}; its meshes are: {available}"

    def __contains__(self, name: object) -> bool:
        return name in self._hosts

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._hosts))

    def __repr__(self) -> str:
        meshes = ", ".join(f"{name}={mesh!r}" for name, mesh in self._hosts.items())
        return f"JobState({meshes})"


@dataclass(frozen=True)
class _Reconnected:
    """The status of a job that ``state()`` connected to a saved job's allocation."""

    job: JobTrait


_Status = Literal["not_running", "running"] | _Reconnected


class JobTrait(ABC):
    """A job: a specification of named host meshes, and the allocation applying it
    creates (see the module docs).

    Subclasses call ``super().__init__()`` and implement:

    - ``_create(client_script)``: start the allocation (workers, a scheduler job).
      ``client_script`` is a script to run inside the allocation (batch mode); a job
      type that cannot do that raises :class:`RuntimeError` for a script.
    - ``_state()``: connect to the running allocation and return its meshes.
    - ``can_run(spec)``: whether this job's (running) allocation can serve ``spec``,
      for reusing a cached job.
    - ``_kill()``: end the allocation.

    Subclasses must not set the status themselves: ``apply()`` marks the job running
    once ``_create`` returns, ``kill()`` marks it stopped. A job object is not
    thread-safe.
    """

    # Class-level defaults, so that a job unpickled from an older layout still works.
    _status: _Status = "not_running"
    _apply_id: str | None = None
    _admin: MeshAdminConfig | None = None
    _telemetry: TelemetryConfig | None = None
    #: Where this (running) job was last saved with ``dump`` (or reconnected from by
    #: ``state()``), for saving it again when its allocation grows (``add_mesh``).
    _saved_at: str | None = None
    #: The mounts ``state()`` applies (``remote_mount``, ``gather_mount``).
    _remote_mounts: tuple[mount_spec.RemoteMount, ...] = ()
    _gather_mounts: tuple[mount_spec.GatherMount, ...] = ()
    #: Set on the copy a job saves for its batch-mode client script
    #: (``apply(client_script=...)``): inside that script (``MONARCH_BATCH_JOB=1``),
    #: ``state()`` of any job uses it, whatever the script's own job asks for.
    _batch: bool = False
    #: Whether ``kill()`` ends the hosts ``state()`` hands out (and so every proc on
    #: them); not so for a job whose hosts are this machine (``LocalJob``).
    _kill_ends_hosts: bool = True

    def __init__(self) -> None:
        self._status = "not_running"
        self._apply_id = None

    @property
    def _running(self) -> JobTrait | None:
        """The job whose allocation this one uses: itself once applied, the saved job
        once reconnected to one, ``None`` when inactive."""
        status = self._status
        if isinstance(status, _Reconnected):
            return status.job
        return self if status == "running" else None

    @property
    def active(self) -> bool:
        """Whether this job is applied (or reconnected to a saved one) and not killed.
        Stays true when the allocation died on its own: ``state()`` then raises."""
        return self._running is not None

    @property
    def apply_id(self) -> str | None:
        """A fresh uuid for each allocation ``apply()`` creates (a reconnected job
        reports the saved job's); ``None`` while inactive."""
        running = self._running
        return None if running is None else running._apply_id

    def apply(self, client_script: str | None = None) -> None:
        """Create the allocation, unless this job is active (then a no-op).

        ``client_script`` asks the job to run that script inside the allocation (batch
        mode): the job is saved at ``.monarch/job_state.pkl`` and the script runs with
        ``MONARCH_BATCH_JOB=1``, where ``state()`` of any job returns this one's meshes.
        Job types that cannot raise :class:`RuntimeError`, as ``ProcessJob`` does.
        """
        if self._running is not None:
            return
        self._create(client_script)
        self._apply_id = str(uuid.uuid4())
        self._status = "running"

    def enable_admin(self, config: MeshAdminConfig | None = None, **kwargs: Any) -> JobTrait:
        """Serve the admin server (JSON API, ``/metrics``, the dashboard) from the
        process that calls ``state()``; its URL is ``state().admin_url``. Takes a
        :class:`MeshAdminConfig` or its fields as keywords. Returns the job."""
        self._admin = config_from_kwargs(MeshAdminConfig, config, kwargs, "enable_admin")
        return self

    def enable_telemetry(
        self,
        config: TelemetryConfig | None = None,
        *,
        mesh_admin_config: MeshAdminConfig | None = None,
        **kwargs: Any,
    ) -> JobTrait:
        """Turn monitoring on: ``state()`` starts the admin server and the dashboard
        (``state().dashboard_url``; printed when ``include_dashboard``). Takes a
        :class:`TelemetryConfig` or its fields as keywords, and optionally the admin
        server's settings. Returns the job."""
        self._telemetry = config_from_kwargs(TelemetryConfig, config, kwargs, "enable_telemetry")
        if mesh_admin_config is not None:
            self.enable_admin(mesh_admin_config)
        return self

    def remote_mount(
        self,
        source: str,
        mntpoint: str | None = None,
        meshes: list[str] | None = None,
        python_exe: str | None = ".venv/bin/python",
        **kwargs: Any,
    ) -> None:
        """Make the directory ``source`` of this machine appear, read-only, at
        ``mntpoint`` (default: the same path) on every host of ``meshes`` (default:
        all), from the next ``state()`` on, each ``state()`` refreshing it.

        With ``python_exe`` (a path inside ``source``; ``None`` for none), the meshes
        ``state()`` returns start their procs with that interpreter inside the mount:
        the client's virtual environment on every host.

        Here the directory is copied at each ``state()`` (upstream Monarch serves it
        live through FUSE); ``kwargs``, the FUSE mount's options there, are ignored
        with a warning.

        Raises:
            ValueError: ``source`` is not a directory, or ``python_exe`` is not a file
                in it.
        """
        if kwargs:
            warnings.warn(
                f"remote_mount: options {sorted(kwargs)} configure upstream Monarch's FUSE "
                "mount; ignored here, where the directory is copied at each state()",
                UserWarning,
                stacklevel=2,
            )
        mount = mount_spec.remote_mount(source, mntpoint, meshes, python_exe)
        self._remote_mounts = (*self._remote_mounts, mount)

    def gather_mount(
        self, remote_mount_point: str, local_mount_point: str, meshes: list[str] | None = None
    ) -> None:
        """Make the directory ``remote_mount_point`` of every host of ``meshes``
        (default: all) appear, read-only, under ``local_mount_point`` on this machine,
        from the next ``state()`` on: one sub-directory per host named after its
        coordinates (``hosts_0``), or the directory itself for a mesh of one host
        without dimensions. ``$SUBDIR`` in ``remote_mount_point`` is replaced, on each
        host, by that name.

        Here each ``state()`` copies the hosts' directories (upstream Monarch serves
        them live through FUSE).
        """
        mount = mount_spec.gather_mount(remote_mount_point, local_mount_point, meshes)
        self._gather_mounts = (*self._gather_mounts, mount)

    def _monitored(self, state: JobState) -> JobState:
        _note_handed_out(self, state)
        if self._remote_mounts or self._gather_mounts:
            from monarch._src.job import mounts  # the actor runtime: not on import

            state._hosts = mounts.apply_mounts(
                state._hosts, self._remote_mounts, self._gather_mounts
            )
        start_for_state(state, self._admin, self._telemetry)
        return state

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """Connect to the allocation and return its host meshes (JOB-2).

        When this job is active, that is its own (or reconnected) allocation, and the
        cache is neither read nor written. Otherwise, when ``cached_path`` holds a
        saved, active job that ``can_run`` this one, this job reconnects to it; when it
        holds one that cannot, that job is killed and the file deleted. Failing a
        reuse, this job is applied and, once connected, saved at ``cached_path``.
        ``cached_path=None`` never reads or writes a cache.

        Raises :class:`RuntimeError` when the allocation is gone (for ``ProcessJob``,
        when a worker process exited).
        """
        running = self._running
        if running is not None:
            return self._monitored(running._state())
        if cached_path is not None:
            cached = _load_cached(cached_path)
            if cached is not None:
                if _batch_client_of(cached) or _can_run(cached, self):
                    logger.info("reusing the job saved at %s", cached_path)
                    cached._saved_at = os.path.abspath(cached_path)
                    self._status = _Reconnected(cached)
                    return self._monitored(cached._state())
                logger.info("the job saved at %s cannot run this one; killing it", cached_path)
                try:
                    cached.kill()
                except Exception:
                    logger.warning("could not kill the job saved at %s", cached_path, exc_info=True)
                _remove(cached_path)
        self.apply()
        state = self._state()
        if cached_path is not None:
            self.dump(cached_path)
        return self._monitored(state)

    def kill(self) -> None:
        """End the allocation this job uses (its own, or the saved one it reconnected
        to). A no-op when inactive."""
        running = self._running
        if running is not None:
            # The procs on the allocation's hosts end with it: in this process their
            # meshes count as stopped first, so that their ends are no failures.
            reason = f"its job ({type(running).__name__}) was killed"
            if running._kill_ends_hosts:
                for host in _handed_out(self, running):
                    host._abandon(reason)
            running._kill()
            if running is not self:
                running._status = "not_running"
        self._status = "not_running"

    def dump(self, filename: str) -> None:
        """Save this job to ``filename`` (a pickle; parent directories are created; a
        symlink is followed), for :func:`job_load` or a later ``state()``. A
        ``ProcessJob`` saved this way keeps its workers running when this process
        exits: end them with ``kill()``."""
        target = os.path.realpath(filename) if os.path.islink(filename) else filename
        running = self._running
        before = None if running is None else running._saved_at
        if running is not None:
            running._saved_at = os.path.abspath(filename)
        try:
            data = pickle.dumps(self)
        except BaseException:
            if running is not None:
                running._saved_at = before
            raise
        directory = os.path.dirname(os.path.abspath(target))
        os.makedirs(directory, exist_ok=True)
        # Write beside the target and rename, so a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(prefix=".job-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            _remove(tmp)
            raise
        self._mark_saved()

    def dumps(self) -> bytes:
        """This job as bytes, for :func:`job_loads` (same effect as :meth:`dump`)."""
        data = pickle.dumps(self)
        self._mark_saved()
        return data

    def _mark_saved(self) -> None:
        running = self._running
        if running is not None:
            running._saved()

    def _saved(self) -> None:
        """Called once this (running) job was saved: what the allocation would have
        ended at this process's exit may now outlive it. Default: nothing."""
        return None

    def _save_again(self) -> None:
        """Save this running job again at the path it was last saved at (``dump``, or
        the cache ``state()`` wrote or reconnected through) after its allocation
        changed (``add_mesh``), as long as that file still holds this allocation (the
        same ``apply_id``): a file that now holds another job is left alone."""
        path = self._saved_at
        if path is None:
            return
        saved = _load_cached(path)
        if saved is None or saved.apply_id != self.apply_id:
            logger.info("not saving the job again at %s: the file holds another job", path)
            return
        self.dump(path)

    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Start the allocation (see the class docs)."""

    @abstractmethod
    def _state(self) -> JobState:
        """Connect to the running allocation and return its host meshes."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's allocation is running and can serve ``spec`` (a job
        specification not yet applied), so that ``spec.state()`` may reuse it."""

    @abstractmethod
    def _kill(self) -> None:
        """End the allocation."""


def _refuse_batch(job: JobTrait, client_script: str | None) -> None:
    if client_script is not None:
        raise RuntimeError(
            f"batch mode is not supported by {type(job).__name__}: it cannot run "
            f"apply(client_script={client_script!r}) inside its allocation; run the "
            "script yourself instead (it connects with job.state())"
        )


def _load_cached(path: str) -> JobTrait | None:
    """The job whose allocation the job saved at ``path`` uses (itself, or the one it
    reconnected to), if any: a missing file, an unreadable one or an inactive job mean
    none (the file is overwritten once this job is applied)."""
    try:
        job = job_load(path)
    except FileNotFoundError:
        return None
    except Exception:
        logger.warning("ignoring the unreadable job cache at %s", path, exc_info=True)
        return None
    return job._running


#: The host meshes ``state()`` handed out in this process, by job (weakly: neither
#: the jobs nor the meshes are kept alive by this), for ``kill()``.
_handed: weakref.WeakKeyDictionary[JobTrait, list[weakref.ref[Any]]] = weakref.WeakKeyDictionary()


def _note_handed_out(job: JobTrait, state: JobState) -> None:
    refs = _handed.setdefault(job, [])
    refs[:] = [r for r in refs if r() is not None]
    known = {id(r()) for r in refs}
    for host in state._hosts.values():
        if id(host) not in known and hasattr(host, "_abandon"):
            refs.append(weakref.ref(host))
            known.add(id(host))


def _handed_out(*jobs: JobTrait) -> list[Any]:
    hosts: dict[int, Any] = {}
    for job in jobs:
        for ref in _handed.get(job, ()):
            host = ref()
            if host is not None:
                hosts[id(host)] = host
    return list(hosts.values())


#: The environment variable a batch-mode client script runs with.
BATCH_ENV = "MONARCH_BATCH_JOB"


def _batch_client_of(cached: JobTrait) -> bool:
    """Whether this process is the batch-mode client script of the saved job ``cached``
    (which then serves every ``state()`` of the script)."""
    return cached._batch and os.environ.get(BATCH_ENV) == "1"


def _can_run(cached: JobTrait, spec: JobTrait) -> bool:
    try:
        return cached.can_run(spec)
    except Exception:
        logger.warning("the cached job %r failed can_run; not reusing it", cached, exc_info=True)
        return False


def _remove(path: str) -> None:
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        os.remove(target)
    except FileNotFoundError:
        pass


def job_loads(data: bytes) -> JobTrait:
    """The job :meth:`JobTrait.dumps` wrote. Only load data you trust: it is a
    pickle."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"expected a pickled job (a JobTrait), got {type(job).__name__}")
    return job


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job :meth:`JobTrait.dump` (or ``state()``) saved at ``filename``. Only load
    files you trust: they are pickles."""
    with open(filename, "rb") as f:
        data = f.read()
    try:
        return job_loads(data)
    except TypeError as e:
        raise TypeError(f"{filename}: {e}") from None
