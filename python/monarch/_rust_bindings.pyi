"""Typed interface of ``monarch._rust_bindings``, the compiled extension module.

Built from the ``monarch_extension`` crate by maturin; ``make stubtest`` checks this file
against the built module.
"""

import asyncio
from collections.abc import Generator
from types import GenericAlias
from typing import Any, Generic, Literal, TypedDict, TypeVar, final, type_check_only

__all__ = [
    "Client",
    "Future",
    "PortReceiver",
    "PortRef",
    "Proc",
    "WouldBlockRuntime",
    "__version__",
    "build_info",
]

_R_co = TypeVar("_R_co", covariant=True)

__version__: str
"""The version of the ``monarch_extension`` crate, equal to the package version."""

@type_check_only
class _BuildInfo(TypedDict):
    version: str
    profile: Literal["debug", "release"]
    target: str
    rustc: str

def build_info() -> _BuildInfo:
    """Describe how this extension was built, for bug reports.

    Returns a new dict with the keys ``version``, ``profile`` (``"debug"`` or
    ``"release"``), ``target`` (the Rust target triple) and ``rustc`` (the compiler
    version).
    """

class WouldBlockRuntime(RuntimeError):
    """A blocking call (such as ``Future.get()``) was made on a thread of Monarch's tokio
    runtime, where blocking would stall the runtime. Await instead, or block from a thread
    of your own."""

@final
class Future(Generic[_R_co]):
    """The result of work running on Monarch's tokio runtime (API.md section 1.4).

    Not user-constructible (``TypeError``). The work is lazy: it starts the first time
    someone waits. The result, or the exception, is cached: repeated waits return the
    same object or re-raise the same exception object.
    """

    def get(self, timeout: float | None = None) -> _R_co:
        """Block until the result is ready, without holding the GIL, and return it.

        ``timeout`` (seconds, finite and >= 0) raises ``TimeoutError`` if the work is not
        done by then; the work keeps running, and a later ``get()`` or ``await`` still
        sees its result. A negative or non-finite timeout raises ``ValueError``. Called on
        a thread running an asyncio loop it still works but warns (``UserWarning``); on a
        tokio runtime thread it raises ``WouldBlockRuntime``.
        """

    def result(self, timeout: float | None = None) -> _R_co:
        """Same as ``get``."""

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like ``get``; return the work's exception, or ``None`` if it succeeded."""

    def as_asyncio(self) -> asyncio.Future[_R_co]:
        """A new ``asyncio.Future`` on the running loop that completes with this future
        (``RuntimeError`` without a running loop)."""

    def __await__(self) -> Generator[Any, None, _R_co]:
        """Await the result on any running asyncio loop, any number of times
        (``ValueError`` without a running loop). The loop is never blocked."""

    def __class_getitem__(cls, key: Any) -> GenericAlias:
        """``Future[int]`` is valid at runtime."""

@final
class Proc:
    """A hyperactor proc: it serves one channel address and routes messages.

    No public constructor: use ``Proc.serve``.
    """

    @staticmethod
    def serve(transport: Literal["local", "unix", "tcp"], name: str = "proc") -> Proc:
        """Start a proc listening on a fresh address of ``transport``.

        ``ValueError`` for an unknown transport or an invalid name; ``RuntimeError`` if the
        address cannot be bound.
        """

    @property
    def proc_id(self) -> str:
        """This proc's id, its address included."""

    def client(self, name: str = "client") -> Client:
        """A new client (a mailbox that is not an actor) on this proc."""

@final
class Client:
    """A mailbox on a proc for code that is not an actor: it sends and opens ports."""

    @property
    def actor_id(self) -> str:
        """This client's actor id."""

    def open_port(self) -> tuple[PortRef, PortReceiver]:
        """Open a streaming port on this client's mailbox, carrying lists of byte parts."""

@final
class PortRef:
    """A reference to a port, to send to. Picklable; its ``str`` is the port id."""

    @staticmethod
    def from_string(port_id: str) -> PortRef:
        """Parse a port id (the ``str`` of a ``PortRef``); ``ValueError`` if malformed."""

    def send(self, client: Client, parts: list[bytes] | bytes) -> None:
        """Send one message, ``bytes`` or a list of ``bytes`` parts (kept apart on the
        wire), from ``client``. Never waits. ``TypeError`` for anything else."""

    def __reduce__(self) -> tuple[Any, tuple[str]]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class PortReceiver:
    """The receiving end of a port opened by ``Client.open_port()``."""

    @property
    def port_id(self) -> str:
        """The id of the port (the ``str`` of its ``PortRef``)."""

    def recv(self) -> Future[list[bytes]]:
        """The next message, as a lazy future of its byte parts. Raises ``RuntimeError``
        naming the port once the port is closed."""

    def close(self) -> None:
        """Close the port: pending and later ``recv()`` futures raise ``RuntimeError``;
        messages sent to the port later go back to their senders."""
