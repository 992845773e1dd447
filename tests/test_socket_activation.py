"""Socket activation: a worker serves on a listening socket its parent bound and passed
as a file descriptor (``tcp://HOST:fdN``), and clients dial the socket's real port.

The worker and the client each run in a subprocess of their own (a process's TCP mode
is for its whole life); they trust every connection (``ca="trust_all_connections"``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch._src.actor.workers import READY_LINE

ROOT = Path(__file__).resolve().parents[1]

CLIENT = """\
import json
import sys

from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x + 1


port, fd = sys.argv[1:3]
enable_transport("tcp-localhost")
# fdN only serves: a client that dials it is told to dial the real port.
try:
    attach_to_workers(workers=[f"tcp://127.0.0.1:fd{fd}"], ca="trust_all_connections")
    refused = None
except ValueError as e:
    refused = str(e)
hosts = attach_to_workers(workers=[f"tcp://127.0.0.1:{port}"], ca="trust_all_connections")
procs = hosts.spawn_procs(per_host={"gpus": 1})
answer = procs.spawn("echo", Echo).echo.call_one(41).get(timeout=60)
procs.stop().get(timeout=60)
print("RESULT " + json.dumps({"answer": answer, "refused": refused}), flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in (
        "MONARCH_CLUSTER_SECRET",
        "MONARCH_CLUSTER_AUTH",
        "MONARCH_TLS_CA",
        "MONARCH_TLS_CERT",
        "MONARCH_TLS_KEY",
    ):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return env


class Lines:
    """The lines a process writes to its stdout (and stderr), as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        self.stdout = proc.stdout
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put(None)

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def close(self) -> None:
        """Once the process ended: wait for the rest of its output, close the pipe."""
        self.reader.join(timeout=10)
        self.stdout.close()

    def wait_for(self, text: str, timeout: float) -> None:
        """Wait for a line containing ``text``; fail if the stream ends or ``timeout``
        seconds pass first."""
        while True:
            try:
                line = self.queue.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no {text!r} within {timeout} s: {''.join(self.seen)[-3000:]}")
            if line is None:
                pytest.fail(f"the stream ended before {text!r}: {''.join(self.seen)[-3000:]}")
            self.seen.append(line)
            if text in line:
                return


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def activated() -> Iterator[tuple[int, int]]:
    """A worker serving on a socket this test bound to a free port and passed as a file
    descriptor: the port, and the descriptor's number in the worker."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    fd = sock.fileno()
    code = (
        "from monarch.actor import run_worker_loop_forever\n"
        f"run_worker_loop_forever(address='tcp://127.0.0.1:fd{fd}', "
        "ca='trust_all_connections')\n"
    )
    try:
        worker = subprocess.Popen(
            [sys.executable, "-c", code],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(fd,),
        )
    finally:
        sock.close()  # the worker holds it now
    lines = Lines(worker)
    try:
        # It advertises the socket's real port at the host given.
        lines.wait_for(f"{READY_LINE} tcp:127.0.0.1:{port}", timeout=60)
        yield port, fd
    finally:
        _stop(worker)
        lines.close()


@pytest.mark.timeout(180)
def test_a_worker_serves_on_an_inherited_socket_and_clients_dial_its_port(
    activated: tuple[int, int], tmp_path: Path
) -> None:
    port, fd = activated
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    out = subprocess.run(
        [sys.executable, str(script), str(port), str(fd)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["answer"] == 42, result
    assert "only for serving" in result["refused"], result
    assert "tcp://HOST:PORT" in result["refused"], result


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["file", "not_passed", "not_listening"])
def test_a_descriptor_that_is_not_a_listening_socket_is_refused_naming_it(
    what: str, tmp_path: Path
) -> None:
    """``monarch worker`` with a bad ``fdN`` says which descriptor and what is wrong, and
    exits with status 2."""
    with open(tmp_path / "file", "w") as file, socket.socket() as unbound:
        passed: tuple[int, ...]
        if what == "file":
            fd, passed, problem = file.fileno(), (file.fileno(),), "it is not a socket"
        elif what == "not_passed":
            fd, passed, problem = 900, (), "it is not open in this process"
        else:
            unbound.bind(("127.0.0.1", 0))  # bound, but nobody called listen()
            fd, passed, problem = unbound.fileno(), (unbound.fileno(),), "not listening"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "monarch.tools.cli",
                "worker",
                "--address",
                f"tcp://127.0.0.1:fd{fd}",
                "--trust-all-connections",
            ],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=50,
            pass_fds=passed,
        )
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"the inherited file descriptor {fd}: " in out.stderr, out.stderr[-3000:]
    assert problem in out.stderr, out.stderr[-3000:]
