"""A client that exits while its trainer recovers (run by test_elastic_exit.py).

It trains one step with 2 replicas and a warm spare, prints every replica's pid
(``PIDS ...``), kills replica 1, and steps again. The spare, promoted, blocks as it
joins the new group and prints ``JOINING`` (its output reaches this client's stdout),
so the test can stop this client at that moment: recovery is in progress.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import torch

from monarch.actor import endpoint, this_host
from monarch.recovery import ElasticTrainer, Membership, Replica


class Blocker(Replica):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def batch(self, step: int) -> Any:
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 4, generator=g)

    def loss(self, batch: Any) -> Any:
        return self.model(batch).pow(2).mean()

    def on_membership(self, membership: Membership) -> None:
        if membership.generation >= 1 and self.step == 0:  # the promoted spare
            print("JOINING", flush=True)
            threading.Event().wait()  # blocks until the proc is stopped or killed

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def main() -> None:
    trainer = ElasticTrainer(Blocker, this_host(), 2, spares=1, timeout=120)
    trainer.start()
    trainer.step()
    pids = [r.pid.call_one().get(timeout=60) for r in trainer.replicas]
    pids += [s.actor.pid.call_one().get(timeout=60) for s in trainer._spares]
    print("PIDS", *pids, flush=True)
    os.kill(pids[1], signal.SIGKILL)
    trainer.step()  # never returns: the test stops this process during the recovery
    sys.exit("recovery finished, which the spare's block should have prevented")


if __name__ == "__main__":
    main()
