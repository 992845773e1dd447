"""The training of ``benches/recovery_bench.py``, one model and one data order run two
ways (the bench starts both; see its docs):

- ``python recovery_workload.py ours STEPS RUN_DIR WORKER_ADDRESS...``: a monarch
  client that attaches to the workers and trains with ``ElasticTrainer`` (3 replicas on
  hosts 0-2, a warm spare on host 3);
- ``torchrun ... recovery_workload.py torchrun STEPS RUN_DIR``: one rank of the same
  training with ``DistributedDataParallel`` (gloo), which loads ``RUN_DIR/ckpt.pt`` at
  start when it exists and, on rank 0, saves it after every step (the usual way to make
  a torchrun job survive ``--max-restarts``).

Neither trains before ``RUN_DIR/go`` exists: the bench creates it once the spare is
ready (ours: the client printed ``READY`` after the trainer started and its warm spare
answered; torchrun: the spare host's agent waits in the rendezvous's redundancy list).
Both print ``STEP <step> <CLOCK_MONOTONIC time> <generation>`` when a step completes
(ours: generation 1 on the step completed right after a recovery, else 0; torchrun:
``TORCHELASTIC_RESTART_COUNT``, printed by rank 0), and save the final model's state
dict to ``RUN_DIR/<side>-final.pt`` at the end, then print ``DONE``. Every time is
``time.monotonic()``, which all network namespaces of the machine share.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: The model: an MLP of 256 -> 1024 -> 1024 -> 16 (1.3 M parameters, 5.1 MiB of weights
#: and as much of momentum), and the samples per replica and step.
IN, HIDDEN, OUT, BATCH = 256, 1024, 16, 64
#: Replicas (data-parallel ranks).
REPLICAS = 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(IN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, OUT),
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data of ``step``: a function of the two only, on both sides."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, IN, generator=g)
    return x, torch.sin(x[:, :OUT])


def step_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


#: How long training waits for the bench's ``go`` file.
GO_TIMEOUT = 300.0


def _say(line: str) -> None:
    print(line, flush=True)


def _wait_for_go(run_dir: Path) -> None:
    deadline = time.monotonic() + GO_TIMEOUT
    while not (run_dir / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {run_dir / 'go'} within {GO_TIMEOUT:g} s")
        time.sleep(0.01)  # polling a file the bench creates; nothing to wait on


# ---------------------------------------------------------------------------- ours


def ours(steps: int, run_dir: Path, workers: list[str]) -> None:
    import monarch.actor
    from monarch.actor import attach_to_workers, enable_transport, endpoint
    from monarch.recovery import ElasticTrainer, Replica

    class Trainer(Replica):
        def __init__(self) -> None:
            self.model = make_model()
            self.optimizer = make_optimizer(self.model)

        def batch(self, step: int) -> Any:
            return make_batch(step, self.replica_rank)

        def loss(self, batch: Any) -> torch.Tensor:
            return step_loss(self.model, batch)

        @endpoint
        async def save(self, path: str) -> None:
            torch.save(self.model.state_dict(), path)

    unhandled: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda f: unhandled.append(str(f).splitlines()[0])
    enable_transport("tcp")
    hosts = attach_to_workers(workers=workers, ca=None, name="bench")
    hosts.initialized.get(timeout=120)
    with ElasticTrainer(Trainer, hosts, REPLICAS, spares=1) as trainer:
        # The warm spare is started in the background: train once it is ready, as
        # torchrun's spare agent is (private API: the bench's business only).
        for spare in trainer._spares:
            spare.actor.initialized.get(timeout=300)
        _say(f"READY {time.monotonic():.6f} {trainer.hosts_of_replicas()}")
        _wait_for_go(run_dir)
        for _ in range(steps):
            result = trainer.step()
            recovered = 1 if result.recovery is not None else 0
            _say(f"STEP {result.step} {time.monotonic():.6f} {recovered}")
            if result.recovery is not None:
                r = result.recovery
                _say(
                    "RECOVERY "
                    + json.dumps(
                        {
                            "step": r.step,
                            "lost": list(r.lost),
                            "replaced": r.replaced,
                            "seconds": r.seconds,
                            "attempts": r.attempts,
                        }
                    )
                )
        trainer.replicas[0].save.call_one(str(run_dir / "ours-final.pt")).get(timeout=120)
    if unhandled:
        _say("UNHANDLED " + json.dumps(unhandled))
    _say("DONE")


# ---------------------------------------------------------------------------- torchrun


def ddp(steps: int, run_dir: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model = make_model()
    optimizer = make_optimizer(model)
    ckpt = run_dir / "ckpt.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp_model = DistributedDataParallel(model)
    if rank == 0:
        _say(f"STARTED {time.monotonic():.6f} {restart} {start}")
    _wait_for_go(run_dir)
    for step in range(start, steps):
        optimizer.zero_grad()
        step_loss(ddp_model, make_batch(step, rank)).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if rank == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step + 1,
            }
            tmp = run_dir / "ckpt.pt.tmp"
            torch.save(state, tmp)
            os.replace(tmp, ckpt)
            _say(f"STEP {step} {time.monotonic():.6f} {restart}")
    if rank == 0:
        torch.save(model.state_dict(), run_dir / "torchrun-final.pt")
        _say("DONE")
    dist.destroy_process_group()


if __name__ == "__main__":
    side, n_steps, directory = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    if side == "ours":
        ours(n_steps, directory, sys.argv[4:])
    elif side == "torchrun":
        ddp(n_steps, directory)
    else:
        raise SystemExit(f"unknown side {side!r}: ours or torchrun")
