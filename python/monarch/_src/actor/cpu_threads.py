"""Procs that share a host share its cores: torch's CPU threads per proc.

``HostMesh.spawn_procs(per_host=...)`` starts ``k = prod(per_host)`` procs on each host.
Left alone, each of them would run as many torch (OpenMP) threads as the host has
cores, ``k`` times too many; their idle threads also spin for a while waiting for
work, on cores the other procs need. So each proc of such a spawn uses
``max(1, cores // k)`` threads, ``cores`` being the CPUs it may run on
(``os.sched_getaffinity``): it sets ``OMP_NUM_THREADS`` (read by torch, MKL and OpenMP
when they load) and, where torch is imported already (the fork server's template
preloads it), calls ``torch.set_num_threads``. ``torchrun`` does the same for the
processes it starts on a node (one thread each).

Nothing is set when

- the config key ``spawn_cpu_threads`` is false (``MONARCH_SPAWN_CPU_THREADS=0``),
- the spawn starts one proc per host,
- the spawn binds its procs to CPUs (``proc_bind``: each proc's CPUs are its own, and
  torch uses them all),
- ``OMP_NUM_THREADS`` is set already: in the spawning process's environment, in the
  spawn's ``env=`` or ``bootstrap_command`` variables, or in the host's environment.

As for GPUs (``cuda_devices``), the decision is split in two, because only the host
knows its cores: the spawning process adds :data:`SHARE_ENV` (``k``) to the spawn's
environment (:func:`spawn_variables`), and each proc, first thing, counts its CPUs and
sets its threads (:func:`share_this_proc`). A spawn's ``bootstrap`` function runs after
this, so it may set anything else. An ``OMP_NUM_THREADS`` given to the procs (``env=``)
is applied to a torch the fork server preloaded as well, which read it too early.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, MutableMapping

from monarch._src import config

__all__ = ["SHARE_ENV", "THREADS_ENV", "share_this_proc", "spawn_variables", "threads_for"]

#: The variable that asks a proc to share its host's cores: how many procs its spawn
#: starts on each host.
SHARE_ENV = "MONARCH_PROCS_PER_HOST"
#: OpenMP's (and so torch's) thread count variable.
THREADS_ENV = "OMP_NUM_THREADS"


def spawn_variables(
    per_host: Mapping[str, int], bound: bool, *variables: Mapping[str, str]
) -> dict[str, str]:
    """The variables a spawn adds so its procs share their host's cores:
    ``{SHARE_ENV: k}``, or nothing (see the module docs; ``bound``: the spawn binds its
    procs to CPUs; ``variables``: the spawn's own)."""
    count = math.prod(per_host.values())
    if count <= 1 or bound or not config.get("spawn_cpu_threads"):
        return {}
    if THREADS_ENV in os.environ or any(THREADS_ENV in v for v in variables):
        return {}
    return {SHARE_ENV: str(count)}


def threads_for(cpus: int, procs: int) -> int:
    """Threads of each of ``procs`` procs sharing ``cpus`` CPUs (at least one).

    >>> threads_for(2, 4), threads_for(16, 4), threads_for(16, 3), threads_for(0, 2)
    (1, 4, 5, 1)
    """
    return max(1, cpus // max(1, procs))


def share_this_proc(
    environ: MutableMapping[str, str] | None = None, cpus: int | None = None
) -> int | None:
    """In a spawned proc, before any user code: set its threads as :data:`SHARE_ENV`
    asks (see the module docs), or as ``OMP_NUM_THREADS`` says where it is set. Returns
    the thread count set, or ``None``. ``environ`` and ``cpus`` stand in for the real
    ones in tests."""
    env = os.environ if environ is None else environ
    request = env.pop(SHARE_ENV, None)
    given = env.get(THREADS_ENV)
    threads: int | None = None
    if given is not None:
        # The user's (or the host's) choice; it must reach a preloaded torch too.
        threads = _positive(given)
    elif request is not None:
        procs = _positive(request)
        if procs is not None:
            if cpus is None:
                cpus = len(os.sched_getaffinity(0))
            threads = threads_for(cpus, procs)
            env[THREADS_ENV] = str(threads)
    torch = sys.modules.get("torch") if environ is None else None
    if threads is not None and torch is not None:
        # Imported by the fork server's template, whose OpenMP read the variable before
        # it was set here (or with the template's own value).
        torch.set_num_threads(threads)
    return threads


def _positive(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None
