"""Jobs: where a Monarch program's hosts come from.

A job is a declarative *specification* of the host meshes a program needs ("two hosts
called ``trainers``"), plus, once applied, the *allocation* that satisfies it (the
processes, or the scheduler reservation, that run the workers). ``apply()`` brings the
allocation into existence (a no-op when it exists); ``state()`` connects to it and
returns a :class:`JobState`, whose attributes are the named :class:`HostMesh` objects;
``kill()`` ends it.

A job is picklable: :meth:`JobTrait.dump` writes it to a file, and a later process (or
the same one) loads it with :func:`job_load` and reconnects to the same allocation.
``state()`` uses this as a cache (by default ``.monarch/job_state.pkl``): run a script
twice and the second run reuses the first run's workers, as long as the saved job
:meth:`~JobTrait.can_run` the new specification.

Implementations here: :class:`LocalJob` (every mesh is this machine, ``this_host()``)
and :class:`ProcessJob` (worker processes on this machine, one per "host", for testing
multi-host code). Scheduler-backed jobs (Slurm, Kubernetes) fit the same trait: their
``_create`` submits the workers, ``_state`` reconnects with
``monarch.actor.attach_to_workers``, and ``can_run`` checks the reservation is alive.

Invariants (tests cite them):

- JOB-1: ``apply()`` creates at most one allocation per job object until ``kill()``;
  each allocation gets a fresh ``apply_id``.
- JOB-2: ``state()`` on a job that is not active reuses the job saved at
  ``cached_path`` exactly when that job is active and ``can_run`` this one; otherwise
  it kills the saved job, deletes the file, applies this job and saves it there.
- JOB-3: the workers of a ``ProcessJob`` end with ``kill()``; those never saved with
  ``dump``/``dumps`` also end when the process that started them exits.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import pickle
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import types
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from monarch._src.job import context
from monarch._src.job.telemetry import (
    MeshAdminConfig,
    TelemetryConfig,
    config_from_kwargs,
    start_for_state,
)

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import HostMesh

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
]

#: Where ``state()`` caches the applied job, relative to the working directory.
DEFAULT_JOB_PATH: str = ".monarch/job_state.pkl"

logger = logging.getLogger(__name__)


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
        mode); job types that cannot raise :class:`RuntimeError`, as ``LocalJob`` and
        ``ProcessJob`` do.
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

    def _monitored(self, state: JobState) -> JobState:
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
                if _can_run(cached, self):
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


_current_job: JobTrait | None = None


def set_current_job(job: JobTrait | str | None) -> None:
    """Make ``job`` the job :func:`load_current_job` returns.

    A job object is held for this process only (``None`` forgets it). A string
    ``"module.attr"`` (a job, or a function returning one) is recorded on disk as the
    spec of the current context of the ``monarch`` command (``.monarch/<context>/spec``,
    as ``monarch apply module.attr`` records it), for this and later processes; it
    replaces a job object set earlier. The string is checked by importing it.
    """
    global _current_job
    if isinstance(job, str):
        import_job(job)  # fails here, naming the problem, not at the next load
        context.write_spec(context.ensure_layout(), job)
        _current_job = None
        return
    if job is not None and not isinstance(job, JobTrait):
        raise TypeError(f"set_current_job expects a job (a JobTrait) or 'module.attr', got {job!r}")
    _current_job = job


def load_current_job() -> JobTrait:
    """The current job: the job object given to :func:`set_current_job`; else, in the
    current context of the ``monarch`` command (see ``monarch context``), the applied
    job saved at :data:`DEFAULT_JOB_PATH` when it is active and serves the context's
    recorded spec (or no spec is recorded); else a new job from that spec (not applied:
    its ``state()`` applies it and saves it there).

    Raises :class:`FileNotFoundError` when there is none of these.
    """
    if _current_job is not None:
        return _current_job
    name = context.current()
    spec = context.read_spec(name)
    saved = _load_cached(DEFAULT_JOB_PATH)
    if spec is None:
        if saved is not None:
            return saved
        raise FileNotFoundError(
            f"no current job: none was set with set_current_job(), and context {name!r} "
            f"has none ({os.path.join(os.getcwd(), DEFAULT_JOB_PATH)} does not exist); "
            "run `monarch apply module.attr` first (or `job.state()`, which saves the job "
            "there)"
        )
    job = import_job(spec)
    if saved is not None and _can_run(saved, job):
        return saved
    return job


def import_job(spec: str) -> JobTrait:
    """The job ``spec`` names: ``module.attr``, where ``attr`` is a job or a function
    that returns one (called without arguments). The working directory is on the
    import path."""
    module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"{spec!r} does not name a job: give module.attr, e.g. `monarch apply jobs.job` "
            "for the object `job` in jobs.py"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise ValueError(
                f"cannot import {module_name!r} for {spec!r}: no module {e.name!r} in "
                f"{cwd} or on the Python path; run the command from the directory that "
                "holds it"
            ) from e
        raise
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise ValueError(
            f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
            f"attribute {attr!r} for {spec!r}"
        ) from None
    what = value
    if not isinstance(value, JobTrait) and callable(value) and not isinstance(value, type):
        value = value()
    if not isinstance(value, JobTrait):
        got = type(value).__name__
        hint = ""
        if isinstance(what, types.ModuleType):
            hint = f"; {spec} is a module: name the job in it, e.g. {spec}.job"
        elif isinstance(what, type):
            got = f"the class {what.__name__}"
            hint = f"; make an instance in {module_name}, e.g. job = {what.__name__}(...)"
        raise TypeError(
            f"{spec} is not a job: expected a JobTrait (e.g. ProcessJob({{'hosts': 2}})) or "
            f"a function returning one, got {got}{hint}"
        )
    return value


def load_saved_job(name: str) -> JobTrait | None:
    """The job applied in context ``name``, or ``None`` when it has none."""
    path = context.state_path(name)
    try:
        return job_load(str(path))
    except FileNotFoundError:
        return None


def remove_context(name: str) -> JobTrait | None:
    """Kill the job of context ``name`` and delete the context; the job it killed. When
    ``name`` was current, ``default`` becomes current."""
    context.check_exists(name)
    job = load_saved_job(name)
    if job is not None:
        job.kill()
    context.delete(name)
    return job


class LocalJob(JobTrait):
    """Every named mesh is this machine: ``this_host()``, a 0-dimensional host mesh
    (no ``"hosts"`` dimension). Lets a program written against a job run locally by
    swapping the job. Nothing is started or killed; a cached ``LocalJob`` is never
    reused (a fresh one is as good)."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(
                f"LocalJob(hosts={hosts!r}): expected a sequence of mesh names, e.g. "
                "LocalJob(hosts=('trainers', 'dataloaders'))"
            )
        super().__init__()
        self._host_names: tuple[str, ...] = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        _refuse_batch(self, client_script)

    def _state(self) -> JobState:
        from monarch._src.actor.proc_mesh import this_host

        host = this_host()
        return JobState({name: host for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        """Never: a ``LocalJob`` has no allocation to reuse (``state()`` is always this
        machine, so there is nothing to save between programs).

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``False``.
        """
        return False

    def _kill(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalJob(hosts={self._host_names!r})"


@dataclass(frozen=True)
class _Worker:
    """One worker process of a ``ProcessJob``: what a later process needs to reach it
    and to tell it from an unrelated process that reused its pid."""

    mesh: str
    pid: int
    #: Its start time in clock ticks since boot (``/proc/<pid>/stat``), if known.
    started: int | None
    address: str
    #: The file its output goes to, or ``None`` when it writes to the client's.
    log: str | None = None

    def describe(self) -> str:
        where = f"; its output is in {self.log}" if self.log else ""
        return f"pid {self.pid} of mesh {self.mesh!r} at {self.address}{where}"

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log, if it has one."""
        if self.log is None:
            return ""
        try:
            with open(self.log, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return ""
        return "".join(tail)


#: The ``Popen`` of each worker this process started, by pid, until it is reaped: kept
#: here, not in the job, because a saved job outlives its object (and its pickle must not
#: hold one).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of ``pid`` from ``/proc``, or ``None`` if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is parenthesised and may hold anything: split after it.
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _is_running(worker: _Worker) -> bool:
    popen = _children.get(worker.pid)
    if popen is not None:
        if popen.poll() is None:
            return True
        del _children[worker.pid]  # reaped: its pid may be reused from now on
        return False
    stat = _proc_stat(worker.pid)
    if stat is None:
        if os.path.isdir("/proc"):
            return False
        try:  # no procfs: all we can ask is whether the pid exists
            os.kill(worker.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state, started = stat
    same = worker.started is None or worker.started == started
    return same and state not in ("Z", "X")


def _signal(worker: _Worker, sig: signal.Signals) -> None:
    """Signal the worker's process group (it leads one), if it is still that worker."""
    if not _is_running(worker):
        return
    try:
        os.killpg(worker.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(worker.pid, sig)
        except OSError:
            pass


def _wait_exited(workers: list[_Worker], timeout: float) -> list[_Worker]:
    """Wait up to ``timeout`` seconds for ``workers`` to exit; return those still
    running. Polls: a process that is not our child gives nothing to wait on."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        workers = [w for w in workers if _is_running(w)]
        if not workers or time.monotonic() >= deadline:
            return workers
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class _Workers:
    """The worker processes of one ``ProcessJob`` allocation, and the private directory
    holding their sockets. Plain data: pickled with the job."""

    def __init__(self, socket_dir: str) -> None:
        self.socket_dir = socket_dir
        self.meshes: dict[str, list[_Worker]] = {}

    def all(self) -> list[_Worker]:
        return [w for workers in self.meshes.values() for w in workers]

    def exited(self) -> list[_Worker]:
        return [w for w in self.all() if not _is_running(w)]

    def next_index(self) -> int:
        """The number of the next worker's files (``worker-<n>.sock``): past every
        worker started so far and every file in the directory, so that a worker added
        later never meets an old worker's files (a ready file left by one that was
        killed would read as its own)."""
        used = [len(self.all()) - 1]
        try:
            entries = os.listdir(self.socket_dir)
        except OSError:
            entries = []
        for entry in entries:
            number = entry.removeprefix("worker-").split(".", 1)[0]
            if entry.startswith("worker-") and number.isdigit():
                used.append(int(number))
        return max(used) + 1

    def stop(self, grace: float) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after ``grace``
        seconds, then remove the socket directory."""
        _stop_workers(self.all(), grace)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _stop_workers(workers: list[_Worker], grace: float) -> None:
    """SIGTERM the process group of each of ``workers``, SIGKILL what is left after
    ``grace`` seconds, and wait (``grace`` again) for them to exit."""
    live = [w for w in workers if _is_running(w)]
    for w in live:
        _signal(w, signal.SIGTERM)
    live = _wait_exited(live, grace)
    for w in live:
        _signal(w, signal.SIGKILL)
    live = _wait_exited(live, grace)
    if live:
        logger.warning(
            "ProcessJob workers still running after SIGKILL: %s",
            "; ".join(w.describe() for w in live),
        )


#: Worker groups started by this process and never saved: stopped at its exit (JOB-3).
_unsaved: set[_Workers] = set()


def _stop_unsaved_at_exit() -> None:
    # The client's own exit first, whatever the order the hooks were registered in (the
    # runtime may have started before this module was imported): it checks what became
    # of its procs, and workers ended under it would read as lost hosts.
    runtime = sys.modules.get("monarch._src.actor.runtime")
    if _unsaved and runtime is not None:
        runtime._shutdown_at_exit()
    for workers in list(_unsaved):
        try:
            workers.stop(ProcessJob.stop_grace)
        except Exception as e:  # at exit there is nobody left to raise to
            print(f"monarch.job: stopping ProcessJob workers failed: {e!r}", file=sys.stderr)
    _unsaved.clear()


# Registered when this module is imported, after ``import monarch`` registered its own
# hooks and usually before the actor runtime starts (and registers its shutdown): atexit
# runs hooks last-in first-out, so the client stops its procs before the workers go (and
# the hook runs the runtime's first when it was registered earlier).
atexit.register(_stop_unsaved_at_exit)


def _valid_mesh(name: object, count: object) -> bool:
    """Whether ``name`` and ``count`` make a mesh of a ``ProcessJob``: a non-empty name
    and a positive number of hosts."""
    return (
        isinstance(name, str)
        and bool(name)
        and isinstance(count, int)
        and not isinstance(count, bool)
        and count >= 1
    )


#: Longest Unix socket path (``sun_path`` holds 108 bytes with the terminating NUL).
_MAX_SOCKET_PATH = 107

#: ``monarch._src.actor.workers.READY_FILE_ENV`` (not imported: it loads the runtime).
_READY_FILE_ENV = "MONARCH_WORKER_READY_FILE"


def _ready_file(address: str) -> str:
    """The file a ``ProcessJob`` worker at ``address`` creates once it serves."""
    return address.removeprefix("ipc://").removesuffix(".sock") + ".ready"


def _inherit_output() -> bool:
    """Whether workers may write to this process's stdout and stderr: not when either
    is a pipe or a socket, which a worker outliving this process (a saved job's) would
    hold open, so that a reader (``| tee``, ``subprocess.run(capture_output=True)``)
    would wait for it."""
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            return False
    return True


def _make_socket_dir() -> str:
    """A fresh private (0700) directory for worker sockets; under ``/tmp`` when the
    default temporary directory's paths would be too long for a socket."""
    directory = tempfile.mkdtemp(prefix="monarch-job-")
    if len(os.path.join(directory, "worker-9999.sock")) > _MAX_SOCKET_PATH:
        os.rmdir(directory)
        directory = tempfile.mkdtemp(prefix="monarch-job-", dir="/tmp")
    return directory


class ProcessJob(JobTrait):
    """Worker processes on this machine, one per "host": ``ProcessJob({"trainers": 2})``
    gives a mesh ``trainers`` with extent ``{"hosts": 2}``, as a two-machine job would.
    For testing multi-host programs on one machine.

    ``apply()`` starts each worker (``python -m monarch.tools.cli worker``) in its own
    session, listening on a Unix socket (``ipc://``) in a private temporary directory,
    and returns once each serves (its agent answers, as its ready file beside the socket
    says); ``env`` is added to the workers' environment. Workers write to this process's
    stdout and stderr, or, when either is a pipe, to ``worker-<n>.log`` beside their
    sockets (the error of a worker that exits names its log). ``state()`` attaches to them with
    ``monarch.actor.attach_to_workers``; it raises :class:`RuntimeError` once a worker
    has exited. ``kill()`` sends the workers' process groups SIGTERM, then SIGKILL after
    :attr:`stop_grace` seconds, and removes the directory.

    Workers end with ``kill()``, or when the process that started them exits, unless
    the job was saved (``dump``/``dumps``, as ``state()`` does with its cache): a saved
    job's workers keep running for a later process to reuse, until someone calls
    ``kill()`` on the job (or ``monarch kill``). A saved job ``can_run`` a specification
    with the same meshes and ``env`` while all its workers are alive. No batch mode.
    """

    #: Seconds ``kill()`` waits after SIGTERM, and again after SIGKILL.
    stop_grace: float = 5.0
    #: Seconds ``apply()`` waits for every worker to serve on its socket.
    start_timeout: float = 60.0

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        if (
            not isinstance(meshes, Mapping)
            or not meshes
            or not all(_valid_mesh(name, count) for name, count in meshes.items())
        ):
            raise ValueError(
                f"ProcessJob(meshes={meshes!r}): expected mesh names mapped to positive "
                "host counts, e.g. ProcessJob({'trainers': 2})"
            )
        env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError(f"ProcessJob(env={env!r}): expected a dict of str to str")
        super().__init__()
        self._meshes: dict[str, int] = dict(meshes)
        self._env: dict[str, str] = env
        self._workers: _Workers | None = None

    def _worker_command(self, address: str) -> list[str]:
        """The command line of a worker listening on ``address``."""
        return [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", address]

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add the mesh ``name`` of ``num_nodes`` hosts (worker processes).

        Before the job is applied, this extends the specification, as if the mesh had
        been given to the constructor. On a running job (applied, or reconnected to a
        saved one through the cache) it also starts the new workers at once, the way
        ``apply()`` started the first ones (the same ``env`` and socket directory), and
        returns once they serve: ``job.state()[name]`` is then their host mesh, of
        extent ``{"hosts": num_nodes}``. The workers already running are not touched.
        ``kill()`` ends the new workers with the others, and so does the exit of this
        process when the job was never saved; a job saved with ``dump()`` (or by
        ``state()`` in its cache) is saved again at that path with the new mesh (one
        saved with ``dumps()`` only, you save again yourself).

        A saved job grown this way is reused by a specification with all its meshes
        (``can_run`` compares the meshes, the added ones included).

        Args:
            name: The new mesh's name.
            num_nodes: How many hosts (worker processes) it has.

        Raises:
            ValueError: The job already has a mesh ``name``, or the name or count is not
                valid.
            RuntimeError: A new worker exited before it served, or did not serve within
                :attr:`start_timeout`; the new workers are stopped and the job is left
                as it was.
        """
        if not _valid_mesh(name, num_nodes):
            raise ValueError(
                f"ProcessJob.add_mesh({name!r}, {num_nodes!r}): expected a non-empty mesh "
                "name and a positive host count, e.g. job.add_mesh('loaders', 2)"
            )
        running = self._running
        meshes = dict(self._meshes)
        if isinstance(running, ProcessJob):
            meshes.update(running._meshes)
        if name in meshes:
            raise ValueError(
                f"ProcessJob.add_mesh({name!r}, {num_nodes!r}): this job already has a "
                f"mesh named {name!r} (its meshes: {meshes}); expected a new name; pick "
                "another one, or kill() the job and give it the meshes you need"
            )
        if isinstance(running, ProcessJob):
            running._start_mesh(name, num_nodes)
        self._meshes[name] = num_nodes
        if running is not None:
            running._save_again()

    def _start_mesh(self, name: str, count: int) -> None:
        """Start ``count`` more workers, the mesh ``name`` of this running job, and wait
        until they serve; on failure stop them and leave the job as it was."""
        workers = self._workers
        if workers is None:
            raise RuntimeError(
                f"ProcessJob.add_mesh({name!r}, {count!r}): the job has no workers; "
                "apply() it first"
            )
        env = {**os.environ, **self._env}
        inherit = _inherit_output()
        first = workers.next_index()
        started: list[_Worker] = []
        try:
            for index in range(first, first + count):
                base = os.path.join(workers.socket_dir, f"worker-{index}")
                started.append(self._start_worker(name, base, env, inherit))
            self._wait_serving(started)
        except BaseException:
            _stop_workers(started, self.stop_grace)
            raise
        workers.meshes[name] = started
        self._meshes[name] = count

    def _create(self, client_script: str | None) -> None:
        _refuse_batch(self, client_script)
        workers = _Workers(_make_socket_dir())
        env = {**os.environ, **self._env}
        inherit = _inherit_output()
        try:
            index = 0
            for mesh, count in self._meshes.items():
                started = workers.meshes.setdefault(mesh, [])
                for _ in range(count):
                    base = os.path.join(workers.socket_dir, f"worker-{index}")
                    index += 1
                    started.append(self._start_worker(mesh, base, env, inherit))
            self._wait_serving(workers.all())
        except BaseException:
            workers.stop(self.stop_grace)
            raise
        self._workers = workers
        _unsaved.add(workers)

    def _start_worker(
        self, mesh: str, base: str, env: dict[str, str], inherit_output: bool
    ) -> _Worker:
        """Start one worker listening at ``base.sock`` (output to ``base.log`` unless
        ``inherit_output``)."""
        address = f"ipc://{base}.sock"
        log = None if inherit_output else f"{base}.log"
        output = None if log is None else open(log, "ab")
        try:
            popen = subprocess.Popen(
                self._worker_command(address),
                env={**env, _READY_FILE_ENV: _ready_file(address)},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        finally:
            if output is not None:
                output.close()  # the worker has its own descriptor
        _children[popen.pid] = popen
        proc = _proc_stat(popen.pid)
        return _Worker(mesh, popen.pid, None if proc is None else proc[1], address, log)

    def _wait_serving(self, workers: list[_Worker]) -> None:
        """Wait until each of ``workers`` serves (its ready file exists); raise if one
        exits first. Its socket alone is not enough: it exists before the worker's agent,
        and a client's first heartbeat arriving in between would be dropped (and its
        attach time out, ``mesh_attach_config_timeout`` later)."""
        deadline = time.monotonic() + self.start_timeout
        pending = list(workers)
        delay = 0.005
        while True:
            for w in list(pending):
                if os.path.exists(_ready_file(w.address)):
                    pending.remove(w)
                elif not _is_running(w):
                    command = shlex.join(self._worker_command(w.address))
                    tail = w.log_tail()
                    why = (
                        f"its output ends with:\n{tail}"
                        if tail
                        else "its output (on this process's stderr) says why"
                    )
                    raise RuntimeError(
                        f"ProcessJob: the worker ({w.describe()}) exited before it "
                        f"listened and served (command: {command}); {why}"
                    )
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"ProcessJob: workers did not listen and serve within "
                    f"{self.start_timeout:g} s: " + "; ".join(w.describe() for w in pending)
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _state(self) -> JobState:
        workers = self._workers
        if workers is None:
            raise RuntimeError("ProcessJob has no workers: apply() it first")
        exited = workers.exited()
        if exited:
            raise RuntimeError(
                "lost connection to worker processes of this ProcessJob (exited: "
                + "; ".join(w.describe() for w in exited)
                + "); call job.kill(), then job.state() to start new workers"
            )
        # Imported here: monarch.job stays cheap to import.
        from monarch._src.actor.workers import attach_to_workers

        # Unix sockets need no credentials (their directory is private to this user):
        # the process's TCP authentication is left as it is, never switched off.
        meshes: dict[str, HostMesh] = {}
        for name, ws in workers.meshes.items():
            meshes[name] = attach_to_workers(name=name, ca=None, workers=[w.address for w in ws])
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's workers can serve ``spec``, so that ``spec.state()``
        reuses them instead of starting new ones.

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``True`` when ``spec`` is a ``ProcessJob`` of the same class with the same
            meshes and environment, and the workers this job started are all still
            running.
        """
        return (
            isinstance(spec, ProcessJob)
            and type(spec) is type(self)
            and spec._meshes == self._meshes
            and spec._env == self._env
            and self._workers is not None
            and not self._workers.exited()
        )

    def _kill(self) -> None:
        workers = self._workers
        if workers is None:
            return
        _unsaved.discard(workers)
        self._workers = None
        workers.stop(self.stop_grace)

    def _saved(self) -> None:
        if self._workers is not None:
            _unsaved.discard(self._workers)

    def __repr__(self) -> str:
        env = f", env={self._env!r}" if self._env else ""
        return f"{type(self).__name__}({self._meshes!r}{env})"


def __getattr__(name: str) -> object:
    """``exec_command``, ``shell`` and ``PortForwarder`` where upstream's scripts import
    them from (``monarch._src.job.job``); loaded on first use (they need the actor
    runtime, which importing this module does not load)."""
    if name == "exec_command":
        from monarch._src.job.exec import exec_command

        return exec_command
    if name == "shell":
        from monarch._src.job.shell import shell

        return shell
    if name == "PortForwarder":
        from monarch._src.job.port_forward import PortForwarder

        return PortForwarder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hosts_from_config(name: str = "hosts") -> HostMesh:
    """Two worker processes on this machine, attached as a 2-host mesh (extent
    ``{"hosts": 2}``): a stand-in for a real cluster, for trying multi-host code on
    one machine (a :class:`monarch.job.ProcessJob`). The workers end with this
    process."""
    mesh: HostMesh = getattr(ProcessJob({name: 2}).state(cached_path=None), name)
    return mesh
