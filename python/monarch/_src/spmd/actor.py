"""``SPMDActor``: torchrun's environment, and torchrun-style scripts, inside actors.

One ``SPMDActor`` per proc computes, from its position in the mesh, the variables
``torch.distributed.run`` (torchrun) gives each worker, with the **last** dimension of
the mesh taken as the per-node one (usually ``"gpus"``):

======================================  ==============================================
``RANK``, ``ROLE_RANK``                 the row-major rank in the whole mesh
``LOCAL_RANK``                          the coordinate on the last dimension
``WORLD_SIZE``, ``ROLE_WORLD_SIZE``     the number of procs in the mesh
``LOCAL_WORLD_SIZE``                    the size of the last dimension
``GROUP_RANK``                          ``RANK // LOCAL_WORLD_SIZE`` (the node index)
``GROUP_WORLD_SIZE``                    ``ceil(WORLD_SIZE / LOCAL_WORLD_SIZE)``
``ROLE_NAME``                           ``"rank"``
``MASTER_ADDR``, ``MASTER_PORT``        as given
======================================  ==============================================

``setup_env`` sets them in the actor's process; ``main`` also runs a script or module
there, the way torchrun runs it in each worker. Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
import runpy
import socket
import sys

from monarch._src.actor.actor import Actor
from monarch._src.actor.context import current_rank, current_size
from monarch._src.actor.endpoint import endpoint
from monarch._src.spmd.network import AddrType, get_ipaddr

__all__ = ["SPMDActor", "torch_elastic_env"]


def torch_elastic_env(
    labels: list[str], sizes: list[int], coords: list[int], master_addr: str, master_port: int
) -> dict[str, str]:
    """The torchrun variables of the proc at ``coords`` of a mesh with dimensions
    ``labels`` of ``sizes`` (the last dimension is the per-node one).

    >>> env = torch_elastic_env(["hosts", "gpus"], [2, 4], [1, 2], "node0", 29500)
    >>> [env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_PORT")]
    ['6', '2', '8', '1', '29500']
    >>> torch_elastic_env([], [], [], "localhost", 1)["WORLD_SIZE"]
    '1'
    """
    rank = 0
    for size, coord in zip(sizes, coords, strict=True):
        rank = rank * size + coord
    world_size = math.prod(sizes)
    local_rank = coords[-1] if coords else 0
    local_world_size = sizes[-1] if sizes else 1
    return {
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "ROLE_RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local_world_size),
        "GROUP_WORLD_SIZE": str(-(-world_size // local_world_size)),
        "ROLE_NAME": "rank",
    }


def _free_port() -> int:
    """A TCP port nobody listens on now (on every interface, as a TCPStore binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class SPMDActor(Actor):
    """Sets torchrun's environment variables in its process (see the module docs) and
    runs torchrun-style scripts there.

    Spawn it on every proc of a mesh (``setup_torch_elastic_env`` does), ask the rank-0
    actor for an address (``get_host_port``), then ``setup_env`` or ``main`` on all::

        spmd = procs.spawn("_SPMDActor", SPMDActor)
        first = spmd.slice(**dict.fromkeys(procs.extent.labels, 0))
        addr, port = first.get_host_port.call_one(None).get()
        spmd.main.call(addr, port, ["-m", "train", "--lr", "0.001"]).get()
    """

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        self._labels = list(sizes)
        self._sizes = [sizes[label] for label in self._labels]
        self._coords = [point[label] for label in self._labels]
        # The numbers of the table, as attributes (subclasses read them).
        env = self._env("", 0)
        self.rank = int(env["RANK"])
        self.local_rank = int(env["LOCAL_RANK"])
        self.world_size = int(env["WORLD_SIZE"])
        self.local_world_size = self.nproc_per_node = int(env["LOCAL_WORLD_SIZE"])
        self.group_rank = int(env["GROUP_RANK"])
        self.group_world_size = int(env["GROUP_WORLD_SIZE"])

    def _env(self, master_addr: str, master_port: int) -> dict[str, str]:
        return torch_elastic_env(self._labels, self._sizes, self._coords, master_addr, master_port)

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None = None) -> tuple[str, int]:
        """This machine's address (its hostname, or with ``use_ipaddr`` an IP of that
        family) and a free TCP port: a ``MASTER_ADDR``/``MASTER_PORT`` for the mesh."""
        hostname = socket.gethostname()
        port = _free_port()
        if use_ipaddr is None:
            return hostname, port
        return get_ipaddr(hostname, port, use_ipaddr), port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set the torchrun variables in this process's environment."""
        os.environ.update(self._env(master_addr, master_port))

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the torchrun variables, then run a script the way torchrun would in this
        process: ``["-m", "pkg.module", *args]`` runs a module, ``["path.py", *args]``
        a file, both as ``__main__`` with ``sys.argv`` set to the script's (restored
        afterwards). Returns True; ``sys.exit(0)`` in the script counts as success.

        Raises:
            ValueError: ``script_args`` names no script or module.
            RuntimeError: the script exited with a non-zero status.
        """
        args = [str(a) for a in script_args]
        if not args or (args[0] == "-m" and len(args) < 2):
            raise ValueError(
                f"SPMDActor.main: no script or module in {script_args!r}; give "
                "['-m', 'pkg.module', *args] or ['path/to/script.py', *args]"
            )
        os.environ.update(self._env(master_addr, master_port))
        saved = sys.argv
        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(args)
                runpy.run_path(args[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(
                    f"SPMDActor.main: {' '.join(args)} exited with status {e.code!r}"
                ) from None
        finally:
            sys.argv = saved
        return True
