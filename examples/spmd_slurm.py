"""SPMD training on a Slurm allocation: a torchrun-style script, run by monarch.

The same file is two programs:

- the **client** (``python examples/spmd_slurm.py --nodes 2``) asks Slurm for the nodes
  through :class:`monarch.job.SlurmJob`, spawns ``--procs-per-node`` procs on each node,
  gives them torchrun's environment and runs this file's ``--train`` part in every proc
  with ``SPMDActor.main``, then ends the Slurm job;
- the **training script** (``--train``) is ordinary torchrun-style code: it reads
  ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``, joins the process group (gloo, on CPU) and trains
  a small DDP model; it would run unchanged under ``torchrun``. At the end every rank
  checks that DDP kept the replicas identical.

Run it on a Slurm login node, with a Python that has monarch on every node (the same path,
e.g. a shared venv)::

    python examples/spmd_slurm.py --nodes 2 --python "$PWD/.venv/bin/python"

The guide is ``docs/slurm.md``; ``tests/slurm`` runs this example on a real Slurm.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys


def train(steps: int) -> None:
    """The torchrun-style part: one process per rank, told its place by environment."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # DDP also broadcasts rank 0's parameters
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    w = torch.linspace(-1.0, 1.0, 8).unsqueeze(1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=data)
        loss = nn.functional.mse_loss(model(x), x @ w)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # DDP averages the gradients
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    print(
        f"rank {rank}/{world} on {os.uname().nodename}: loss {loss.item():.4f}, "
        f"replicas identical: {same}",
        flush=True,
    )
    dist.destroy_process_group()
    if not same:
        raise SystemExit("DDP replicas diverged")


def client(args: argparse.Namespace) -> None:
    """Get the nodes from Slurm, run ``train`` on every proc, end the job."""
    from monarch.job import SlurmJob
    from monarch.spmd import SPMDActor

    job = SlurmJob(
        {"trainers": args.nodes},
        python_exe=args.python,
        time_limit=args.time_limit,
        partition=args.partition,
        log_dir=args.log_dir,
        job_start_timeout=args.start_timeout,
    )
    try:
        nodes = job.state(cached_path=None).trainers
        procs = nodes.spawn_procs(per_host={"gpus": args.procs_per_node})
        spmd = procs.spawn("_SPMDActor", SPMDActor)
        # The proc at the origin picks the rendezvous address and a free port.
        addr, port = spmd.slice(hosts=0, gpus=0).get_host_port.call_one(None).get(timeout=60)
        script = [os.path.abspath(__file__), "--train", "--steps", str(args.steps)]
        done = spmd.main.call(addr, port, script).get(timeout=args.train_timeout)
        ok = all(done.values())
        world = args.nodes * args.procs_per_node
        print(f"trained on {world} ranks over {args.nodes} Slurm nodes: {ok}", flush=True)
        procs.stop().get(timeout=60)
    finally:
        job.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="run the training script part")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--procs-per-node", type=int, default=1)
    parser.add_argument("--python", default=sys.executable, help="Python on the nodes")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--time-limit", default="00:10:00")
    parser.add_argument("--log-dir", default=None, help="where the Slurm log goes")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--train-timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.train:
        train(args.steps)
    else:
        client(args)


if __name__ == "__main__":
    main()
