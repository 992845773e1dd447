"""A client that ends while its trainer recovers leaves no process behind."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from injected_faults import alive

from output_lines import LineReader

pytest.importorskip("torch")

HERE = Path(__file__).parent


def _lines_until(proc: subprocess.Popen[str], prefix: str, timeout: float) -> str:
    lines = LineReader.of(proc)
    line = lines.until(prefix, timeout, prefix=False)
    if line is not None:
        return line.split(prefix, 1)[1].strip()
    proc.kill()
    rest = proc.communicate(timeout=30)[0]
    raise AssertionError(f"no {prefix!r} line; output:\n{''.join(lines.seen)}{rest}"[-4000:])


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until every process of ``pids`` has exited (a pidfd becomes readable when
    its process exits); those still running after ``timeout``."""
    sel = selectors.DefaultSelector()
    for pid in pids:
        try:
            sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                sel.unregister(key.fileobj)
                os.close(key.fd)
        return [p for p in pids if alive(p)]
    finally:
        for key in list(sel.get_map().values()):
            os.close(key.fd)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_no_replica_outlives_a_client_stopped_during_recovery(how: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "exit_client.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        pids = [int(p) for p in _lines_until(proc, "PIDS ", 120).split()]
        assert len(pids) == 3
        _lines_until(proc, "JOINING", 60)
        proc.send_signal(how)
        proc.communicate(timeout=60)
        assert not _wait_gone(pids, 30), "replicas outlived their client"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
