"""Jobs: where a Monarch program's hosts come from.

A job describes the host meshes a program needs; ``job.state()`` creates them (or
reuses a saved job's) and returns them by name::

    from monarch.job import ProcessJob

    job = ProcessJob({"trainers": 2})
    trainers = job.state(cached_path=None).trainers  # a HostMesh, extent {"hosts": 2}
    ...
    job.kill()

``LocalJob`` uses this machine (``this_host()``) for every mesh; ``ProcessJob`` runs
worker processes on this machine, one per host, for testing multi-host code. Guide:
``docs/job.md``; the implementation lives in ``monarch._src.job``. Importing this module
is cheap: it starts nothing and imports neither the actor runtime nor ``torch``.
"""

from monarch._src.job.job import DEFAULT_JOB_PATH as DEFAULT_JOB_PATH
from monarch._src.job.job import JobState as JobState
from monarch._src.job.job import JobTrait as JobTrait
from monarch._src.job.job import LocalJob as LocalJob
from monarch._src.job.job import ProcessJob as ProcessJob
from monarch._src.job.job import job_load as job_load
from monarch._src.job.job import job_loads as job_loads
from monarch._src.job.job import load_current_job as load_current_job
from monarch._src.job.job import set_current_job as set_current_job

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
]
