"""Client programs for the multi-host tests, run in the client network namespace:
``python client_script.py SCENARIO WORKER_ADDRESS...``.

Each scenario prints one line ``RESULT <json>`` at the end (and ``READY`` when it
waits for the test to do something to a host: it then reads one line from stdin).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import threading
import time
from typing import Any

import monarch.actor
from monarch.actor import (
    Actor,
    SupervisionError,
    attach_to_workers,
    current_rank,
    enable_transport,
    endpoint,
)


class Member(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def where(self) -> dict[str, Any]:
        from monarch._src.actor import process

        return {
            "rank": dict(current_rank()),
            "proc": process.get().proc_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }

    @endpoint
    def record(self, i: int) -> None:
        self.log.append(i)

    @endpoint
    def get_log(self) -> list[int]:
        return self.log

    @endpoint
    def ping(self) -> int:
        return os.getpid()


class Spawner(Actor):
    """Spawns actors on a proc mesh it is handed (from another host) and calls them."""

    @endpoint
    def spawn_on(self, procs: Any) -> list[int]:
        members = procs.spawn("nested", Member)
        return sorted(members.ping.call().get(timeout=60).values())


class Talker(Actor):
    @endpoint
    def say(self) -> None:
        rank = current_rank().rank
        print(f"stdout of rank {rank} on {socket.gethostname()}")
        print(f"stderr of rank {rank}", file=sys.stderr)

    @endpoint
    def die(self) -> None:
        print("last words", flush=True)
        os._exit(3)


class Tee:
    """A ``sys.stdout`` that keeps what was written."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.text.append(text)
        return int(self.inner.write(text))

    def flush(self) -> None:
        self.inner.flush()


def attach(workers: list[str]) -> Any:
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    hosts.initialized.get(timeout=60)
    return hosts


def result(value: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def wait_for_test() -> None:
    print("READY", flush=True)
    sys.stdin.readline()


def spawn_cast(workers: list[str]) -> None:
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    members = procs.spawn("members", Member)
    where = members.where.call().get(timeout=120)
    places = [v for _, v in where.items()]
    # ORD-1 across hosts: broadcasts then a direct call see every message in order.
    for i in range(50):
        members.record.broadcast(i)
    logs = members.get_log.call().get(timeout=60)
    ordered = all(v == list(range(50)) for _, v in logs.items())
    # A proc mesh handed to an actor on another host: it spawns there and calls.
    spawner = procs.slice(hosts=0, gpus=0).spawn("spawner", Spawner)
    nested = spawner.spawn_on.call_one(procs.slice(hosts=2)).get(timeout=120)
    result({"sizes": dict(procs.sizes), "places": places, "ordered": ordered, "nested": nested})


def failure(workers: list[str]) -> None:
    """Spawn on every host, wait for the test to break host 2, then report what the
    client saw: the failure, how long it took, and that the other hosts still work."""
    failures: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: failures.append(str(f))
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    members = procs.spawn("members", Member)
    members.ping.call().get(timeout=120)
    wait_for_test()
    broken_at = time.monotonic()
    deadline = broken_at + 30
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    detected = time.monotonic() - broken_at if failures else None
    error = None
    try:
        members.slice(hosts=2).ping.call().get(timeout=30)
    except SupervisionError as e:
        error = str(e)
    except Exception as e:  # reported, and the test fails on it
        error = f"unexpected {type(e).__name__}: {e}"
    healthy = sorted(members.slice(hosts=0).ping.call().get(timeout=30).values())
    healthy += sorted(members.slice(hosts=1).ping.call().get(timeout=30).values())
    result(
        {
            "detected_s": detected,
            "failures": failures[:3],
            "error": error,
            "healthy": len(healthy),
        }
    )
    wait_for_test()
    # The broken host back (or a new worker there): new procs work on it.
    again = hosts.slice(hosts=2).spawn_procs(per_host={"gpus": 1}, name="again")
    pids = again.spawn("again", Member).ping.call().get(timeout=60)
    result({"again": len(list(pids.values()))})


def shutdown_lost(workers: list[str]) -> None:
    """Spawn on every host and wait for the test to kill the worker of host 2 and cut
    host 1 off the network. ``known`` (argv's last word): wait until both are found
    lost, then shut down; ``silent``: shut down at once, host 1 not found lost yet.
    Report how long ``HostMesh.shutdown()`` took, and the failures seen."""
    mode = workers.pop()
    failures: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: failures.append(str(f))
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    members = procs.spawn("members", Member)
    members.ping.call().get(timeout=120)
    wait_for_test()
    if mode == "known":
        deadline = time.monotonic() + 30
        lost = {f"worker@tcp:{a.split('//', 1)[1]}" for a in workers[1:]}
        while time.monotonic() < deadline and not all(
            any(host in f for f in failures) for host in lost
        ):
            time.sleep(0.01)
    # Shutdown warns on stderr about each worker that did not confirm its end, and why
    # (a host known lost: "it was lost already", neither asked nor waited on).
    warnings = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stderr(warnings):
        hosts.shutdown().get(timeout=120)
    took = time.monotonic() - start
    print(warnings.getvalue(), end="", file=sys.stderr)
    not_ended = [ln for ln in warnings.getvalue().splitlines() if "did not confirm" in ln]
    result({"took": took, "failures": failures, "not_ended": not_ended})


def hold(workers: list[str]) -> None:
    """Spawn procs, report their pids, and wait to be killed."""
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    pids = procs.spawn("members", Member).ping.call().get(timeout=120)
    result({"pids": sorted(pids.values())})
    while True:
        time.sleep(1)


def wrong_credentials(workers: list[str]) -> None:
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None)
    error = None
    try:
        hosts.initialized.get(timeout=60)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    spawn_error = None
    try:
        hosts.spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=60)
    except Exception as e:
        spawn_error = f"{type(e).__name__}: {e}"
    result({"error": error, "spawn_error": spawn_error})


def output(workers: list[str]) -> None:
    """Procs on every host print; the one on host 2 then dies. Report what the client
    wrote in all, and what it had written when the failure reached the fault hook."""
    tee = Tee(sys.stdout)
    sys.stdout = tee
    before_failure: list[str] = []
    failed = threading.Event()

    def hook(failure: object) -> None:
        before_failure.append("".join(tee.text))
        failed.set()

    monarch.actor.unhandled_fault_hook = hook
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 1}, name="talk")
    talkers = procs.spawn("t", Talker)
    talkers.say.call().get(timeout=120)
    talkers.slice(hosts=2).die.broadcast()
    failed.wait(timeout=30)
    procs.stop().get(timeout=60)
    sys.stdout = tee.inner
    result({"all": "".join(tee.text), "before_failure": before_failure[:1]})


class Caller(Actor):
    """Calls the actors it is handed (on other hosts) and returns their pids."""

    @endpoint
    def ping_all(self, peers: Any) -> list[int]:
        return sorted(peers.ping.call().get(timeout=60).values())


def replacement(workers: list[str]) -> None:
    """A replacement host joins (issue 37): spawn on every host; the test SIGKILLs host
    2's worker and sends the time it did; once the fault hook has the loss, check the
    survivors and say READY; the test starts a new worker in host 2's namespace and
    sends its address; attach to it (a host mesh of its own), spawn there, and call the
    new actors together with the survivors' actors of the first mesh (hosts 0 and 1),
    each side calling the other too. Report what was seen and how long each step
    took."""
    lost = threading.Event()
    failures: list[str] = []
    hook_at: list[float] = []

    def hook(failure: object) -> None:
        hook_at.append(time.monotonic())
        failures.append(str(failure))
        lost.set()

    monarch.actor.unhandled_fault_hook = hook
    hosts = attach(workers)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    members = procs.spawn("members", Member)
    before = members.ping.call().get(timeout=120)
    print("READY", flush=True)
    # The test's time.monotonic() at the kill (the clock is the machine's, in every
    # namespace).
    killed_at = float(sys.stdin.readline())
    detected = hook_at[0] - killed_at if lost.wait(timeout=30) else None
    error = None
    try:
        members.slice(hosts=2).ping.call().get(timeout=30)
    except SupervisionError as e:
        error = str(e)
    except Exception as e:  # reported, and the test fails on it
        error = f"unexpected {type(e).__name__}: {e}"
    survivors = members.slice(hosts=slice(0, 2))
    survivor_pids = sorted(survivors.ping.call().get(timeout=30).values())
    print("READY", flush=True)
    address = sys.stdin.readline().strip()
    start = time.monotonic()
    joined = attach_to_workers(workers=[address], ca=None, name="replacement")
    joined.initialized.get(timeout=60)
    new_procs = joined.spawn_procs(per_host={"gpus": 2})
    fresh = new_procs.spawn("fresh", Member)
    pending = [survivors.ping.call(), fresh.where.call()]
    together, places = (p.get(timeout=60) for p in pending)
    answered_at = time.monotonic()
    # Each side calls the other directly: actors on the new host call the survivors,
    # and new actors on the survivors' procs (of the failed mesh) call the new host.
    callers = new_procs.spawn("callers", Caller)
    new_to_old = callers.ping_all.call(survivors).get(timeout=60).values()
    back = procs.slice(hosts=slice(0, 2)).spawn("back", Caller)
    old_to_new = back.ping_all.call(fresh).get(timeout=60).values()
    new_procs.stop().get(timeout=60)
    procs.stop().get(timeout=60)
    result(
        {
            "detected_s": detected,
            "failures": failures[:3],
            "error": error,
            "before": sorted(before.values()),
            "survivors": survivor_pids,
            "together": sorted(together.values()),
            "places": [v for _, v in places.items()],
            "joined_s": answered_at - start,
            "kill_to_answer_s": answered_at - killed_at,
            "new_to_old": new_to_old,
            "old_to_new": old_to_new,
        }
    )


SCENARIOS = {
    "output": output,
    "spawn_cast": spawn_cast,
    "failure": failure,
    "hold": hold,
    "shutdown_lost": shutdown_lost,
    "wrong_credentials": wrong_credentials,
    "replacement": replacement,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2:])
