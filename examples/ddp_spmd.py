"""Data-parallel training (PyTorch DDP) in monarch actors, on CPU.

The SPMD way: one proc per "GPU" (here a CPU process), ``setup_torch_elastic_env`` gives
every proc torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), and the
actors spawned there run the usual DDP code (``init_process_group("gloo")``,
``DistributedDataParallel``). The client drives the training loop one step at a time and
sees every rank's loss; gradients are averaged across ranks by DDP, so every rank ends
with the same parameters.

Run it with ``python examples/ddp_spmd.py`` (2 procs, then 4); the guide is
``docs/spmd.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from monarch.actor import Actor, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env

#: The model's input and output widths, and samples per rank and step.
IN, OUT, BATCH = 8, 1, 16


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class DDPTrainer(Actor):
    """One rank of a DDP job: joins the process group that torchrun's variables
    describe, and trains its replica of the model on its own shard of the data."""

    def __init__(self, lr: float = 0.2) -> None:
        self.rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        torch.manual_seed(0)  # DDP also broadcasts rank 0's parameters to every rank
        self.model = DistributedDataParallel(ToyModel())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        # Each rank's data: y = x . w + noise, with the same w everywhere.
        self.data = torch.Generator().manual_seed(1000 + self.rank)
        self.w = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)
        self.step = 0

    @endpoint
    def train_step(self) -> dict[str, float]:
        """One optimizer step on a fresh batch; this rank's loss and gradient norm."""
        x = torch.randn(BATCH, IN, generator=self.data)
        y = x @ self.w + 0.01 * torch.randn(BATCH, OUT, generator=self.data)
        self.optimizer.zero_grad()
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # DDP averages the gradients here
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        self.optimizer.step()
        self.step += 1
        return {"rank": self.rank, "loss": loss.item(), "grad_norm": float(grad_norm)}

    @endpoint
    def parameters(self) -> list[float]:
        """Every parameter of this rank's replica, flattened."""
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]

    @endpoint
    def cleanup(self) -> None:
        dist.destroy_process_group()


def train(world_size: int, steps: int, verbose: bool = True) -> list[list[float]]:
    """Train for ``steps`` steps on ``world_size`` procs of this machine; the parameters
    each rank ends with, by rank."""
    procs = this_host().spawn_procs(per_host={"gpus": world_size})
    try:
        setup_torch_elastic_env(procs)
        trainers = procs.spawn("ddp", DDPTrainer)
        for step in range(1, steps + 1):
            results = [r for _, r in trainers.train_step.call().get()]
            if verbose:
                print(
                    f"world {world_size} step {step}: "
                    + "  ".join(
                        f"rank {int(r['rank'])} loss={r['loss']:.4f} grad_norm={r['grad_norm']:.4f}"
                        for r in results
                    ),
                    flush=True,
                )
        params = [p for _, p in trainers.parameters.call().get()]
        trainers.cleanup.call().get()
        return params
    finally:
        procs.stop().get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    for world_size in args.world_sizes:
        params = train(world_size, args.steps)
        same = all(p == params[0] for p in params)
        print(f"world {world_size}: every rank has the same parameters: {same}")
        assert same


if __name__ == "__main__":
    main()
