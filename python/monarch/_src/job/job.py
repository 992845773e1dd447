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

This module is the face of the parts beside it, and re-exports their names:
:mod:`~monarch._src.job.trait` (``JobTrait``, ``JobState``, the state cache),
:mod:`~monarch._src.job.current` (the current job, ``module.attr`` specs, each
context's saved job), :mod:`~monarch._src.job.local` (``LocalJob``),
:mod:`~monarch._src.job.process` (``ProcessJob``) and
:mod:`~monarch._src.job.process_workers` (its worker processes).

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

from typing import TYPE_CHECKING

# The parts, re-exported: this module stays where every name is imported from (and
# where jobs pickled before the split find their classes).
from monarch._src.job.current import import_job as import_job
from monarch._src.job.current import load_current_job as load_current_job
from monarch._src.job.current import load_saved_job as load_saved_job
from monarch._src.job.current import remove_context as remove_context
from monarch._src.job.current import set_current_job as set_current_job
from monarch._src.job.local import LocalJob as LocalJob
from monarch._src.job.process import ProcessJob as ProcessJob
from monarch._src.job.process_workers import _children as _children
from monarch._src.job.process_workers import _proc_stat as _proc_stat
from monarch._src.job.process_workers import _unsaved as _unsaved
from monarch._src.job.process_workers import _Worker as _Worker
from monarch._src.job.process_workers import _Workers as _Workers
from monarch._src.job.trait import DEFAULT_JOB_PATH as DEFAULT_JOB_PATH
from monarch._src.job.trait import JobState as JobState
from monarch._src.job.trait import JobTrait as JobTrait
from monarch._src.job.trait import _Reconnected as _Reconnected
from monarch._src.job.trait import _refuse_batch as _refuse_batch
from monarch._src.job.trait import job_load as job_load
from monarch._src.job.trait import job_loads as job_loads

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
