"""The spellings of earlier Monarch releases that scripts (and blog posts) still use.

- ``proc_mesh(gpus=N, hosts=H, env=..., setup=...)``: procs on this machine, extent
  ``{"hosts": H, "gpus": N}``. Today: ``this_host().spawn_procs(per_host={"gpus": N},
  env=..., bootstrap=...)``.
- ``await proc_mesh(...)`` and ``await procs.spawn(...)``: both are awaitable and give
  the mesh once it is ready (``ProcMesh.__await__``, ``ActorMesh.__await__``). Today
  both return a usable mesh at once; ``await mesh.initialized`` waits.

Each warns with a ``DeprecationWarning`` that shows today's spelling. ``monarch.actor``
gives ``proc_mesh`` on request (``from monarch.actor import proc_mesh``) without listing
it in ``__all__``.

Unlike ``spawn_procs``, ``proc_mesh`` leaves ``CUDA_VISIBLE_DEVICES`` alone: the scripts
written for it select their GPU by rank (``model.to(rank)``), which needs every GPU
visible in every proc.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from monarch._src.actor.cuda_devices import local_gpu_count
from monarch._src.actor.proc_mesh import ProcMesh, this_host

__all__ = ["proc_mesh"]


def proc_mesh(
    *,
    gpus: int | None = None,
    hosts: int = 1,
    env: dict[str, str] | None = None,
    setup: Callable[[], Any] | None = None,
) -> ProcMesh:
    """Deprecated: ``hosts * gpus`` procs on this machine, extent ``{"hosts": hosts,
    "gpus": gpus}`` (``gpus`` defaults to this machine's GPU count, at least 1), with
    ``env`` added to their environment and ``setup`` run in each before any actor.
    Returns at once; ``await`` on the result still works (and warns too).

    Use ``this_host().spawn_procs(per_host={"gpus": gpus}, env=env, bootstrap=setup)``.
    """
    for label, value in (("gpus", gpus), ("hosts", hosts)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"proc_mesh({label}={value!r}): expected a positive int")
    count = gpus if gpus is not None else max(local_gpu_count(), 1)
    args = [f"per_host={{'gpus': {count}}}"]
    if env:
        args.append("env={...}")
    if setup is not None:
        args.append("bootstrap=setup")
    warnings.warn(
        f"monarch.actor.proc_mesh() is deprecated; use "
        f"`procs = this_host().spawn_procs({', '.join(args)})` (from monarch.actor import "
        f"this_host; proc_mesh's extent also has a 'hosts' dimension, of size {hosts}: "
        f"per_host={{'hosts': {hosts}, 'gpus': {count}}} keeps it). spawn_procs and spawn "
        "return usable meshes at once, without await (`await procs.initialized` waits "
        "for the procs)",
        DeprecationWarning,
        stacklevel=2,
    )
    return this_host()._spawn_procs(
        {"hosts": hosts, "gpus": count}, setup, None, None, None, env, pin_gpus=False
    )
