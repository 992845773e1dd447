"""``RDMABuffer`` and ``RDMAAction``: one-sided transfers of registered memory.

A buffer registers memory of the process that creates it (its *owner*) in place and is
a small picklable handle to it: owner actor, owner pid and host, the registration
(id, address, length, key, liveness slot), the owner's transfer-server address, and
for CUDA memory a CUDA IPC handle. Whoever holds the handle reads or writes the memory
without the owner's threads taking part where the path allows it.

Paths, chosen per transfer from the reader's side (``RDMABuffer.backend``):

- ``"cma"``: owner on this host (same kernel, pid and network namespace), CPU memory:
  ``process_vm_readv`` / ``process_vm_writev`` straight between the two processes.
- ``"cuda_ipc"``: owner on this host, either side in CUDA memory: the owner's memory
  is opened with its CUDA IPC handle and copied by the GPU (CPU memory of the owner is
  staged with a cross-memory copy).
- ``"ibverbs"``: both sides have an RDMA device (one-sided RDMA READ/WRITE).
- ``"tcp"``: otherwise, between hosts, when ``rdma_allow_tcp_fallback`` is true: the
  owner's transfer server streams from and into the registered memory over parallel
  connections.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from monarch._rust_bindings import (
    RdmaDropped,
    RdmaOwnerGone,
    RdmaRegion,
    rdma_allow_peer_access,
    rdma_choose,
    rdma_deregister,
    rdma_drop_remote,
    rdma_host_key,
    rdma_ibverbs_probe,
    rdma_ibverbs_register,
    rdma_read,
    rdma_register,
    rdma_register_device,
    rdma_serve,
    rdma_write,
)
from monarch._src import config
from monarch._src.actor.future import Done, Future
from monarch._src.rdma.memory import Memory, local_memory
from monarch._src.rdma.notices import (
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    warn_once,
)

if TYPE_CHECKING:
    from monarch._rust_bindings import Future as RustFuture

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]

#: A registered region, as the bindings give it (``pid``, ``id``, ``addr``, ``len``,
#: ``key``, ``slot``).
Region = RdmaRegion


# --- this process ----------------------------------------------------------------------


def _host_key() -> str:
    """Who counts as "this host" for one-sided copies: same boot (kernel), same pid
    namespace (pids mean the same), same network namespace (how simulated hosts are
    told apart)."""
    return rdma_host_key()


_setup_lock = threading.Lock()
_server: str | None = None
_peer_access_allowed = False


def _this_server() -> str:
    """This process's transfer-server address (started on first registration)."""
    global _server, _peer_access_allowed
    with _setup_lock:
        if not _peer_access_allowed:
            rdma_allow_peer_access()
            _peer_access_allowed = True
        if _server is None:
            _server = rdma_serve()
        return _server


def _probe() -> tuple[bool, tuple[str, ...], str | None]:
    """``(available, devices, reason)``: the device probe (cached in Rust) under the
    current ``rdma_disable_ibverbs`` setting."""
    ok, devices, reason = rdma_ibverbs_probe(bool(config.get("rdma_disable_ibverbs")))
    return ok, tuple(devices), reason


def is_ibverbs_available() -> bool:
    """Whether this process can use ibverbs: libibverbs is installed, an RDMA device is
    present, and ``rdma_disable_ibverbs`` is false."""
    return _probe()[0]


def is_rdma_available() -> bool:
    """Deprecated spelling of :func:`is_ibverbs_available`."""
    warnings.warn(
        "is_rdma_available() is deprecated; use is_ibverbs_available() (or "
        "get_rdma_backend() to learn which path transfers between hosts take)",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend() -> Literal["ibverbs", "tcp", "none"]:
    """How this process moves buffers to and from other hosts: ``"ibverbs"`` with an
    RDMA device, else ``"tcp"`` when ``rdma_allow_tcp_fallback`` is true, else
    ``"none"``. (On one host, transfers use cross-memory copies whatever this says.)"""
    if is_ibverbs_available():
        return "ibverbs"
    if config.get("rdma_allow_tcp_fallback"):
        return "tcp"
    return "none"


# --- the handle ------------------------------------------------------------------------


def _owner_name() -> str:
    # A script that imported only monarch.rdma gets its client started here, as with any
    # first use of monarch (the actor package registers the runtime's bootstrap).
    from monarch._src.actor.context import context

    return str(context().actor_instance.actor_id)


class RDMABuffer:
    """Memory of one process, registered in place for one-sided reads and writes by
    any other actor that holds this handle.

    ``data`` is a 1-D contiguous ``torch.Tensor`` (CPU or CUDA; any dtype: register
    ``t.view(torch.uint8).flatten()`` for a tensor of another shape) or a 1-D
    C-contiguous memoryview (any buffer object). Sizes are in bytes. Nothing is
    copied: the owner must keep the memory unchanged while transfers run. The
    registration holds a reference to ``data`` until :meth:`drop`.

    Pickles to a small reference: return it from endpoints, pass it as an argument.
    """

    __slots__ = (
        "__weakref__",
        "_cuda",
        "_device",
        "_host",
        "_owner",
        "_region",
        "_rkey",
        "_server",
        "_writable",
    )

    def __init__(self, data: Any) -> None:
        mem = local_memory(data, "register")
        server = _this_server()
        self._owner = _owner_name()
        self._host = _host_key()
        self._server: str | None = server
        self._device = mem.device
        self._writable = mem.writable
        self._cuda: tuple[Any, ...] | None = None
        if mem.is_cuda:
            from monarch._src.rdma import cuda

            cuda.check_allocator()
            self._cuda = cuda.ipc_handle(mem.keep)
            self._region: Region = rdma_register_device(mem.addr, mem.nbytes, mem.keep)
        else:
            self._region = rdma_register(mem.addr, mem.nbytes, mem.keep)
        self._rkey: int | None = None
        if not mem.is_cuda and is_ibverbs_available():
            self._rkey = rdma_ibverbs_register(self._region)

    # -- pickling: a small reference --

    def __reduce__(self) -> tuple[Callable[..., RDMABuffer], tuple[Any, ...]]:
        return (
            _rebuild,
            (
                self._owner,
                self._host,
                self._server,
                self._region,
                self._device,
                self._writable,
                self._cuda,
                self._rkey,
            ),
        )

    # -- what it is --

    def size(self) -> int:
        """The buffer's size in bytes."""
        return self._region.len

    @property
    def owner(self) -> str:
        """The actor that registered the memory (its actor id)."""
        return self._owner

    @property
    def device(self) -> str:
        """Where the memory is: ``"cpu"`` or ``"cuda:<index>"``."""
        return self._device

    @property
    def backend(self) -> str:
        """The path a transfer from this process to the owner takes: ``"cma"``,
        ``"cuda_ipc"``, ``"ibverbs"`` or ``"tcp"`` (``"none"`` when there is none)."""
        try:
            return self._route(None)
        except RuntimeError:
            return "none"

    def __repr__(self) -> str:
        return (
            f"RDMABuffer({self.size()} bytes, {self._device}, owner {self._owner}, "
            f"id {self._region.id})"
        )

    def _describe(self) -> str:
        return f"RDMABuffer of {self.size()} bytes ({self._device}) owned by {self._owner}"

    def _is_local(self) -> bool:
        return self._host == _host_key()

    def _route(self, local: Memory | None) -> Literal["cma", "cuda_ipc", "ibverbs", "tcp"]:
        if self._is_local():
            if self._device != "cpu" or (local is not None and local.is_cuda):
                return "cuda_ipc"
            return "cma"
        if self._device != "cpu":
            raise RuntimeError(
                f"{self._describe()} is in CUDA memory of another host: that takes "
                "ibverbs with GPUDirect RDMA, which these hosts do not have; register a "
                "CPU copy of the tensor instead (t.cpu())"
            )
        try:
            return rdma_choose(
                self._region,
                self._host,
                self._rkey,
                bool(config.get("rdma_allow_tcp_fallback")),
                bool(config.get("rdma_disable_ibverbs")),
            )
        except RuntimeError as e:
            raise RuntimeError(
                f"no fast path from {_owner_name()} to the owner of the {self._describe()}: {e}"
            ) from None

    # -- transfers --

    def read_into(self, dst: Any, *, timeout: float = 60) -> Future[None]:
        """Copy the whole buffer into the leading bytes of local ``dst`` (a tensor or a
        writable buffer of at least :meth:`size` bytes; the rest is untouched). Lazy:
        ``.get()`` or ``await`` the result."""
        mem = local_memory(dst, "destination")
        if mem.nbytes < self.size():
            raise ValueError(
                f"read_into: the destination has {mem.nbytes} bytes but the "
                f"{self._describe()} has {self.size()}; give a destination of at least "
                f"{self.size()} bytes"
            )
        return self._transfer("read", mem, timeout)

    def write_from(self, src: Any, *, timeout: float = 60) -> Future[None]:
        """Copy local ``src`` into the leading bytes of the buffer (``src`` must not be
        larger than :meth:`size`). Lazy: ``.get()`` or ``await`` the result."""
        mem = local_memory(src, "source")
        if mem.nbytes > self.size():
            raise ValueError(
                f"write_from: the source has {mem.nbytes} bytes but the "
                f"{self._describe()} has only {self.size()}; write at most {self.size()} "
                "bytes (a slice of the source)"
            )
        if not self._writable:
            raise ValueError(
                f"write_from: the {self._describe()} was registered from a read-only "
                "buffer; the owner must register writable memory (a bytearray or a "
                "tensor) to accept writes"
            )
        return self._transfer("write", mem, timeout)

    def _transfer(self, op: str, mem: Memory, timeout: float) -> Future[None]:
        _check_timeout(timeout)
        region = self._region
        if op == "write" and mem.nbytes < self.size():
            region = region.with_len(mem.nbytes)
        if mem.nbytes == 0:
            return Future(impl=Done(None))
        via = self._route(mem)
        if via == "cuda_ipc" or mem.is_cuda:
            from monarch._src.rdma import cuda

            return Future(
                impl=_ThreadWork(
                    functools.partial(cuda.transfer, self, op, region, mem, timeout, via),
                    self,
                )
            )
        if via == "tcp":
            warn_once(
                RDMATcpFallbackWarning,
                f"{self._describe()} is on another host and neither side has an RDMA "
                "device: transfers stream over TCP (set rdma_allow_tcp_fallback=False to "
                "forbid this)",
            )
        make = rdma_read if op == "read" else rdma_write
        verb = "read_into" if op == "read" else "write_from"
        fut = make(
            f"{verb} of the {self._describe()}",
            region,
            via,
            self._server,
            mem.addr,
            mem.keep,
            float(timeout),
            max(1, int(config.get("rdma_tcp_fallback_parallelism"))),
            max(1, int(config.get("rdma_max_chunk_size_mb"))) << 20,
            self._rkey if via == "ibverbs" else None,
        )
        return Future(impl=_RustTransfer(fut, self))

    def drop(self) -> Future[None]:
        """Release the registration: later transfers fail. Works from the owner and from
        any holder of the handle; dropping twice is fine."""
        if self._is_local() and self._region.pid == os.getpid():
            rdma_deregister(self._region.id)
            return Future(impl=Done(None))
        if self._server is None:
            return Future(impl=Done(None))
        return Future(impl=_RustTransfer(rdma_drop_remote(self._region, self._server, 60.0), self))


def _rebuild(
    owner: str,
    host: str,
    server: str | None,
    region: Region,
    device: str,
    writable: bool,
    cuda_handle: tuple[Any, ...] | None,
    rkey: int | None = None,
) -> RDMABuffer:
    buf = RDMABuffer.__new__(RDMABuffer)
    buf._owner = owner
    buf._host = host
    buf._server = server
    buf._region = region
    buf._device = device
    buf._writable = writable
    buf._cuda = cuda_handle
    buf._rkey = rkey
    return buf


def _check_timeout(timeout: float) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if timeout != timeout or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout}")


def owner_gone(buf: RDMABuffer, why: BaseException) -> BaseException:
    """The error a transfer raises when ``buf``'s owner is gone."""
    from monarch._src.actor.errors import SupervisionError

    return SupervisionError(
        f"the {buf._describe()} cannot be reached: its owner's process exited, was "
        f"killed, or is cut off ({why})"
    )


def _translate(buf: RDMABuffer, e: BaseException) -> BaseException:
    if isinstance(e, RdmaOwnerGone):
        return owner_gone(buf, e)
    if isinstance(e, RdmaDropped):
        return RuntimeError(f"the {buf._describe()} was dropped (or never registered there): {e}")
    return e


class _RustTransfer:
    """A transfer running in the Rust runtime, with its errors said in the buffer's
    terms."""

    def __init__(self, fut: RustFuture[Any], buf: RDMABuffer) -> None:
        self._fut = fut
        self._buf = buf

    def wait(self, timeout: float | None) -> None:
        try:
            self._fut.get(timeout)
        except (RdmaOwnerGone, RdmaDropped) as e:
            raise _translate(self._buf, e) from None

    async def wait_async(self) -> None:
        try:
            await self._fut
        except (RdmaOwnerGone, RdmaDropped) as e:
            raise _translate(self._buf, e) from None


class _ThreadWork:
    """Work done by Python code in a thread of its own (CUDA copies), started on the
    first wait; timeouts do not cancel it."""

    def __init__(self, fn: Callable[[], None], buf: RDMABuffer) -> None:
        self._fn = fn
        self._buf = buf
        self._started: Any = None
        self._lock = threading.Lock()

    def _start(self) -> Any:
        import concurrent.futures

        with self._lock:
            if self._started is None:
                done: concurrent.futures.Future[None] = concurrent.futures.Future()
                done.set_running_or_notify_cancel()

                def run() -> None:
                    try:
                        done.set_result(self._fn())
                    except BaseException as e:
                        done.set_exception(e)

                # A daemon thread per transfer: a copy never keeps the interpreter alive.
                threading.Thread(target=run, name="monarch-rdma-copy", daemon=True).start()
                self._started = done
            return self._started

    def wait(self, timeout: float | None) -> None:
        import concurrent.futures

        try:
            self._start().result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the transfer of the {self._buf._describe()} did not finish within "
                f"{timeout} s; it keeps running: call get() again or await the future"
            ) from None
        except (RdmaOwnerGone, RdmaDropped) as e:
            raise _translate(self._buf, e) from None

    async def wait_async(self) -> None:
        import asyncio

        try:
            await asyncio.wrap_future(self._start())
        except (RdmaOwnerGone, RdmaDropped) as e:
            raise _translate(self._buf, e) from None


# --- batches ---------------------------------------------------------------------------


class RDMAAction:
    """A batch of transfers submitted together: ``read_remote`` and ``write_remote``
    (chainable), then ``submit()``, which runs them all concurrently and may be called
    again to run them again."""

    def __init__(self) -> None:
        self._ops: list[tuple[str, Any, RDMABuffer]] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Add a read of remote ``src`` into local ``dst`` (checked now)."""
        _check_buffer(src, "read_remote")
        mem = local_memory(dst, "destination")
        if mem.nbytes < src.size():
            raise ValueError(
                f"read_remote: the destination has {mem.nbytes} bytes but the "
                f"{src._describe()} has {src.size()}"
            )
        self._ops.append(("read", dst, src))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Add a write of local ``src`` into remote ``dst`` (checked now)."""
        _check_buffer(dst, "write_remote")
        mem = local_memory(src, "source")
        if mem.nbytes > dst.size():
            raise ValueError(
                f"write_remote: the source has {mem.nbytes} bytes but the "
                f"{dst._describe()} has only {dst.size()}"
            )
        self._ops.append(("write", src, dst))
        return self

    def fetch_add(self, *args: Any, **kwargs: Any) -> RDMAAction:
        """Not supported: atomics need ibverbs atomics, which monarch does not use yet."""
        raise NotImplementedError(
            "RDMAAction.fetch_add is not implemented: use read_remote/write_remote"
        )

    def compare_and_swap(self, *args: Any, **kwargs: Any) -> RDMAAction:
        """Not supported: atomics need ibverbs atomics, which monarch does not use yet."""
        raise NotImplementedError(
            "RDMAAction.compare_and_swap is not implemented: use read_remote/write_remote"
        )

    def submit(self, *, timeout: float = 60) -> Future[None]:
        """Run every transfer of the batch, concurrently; fails (after all ended) with
        the first failure. Lazy; may be submitted again."""
        futures = [
            buf.read_into(local, timeout=timeout)
            if op == "read"
            else buf.write_from(local, timeout=timeout)
            for op, local, buf in self._ops
        ]
        return Future(impl=_All(futures))

    def __len__(self) -> int:
        return len(self._ops)


def _check_buffer(buf: object, what: str) -> None:
    if not isinstance(buf, RDMABuffer):
        raise TypeError(f"{what}: expected an RDMABuffer, got {type(buf).__name__}")


class _All:
    """Waits for every future; raises the first failure once all ended."""

    def __init__(self, futures: list[Future[None]]) -> None:
        self._futures = futures

    def wait(self, timeout: float | None) -> None:
        import asyncio

        from monarch._src.actor.future import background_loop

        async def gather() -> None:
            await self.wait_async()

        conc = asyncio.run_coroutine_threadsafe(gather(), background_loop())
        import concurrent.futures

        try:
            conc.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the RDMAAction of {len(self._futures)} transfers did not finish within "
                f"{timeout} s; it keeps running: call get() again or await the future"
            ) from None

    async def wait_async(self) -> None:
        import asyncio

        async def one(f: Future[None]) -> None:
            await f

        results = await asyncio.gather(*(one(f) for f in self._futures), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
