"""Distributed tensors on CPU: one script drives torch on every proc of a mesh.

Four procs on this machine form a ``{"hosts": 2, "gpus": 2}`` mesh (the names are only
labels here: no GPU is needed). Under ``mesh.activate()`` every torch operation runs on
every proc, on its own shard; ``monarch.inspect`` brings one shard back. The script
shows, in order:

1. activation and inspection of a shard by its coordinates;
2. commands that run on every rank (each rank's shard differs: it mixes in its rank);
3. recovery after a failed command: the error names the rank and the line, and the
   workers keep going;
4. reductions over one and two mesh dimensions;
5. renamed and split views of the mesh;
6. a two-stage pipeline over slices of the mesh, moving activations with ``to_mesh``.

Run it with ``python examples/distributed_tensors.py``; the guide is ``docs/tensors.md``.
"""

from __future__ import annotations

import torch
from torch import nn

import monarch
from monarch.actor import this_host


def main() -> None:
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    print(mesh.to_table())

    # 1. Activation: torch runs on every proc of the mesh; inspect fetches one shard.
    with mesh.activate():
        t = torch.rand(3, 4)
    print("a shard of t:", monarch.inspect(t, hosts=1, gpus=0).shape)

    # 2. Commands on every rank: each rank scales by its own rank.
    with mesh.activate():
        rank = mesh.rank_tensor(("hosts", "gpus"))
        x = torch.ones(2, 2) * rank
    for h in range(2):
        for g in range(2):
            print(f"x at hosts={h} gpus={g}:", monarch.inspect(x, hosts=h, gpus=g)[0].tolist())

    # 3. A failed command fails only what depends on it.
    with mesh.activate():
        bad = x.index_select(0, torch.tensor([5]))  # index out of range, on the workers
        good = x + 1
    try:
        monarch.inspect(bad)
    except monarch.RemoteException as e:
        print(f"recovered from a failure on rank {e.rank}: {e.message}")
    print("the workers go on:", monarch.inspect(good, hosts=1, gpus=1)[0].tolist())

    # 4. Reductions over one dimension, two dimensions, and a gather.
    with mesh.activate():
        per_host = x.reduce("gpus", "sum")
        everywhere = x.reduce(("hosts", "gpus"), "max")
        gathered = rank.reduce(("hosts", "gpus"), "stack")
    print("sum over gpus, host 1:", monarch.inspect(per_host, hosts=1)[0].tolist())
    print("max over the mesh:", monarch.inspect(everywhere)[0].tolist())
    print("every rank, gathered:", monarch.inspect(gathered).tolist())

    # 5. Views: renamed and split meshes run the same workers.
    dp_tp = mesh.rename(hosts="dp", gpus="tp")
    with dp_tp.activate():
        y = torch.ones(2) * dp_tp.rank_tensor("tp")
        y = y.reduce("dp", "sum")
    print("renamed, reduced over dp, tp=1:", monarch.inspect(y, tp=1).tolist())
    flat = mesh.flatten("all").split(all=("pp", "dp"), pp=2)
    print(flat.to_table())

    # 6. A pipeline: stage i runs on the procs of host i; activations move with to_mesh.
    stages = [mesh.slice(hosts=i) for i in range(2)]
    layers = []
    for stage in stages:
        with stage.activate():
            torch.manual_seed(0)
            layers.append(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    with stages[0].activate():
        activations = torch.rand(3, 4)
    with torch.no_grad():
        for stage, layer in zip(stages, layers, strict=True):
            activations = monarch.to_mesh(activations, stage)  # or activations.to_mesh(stage)
            with stage.activate():
                activations = layer(activations)
    print("pipeline output:", monarch.inspect(activations).shape)

    mesh.stop().get()
    print("distributed tensors: done")


if __name__ == "__main__":
    main()
