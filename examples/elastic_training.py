"""Data-parallel training that loses a replica and goes on from the same step.

Three replicas train a small model with averaged gradients (a gloo process group). In
the middle of the run the script kills one replica's process (SIGKILL, as a crash or an
out-of-memory kill would). The trainer hears of it through supervision, starts a new
replica, forms a new group with the survivors, copies a survivor's model and optimizer
state into the new replica with ``monarch.rdma``, and computes the interrupted step
again: nothing restarts and no checkpoint is read. The script then trains the same
steps without a failure and checks that both runs end with the same weights.

Run it with ``python examples/elastic_training.py``; the guide is ``docs/recovery.md``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
from torch import nn

from monarch.actor import endpoint, this_host
from monarch.recovery import ElasticTrainer, Replica

#: The model's widths, and samples per replica and step.
IN, HIDDEN, BATCH = 16, 32, 32


class Trainer(Replica):
    """One replica: a small MLP fit to y = x . w, on its own share of every step's data."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.w = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        # A function of (step, rank) only: a recomputed step sees the same data.
        g = torch.Generator().manual_seed(step * 1000 + self.replica_rank)
        x = torch.randn(BATCH, IN, generator=g)
        return x, x @ self.w

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def weights(self) -> list[float]:
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]


def train(replicas: int, steps: int, kill_at: int | None) -> list[float]:
    """Train ``steps`` steps; before step ``kill_at`` kill replica 1's process. The
    weights every replica ends with (checked equal)."""
    with ElasticTrainer(Trainer, this_host(), replicas, spares=1) as trainer:
        for _ in range(steps):
            if trainer.step_count == kill_at:
                pid = trainer.replicas[1].pid.call_one().get()
                print(f"step {kill_at}: killing replica 1 (pid {pid})", flush=True)
                os.kill(pid, signal.SIGKILL)
            result = trainer.step()
            losses = " ".join(f"{loss:.4f}" for loss in result.losses)
            print(f"step {result.step}: losses {losses}", flush=True)
            if result.recovery is not None:
                r = result.recovery
                print(
                    f"  recovered: lost replica(s) {list(r.lost)}, new replica(s) on host(s) "
                    f"{r.replaced}, state copied from replica {r.source}, "
                    f"{r.seconds * 1000:.0f} ms from the failure to the new group",
                    flush=True,
                )
        weights: list[list[float]] = [w.weights.call_one().get() for w in trainer.replicas]
    assert all(w == weights[0] for w in weights), "replicas disagree"
    return weights[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=4)
    args = parser.parse_args()
    start = time.monotonic()
    recovered = train(args.replicas, args.steps, args.kill_at)
    print(f"with a failure: {time.monotonic() - start:.1f} s", flush=True)
    reference = train(args.replicas, args.steps, None)
    diff = max(abs(a - b) for a, b in zip(recovered, reference, strict=True))
    print(f"largest difference from a run without the failure: {diff:.2e}", flush=True)
    assert diff <= 1e-6, diff


if __name__ == "__main__":
    main()
