"""One GPU per proc: ``CUDA_VISIBLE_DEVICES`` for the procs of a ``"gpus"`` dimension.

``HostMesh.spawn_procs(per_host={..., "gpus": N, ...})`` gives the proc at ``gpus``
coordinate ``i`` of each host ``CUDA_VISIBLE_DEVICES=i`` when the host has exactly ``N``
GPUs, so that ``torch.device("cuda")`` (device 0 of the proc) is its own GPU. Nothing is
set when

- the config key ``spawn_cuda_visible_devices`` is false (``MONARCH_SPAWN_CUDA_VISIBLE_DEVICES=0``),
- the spawn has no ``"gpus"`` dimension,
- ``CUDA_VISIBLE_DEVICES`` is set already: in the client's environment, in the spawn's
  ``env=`` or ``bootstrap_command`` variables, or in the host's environment (a spawn's
  ``bootstrap`` function runs after this and may set it to anything),
- the host does not have exactly as many GPUs as the ``"gpus"`` dimension is long (no
  GPU, or procs sharing GPUs: the user decides).

The decision is split in two, because only the host knows its GPUs: the client adds
:data:`PIN_ENV` to the environment of the spawn (:func:`spawn_variables`), and each
proc, first thing in :func:`monarch._src.actor.runtime.serve_child`, counts the GPUs of
its machine (without importing torch: ``/proc/driver/nvidia/gpus``, else ``nvidia-smi
-L``) and sets its variable (:func:`pin_this_proc`). A proc's coordinate comes from
``HYPERACTOR_MESH_PROC_RANK``, its row-major rank among the procs its host started for
the spawn.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, MutableMapping

from monarch._src import config

__all__ = [
    "GPU_DIM",
    "PIN_ENV",
    "VISIBLE_ENV",
    "device_for_proc",
    "local_gpu_count",
    "pin_this_proc",
    "spawn_variables",
]

#: The per-host dimension whose procs get one GPU each.
GPU_DIM = "gpus"
#: The variable that asks a proc to pin itself: ``"<stride>:<size>"`` of the ``"gpus"``
#: dimension within the host's procs of the spawn.
PIN_ENV = "MONARCH_CUDA_PIN"
#: CUDA's device selection variable.
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
#: The proc's rank among the procs its host started together (set by the host).
_RANK_ENV = "HYPERACTOR_MESH_PROC_RANK"
#: Where the NVIDIA driver lists the GPUs it can see (one directory per GPU).
_NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"
#: How long ``nvidia-smi -L`` may take before the machine counts as having no GPU.
_NVIDIA_SMI_TIMEOUT = 10.0


def spawn_variables(per_host: Mapping[str, int], *variables: Mapping[str, str]) -> dict[str, str]:
    """The variables a spawn adds so its procs pin their GPU: ``{PIN_ENV: ...}``, or
    nothing when pinning is off, there is no ``"gpus"`` dimension, or
    ``CUDA_VISIBLE_DEVICES`` is in this process's environment or in ``variables`` (the
    spawn's own).
    """
    if GPU_DIM not in per_host or not config.get("spawn_cuda_visible_devices"):
        return {}
    if VISIBLE_ENV in os.environ or any(VISIBLE_ENV in v for v in variables):
        return {}
    labels = list(per_host)
    stride = 1
    for label in labels[labels.index(GPU_DIM) + 1 :]:
        stride *= per_host[label]
    return {PIN_ENV: f"{stride}:{per_host[GPU_DIM]}"}


def device_for_proc(
    rank: int, stride: int, size: int, gpu_count: int, visible: str | None
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value of the proc of host-local ``rank``, whose
    ``"gpus"`` coordinate is ``(rank // stride) % size``; ``None`` to leave it alone
    (``visible`` is already set, or the machine's ``gpu_count`` GPUs are not one per
    coordinate).

    >>> device_for_proc(5, 1, 4, 4, None)
    '1'
    >>> device_for_proc(5, 2, 4, 4, None), device_for_proc(1, 1, 4, 8, None)
    ('2', None)
    >>> device_for_proc(1, 1, 4, 4, "3") is None, device_for_proc(0, 1, 2, 0, None) is None
    (True, True)
    """
    if visible is not None or gpu_count <= 0 or gpu_count != size:
        return None
    return str((rank // stride) % size)


def local_gpu_count() -> int:
    """How many NVIDIA GPUs this machine shows, without importing torch or initializing
    CUDA: the entries of ``/proc/driver/nvidia/gpus``, else the lines ``nvidia-smi -L``
    prints (0 when neither is there, or ``nvidia-smi`` fails or hangs)."""
    try:
        return len(os.listdir(_NVIDIA_PROC_DIR))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run(
            [smi, "-L"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def pin_this_proc(
    environ: MutableMapping[str, str] | None = None, gpu_count: int | None = None
) -> str | None:
    """In a spawned proc, before any user code: set ``CUDA_VISIBLE_DEVICES`` as
    :data:`PIN_ENV` asks (see the module docs). Returns the value set, or ``None``.
    ``environ`` and ``gpu_count`` stand in for the real ones in tests."""
    env = os.environ if environ is None else environ
    request = env.pop(PIN_ENV, None)
    if request is None or VISIBLE_ENV in env:
        return None
    try:
        stride_text, size_text = request.split(":")
        stride, size = int(stride_text), int(size_text)
        rank = int(env[_RANK_ENV])
    except (KeyError, ValueError):
        return None  # not spawned by a host that sets the rank: nothing to decide on
    count = local_gpu_count() if gpu_count is None else gpu_count
    device = device_for_proc(rank, stride, size, count, None)
    if device is not None:
        env[VISIBLE_ENV] = device
    return device
