"""The DDP notebook of the blog post that introduced Monarch, as one script, on CPU.

It is written against an earlier release's API and must keep running unchanged:
``proc_mesh(gpus=..., env=...)`` awaited, ``await procs.spawn(...)``, ``await
mesh.endpoint.call()``, and iterating a ``ValueMesh`` as ``(point, value)`` pairs. The
only changes from the post are the ones a machine without GPUs needs (the gloo backend,
tensors on the CPU, no psutil), and the master port comes from ``DDP_MASTER_PORT`` so
that tests can pick a free one. ``tests/actor/test_legacy.py`` runs it.
"""

import asyncio
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from monarch.actor import Actor, current_rank, endpoint, proc_mesh

WORLD_SIZE = 2


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()  # noqa: UP008
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class DDPActor(Actor):
    """This Actor wraps the basic functionality from Torch's DDP example."""

    def __init__(self):
        self.rank = current_rank().rank
        self.step = 0

    def _rprint(self, msg):
        print(f"{self.rank=} {msg}", flush=True)

    @endpoint
    async def setup(self):
        self._rprint("Initializing torch distributed")
        dist.init_process_group("gloo", rank=self.rank, world_size=WORLD_SIZE)
        self._rprint("Finished initializing torch distributed")
        torch.manual_seed(0)
        self.model = DDP(ToyModel())
        self.loss_fn = nn.MSELoss()
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.001)

    @endpoint
    async def cleanup(self):
        self._rprint("Cleaning up torch distributed")
        dist.destroy_process_group()

    @endpoint
    async def demo_basic(self):
        self._rprint("Running basic DDP example")
        model = ToyModel()
        ddp_model = DDP(model)
        loss_fn = nn.MSELoss()
        optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()
        self._rprint("Finished running basic DDP example")

    @endpoint
    async def get_system_info(self):
        info = {
            "rank": self.rank,
            "process_id": os.getpid(),
            "device_name": "cpu",
            "gpu_memory_allocated": 0,
        }
        print(f"[Rank {self.rank}] System Info: PID={info['process_id']}", flush=True)
        return info

    @endpoint
    async def train_step(self):
        start = time.time()
        self.step += 1
        self.optimizer.zero_grad()
        outputs = self.model(torch.randn(20, 10))
        loss = self.loss_fn(outputs, torch.randn(20, 5))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        self.optimizer.step()
        elapsed = time.time() - start
        print(
            f"[Rank {self.rank}] Step {self.step}: Loss={loss.item():.4f}, "
            f"GradNorm={grad_norm:.4f}, Time={elapsed:.3f}s",
            flush=True,
        )
        return {
            "loss": loss.item(),
            "grad_norm": float(grad_norm),
            "throughput": 20 / max(elapsed, 1e-9),
        }


async def main():
    # Spawn a process mesh
    local_proc_mesh = await proc_mesh(
        gpus=WORLD_SIZE,
        env={
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": os.environ.get("DDP_MASTER_PORT", "12455"),
        },
    )
    # Spawn our actor mesh on top of the process mesh
    ddp_actor = await local_proc_mesh.spawn("ddp_actor", DDPActor)
    ddp_actors = ddp_actor

    await ddp_actor.setup.call()
    await ddp_actor.demo_basic.call()

    print("Gathering system info from all ranks...")
    system_info = await ddp_actors.get_system_info.call()
    print("\n SYSTEM INFORMATION ACROSS ALL RANKS:")
    print("=" * 60)
    for point, rank_info in system_info:  # noqa: B007
        print(
            f"Rank {rank_info['rank']}: PID={rank_info['process_id']}, "
            f"Device={rank_info['device_name']}, "
            f"GPU Memory={rank_info['gpu_memory_allocated'] / 1e6:.1f}MB"
        )
    print(f"\nFound {len(system_info)} ranks in the mesh")
    all_rank_info = [value for point, value in system_info]
    total = sum(info["gpu_memory_allocated"] for info in all_rank_info) / 1e6
    print(f"Total GPU memory across all ranks: {total:.1f}MB")

    print("Running training steps...")
    for step in range(3):
        print(f"\n--- Step {step + 1} ---")
        step_results = await ddp_actors.train_step.call()
        all_results = [value for point, value in step_results]
        losses = [result["loss"] for result in all_results]
        grad_norms = [result["grad_norm"] for result in all_results]
        throughputs = [result["throughput"] for result in all_results]
        print(f"Losses across ranks: {[f'{loss:.4f}' for loss in losses]}")
        print(f"Gradient norms: {[f'{g:.4f}' for g in grad_norms]}")
        print(f"Avg throughput: {sum(throughputs) / len(throughputs):.1f} samples/sec")

    await ddp_actor.cleanup.call()
    await local_proc_mesh.stop()
    print("DDP example completed successfully!")


if __name__ == "__main__":
    asyncio.run(main())
