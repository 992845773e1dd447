"""Local memory as the RDMA layer sees it: an address, a length, a device, and the
Python object that keeps it alive.

Accepted are torch tensors (CPU or CUDA) and objects with the buffer protocol
(``memoryview``, ``bytearray``, ``bytes``, arrays). torch is never imported here: a
tensor is recognised by its type's module, so memoryview users do not pay for torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

__all__ = ["Memory", "is_tensor", "local_memory"]


@dataclass(frozen=True)
class Memory:
    """A contiguous range of this process's memory."""

    addr: int
    nbytes: int
    #: ``"cpu"`` or ``"cuda:<index>"``.
    device: str
    writable: bool
    #: What owns the memory (the tensor, or a memoryview holding the exporter's buffer).
    keep: Any

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def is_tensor(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor (checked without importing torch)."""
    for cls in type(obj).__mro__:
        if cls.__module__ == "torch" and cls.__name__ == "Tensor":
            return True
    return False


class _PyBuffer(ctypes.Structure):
    # The leading fields of CPython's Py_buffer, up to what we read; the rest is room.
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("rest", ctypes.c_char * 96),
    ]


def _address(view: memoryview) -> int:
    """The address of ``view``'s first byte (read-only views too)."""
    if view.nbytes == 0:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    buf = _PyBuffer()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    get.restype = ctypes.c_int
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    release.restype = None
    if get(view, ctypes.byref(buf), 0) != 0:  # PyBUF_SIMPLE
        raise ValueError("cannot take the address of a read-only buffer")
    try:
        return int(buf.buf or 0)
    finally:
        release(ctypes.byref(buf))


def local_memory(obj: Any, role: str) -> Memory:
    """The memory of ``obj``, checked for ``role``: ``"register"`` (an RDMABuffer's
    data: 1-D, contiguous, at least one byte), ``"destination"`` (writable,
    contiguous) or ``"source"`` (contiguous)."""
    if is_tensor(obj):
        return _tensor_memory(obj, role)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"expected a torch.Tensor or a 1-D memoryview for the {_what(role)}, got "
            f"{type(obj).__name__}"
        ) from None
    if role == "register" and view.ndim != 1:
        raise ValueError(
            f"RDMABuffer data must be a 1-D memoryview, got {view.ndim} dimensions "
            f"(shape {view.shape}); pass view.cast('B') for a flat byte view"
        )
    if not view.c_contiguous:
        raise ValueError(
            f"the {_what(role)} memoryview is not contiguous; copy it into a contiguous "
            "buffer first (e.g. memoryview(bytearray(view.tobytes())))"
        )
    if role == "destination" and view.readonly:
        raise ValueError(
            "the destination is a read-only buffer (e.g. bytes); read into a writable "
            "one such as a bytearray or a tensor"
        )
    if role == "register" and view.nbytes == 0:
        raise ValueError(_EMPTY)
    return Memory(
        addr=_address(view),
        nbytes=view.nbytes,
        device="cpu",
        writable=not view.readonly,
        keep=view,
    )


_EMPTY = (
    "cannot register an empty (0-byte) RDMABuffer: there is nothing to transfer; register "
    "at least one byte"
)


def _what(role: str) -> str:
    return {"register": "RDMABuffer data", "destination": "destination", "source": "source"}[role]


def _tensor_memory(t: Any, role: str) -> Memory:
    if role == "register":
        if t.dim() != 1:
            raise ValueError(
                f"RDMABuffer data must be a 1-D contiguous tensor, got shape "
                f"{tuple(t.shape)}; register a flat byte view of it: "
                "t.view(torch.uint8).flatten() (t.contiguous() first if it is not "
                "contiguous)"
            )
        if not t.is_contiguous():
            raise ValueError(
                f"RDMABuffer data must be contiguous, but this tensor (shape "
                f"{tuple(t.shape)}, stride {tuple(t.stride())}) is a strided view; "
                "register t.contiguous() (a copy: keep it and copy results back) or a "
                "contiguous slice instead"
            )
    elif not t.is_contiguous():
        raise ValueError(
            f"the {role} tensor (shape {tuple(t.shape)}, stride {tuple(t.stride())}) is "
            "not contiguous; transfers copy bytes in order, so use a contiguous tensor "
            "(t.contiguous() for a source; for a destination, read into a contiguous "
            "tensor and then copy it into the view with view.copy_(tmp))"
        )
    nbytes = t.numel() * t.element_size()
    if role == "register" and nbytes == 0:
        raise ValueError(_EMPTY)
    device = t.device
    name = "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"tensors on {device.type} are not supported by monarch.rdma (CPU and CUDA "
            "memory are); move the tensor to the CPU first"
        )
    return Memory(addr=t.data_ptr(), nbytes=nbytes, device=name, writable=True, keep=t)
