"""Names of upstream Monarch's first tensor engine that have no equivalent here.

Upstream's ``monarch`` module still exports ``world_mesh`` and ``mast_reserve``, which
belong to its first distributed-tensor runtime: a ``monarch_supervisor`` context that
connects to hosts itself, and Meta's internal MAST scheduler. This package has neither:
distributed tensors run on proc meshes (``procs.activate()``), and hosts come from
``monarch.job`` or ``monarch.actor.attach_to_workers``. The two names exist so that code
written for upstream fails at the call with an error that says what to write instead,
rather than with an ``AttributeError``.

Importing this module is cheap: it imports neither torch nor the engine.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, NoReturn

__all__ = ["mast_reserve", "world_mesh"]


def world_mesh(ctx: Any, hosts: Any, gpu_per_host: int, _processes: Any = None) -> NoReturn:
    """Not supported: upstream Monarch's ``world_mesh(ctx, hosts, gpu_per_host)`` made a
    tensor ``DeviceMesh`` (dimensions ``host`` and ``gpu``) over hosts connected to a
    ``monarch_supervisor`` context, its first controller. This package has no such
    controller: a tensor mesh is a proc mesh, activated. Spawn one proc per GPU on a host
    mesh and activate it::

        procs = hosts.spawn_procs(per_host={"gpus": gpu_per_host})
        with procs.activate():
            ...

    where ``hosts`` is ``this_host()`` (this machine), ``job.state().<name>`` of a
    ``monarch.job`` job, or ``monarch.actor.attach_to_workers(...)``; the dimensions are
    then ``hosts`` and ``gpus``.

    Args:
        ctx: The ``monarch_supervisor`` context (not used).
        hosts: The hosts (not used; their number appears in the error).
        gpu_per_host: The GPUs per host (appears in the error).
        _processes: Not used.

    Raises:
        NotImplementedError: Always, saying how to build the mesh with proc meshes.
    """
    count = f"{len(hosts)} hosts" if isinstance(hosts, Sized) else "the hosts"
    raise NotImplementedError(
        f"monarch.world_mesh(ctx, hosts, gpu_per_host={gpu_per_host!r}) is not supported: it "
        "builds a tensor mesh over the hosts of a monarch_supervisor context (upstream "
        "Monarch's first controller), and this monarch has no such controller; a tensor "
        f"mesh here is a proc mesh, activated. With a host mesh of {count} (`this_host()` "
        "for this machine, `job.state().<name>` of a monarch.job job such as SlurmJob, or "
        "`monarch.actor.attach_to_workers(...)`), write "
        f"`procs = hosts.spawn_procs(per_host={{'gpus': {gpu_per_host!r}}})` and then "
        "`with procs.activate(): ...` (its dimensions are 'hosts' and 'gpus' where "
        "world_mesh had 'host' and 'gpu'); see docs/tensors.md"
    )


def mast_reserve(hosts: int, *args: Any, **kwargs: Any) -> NoReturn:
    """Not supported: upstream Monarch's ``mast_reserve`` (``monarch.notebook.
    reserve_torchx``) reserves hosts on MAST, Meta's internal cluster scheduler, through
    torchx, and returns the job's name; MAST cannot be reached outside Meta. Reserve
    hosts with a ``monarch.job`` job instead, and spawn the procs on them::

        job = SlurmJob({"trainers": hosts})  # or monarch.job.kubernetes.KubernetesJob
        procs = job.state().trainers.spawn_procs(per_host={"gpus": 8})

    (``monarch.actor.attach_to_workers(...)`` for machines already running workers).

    Args:
        hosts: The number of hosts (appears in the error).
        args: upstream's other arguments (not used).
        kwargs: upstream's other arguments (not used).

    Raises:
        NotImplementedError: Always, naming the schedulers this package supports.
    """
    raise NotImplementedError(
        f"monarch.mast_reserve(hosts={hosts!r}) is not supported: it reserves hosts on MAST, "
        "Meta's internal cluster scheduler (through torchx), which cannot be reached "
        "outside Meta. Reserve the hosts with a monarch.job job instead, e.g. "
        f"`job = monarch.job.SlurmJob({{'trainers': {hosts!r}}}, ...)` (or "
        "monarch.job.kubernetes.KubernetesJob), then "
        "`procs = job.state().trainers.spawn_procs(per_host={'gpus': 8})` and "
        "`with procs.activate(): ...`; for machines already running monarch workers, "
        "`monarch.actor.attach_to_workers(...)`; see docs/job.md"
    )
