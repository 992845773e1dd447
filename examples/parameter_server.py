"""A parameter server over ``monarch.rdma``: weights and gradients move as one-sided
transfers, never inside messages.

One ``ParameterServer`` actor owns the model's weights and one gradient slot per worker,
all plain torch tensors, and hands out ``RDMABuffer`` handles of them (small, picklable
objects that point at its memory). A mesh of ``Worker`` actors, in procs of their own,
trains a small model on its own shard of a regression problem. Each step, every worker:

1. reads the current weights straight into its model's parameters
   (``await buf.read_into(param)``),
2. computes its loss and gradients,
3. writes its gradients into its own slot on the server (``await buf.write_from(grad)``);

then the client asks the server to apply the mean of the slots (SGD, in place, so the
handles stay valid). Messages carry only the handles and the losses; the bytes go
through ``monarch.rdma`` (between procs of one host: a direct copy between the two
processes' memory; between hosts: TCP; with RDMA NICs: ibverbs).

Run it with ``python examples/parameter_server.py`` (3 workers, 8 steps); the guide is
``docs/rdma.md``.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.rdma import RDMABuffer

#: The model's input width, hidden width, and samples per worker.
IN, HIDDEN, BATCH = 8, 16, 64
#: How long the client waits for any one call.
TIMEOUT_S = 60.0


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the server's initial weights; workers' are overwritten anyway
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as the 1-D uint8 view ``RDMABuffer`` takes (a
    view: it shares ``t``'s memory)."""
    return t.detach().view(torch.uint8).flatten()


class ParameterServer(Actor):
    """Owns the weights and a gradient slot per worker, and registers each of them once:
    the handles stay valid as long as the tensors live and are updated in place."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.weights = {name: p.detach().clone() for name, p in make_model().named_parameters()}
        # One slot per worker and parameter: worker i writes row i.
        self.grads = {
            name: torch.zeros(num_workers, *w.shape, dtype=w.dtype)
            for name, w in self.weights.items()
        }
        self.weight_handles = {name: RDMABuffer(as_bytes(w)) for name, w in self.weights.items()}
        self.grad_handles = [
            {name: RDMABuffer(as_bytes(g[i])) for name, g in self.grads.items()}
            for i in range(num_workers)
        ]

    @endpoint
    def ps_get_metadata(self) -> dict[str, list[int]]:
        """The shape of every parameter, by name."""
        return {name: list(w.shape) for name, w in self.weights.items()}

    @endpoint
    def ps_get_weight_handles(self) -> dict[str, RDMABuffer]:
        return self.weight_handles

    @endpoint
    def ps_get_gradient_handles(self, rank: int) -> dict[str, RDMABuffer]:
        """The handles of worker ``rank``'s gradient slot."""
        return self.grad_handles[rank]

    @endpoint
    def ps_apply_gradients(self, lr: float) -> float:
        """One SGD step with the mean of the workers' gradients; its norm."""
        norm_sq = 0.0
        for name, w in self.weights.items():
            mean = self.grads[name].mean(dim=0)
            w.sub_(lr * mean)  # in place: the registered memory is the weights
            norm_sq += float(mean.pow(2).sum())
        return math.sqrt(norm_sq)

    @endpoint
    def ps_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the weights, sent as a message (to check the workers against)."""
        return {name: w.clone() for name, w in self.weights.items()}


class Worker(Actor):
    """Trains a replica of the model on its own data; pulls weights, pushes gradients."""

    def __init__(self) -> None:
        self.rank = current_rank()["procs"]
        self.model = make_model()
        # This worker's shard: y = sin(x . u), the same u everywhere, its own x.
        gen = torch.Generator().manual_seed(100 + self.rank)
        u = torch.linspace(-1.0, 1.0, IN)
        self.x = torch.randn(BATCH, IN, generator=gen)
        self.y = torch.sin(self.x @ u).unsqueeze(1)
        self.weights: dict[str, RDMABuffer] = {}
        self.grads: dict[str, RDMABuffer] = {}

    @endpoint
    async def connect(self, server: ParameterServer) -> str:
        """Fetch the server's handles (once); the backend the transfers use."""
        shapes = await server.ps_get_metadata.call_one()
        for name, p in self.model.named_parameters():
            assert list(p.shape) == shapes[name], (name, p.shape, shapes[name])
        self.weights = await server.ps_get_weight_handles.call_one()
        self.grads = await server.ps_get_gradient_handles.call_one(self.rank)
        return next(iter(self.weights.values())).backend

    async def pull(self) -> None:
        """Read the server's weights straight into this model's parameters."""
        for name, p in self.model.named_parameters():
            await self.weights[name].read_into(as_bytes(p))

    @endpoint
    async def step(self) -> float:
        """Pull the weights, compute the gradients, push them into this worker's slot."""
        await self.pull()
        self.model.zero_grad()
        loss = nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()  # type: ignore[no-untyped-call]
        for name, p in self.model.named_parameters():
            assert p.grad is not None
            await self.grads[name].write_from(as_bytes(p.grad))
        return loss.item()

    @endpoint
    async def sync(self) -> dict[str, torch.Tensor]:
        """Pull the latest weights; return a copy of them."""
        await self.pull()
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}


def train(num_workers: int, steps: int, lr: float) -> list[float]:
    """Train for ``steps`` steps; the mean loss of each step."""
    server_procs = this_host().spawn_procs(per_host={"procs": 1})
    worker_procs = this_host().spawn_procs(per_host={"procs": num_workers})
    try:
        server = server_procs.spawn("ps", ParameterServer, num_workers)
        workers = worker_procs.spawn("worker", Worker)
        backends = {b for _, b in workers.connect.call(server).get(timeout=TIMEOUT_S)}
        print(f"{num_workers} workers connected; transfers use {', '.join(sorted(backends))}")
        means = []
        for step in range(1, steps + 1):
            losses = [loss for _, loss in workers.step.call().get(timeout=TIMEOUT_S)]
            norm = server.ps_apply_gradients.call_one(lr).get(timeout=TIMEOUT_S)
            means.append(sum(losses) / len(losses))
            print(
                f"step {step}: mean loss {means[-1]:.4f} "
                f"(workers: {', '.join(f'{x:.4f}' for x in losses)}), grad norm {norm:.4f}",
                flush=True,
            )
        # Every worker pulls the final weights: they must be the server's, bit for bit.
        final = server.ps_weights.call_one().get(timeout=TIMEOUT_S)
        for _, weights in workers.sync.call().get(timeout=TIMEOUT_S):
            assert weights.keys() == final.keys()
            assert all(torch.equal(weights[k], final[k]) for k in final), "weights differ"
        print(f"all {num_workers} workers hold the server's weights")
        return means
    finally:
        worker_procs.stop().get(timeout=TIMEOUT_S)
        server_procs.stop().get(timeout=TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    means = train(args.workers, args.steps, args.lr)
    assert means[-1] < means[0], f"the loss did not go down: {means}"


if __name__ == "__main__":
    main()
