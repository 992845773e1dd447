"""Client programs of the multi-host ``monarch.rdma`` tests, run in the client network
namespace: ``python rdma_client_script.py SCENARIO WORKER_ADDRESS...`` (two workers:
host 0 owns the buffer, host 1 uses it).

Like ``client_script.py``, each scenario prints ``RESULT <json>`` lines, and ``READY``
when it waits for the test to do something to a host: it then reads one line from stdin
(here, the ``time.monotonic()`` at which the test broke the host).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from typing import Any

import torch

import monarch.actor
from monarch.actor import (
    Actor,
    Channel,
    Port,
    attach_to_workers,
    context,
    enable_transport,
    endpoint,
)
from monarch.rdma import RDMAAction, RDMABuffer, RDMATcpFallbackWarning

# The content helpers shared with the one-host tests; the workers on the other hosts get
# them pickled by value, so they need not find the module.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cloudpickle

import rdma_content
from rdma_content import SENTINEL, MiB, mismatch, outcome, pattern, read_until_gone

cloudpickle.register_pickle_by_value(rdma_content)


def tcp_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [w.category.__name__ for w in record if issubclass(w.category, RDMATcpFallbackWarning)]


def use(buf: RDMABuffer, seed: int, new_seed: int) -> dict[str, Any]:
    """Read ``buf`` (which holds ``pattern(seed)``), write ``pattern(new_seed)``, read it
    back, then an RDMAAction doing both; report contents, the handle and the warnings."""
    n = buf.size()
    report: dict[str, Any] = {"size": n, "owner": buf.owner, "backend": buf.backend}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dst = torch.full((n + 3,), SENTINEL, dtype=torch.uint8)
        buf.read_into(dst, timeout=60).get(timeout=90)
        report["read"] = mismatch(dst[:n], pattern(n, seed))
        report["tail"] = mismatch(dst[n:], torch.full((3,), SENTINEL, dtype=torch.uint8))
        buf.write_from(pattern(n, new_seed), timeout=60).get(timeout=90)
        dst.fill_(SENTINEL)
        buf.read_into(dst[:n], timeout=60).get(timeout=90)
        report["read_back"] = mismatch(dst[:n], pattern(n, new_seed))
        dst.fill_(SENTINEL)
        RDMAAction().read_remote(dst, buf).write_remote(buf, pattern(n, new_seed)).submit(
            timeout=60
        ).get(timeout=90)
        report["action"] = mismatch(dst[:n], pattern(n, new_seed))
    report["warnings"] = tcp_warnings(record)
    report["all_warnings"] = [f"{w.category.__name__}: {w.message}" for w in record]
    return report


class Peer(Actor):
    def __init__(self) -> None:
        self.mem: Any = None
        self.buf: RDMABuffer | None = None

    @endpoint
    def whoami(self) -> dict[str, Any]:
        return {
            "actor_id": context().actor_instance.actor_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }

    @endpoint
    def own(self, nbytes: int, seed: int) -> RDMABuffer:
        self.mem = pattern(nbytes, seed)
        self.buf = RDMABuffer(self.mem)
        return self.buf

    @endpoint
    def check(self, seed: int) -> str:
        return mismatch(self.mem, pattern(self.mem.numel(), seed))

    @endpoint
    def use(self, buf: RDMABuffer, seed: int, new_seed: int) -> dict[str, Any]:
        return use(buf, seed, new_seed)

    @endpoint
    def read_until_gone(self, buf: RDMABuffer, seed: int, started: Port[str]) -> dict[str, Any]:
        return read_until_gone(buf, seed, lambda: started.send("reading"))


def result(value: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def wait_for_test() -> float:
    """READY, then the line the test answers: when it broke the host (monotonic)."""
    print("READY", flush=True)
    return float(sys.stdin.readline())


def setup(workers: list[str]) -> tuple[Any, Any, list[str]]:
    failures: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: failures.append(str(f))
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    hosts.initialized.get(timeout=60)
    procs = hosts.spawn_procs(per_host={"procs": 1})
    peers = procs.spawn("peers", Peer)
    return peers.slice(hosts=0), peers.slice(hosts=1), failures


def transfers(workers: list[str]) -> None:
    """An actor on host 0 owns 64 MiB; the actor on host 1, then the client (in a third
    namespace), read and write it."""
    owner, other, failures = setup(workers)
    n = 64 * MiB
    owner_info = owner.whoami.call_one().get(timeout=120)
    other_info = other.whoami.call_one().get(timeout=120)
    buf = owner.own.call_one(n, 1).get(timeout=120)
    remote = other.use.call_one(buf, 1, 2).get(timeout=180)
    remote["owner_check"] = owner.check.call_one(2).get(timeout=120)
    local = use(buf, 2, 3)
    local["owner_check"] = owner.check.call_one(3).get(timeout=120)
    buf.drop().get(timeout=60)
    after_drop = outcome(lambda: buf.read_into(torch.empty(n, dtype=torch.uint8)).get(timeout=60))
    result(
        {
            "owner": owner_info,
            "other": other_info,
            "remote": remote,
            "local": local,
            "after_drop": after_drop,
            "failures": failures[:3],
        }
    )


def owner_host_killed(workers: list[str]) -> None:
    """The actor on host 1 reads host 0's buffer in a loop; the test kills host 0's
    worker; the reads end in SupervisionError, as do the client's later ones."""
    owner, other, failures = setup(workers)
    n = 64 * MiB
    owner_info = owner.whoami.call_one().get(timeout=120)
    buf = owner.own.call_one(n, 5).get(timeout=120)
    port, receiver = Channel.open()
    loop = other.read_until_gone.call_one(buf, 5, port)
    receiver.recv().get(timeout=120)
    killed_at = wait_for_test()
    report = loop.get(timeout=150)
    start = time.monotonic()
    dst = torch.empty(n, dtype=torch.uint8)
    client_after = outcome(lambda: buf.read_into(dst, timeout=30).get(timeout=45))
    took = time.monotonic() - start
    result(
        {
            "owner": owner_info,
            "killed_at": killed_at,
            "report": report,
            "client_after": [*client_after, took],
            "failures": failures[:3],
        }
    )


SCENARIOS = {"transfers": transfers, "owner_host_killed": owner_host_killed}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2:])
