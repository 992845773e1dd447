"""DDP on Kubernetes: data-parallel training across worker pods, driven by one client.

The pods run ``monarch worker`` (``ddp-workers.yaml``: a StatefulSet ``trainers`` behind a
headless Service, the cluster secret from the Secret ``monarch-cluster-secret``). This
client finds them with :class:`~monarch.job.kubernetes.KubernetesJob` (pre-provisioned
mode: by label selector, ranked by StatefulSet ordinal), starts ``--procs-per-host``
procs on each pod, points torch.distributed at rank 0's pod IP, and trains a toy model
with ``DistributedDataParallel`` (gloo, so it runs on CPUs too; use ``nccl`` on GPUs).

Run it in the cluster (``ddp-client.yaml`` runs it as a Job), or anywhere that reaches
the pod IPs::

    python ddp_kubernetes.py --namespace monarch --hosts 2
    python ddp_kubernetes.py --kubeconfig ~/.kube/config --namespace monarch --hosts 2

Guide: ``docs/kubernetes.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import KubeConfig, KubernetesJob
from monarch.spmd import setup_torch_elastic_env

#: The model's input and output widths, and samples per rank and step.
IN, OUT, BATCH = 8, 1, 16


class Rendezvous(Actor):
    """Where rank 0 listens for torch.distributed: its pod IP and a free port."""

    @endpoint
    def address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            port: int = s.getsockname()[1]
        return os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname()), port


class DDPTrainer(Actor):
    """One rank: joins the process group of torchrun's variables and trains its
    replica of the model on its own shard of the data."""

    def __init__(self, backend: str = "gloo") -> None:
        self.rank = int(os.environ["RANK"])
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
        torch.manual_seed(0)  # DDP also broadcasts rank 0's parameters
        self.model = DistributedDataParallel(
            nn.Sequential(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, OUT))
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.2)
        self.data = torch.Generator().manual_seed(1000 + self.rank)
        self.w = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    @endpoint
    def train_step(self) -> float:
        """One optimizer step on a fresh batch; this rank's loss."""
        x = torch.randn(BATCH, IN, generator=self.data)
        y = x @ self.w + 0.01 * torch.randn(BATCH, OUT, generator=self.data)
        self.optimizer.zero_grad()
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # DDP averages the gradients
        self.optimizer.step()
        return float(loss.item())

    @endpoint
    def parameters(self) -> list[float]:
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]

    @endpoint
    def cleanup(self) -> None:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--kubeconfig", help="outside the cluster: a kubeconfig file")
    parser.add_argument("--mesh", default="trainers", help="the pods' mesh-name label")
    parser.add_argument("--selector", help="another label selector for the pods")
    parser.add_argument("--hosts", type=int, default=2, help="how many pods")
    parser.add_argument("--procs-per-host", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=600, help="seconds to wait for pods")
    parser.add_argument("--kill", action="store_true", help="end the workers afterwards")
    args = parser.parse_args()

    kubeconfig = KubeConfig.from_path(args.kubeconfig) if args.kubeconfig else None
    job = KubernetesJob(args.namespace, timeout=args.timeout, kubeconfig=kubeconfig)
    job.add_mesh(args.mesh, args.hosts, label_selector=args.selector)
    hosts = job.state(cached_path=None)[args.mesh]

    procs = hosts.spawn_procs(per_host={"gpus": args.procs_per_host})
    rank0 = procs.slice(hosts=0, gpus=0).spawn("rendezvous", Rendezvous)
    master_addr, master_port = rank0.address.call_one().get()
    setup_torch_elastic_env(procs, master_addr=master_addr, master_port=master_port)
    trainers = procs.spawn("ddp", DDPTrainer)
    for step in range(1, args.steps + 1):
        losses = [loss for _, loss in trainers.train_step.call().get()]
        print(f"step {step}: " + " ".join(f"{loss:.4f}" for loss in losses), flush=True)
    params = [p for _, p in trainers.parameters.call().get()]
    same = all(p == params[0] for p in params)
    print(f"{len(params)} ranks on {args.hosts} pods; same parameters everywhere: {same}")
    trainers.cleanup.call().get()
    procs.stop().get()
    if args.kill:
        job.kill()
    assert same


if __name__ == "__main__":
    main()
