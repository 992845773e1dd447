"""A torchrun-style DDP training script (the DDP example of docs/spmd.md, as a script):
``torchrun --nproc-per-node=2 spmd_ddp_script.py --steps 3 --out DIR`` runs it under
torchrun; the tests run it through ``monarch.job.spmd.serve``.

Each rank reads its place from torchrun's environment, joins the gloo process group,
trains a small model with ``DistributedDataParallel`` on data of its own, and writes
``DIR/rank-<RANK>.json``: its environment, arguments and final parameters. DDP averages
the gradients, so every rank must end with the same parameters; a rank that sees
otherwise exits with status 3.

``--fail-rank R`` makes rank R raise ``ValueError`` before it joins the group (the other
ranks then wait in ``init_process_group`` until they are stopped).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if rank == args.fail_rank:
        raise ValueError(f"rank {rank} was told to fail")

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)  # each rank its own data
    losses = []
    for _ in range(args.steps):
        x = torch.randn(8, 4, generator=data)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # gradients averaged over ranks
        optimizer.step()
        losses.append(loss.item())
    params = [float(v) for p in model.parameters() for v in p.detach().flatten()]
    flat = torch.tensor(params)
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    dist.destroy_process_group()
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"]
    names += ["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
    record = {
        "env": {k: os.environ.get(k) for k in names},
        "argv": sys.argv,
        "params": params,
        "losses": losses,
        "same": same,
        "pid": os.getpid(),
        "host": os.uname().nodename,
    }
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(record))
    print(f"rank {rank}: loss {losses[-1]:.4f}, replicas identical: {same}", flush=True)
    if not same:
        sys.exit(3)


if __name__ == "__main__":
    main()
