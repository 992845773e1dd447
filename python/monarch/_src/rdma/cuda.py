"""CUDA memory in ``monarch.rdma``: CUDA IPC handles between processes of one host.

The owner of a CUDA buffer exports its storage with a CUDA IPC handle (the one
``torch.multiprocessing`` uses), carried in the buffer's handle. A process on the same
host opens it once (cached) and copies with the GPU; its own memory may be CPU or
CUDA. CPU memory of the owner into a CUDA destination (or the reverse) goes through a
pinned staging buffer with a cross-memory copy. Imported only when CUDA memory is
involved, so that ``monarch.rdma`` does not import torch otherwise.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Literal

from monarch._rust_bindings import rdma_check_live, rdma_read, rdma_write
from monarch._src.rdma.notices import RDMAReadTransferWarning, RDMAWriteTransferWarning, warn_once

if TYPE_CHECKING:
    from monarch._src.rdma.buffer import RDMABuffer, Region
    from monarch._src.rdma.memory import Memory

__all__ = ["check_allocator", "ipc_handle", "transfer"]

_warned = False
_lock = threading.Lock()
#: Opened IPC storages of other processes, by (pid, handle, offset, size), most recent
#: last; at most ``_OPENED_MAX``.
_opened: dict[tuple[int, bytes, int, int], Any] = {}
_OPENED_MAX = 64


def check_allocator() -> None:
    """Warn (once) when PyTorch's CUDA allocator may hand out memory another process
    cannot map reliably: without expandable segments a registered tensor shares its
    IPC allocation with unrelated tensors."""
    global _warned
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in conf.replace(" ", "") or _warned:
        return
    _warned = True
    import warnings

    warnings.warn(
        "RDMABuffer of a CUDA tensor without PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True: set it before torch initialises CUDA for the most "
        "reliable sharing of CUDA memory between processes",
        UserWarning,
        stacklevel=3,
    )


def ipc_handle(t: Any) -> tuple[Any, ...]:
    """What a peer needs to open ``t``'s memory: the storage's IPC handle and the
    tensor's byte offset in it."""
    storage = t.untyped_storage()
    shared = storage._share_cuda_()
    return (*shared, t.storage_offset() * t.element_size())


def _require_cuda(buf: RDMABuffer) -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"the {buf._describe()} lives in CUDA memory, but this process has no CUDA "
            "(torch.cuda.is_available() is False: no GPU visible, CUDA_VISIBLE_DEVICES "
            "empty, or a CPU-only torch); read it from a process with a GPU, or have "
            "the owner register a CPU copy (t.cpu())"
        )
    return torch


def _remote_view(buf: RDMABuffer, region: Region) -> Any:
    """A uint8 CUDA tensor over the owner's registered memory (opened once)."""
    torch = _require_cuda(buf)
    assert buf._cuda is not None
    (device, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync, start) = buf._cuda
    # One CUDA allocation (one IPC handle) holds many tensors: the key includes where
    # in it this storage lies.
    key = (region.pid, bytes(handle), int(offset), int(size))
    with _lock:
        storage = _opened.pop(key, None)
        if storage is None:
            torch.cuda._lazy_init()  # opening an IPC handle needs an initialised CUDA
            storage = torch.UntypedStorage._new_shared_cuda(
                device, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync
            )
        _opened[key] = storage
        while len(_opened) > _OPENED_MAX:
            del _opened[next(iter(_opened))]
    whole = torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}")
    whole.set_(storage, 0, (storage.nbytes(),), (1,))
    return whole[start : start + region.len]


def _as_bytes(mem: Memory, n: int) -> Any:
    """The first ``n`` bytes of local memory as a uint8 tensor (no copy)."""
    import torch

    keep = mem.keep
    if isinstance(keep, torch.Tensor):
        return keep.view(-1).view(torch.uint8)[:n] if keep.dim() else keep.view(torch.uint8)
    return torch.frombuffer(keep, dtype=torch.uint8, count=n) if n else torch.empty(0)


def transfer(
    buf: RDMABuffer,
    op: str,
    region: Region,
    mem: Memory,
    timeout: float,
    via: Literal["cma", "cuda_ipc", "ibverbs", "tcp"],
) -> None:
    """Copy between ``buf`` and local ``mem``, where one side is CUDA: with CUDA IPC
    when the owner is on this host (``via`` is ``"cuda_ipc"``), else through pinned
    staging memory over ``via``."""
    n = region.len
    torch = _require_cuda(buf)
    local = _as_bytes(mem, n)
    host_via = "cma" if via == "cuda_ipc" else via
    if via == "cuda_ipc":
        # One-sided liveness check: a dropped buffer or a dead owner is refused before
        # its (possibly reused) memory is touched.
        rdma_check_live(region)
    if buf._device != "cpu":
        remote = _remote_view(buf, region)
        if op == "read":
            local.copy_(remote)
        else:
            remote.copy_(local)
        torch.cuda.synchronize(remote.device)
        return
    # The owner's memory is CPU, ours is CUDA: stage through pinned memory.
    staging = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    what = f"staging for the {buf._describe()}"
    if op == "read":
        warn_once(
            RDMAReadTransferWarning,
            f"reading the {buf._describe()} (CPU memory) into CUDA memory goes through a "
            "pinned staging copy; read into CPU memory to avoid it",
        )
        rdma_read(
            what, region, host_via, buf._server, staging.data_ptr(), staging, timeout, 4, 1 << 26
        ).get()
        local.copy_(staging)
        torch.cuda.synchronize(local.device)
    else:
        warn_once(
            RDMAWriteTransferWarning,
            f"writing CUDA memory into the {buf._describe()} (CPU memory) goes through a "
            "pinned staging copy; write from CPU memory to avoid it",
        )
        staging.copy_(local)
        rdma_write(
            what, region, host_via, buf._server, staging.data_ptr(), staging, timeout, 4, 1 << 26
        ).get()
