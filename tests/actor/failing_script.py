"""A client whose actor fails while its main thread does one of several things; run by
test_determinism.py, many times per case, to check that the outcome never varies.

Usage: ``python failing_script.py MAIN FAILURE HOOK`` where

* MAIN, what the main thread does when the failure arrives: ``get`` (blocked in
  ``get()`` on a call to the failing actor), ``await`` (awaiting that call),
  ``except`` (inside an ``except SupervisionError`` block, sleeping), ``sleep``,
  ``compute`` (a pure-Python loop);
* FAILURE: ``exit`` (the actor's proc calls ``os._exit(3)``), ``sigkill`` (the proc
  kills itself with SIGKILL), ``init`` (``__init__`` raises);
* HOOK: ``default``, or ``returns`` (a hook that records the failure and returns).

It prints ``OUTCOME ...`` lines on stdout for what the main thread saw, and ``ATEXIT``
from an atexit handler.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import sys
import time

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host

MAIN, FAILURE, HOOK = sys.argv[1:4]


def at_exit() -> None:
    print("ATEXIT", flush=True)


atexit.register(at_exit)

seen: list[MeshFailure] = []
if HOOK == "returns":
    monarch.actor.unhandled_fault_hook = seen.append


class Victim(Actor):
    def __init__(self, fail: bool) -> None:
        if fail:
            raise ValueError("__init__ failed on purpose")

    @endpoint
    def die(self, how: str) -> None:
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    def ping(self) -> int:
        return 1


def outcome(what: str) -> None:
    print(f"OUTCOME {what}", flush=True)


procs = this_host().spawn_procs(per_host={"procs": 1})
# A mesh stopped on purpose: calls to it raise SupervisionError, not a failure.
stopped = procs.spawn("stopped", Victim, False)
stopped.stop().get(timeout=30)

victim = procs.spawn("victim", Victim, FAILURE == "init")


def fail() -> object:
    """Make the victim fail; a call that the failure leaves pending."""
    if FAILURE == "init":
        return victim.ping.call_one()
    return victim.die.call_one(FAILURE)


def settle(pending: object) -> None:
    try:
        pending.get(timeout=60)  # type: ignore[attr-defined]
        outcome("value")
    except SupervisionError as e:
        outcome(f"SupervisionError {e}")


if MAIN == "get":
    settle(fail())
elif MAIN == "await":

    async def main() -> None:
        try:
            await fail()  # type: ignore[misc]
            outcome("value")
        except SupervisionError as e:
            outcome(f"SupervisionError {e}")

    asyncio.run(main())
elif MAIN == "except":
    try:
        stopped.ping.call_one().get(timeout=30)
    except SupervisionError:
        pending = fail()
        time.sleep(60)
        outcome("slept in except")
        settle(pending)
elif MAIN == "sleep":
    pending = fail()
    time.sleep(0.5 if HOOK == "returns" else 60)
    outcome("slept")
    settle(pending)
elif MAIN == "compute":
    pending = fail()
    deadline = time.monotonic() + (0.5 if HOOK == "returns" else 60)
    n = 0
    while time.monotonic() < deadline:
        n += 1
    outcome("computed")
    settle(pending)

# Later calls on the failed mesh raise too; the hook ran once.
try:
    victim.ping.call_one().get(timeout=30)
    outcome("later value")
except SupervisionError:
    outcome("later SupervisionError")
outcome(f"hook ran {len(seen)} time(s)")
procs.stop().get(timeout=30)
