"""Torchrun command lines on a job's hosts: :func:`serve` gets the hosts for a torchrun
command (``["torchrun", "--nnodes=2", "--nproc-per-node=4", "train.py", ...]``) from a
scheduler (``"local"``, ``"slurm"``, ``"kubernetes"``) and returns an :class:`SPMDJob`,
whose ``run_spmd()`` runs the script on every rank with torchrun's environment. Guide:
[SPMD, "From torchrun"](../spmd.md#from-torchrun).

``job_load`` and ``job_loads`` reload a saved job (an ``SPMDJob`` that ``serve`` saved,
for another ``run_spmd()`` on the same hosts).
"""

from monarch._src.job.spmd import SPMDJob as SPMDJob
from monarch._src.job.spmd import SPMDRunError as SPMDRunError
from monarch._src.job.spmd import job_load as job_load
from monarch._src.job.spmd import job_loads as job_loads
from monarch._src.job.spmd import serve as serve

__all__ = ["SPMDJob", "SPMDRunError", "job_load", "job_loads", "serve"]
