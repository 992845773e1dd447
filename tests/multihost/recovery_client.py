"""The client of the multi-host recovery test, run in the client network namespace:
``python recovery_client.py STEPS KILL_AT REFERENCE_FILE GATE_DIR WORKER_ADDRESS...``
(four workers).

It attaches to the workers and trains a run of ``ElasticTrainer``: 3 replicas on hosts
0-2 and a warm spare (on host 3, the host with no replica). With ``KILL_AT`` -1 the run
has no failure: it writes its weights to ``REFERENCE_FILE`` (JSON) and prints ``RESULT``
with how long it took.

Otherwise the test breaks replica 1's host in the middle of step ``KILL_AT``. Before that
step the client prints ``READY <pid of replica 1> <host of replica 1>`` and goes on. In
the step, each replica (in ``batch``, before its gradients' allreduce) creates
``GATE_DIR/in-step-<rank>`` and waits until ``GATE_DIR/go`` exists: the test waits for
the three files, breaks the host (SIGKILLs everything on it, or cuts its link), creates
``go``, and writes ``go <CLOCK_MONOTONIC time of the break>`` to the client's stdin. The
survivors' allreduce then fails or hangs on the lost peer; the trainer replaces the
replica and computes the step again (a recomputed step does not wait: ``go`` exists).

Every completed step prints ``STEP <run> <step> <monotonic time>``. At the end one line
``RESULT <json>``: the largest difference from the weights in ``REFERENCE_FILE``, the
recovery (its step, lost ranks, placement, seconds, attempts), the steps completed,
where the replicas and the spare ran before and after, how long from the break to the
next completed step, and the failures that reached the fault hook.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import monarch.actor
from monarch.actor import attach_to_workers, enable_transport, endpoint
from monarch.recovery import ElasticTrainer, Replica

#: The model's widths, and samples per replica and step: tiny, so each step is quick.
IN, HIDDEN, BATCH = 16, 32, 32
#: Replicas; the spare host is the one after them.
REPLICAS = 3
#: The replica whose host is broken.
VICTIM = 1
#: How long a replica waits in the gated step for the test's ``go`` file.
GATE_TIMEOUT = 120.0


class Net(Replica):
    """A small MLP fit to y = x . w, each replica on its own share of every step."""

    def __init__(self, gate: str | None = None, gated_step: int = -1) -> None:
        self.gate = Path(gate) if gate else None
        self.gated_step = gated_step
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.w = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.gate is not None and step == self.gated_step:
            self._wait_for_go()
        g = torch.Generator().manual_seed(step * 1000 + self.replica_rank)
        x = torch.randn(BATCH, IN, generator=g)
        return x, x @ self.w

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    def _wait_for_go(self) -> None:
        """Say this replica is in the gated step, and wait for the test's ``go`` (at
        once when it exists already: the step computed again after the recovery)."""
        assert self.gate is not None
        go = self.gate / "go"
        if go.exists():
            return
        (self.gate / f"in-step-{self.replica_rank}").touch()
        deadline = time.monotonic() + GATE_TIMEOUT
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {self.replica_rank}: no {go} in {GATE_TIMEOUT} s")
            time.sleep(0.005)  # polling a file the test creates; nothing to wait on

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def weights(self) -> list[float]:
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]


def _weights(trainer: ElasticTrainer[Net]) -> list[float]:
    every: list[list[float]] = [r.weights.call_one().get(timeout=60) for r in trainer.replicas]
    if any(w != every[0] for w in every):
        raise AssertionError("the replicas' weights disagree after the run")
    return every[0]


def train(hosts: Any, steps: int, kill_at: int, gate: str | None, run: str) -> dict[str, Any]:
    """``steps`` steps; with ``gate``, the test breaks replica 1's host in step
    ``kill_at``. What the run did."""
    out: dict[str, Any] = {"steps": [], "broke_at": None}
    t = time.monotonic()
    with ElasticTrainer(Net, hosts, REPLICAS, gate, kill_at, spares=1) as trainer:
        out["start_s"] = time.monotonic() - t
        out["hosts_before"] = trainer.hosts_of_replicas()
        out["spare_hosts"] = [s.host for s in trainer._spares]
        while trainer.step_count < steps:
            if gate is not None and trainer.step_count == kill_at:
                pid = trainer.replicas[VICTIM].pid.call_one().get(timeout=60)
                host = trainer.hosts_of_replicas()[VICTIM]
                print(f"READY {pid} {host}", flush=True)
            result = trainer.step()
            if gate is not None and result.step == kill_at:
                out["broke_at"] = float(sys.stdin.readline().split()[1])
            done = time.monotonic()
            out["steps"].append([result.step, done])
            print(f"STEP {run} {result.step} {done:.6f}", flush=True)
            if result.recovery is not None:
                out["recovery"] = dataclasses.asdict(result.recovery)
                out["recovered_step_done"] = done
        out["hosts_after"] = trainer.hosts_of_replicas()
        out["spare_hosts_after"] = [s.host for s in trainer._spares]
        out["weights"] = _weights(trainer)
        t = time.monotonic()
    out["stop_s"] = time.monotonic() - t
    return out


def main(argv: list[str]) -> None:
    steps, kill_at, reference_file, gate = int(argv[0]), int(argv[1]), argv[2], argv[3]
    workers = argv[4:]
    failures: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: failures.append(str(f).splitlines()[0])
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None, name="cluster")
    hosts.initialized.get(timeout=60)
    t = time.monotonic()
    if kill_at < 0:
        reference = train(hosts, steps, kill_at, None, "reference")
        with open(reference_file, "w") as f:
            json.dump(reference["weights"], f)
        print("RESULT " + json.dumps({"run_s": time.monotonic() - t}), flush=True)
        return
    broken = train(hosts, steps, kill_at, gate, "failure")
    run_s = time.monotonic() - t
    with open(reference_file) as f:
        weights = json.load(f)
    diff = max(abs(a - b) for a, b in zip(broken["weights"], weights, strict=True))
    resume = None
    if broken.get("recovery") is not None and broken["broke_at"] is not None:
        resume = broken["recovered_step_done"] - broken["broke_at"]
    print(
        "RESULT "
        + json.dumps(
            {
                "diff": diff,
                "recovery": broken.get("recovery"),
                "steps": [s for s, _ in broken["steps"]],
                "hosts_before": broken["hosts_before"],
                "spare_hosts": broken["spare_hosts"],
                "hosts_after": broken["hosts_after"],
                "spare_hosts_after": broken["spare_hosts_after"],
                "break_to_next_step_s": resume,
                "run_s": run_s,
                "start_s": broken["start_s"],
                "stop_s": broken["stop_s"],
                "unhandled": failures,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
