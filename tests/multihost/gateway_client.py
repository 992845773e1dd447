"""A client outside the cluster (``monarch.actor.attach``), for the gateway tests:
``python gateway_client.py SCENARIO GATEWAY WORKER_ADDRESS...``.

``GATEWAY`` is the address the client attaches through (a worker's, as this client
reaches it); the workers are named by their in-cluster addresses. Each scenario prints
one line ``RESULT <json>`` at the end.

Scenarios:

- ``drive``: attach, check what this client cannot reach directly (``--unreachable``
  addresses, before monarch starts), then drive every worker through the gateway: spawn,
  call, cast then gather, messages to a port of the client, output lines, a proc's death
  reported to the fault hook, the survivors, and ``HostMesh.shutdown()``.
- ``late``: attach after monarch started (``this_proc()``) must raise ``RuntimeError``.
- ``credentials``: attach with this process's (wrong) credentials must be refused.
- ``gateway-dies``: spawn on every worker, say ``READY`` and wait for the test to kill
  the gateway's worker, then report the failures that reached the fault hook.
"""

from __future__ import annotations

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
    Channel,
    Port,
    SupervisionError,
    attach,
    attach_to_workers,
    current_rank,
    endpoint,
)


class Member(Actor):
    def __init__(self, gateway_ip: str) -> None:
        self.gateway_ip = gateway_ip
        self.total = 0

    @endpoint
    def where(self) -> dict[str, Any]:
        from monarch._src.actor import process

        # This proc's own IP: the source address of a route to the gateway's host.
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((self.gateway_ip, 9))
            ip = probe.getsockname()[0]
        finally:
            probe.close()
        return {"rank": dict(current_rank()), "proc": process.get().proc_id, "ip": ip}

    @endpoint
    def add(self, n: int) -> None:
        self.total += n

    @endpoint
    def get_total(self) -> int:
        return self.total

    @endpoint
    def report_to(self, port: Port[int]) -> None:
        port.send(current_rank().rank)

    @endpoint
    def say(self) -> None:
        print(f"said by rank {current_rank().rank}", flush=True)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        os._exit(3)


def result(value: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def _reach(address: str) -> str:
    """What a direct TCP connection to ``address`` (``tcp://IP:PORT``) gives."""
    host, port = address.split("//", 1)[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return "connected"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def drive(gateway: str, workers: list[str], unreachable: list[str]) -> None:
    direct = {a: _reach(a) for a in unreachable}
    failures: list[str] = []
    failed = threading.Event()

    def hook(failure: object) -> None:
        failures.append(str(failure))
        failed.set()

    monarch.actor.unhandled_fault_hook = hook
    start = time.monotonic()
    attach(gateway, ca=None)
    attached_s = time.monotonic() - start
    from monarch._src.actor import process

    client_proc = process.get().proc_id
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    hosts.initialized.get(timeout=60)
    start = time.monotonic()
    procs = hosts.spawn_procs(per_host={"gpus": 2}, name="members")
    gateway_ip = gateway.split("//", 1)[1].rsplit(":", 1)[0]
    members = procs.spawn("members", Member, gateway_ip)
    where = members.where.call().get(timeout=120)
    spawned_s = time.monotonic() - start
    places = [v for _, v in where.items()]
    # A cast to every rank, then a call gathering every rank's answer.
    for n in range(1, 11):
        members.add.broadcast(n)
    totals = members.get_total.call().get(timeout=60)
    # Every rank sends to a port of this client.
    send, recv = Channel[int].open()
    members.report_to.broadcast(send)
    reported = sorted(recv.recv().get(timeout=60) for _ in range(len(places)))
    members.say.call().get(timeout=60)
    # A proc dies: its worker reports it, through the gateway, to the fault hook.
    doomed = members.slice(hosts=len(workers) - 1, gpus=1)
    died_at = time.monotonic()
    doomed.die.broadcast()
    failed.wait(timeout=30)
    detected_s = time.monotonic() - died_at if failures else None
    error = None
    try:
        doomed.pid.call().get(timeout=30)
    except SupervisionError as e:
        error = str(e)
    except Exception as e:  # reported, and the test fails on it
        error = f"unexpected {type(e).__name__}: {e}"
    survivors = members.slice(hosts=0, gpus=0).pid.call().get(timeout=30)
    procs.stop().get(timeout=60)
    start = time.monotonic()
    hosts.shutdown().get(timeout=60)
    shutdown_s = time.monotonic() - start
    result(
        {
            "direct": direct,
            "client_proc": client_proc,
            "attached_s": attached_s,
            "spawned_s": spawned_s,
            "places": places,
            "totals": sorted(totals.values()),
            "reported": reported,
            "failures": failures[:3],
            "detected_s": detected_s,
            "error": error,
            "survivors": len(list(survivors.values())),
            "shutdown_s": shutdown_s,
        }
    )


def late(gateway: str) -> None:
    monarch.actor.this_proc()
    try:
        attach(gateway)
    except RuntimeError as e:
        result({"error": str(e)})
        return
    result({"error": None})


def credentials(gateway: str) -> None:
    start = time.monotonic()
    try:
        attach(gateway)
    except RuntimeError as e:
        result({"error": str(e), "took_s": time.monotonic() - start})
        return
    result({"error": None})


def gateway_dies(gateway: str, workers: list[str]) -> None:
    failures: list[str] = []
    everything = threading.Event()

    def hook(failure: object) -> None:
        failures.append(str(failure))
        if len(failures) >= 2 * len(workers):
            everything.set()

    monarch.actor.unhandled_fault_hook = hook
    attach(gateway, ca=None)
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    procs = hosts.spawn_procs(per_host={"gpus": 2}, name="members")
    members = procs.spawn("members", Member, gateway.split("//", 1)[1].rsplit(":", 1)[0])
    members.pid.call().get(timeout=120)
    print("READY", flush=True)
    sys.stdin.readline()
    killed_at = time.monotonic()
    everything.wait(timeout=30)
    result({"failures": failures, "detected_s": time.monotonic() - killed_at})


def main() -> None:
    scenario, gateway, *rest = sys.argv[1:]
    if scenario == "drive":
        split = rest.index("--unreachable") if "--unreachable" in rest else len(rest)
        drive(gateway, rest[:split], rest[split + 1 :])
    elif scenario == "late":
        late(gateway)
    elif scenario == "credentials":
        credentials(gateway)
    elif scenario == "gateway-dies":
        gateway_dies(gateway, rest)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
