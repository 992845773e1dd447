"""Data-parallel training with distributed tensors, on CPU.

One script trains a small MLP replicated on a mesh of 4 procs: every rank holds the
same parameters and its own shard of each batch; after each rank's backward pass the
gradients are averaged across ranks with ``reduce_("gpus", "avg")``, then every rank
takes the same SGD step. Nothing runs in actors of your own: the training loop is plain
torch under ``mesh.activate()``.

The backward pass is walked with ``monarch.grad_generator``, one parameter at a time
from the last layer to the first, so that each gradient can be reduced while the
backward pass of the layers before it still runs:

- :func:`train_ddp` with ``overlap=True`` records each reduction on a separate
  ``monarch.Stream("comms")``: the gradient is borrowed (mutably) onto that stream,
  reduced there, and the borrow is dropped before the optimizer step, which makes the
  main stream wait for the reduction. The workers run the two streams concurrently;
- ``overlap=False`` records the same reductions on the main stream, in line with the
  backward pass;
- :func:`train_reference` is the same training in one process with plain torch, on the
  whole batch (the union of the shards): the losses of both distributed runs match it.

Run it with ``python examples/ddp_tensors.py`` (``--steps N``, ``--main-stream``);
the guide is ``docs/tensors.md``; ``benches/ddp_tensors_bench.py`` times both versions.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import monarch
from monarch.actor import ProcMesh, this_host


@dataclass
class Config:
    """The model, the data and the training."""

    in_dim: int = 16
    hidden: int = 32
    out_dim: int = 4
    #: Linear layers (with a tanh between two of them).
    layers: int = 3
    #: Samples per rank and step: a step's whole batch is ``ranks * batch_per_rank``.
    batch_per_rank: int = 8
    #: Distinct batches (step ``i`` uses batch ``i % batches``).
    batches: int = 4
    lr: float = 0.3
    seed: int = 0


def make_model(cfg: Config) -> nn.Sequential:
    """The MLP, initialized from ``cfg.seed`` (the same on every call)."""
    torch.manual_seed(cfg.seed)
    dims = [cfg.in_dim] + [cfg.hidden] * (cfg.layers - 1) + [cfg.out_dim]
    mods: list[nn.Module] = []
    for i in range(cfg.layers):
        mods.append(nn.Linear(dims[i], dims[i + 1]))
        if i < cfg.layers - 1:
            mods.append(nn.Tanh())
    return nn.Sequential(*mods)


def make_data(cfg: Config, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batches, ``(batches, ranks * batch_per_rank, dim)``: inputs and the
    targets of a fixed random "teacher" map. Rank ``r`` trains on rows
    ``r * batch_per_rank`` to ``(r + 1) * batch_per_rank - 1`` of each."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = ranks * cfg.batch_per_rank
    x = torch.randn(cfg.batches, n, cfg.in_dim, generator=g)
    teacher = torch.randn(cfg.in_dim, cfg.out_dim, generator=g) / cfg.in_dim**0.5
    y = torch.sin(x @ teacher) + 0.05 * torch.randn(cfg.batches, n, cfg.out_dim, generator=g)
    return x, y


def train_reference(cfg: Config, ranks: int, steps: int) -> list[float]:
    """The same training in this process, plain torch, on the whole batches: the loss
    of each step."""
    return reference_run(cfg, ranks, steps)[0]


def reference_run(cfg: Config, ranks: int, steps: int) -> tuple[list[float], nn.Sequential]:
    """:func:`train_reference`'s losses, and the model it trained."""
    model = make_model(cfg)
    x, y = make_data(cfg, ranks)
    losses = []
    for i in range(steps):
        loss = nn.functional.mse_loss(model(x[i % cfg.batches]), y[i % cfg.batches])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p.sub_(cfg.lr * g)
        losses.append(loss.item())
    return losses, model


class Replica:
    """The model and this run's data on every rank of ``mesh``, the data sharded by the
    rank along ``dim``."""

    def __init__(self, mesh: ProcMesh, cfg: Config, dim: str = "gpus") -> None:
        self.mesh, self.cfg, self.dim = mesh, cfg, dim
        self.ranks = mesh.size(dim)
        local = make_model(cfg)
        x, y = make_data(cfg, self.ranks)
        shape = (cfg.batches, self.ranks, cfg.batch_per_rank)
        with mesh.activate():
            # The same module on every rank: its own random init is replaced by the
            # local model's parameters (sent with the command).
            self.model = make_model(cfg)
            with torch.no_grad():
                for p, q in zip(self.model.parameters(), local.parameters(), strict=True):
                    p.copy_(torch.tensor(q.detach().numpy()))
            # Each rank keeps its own rows of every batch.
            rank = mesh.rank_tensor(dim).reshape(1)
            self.x = torch.tensor(x.numpy()).view(*shape, -1).index_select(1, rank).squeeze(1)
            self.y = torch.tensor(y.numpy()).view(*shape, -1).index_select(1, rank).squeeze(1)
        self.params = list(self.model.parameters())
        self.losses: list[torch.Tensor] = []

    def step(self, i: int, comms: Any = None, reduce: bool = True) -> None:
        """Step ``i`` of training: forward and backward on this rank's shard, the
        gradients averaged across ranks (on ``comms``, a ``monarch.Stream``, if given;
        else on the active stream), then SGD. ``reduce=False`` leaves the gradients
        unreduced (each rank then trains alone: for timing the computation only)."""
        cfg = self.cfg
        with self.mesh.activate():
            out = self.model(self.x[i % cfg.batches])
            loss = nn.functional.mse_loss(out, self.y[i % cfg.batches])
            last_first = self.params[::-1]
            grads: list[monarch.Tensor] = []
            borrows = []
            for g in monarch.grad_generator(loss, last_first):
                assert isinstance(g, monarch.Tensor)  # every parameter is used
                if not reduce:
                    pass
                elif comms is None:
                    g.reduce_(self.dim, "avg")
                else:
                    # Reduce on the comms stream while the main stream goes on with the
                    # backward pass of the layers before this one.
                    g_comms, borrow = comms.borrow(g, mutable=True)
                    with comms.activate():
                        g_comms.reduce_(self.dim, "avg")
                    borrows.append(borrow)
                grads.append(g)
            for borrow in borrows:
                borrow.drop()  # the main stream waits for the reduction here
            with torch.no_grad():
                for p, g in zip(last_first, grads, strict=True):
                    p.sub_(cfg.lr * g)
            self.losses.append(loss.detach())

    def fetch_losses(self) -> list[float]:
        """The loss of every step so far, averaged over the ranks (the loss of the
        whole batch, as the shards are the same size); waits for the steps to end."""
        with self.mesh.activate():
            stacked = torch.stack(self.losses)
        per_rank = [monarch.inspect(stacked, {self.dim: r}) for r in range(self.ranks)]
        mean: torch.Tensor = torch.stack(per_rank).mean(0)
        return [float(v) for v in mean]


def comms_stream() -> Any:
    """The stream the gradient reductions run on in the overlapped version."""
    try:
        return monarch.Stream("comms")
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            f"monarch.Stream is not available in this build ({e}); run the training "
            "with its reductions on the main stream: train_ddp(..., overlap=False) or "
            "--main-stream"
        ) from None


def train_ddp(
    mesh: ProcMesh, cfg: Config, steps: int, overlap: bool = True, dim: str = "gpus"
) -> list[float]:
    """Trains ``steps`` steps data-parallel over ``dim`` of ``mesh``; the loss of each
    step. ``overlap``: reductions on a comms stream (else on the main stream)."""
    replica = Replica(mesh, cfg, dim)
    comms = comms_stream() if overlap else None
    for i in range(steps):
        replica.step(i, comms)
    return replica.fetch_losses()


@contextlib.contextmanager
def spawned(gpus: int = 4) -> Iterator[ProcMesh]:
    """A mesh of ``gpus`` procs on this host (CPU only), stopped at the end."""
    mesh = this_host().spawn_procs(per_host={"gpus": gpus})
    try:
        yield mesh
    finally:
        mesh.stop().get(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--main-stream", action="store_true", help="reduce on the main stream (no overlap)"
    )
    args = parser.parse_args()
    cfg = Config()
    ranks = 4
    want = train_reference(cfg, ranks, args.steps)
    with spawned(ranks) as mesh:
        got = train_ddp(mesh, cfg, args.steps, overlap=not args.main_stream)
    where = "the main stream" if args.main_stream else "a comms stream"
    print(f"data-parallel on {ranks} procs, gradients reduced on {where}:")
    print(" step  distributed   one process")
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        print(f"{i:5d}  {a:11.6f}  {b:12.6f}")
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"largest difference: {worst:.2e}")
    if worst > 1e-4:
        raise SystemExit("the distributed losses differ from the one-process ones")


if __name__ == "__main__":
    main()
