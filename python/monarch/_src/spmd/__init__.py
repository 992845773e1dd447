"""SPMD over monarch meshes: torch elastic (torchrun) environments for a proc mesh.

:func:`setup_torch_elastic_env` spawns an :class:`~monarch._src.spmd.actor.SPMDActor`
on every proc of a mesh (a mesh named ``"_SPMDActor"``), picks a master address and
port on the proc at the origin (every coordinate 0) unless given, and sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` and the rest in every proc's environment: after it,
``torch.distributed.init_process_group()`` works in actors spawned on those procs.
"""

from __future__ import annotations

from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.spmd.actor import SPMDActor
from monarch._src.spmd.network import AddrType

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    assert (master_addr is None) == (master_port is None), (
        "setup_torch_elastic_env: give both master_addr and master_port, or neither (then "
        "the proc at the origin of the mesh picks them)"
    )


def _spawn(proc_mesh: ProcMesh) -> tuple[SPMDActor, SPMDActor]:
    """The SPMDActor mesh, and its view at the origin."""
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    origin = actors.slice(**dict.fromkeys(proc_mesh.extent.labels, 0))
    return actors, origin


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Set the torch elastic variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...)
    in the environment of every proc of ``proc_mesh``; blocks until they are set.

    Without ``master_addr``/``master_port``, the proc at the origin reports its
    hostname (or an IP of the ``use_ipaddr`` family) and a free port.
    """
    _check_master(master_addr, master_port)
    actors, origin = _spawn(proc_mesh)
    if master_addr is None:
        master_addr, master_port = origin.get_host_port.call_one(use_ipaddr).get()
    assert master_port is not None
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for async code (awaits instead of blocking)."""
    _check_master(master_addr, master_port)
    actors, origin = _spawn(proc_mesh)
    if master_addr is None:
        master_addr, master_port = await origin.get_host_port.call_one(use_ipaddr)
    assert master_port is not None
    await actors.setup_env.call(master_addr, master_port)
