"""monarch.job.PortForwarder: TCP forwarding through a mesh (invariants PF-1 to PF-4 of
``monarch._src.job.port_forward``).

The remote procs run on the hosts of a ``ProcessJob``; the services are TCP servers of
this process on the loopback interface, which the procs reach too. Sockets have
timeouts and threads are joined, so a failure ends a test instead of hanging it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import monarch.actor
from fault_recorder import RECORDER
from monarch.actor import ActorError, Point, ProcMesh, this_host, this_proc
from monarch.job import PortForwarder, ProcessJob

pytestmark = pytest.mark.timeout(120)

#: Seconds any single wait of these tests may take.
TIMEOUT = 30.0


@pytest.fixture(autouse=True, scope="module")
def _record_faults() -> None:
    # Never restored: failures may arrive after a test, and must not reach the default
    # (exiting) hook.
    monarch.actor.unhandled_fault_hook = RECORDER


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """One proc on each of two worker hosts."""
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        mesh = hosts.spawn_procs()
        mesh.initialized.get(timeout=60)
        yield mesh
        mesh.stop().get(timeout=TIMEOUT)
    finally:
        job.kill()


@pytest.fixture
def remote(procs: ProcMesh) -> ProcMesh:
    """The proc of the first host, as a 0-dimensional mesh (like ``this_proc()``)."""
    return procs.slice(hosts=0)


@pytest.fixture
def forwarder() -> Iterator[PortForwarder]:
    pf = this_proc().spawn("forwarder", PortForwarder)
    yield pf
    pf.stop().get(timeout=TIMEOUT)


# --- TCP servers ---------------------------------------------------------------------------


class Server:
    """A TCP server on 127.0.0.1 that runs ``handle(conn)`` per connection, each on a
    thread of its own, and records when each connection's handler ended."""

    def __init__(self, handle: Callable[[socket.socket], None], rcvbuf: int | None = None) -> None:
        self._handle = handle
        self._listener = socket.create_server(("127.0.0.1", 0))
        if rcvbuf is not None:  # inherited by accepted sockets
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self.accepted = threading.Semaphore(0)
        self.ended = threading.Semaphore(0)
        self.errors: list[BaseException] = []
        self._acceptor = threading.Thread(target=self._accept, name="test-server")
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(TIMEOUT)
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), name="test-conn")
            self._threads.append(thread)
            self.accepted.release()
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except (ConnectionError, TimeoutError, OSError) as e:
            self.errors.append(e)
        finally:
            conn.close()
            self.ended.release()

    def wait_accepted(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.accepted.acquire(timeout=TIMEOUT), "no connection reached the server"

    def wait_ended(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.ended.acquire(timeout=TIMEOUT), "a server connection did not end"

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        self._acceptor.join(TIMEOUT)
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(TIMEOUT)
        assert not any(t.is_alive() for t in [self._acceptor, *self._threads])


def echo(conn: socket.socket) -> None:
    while data := conn.recv(1 << 16):
        conn.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[Server]:
    server = Server(echo)
    yield server
    server.close()


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        data = sock.recv(min(1 << 20, size - len(chunks)))
        if not data:
            raise AssertionError(f"connection closed after {len(chunks)} of {size} bytes")
        chunks += data
    return bytes(chunks)


def recv_all(sock: socket.socket) -> bytes:
    chunks = bytearray()
    while data := sock.recv(1 << 20):
        chunks += data
    return bytes(chunks)


def reset(sock: socket.socket) -> None:
    """Close ``sock`` abruptly: the peer gets a reset, not an end of file."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def forward_to(
    forwarder: PortForwarder, remote: ProcMesh, port: int | str, **kwargs: object
) -> str:
    """Forward a local port (chosen by the system) to ``port`` as seen by ``remote``."""
    addresses = forwarder.forward.call_one(remote, port, this_proc(), "127.0.0.1:0").get(
        timeout=TIMEOUT
    )
    assert len(addresses) == 1
    return addresses[0]


# --- tests ---------------------------------------------------------------------------------


def test_a_local_port_reaches_a_service_through_the_remote_proc(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server, tmp_path: Path
) -> None:
    """PF-1: the destination side runs on the remote proc (the per-point function that
    picks the port runs there), and bytes go both ways unchanged."""
    marker = tmp_path / "destination-pid"
    port = echo_server.port

    def destination(point: Point) -> int:
        marker.write_text(str(os.getpid()))
        return port

    addresses = forwarder.forward.call_one(remote, destination, this_proc(), "127.0.0.1:0").get(
        timeout=TIMEOUT
    )
    assert int(marker.read_text()) != os.getpid()
    (address,) = addresses
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    with connect(address) as sock:
        sock.sendall(b"hello through the mesh")
        assert recv_exactly(sock, 22) == b"hello through the mesh"
        sock.shutdown(socket.SHUT_WR)
        assert recv_all(sock) == b""
    echo_server.wait_ended()


def test_a_destination_given_as_host_and_port(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server
) -> None:
    address = forward_to(forwarder, remote, f"localhost:{echo_server.port}")
    with connect(address) as sock:
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"


def test_concurrent_connections_keep_their_own_bytes(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server
) -> None:
    address = forward_to(forwarder, remote, echo_server.port)

    def exchange(i: int) -> bool:
        payload = bytes([i]) * 1000 + os.urandom(1 << 20)
        with connect(address) as sock:
            writer = threading.Thread(
                target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR))
            )
            writer.start()
            received = recv_all(sock)
            writer.join(TIMEOUT)
        return received == payload

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(exchange, range(8), timeout=TIMEOUT * 2))
    assert results == [True] * 8
    echo_server.wait_ended(8)


def test_a_large_transfer_arrives_intact(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server
) -> None:
    address = forward_to(forwarder, remote, echo_server.port)
    payload = os.urandom(32 << 20)
    with connect(address) as sock:
        writer = threading.Thread(
            target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR))
        )
        writer.start()
        received = recv_all(sock)
        writer.join(TIMEOUT)
        assert not writer.is_alive()
    assert len(received) == len(payload)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()


def test_a_slow_reader_slows_the_writer(forwarder: PortForwarder, remote: ProcMesh) -> None:
    """PF-2: while the service reads nothing, the client can only fill the buffers on
    the way (the sockets' and the relays' windows), far less than it tries to send; once
    the service reads, everything arrives."""
    payload_size = 64 << 20
    may_read = threading.Event()
    received: list[bytes] = []

    def slow(conn: socket.socket) -> None:
        may_read.wait(TIMEOUT * 2)
        received.append(recv_all(conn))

    server = Server(slow, rcvbuf=64 << 10)
    try:
        address = forward_to(forwarder, remote, server.port)
        sent = [0]
        chunk = b"z" * (64 << 10)
        with connect(address) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)

            def write() -> None:
                while sent[0] < payload_size:
                    sock.sendall(chunk)
                    sent[0] += len(chunk)
                sock.shutdown(socket.SHUT_WR)

            writer = threading.Thread(target=write)
            writer.start()
            server.wait_accepted()
            # No more progress for a second: the writer is held back.
            deadline = time.monotonic() + TIMEOUT
            last, still_since = -1, time.monotonic()
            while time.monotonic() < deadline:
                if sent[0] != last:
                    last, still_since = sent[0], time.monotonic()
                elif time.monotonic() - still_since >= 1.0:
                    break
                time.sleep(0.05)
            stalled_at = sent[0]
            may_read.set()
            writer.join(TIMEOUT * 2)
            assert not writer.is_alive()
        server.wait_ended()
    finally:
        may_read.set()
        server.close()
    assert stalled_at < payload_size // 2, f"the writer got {stalled_at} bytes out unread"
    assert received and len(received[0]) == payload_size


def test_a_client_reset_mid_stream_resets_the_service_side(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server
) -> None:
    """PF-3: an abrupt close of the client ends the service's connection."""
    address = forward_to(forwarder, remote, echo_server.port)
    sock = connect(address)
    sock.sendall(b"x" * (1 << 20))
    recv_exactly(sock, 1 << 16)  # the stream flows
    reset(sock)
    echo_server.wait_ended()


def test_a_service_reset_mid_stream_resets_the_client(
    forwarder: PortForwarder, remote: ProcMesh
) -> None:
    """PF-3: an abrupt close of the service's side resets the client's connection."""

    def read_then_reset(conn: socket.socket) -> None:
        recv_exactly(conn, 1000)
        conn.sendall(b"partial answer")
        reset(conn)

    server = Server(read_then_reset)
    try:
        address = forward_to(forwarder, remote, server.port)
        with connect(address) as sock:
            sock.sendall(b"q" * 1000)
            assert recv_exactly(sock, 14) == b"partial answer"
            with pytest.raises(ConnectionResetError):
                recv_all(sock)
        server.wait_ended()
    finally:
        server.close()


def test_an_unreachable_destination_resets_the_client(
    forwarder: PortForwarder, remote: ProcMesh
) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    address = forward_to(forwarder, remote, port)
    with connect(address) as sock:
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"anyone?")
            recv_all(sock)


def test_stop_closes_the_listener_and_every_connection(
    remote: ProcMesh, echo_server: Server
) -> None:
    """PF-4."""
    pf = this_proc().spawn("stopped_forwarder", PortForwarder)
    try:
        address = forward_to(pf, remote, echo_server.port)
        open_conns = [connect(address) for _ in range(3)]
        for sock in open_conns:
            sock.sendall(b"up")
            assert recv_exactly(sock, 2) == b"up"
    finally:
        pf.stop().get(timeout=TIMEOUT)
    echo_server.wait_ended(3)
    for sock in open_conns:
        with sock:
            try:
                assert recv_all(sock) == b""
            except ConnectionResetError:
                pass
    with pytest.raises(ConnectionRefusedError):
        connect(address).close()


def test_the_reverse_direction_a_remote_port_reaches_a_local_service(
    forwarder: PortForwarder, remote: ProcMesh, echo_server: Server
) -> None:
    (address,) = forwarder.forward.call_one(
        this_proc(), echo_server.port, remote, "127.0.0.1:0"
    ).get(timeout=TIMEOUT)
    with connect(address) as sock:  # the remote proc listens there
        sock.sendall(b"back home")
        assert recv_exactly(sock, 9) == b"back home"


def test_forwards_are_pointwise_between_meshes(
    forwarder: PortForwarder, procs: ProcMesh, echo_server: Server
) -> None:
    """Each source proc relays to the destination proc at its coordinates; per-point
    functions choose each one's address and destination."""
    port = echo_server.port
    addresses = forwarder.forward.call_one(
        procs, lambda point: f"127.0.0.1:{port}", procs, lambda point: "127.0.0.1:0"
    ).get(timeout=TIMEOUT)
    assert len(addresses) == 2 and addresses[0] != addresses[1]
    for i, address in enumerate(addresses):
        with connect(address) as sock:
            sock.sendall(b"point %d" % i)
            assert recv_exactly(sock, 7) == b"point %d" % i


def _tagging(tag: bytes) -> Callable[[socket.socket], None]:
    """A handler that answers each connection with ``tag``, then echoes."""

    def handle(conn: socket.socket) -> None:
        conn.sendall(tag)
        echo(conn)

    return handle


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_procs_of_one_host_share_one_source_address(forwarder: PortForwarder) -> None:
    """Several source procs on one host listen on the same address (SO_REUSEPORT): the
    connections to it spread over them, each relayed by the destination proc at the
    accepting proc's coordinates."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    servers = [Server(_tagging(b"A")), Server(_tagging(b"B"))]
    try:
        ports = [server.port for server in servers]
        address = f"127.0.0.1:{_free_port()}"
        addresses = forwarder.forward.call_one(
            procs, lambda point: ports[point.rank], procs, address
        ).get(timeout=TIMEOUT)
        assert addresses == [address, address]
        tags = set()
        for i in range(24):  # each lands on one of the two procs: both, surely
            with connect(address) as sock:
                tags.add(recv_exactly(sock, 1))
                sock.sendall(b"conn %d" % i)
                assert recv_exactly(sock, len(b"conn %d" % i)) == b"conn %d" % i
        assert tags == {b"A", b"B"}
    finally:
        for server in servers:
            server.close()
        procs.stop().get(timeout=TIMEOUT)


def test_mismatched_meshes_and_bad_addresses_are_refused(
    forwarder: PortForwarder, procs: ProcMesh, remote: ProcMesh
) -> None:
    with pytest.raises(ActorError) as info:
        forwarder.forward.call_one(procs, 80, this_proc(), "127.0.0.1:0").get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    assert "same extent" in str(info.value.exception)
    for dst, src in [(0, "127.0.0.1:0"), (80, "no-port"), (80, "127.0.0.1:99999")]:
        with pytest.raises(ActorError) as info:
            forwarder.forward.call_one(remote, dst, this_proc(), src).get(timeout=TIMEOUT)
        assert isinstance(info.value.exception, ValueError), info.value
    # The forwarder is still usable after refusing.
    server = Server(echo)
    try:
        with connect(forward_to(forwarder, remote, server.port)) as sock:
            sock.sendall(b"ok")
            assert recv_exactly(sock, 2) == b"ok"
    finally:
        server.close()
