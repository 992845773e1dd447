"""TCP port forwarding through a mesh: :class:`PortForwarder`.

A forward pairs two proc meshes of the same extent point by point. Every proc of the
*source* mesh listens on a TCP address; each connection it accepts is relayed, as actor
messages, to the proc at the same coordinates of the *destination* mesh, which opens a
TCP connection to the destination address and relays the other way. With the source
``this_proc()`` (the client) and the destination a remote proc, a local port reaches a
service that only the remote host can reach; swapped, a remote port reaches a service
of the client's.

One connection is two relays, one on each side, talking over a pair of channels. Each
side sends what it reads from its socket as ``_Data`` messages and writes what it
receives to its socket; ``_Ack`` tells the sender how many of its bytes were written
(the socket's buffer drained), and a sender keeps at most :data:`_WINDOW` bytes
unacknowledged, reading nothing more from its socket until acks come back. So a slow
reader at one end slows the writer at the other, and neither side buffers more than the
window per connection (plus the kernel's socket buffers).

Ends: a socket that reaches end of file sends ``_Eof``, which half-closes the other
socket (``write_eof``); the connection is done when both directions ended that way. A
socket error (a reset, a broken pipe) or a cancelled relay sends ``_Reset`` instead,
which aborts the other socket (the peer sees a reset). Stopping the
:class:`PortForwarder` stops the actors of every forward it made: their listening
sockets close and their connections are aborted.

Invariants (tests cite them):

- PF-1: each accepted connection reaches the destination proc at the same
  coordinates, and the bytes arrive in order, unchanged, both ways.
- PF-2: a sender has at most ``_WINDOW`` bytes unacknowledged per connection.
- PF-3: an abrupt end (reset) on either side aborts the other side; an orderly end of
  file half-closes it.
- PF-4: stopping the ``PortForwarder`` closes every listening socket and connection of
  its forwards.
- PF-5: sources listen with ``SO_REUSEPORT``: source procs on one host may share an
  address, and the connections to it spread over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import sys
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from monarch._src.actor.actor import Actor
from monarch._src.actor.channel import Channel, Port, PortReceiver
from monarch._src.actor.context import context
from monarch._src.actor.endpoint import concurrent_endpoint, endpoint
from monarch._src.actor.point import Point
from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.actor.supervision import MeshFailure

__all__ = ["PortForwarder"]

logger = logging.getLogger(__name__)

#: Most bytes one ``_Data`` message carries.
_CHUNK = 256 * 1024
#: Most bytes a relay sends before the peer acknowledges them (PF-2).
_WINDOW = 2 * 1024 * 1024
#: Seconds a destination waits for its TCP connection to open.
_CONNECT_TIMEOUT = 30.0
#: Seconds an orderly close waits for the socket to finish sending.
_CLOSE_TIMEOUT = 5.0
#: The host of a destination given as a bare port number.
_LOOPBACK = "127.0.0.1"

#: A destination: a port on the loopback interface, or ``"host:port"``.
_Destination = int | str
#: A source listening address: ``"host:port"`` (port 0: any free port).
_SourceAddress = str


class _Data(NamedTuple):
    data: bytes


class _Ack(NamedTuple):
    size: int


class _Eof(NamedTuple):
    pass


class _Reset(NamedTuple):
    reason: str


_Message = _Data | _Ack | _Eof | _Reset


class _Window:
    """The bytes a relay may still send before the peer acknowledges some."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._changed = asyncio.Event()

    async def wait_free(self) -> int:
        """Wait until some bytes may be sent; how many."""
        while self._free <= 0:
            self._changed.clear()
            await self._changed.wait()
        return self._free

    def spend(self, count: int) -> None:
        self._free -= count

    def refund(self, count: int) -> None:
        self._free += count
        self._changed.set()


class _PeerReset(ConnectionError):
    """The other side of the connection was reset."""


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    outbox: Port[_Message],
    inbox: PortReceiver[_Message],
) -> None:
    """Relay one connection between a socket and its peer relay (see the module docs).

    Three tasks: the socket's bytes to the peer (within the window), the peer's
    messages (acks are taken at once, whatever the socket does: an ack held up behind a
    write that waits for the other end, which itself waits for that ack's window, would
    deadlock), and the peer's bytes to the socket, queued meanwhile (at most a window).
    """
    window = _Window(_WINDOW)
    #: The peer's bytes not yet written to the socket; ``None``: its end of file.
    pending: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def socket_to_peer() -> None:
        while True:
            free = await window.wait_free()
            data = await reader.read(min(_CHUNK, free))
            if not data:
                outbox.send(_Eof())
                return
            window.spend(len(data))
            outbox.send(_Data(data))

    async def from_peer() -> None:
        while True:
            message = await inbox.recv()
            if isinstance(message, _Data):
                pending.put_nowait(message.data)
            elif isinstance(message, _Ack):
                window.refund(message.size)
            elif isinstance(message, _Eof):
                pending.put_nowait(None)
            else:
                raise _PeerReset(message.reason)

    async def peer_to_socket() -> None:
        while (data := await pending.get()) is not None:
            writer.write(data)
            await writer.drain()
            outbox.send(_Ack(len(data)))
        if writer.can_write_eof():
            writer.write_eof()

    sending = asyncio.ensure_future(socket_to_peer())
    receiving = asyncio.ensure_future(from_peer())
    writing = asyncio.ensure_future(peer_to_socket())
    tasks = (sending, receiving, writing)
    try:
        # Done once both directions ended with an end of file; an error in any task, or
        # the peer's reset, ends it at once.
        while not (sending.done() and writing.done()):
            await asyncio.wait(
                [t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED
            )
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
    except _PeerReset:
        _abort(writer)
    except asyncio.CancelledError:
        _send_reset(outbox, "the port forward was stopped")
        _abort(writer)
        raise
    except Exception as e:
        _send_reset(outbox, f"{type(e).__name__}: {e}")
        _abort(writer)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not writer.transport.is_closing():
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection abruptly: its peer gets a reset, not an end of file (asyncio's
    own ``abort`` only drops what was buffered)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _send_reset(outbox: Port[_Message], reason: str) -> None:
    with contextlib.suppress(Exception):  # the peer may be gone already
        outbox.send(_Reset(reason))


class _Relays:
    """The relays an actor runs, so that its cleanup can end them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        outbox: Port[_Message],
        inbox: PortReceiver[_Message],
    ) -> None:
        task = asyncio.get_running_loop().create_task(_relay(reader, writer, outbox, inbox))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("port forward: a connection failed", exc_info=task.exception())

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _check_port(what: str, port: object, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        raise ValueError(f"{what}: expected a TCP port from {low} to 65535, got {port!r}")
    return port


def _parse_address(what: str, address: object, *, allow_zero: bool) -> tuple[str, int]:
    """``"host:port"`` (IPv6 hosts in brackets) as ``(host, port)``."""
    if not isinstance(address, str):
        raise ValueError(f"{what}: expected 'host:port', got {address!r}")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what}: expected 'host:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{what}: the port of {address!r} is not a number") from None
    return host, _check_port(what, port, allow_zero=allow_zero)


def _destination(value: object) -> tuple[str, int]:
    if isinstance(value, str):
        return _parse_address("dst_port", value, allow_zero=False)
    return _LOOPBACK, _check_port("dst_port", value)


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _resolve(spec: Any, point: Point) -> Any:
    """A per-point value: ``spec(point)`` for a function, else ``spec``."""
    return spec(point) if callable(spec) else spec


def _my_point() -> Point:
    return context().actor_instance.rank


class _Connector(Actor):
    """The destination side of a forward: opens a connection per accepted one."""

    def __init__(self) -> None:
        self._target: tuple[str, int] | None = None
        self._relays = _Relays()

    @endpoint
    async def configure(self, destination: _Destination | Callable[[Point], _Destination]) -> None:
        self._target = _destination(_resolve(destination, _my_point()))

    @concurrent_endpoint
    async def open(self, peer: Port[_Message]) -> Port[_Message]:
        """Connect to the destination; the port the source sends this connection's
        messages to."""
        if self._target is None:
            raise RuntimeError("port forward: the destination is not configured")
        host, port = self._target
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), _CONNECT_TIMEOUT
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectionError(
                f"port forward: cannot connect to {_format_address(host, port)}: {e}"
            ) from None
        except asyncio.CancelledError:
            # The forward is stopping: an error for the source, not a failure of this
            # actor (which an escaping CancelledError would be).
            raise ConnectionAbortedError("port forward: stopped while connecting") from None
        inbox_port, inbox = Channel[_Message].open()
        self._relays.start(reader, writer, peer, inbox)
        return inbox_port

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await self._relays.close()


class _Listener(Actor):
    """The source side of a forward: listens, and relays what it accepts to the
    connector at the same coordinates."""

    def __init__(self) -> None:
        self._connector: _Connector | None = None
        self._server: asyncio.AbstractServer | None = None
        self._relays = _Relays()

    @endpoint
    async def start(
        self, connectors: _Connector, address: _SourceAddress | Callable[[Point], _SourceAddress]
    ) -> str:
        """Listen; the address listened on (its actual port when asked for port 0)."""
        point = _my_point()
        host, port = _parse_address("src_address", _resolve(address, point), allow_zero=True)
        self._connector = connectors.slice(**dict(point))
        # SO_REUSEPORT: the procs of a mesh on one host may share one source address;
        # the kernel spreads the connections to it over them.
        self._server = await asyncio.start_server(self._accept, host, port, reuse_port=True)
        bound = self._server.sockets[0].getsockname()
        return _format_address(str(bound[0]), int(bound[1]))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connector = self._connector
        if connector is None:
            _abort(writer)
            return
        try:
            inbox_port, inbox = Channel[_Message].open()
            outbox = await connector.open.call_one(inbox_port)
        except (Exception, asyncio.CancelledError) as e:
            # The destination cannot be reached: the client sees a reset.
            logger.warning("port forward: dropping a connection: %s", e)
            _abort(writer)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._relays.start(reader, writer, outbox, inbox)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._relays.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), _CLOSE_TIMEOUT)


class _Forward:
    """The actors of one forward."""

    def __init__(self, name: str, listeners: _Listener, connectors: _Connector) -> None:
        self.names = (f"port_forward_source_{name}", f"port_forward_destination_{name}")
        self.listeners = listeners
        self.connectors = connectors

    async def stop(self) -> None:
        # Listeners first: nothing new is accepted while the connectors go.
        for mesh in (self.listeners, self.connectors):
            with contextlib.suppress(Exception):
                await mesh.stop("port forward stopped")


class PortForwarder(Actor):
    """Owns TCP port forwards between proc meshes.

    Spawn one (usually on the client: ``this_proc().spawn("forwarder",
    PortForwarder)``), call :meth:`forward` once per forward, and stop it
    (``forwarder.stop()``) to close every listening socket and connection of its
    forwards. A forward whose actors fail (a proc of either mesh died) is stopped, and
    the failure reported on stderr; the forwarder and its other forwards go on.
    """

    def __init__(self) -> None:
        self._forwards: list[_Forward] = []

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: _Destination | Callable[[Point], _Destination],
        src_proc_mesh: ProcMesh,
        src_address: _SourceAddress | Callable[[Point], _SourceAddress],
    ) -> list[str]:
        """Start a forward: each proc of ``src_proc_mesh`` listens on ``src_address``
        and relays every connection it accepts to the proc at the same coordinates of
        ``dst_proc_mesh``, which connects to ``dst_port``.

        Args:
            dst_proc_mesh: the procs that can reach the destination service.
            dst_port: where they connect: a port of their loopback interface
                (``127.0.0.1``), or a ``"host:port"`` string; or a function of each
                destination proc's :class:`~monarch.actor.Point` returning one.
            src_proc_mesh: the procs that listen; the same extent as
                ``dst_proc_mesh``.
            src_address: the ``"host:port"`` each source proc listens on (port 0: a
                free port, see the result), or a function of its ``Point`` returning
                one.

        Returns:
            The address each source proc listens on, ``"host:port"``, in the row-major
            order of ``src_proc_mesh``.

        Raises:
            ActorError: wrapping a ``ValueError`` when the extents differ or an address
                is malformed, or the ``OSError`` of a source that cannot listen; nothing
                of the forward is left running then.
        """
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "PortForwarder.forward: the destination and source proc meshes must have "
                f"the same extent, got {dst_proc_mesh.sizes} and {src_proc_mesh.sizes}"
            )
        if not callable(dst_port):
            _destination(dst_port)
        if not callable(src_address):
            _parse_address("src_address", src_address, allow_zero=True)
        name = uuid.uuid4().hex[:12]
        forward = _Forward(
            name,
            src_proc_mesh.spawn(f"port_forward_source_{name}", _Listener),
            dst_proc_mesh.spawn(f"port_forward_destination_{name}", _Connector),
        )
        listeners, connectors = forward.listeners, forward.connectors
        self._forwards.append(forward)
        try:
            await connectors.configure.call(dst_port)
            addresses = await listeners.start.call(connectors, src_address)
        except BaseException:
            self._forwards.remove(forward)
            await forward.stop()
            raise
        return addresses.values()

    async def __supervise__(self, failure: MeshFailure) -> bool:
        for forward in list(self._forwards):
            if failure.mesh_name in forward.names:
                print(
                    f"monarch: PortForwarder: stopping a forward, whose actors failed: {failure}",
                    file=sys.stderr,
                )
                self._forwards.remove(forward)
                await forward.stop()
                return True
        return False

    async def __cleanup__(self, exc: BaseException | None) -> None:
        forwards, self._forwards = self._forwards, []
        for forward in forwards:
            await forward.stop()
