"""Backpressure: a Python actor's queue is bounded, and a sender faster than the actor
goes at its pace instead of growing the queue without bound."""

from __future__ import annotations

import pytest

from monarch.actor import Actor, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class Slow(Actor):
    @endpoint
    def take(self, data: bytes) -> None:
        import time

        time.sleep(0.005)  # slower than its sender

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()


def test_a_slow_actor_slows_its_sender_instead_of_queueing_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue of a Python actor is bounded (HYPERACTOR_QUEUE_HIGH_WATER, 256 MiB by
    default): over it, the connection that feeds it stops reading, the sender's link
    runs out of budget and ``broadcast`` waits. 400 MiB sent to an actor that takes
    5 ms per message never makes its proc hold more than a few messages."""
    monkeypatch.setenv("HYPERACTOR_QUEUE_HIGH_WATER", str(4 << 20))  # read by the proc
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        slow = procs.spawn("slow", Slow)
        pid = slow.pid.call_one().get(timeout=60)
        before = status_kib(pid, "VmRSS")
        payload = bytes(2 << 20)
        for _ in range(200):
            slow.take.broadcast(payload)
        slow.pid.call_one().get(timeout=120)  # after every take (ORD-1)
        grown = status_kib(pid, "VmHWM") - before
    finally:
        procs.stop().get(timeout=30)
    # Unbounded, the proc's peak would hold most of the 400 MiB (about 300 MiB measured).
    assert grown < 100 << 10, f"the proc's peak RSS grew by {grown >> 10} MiB"
