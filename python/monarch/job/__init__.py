"""Jobs: where a Monarch program's hosts come from.

A job describes the host meshes a program needs; ``job.state()`` creates them (or
reuses a saved job's) and returns them by name::

    from monarch.job import ProcessJob

    job = ProcessJob({"trainers": 2})
    trainers = job.state(cached_path=None).trainers  # a HostMesh, extent {"hosts": 2}
    ...
    job.kill()

``LocalJob`` uses this machine (``this_host()``) for every mesh; ``ProcessJob`` runs
worker processes on this machine, one per host, for testing multi-host code;
``SlurmJob`` gets the hosts from Slurm (one allocation, a worker per task; guide:
[Slurm](../slurm.md)).
``exec_command`` and ``shell`` run commands on the hosts of a mesh, and
``PortForwarder`` forwards TCP ports through a mesh. ``serve`` takes a torchrun command
line and a scheduler and returns an ``SPMDJob``, whose ``run_spmd()`` runs the script on
every rank, raising ``SPMDRunError`` for ranks that fail (also in ``monarch.job.spmd``;
guide: [SPMD](../spmd.md#from-torchrun)).
Guide: [Jobs](../job.md).
Importing this module is cheap: it starts
nothing and imports neither the actor runtime nor ``torch`` (``exec_command``, ``shell``,
``PortForwarder``, ``serve``, ``SPMDJob`` and ``SPMDRunError``, which need the runtime,
are imported on first use).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from monarch._src.job.job import DEFAULT_JOB_PATH as DEFAULT_JOB_PATH
from monarch._src.job.job import JobState as JobState
from monarch._src.job.job import JobTrait as JobTrait
from monarch._src.job.job import LocalJob as LocalJob
from monarch._src.job.job import ProcessJob as ProcessJob
from monarch._src.job.job import job_load as job_load
from monarch._src.job.job import job_loads as job_loads
from monarch._src.job.job import load_current_job as load_current_job
from monarch._src.job.job import set_current_job as set_current_job
from monarch._src.job.slurm import SlurmJob as SlurmJob
from monarch._src.job.telemetry import MeshAdminConfig as MeshAdminConfig
from monarch._src.job.telemetry import TelemetryConfig as TelemetryConfig

if _TYPE_CHECKING:
    from monarch._src.job.exec import exec_command as exec_command
    from monarch._src.job.port_forward import PortForwarder as PortForwarder
    from monarch._src.job.shell import shell as shell
    from monarch._src.job.spmd import SPMDJob as SPMDJob
    from monarch._src.job.spmd import SPMDRunError as SPMDRunError
    from monarch._src.job.spmd import serve as serve

#: The names imported on first use, and their modules.
_LAZY = {
    "exec_command": "monarch._src.job.exec",
    "shell": "monarch._src.job.shell",
    "PortForwarder": "monarch._src.job.port_forward",
    "SPMDJob": "monarch._src.job.spmd",
    "SPMDRunError": "monarch._src.job.spmd",
    "serve": "monarch._src.job.spmd",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SPMDJob",
    "SPMDRunError",
    "SlurmJob",
    "TelemetryConfig",
    "exec_command",
    "job_load",
    "job_loads",
    "load_current_job",
    "serve",
    "set_current_job",
    "shell",
]
