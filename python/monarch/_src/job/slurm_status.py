"""What ``squeue`` says about a Slurm job, as :class:`~monarch._src.job.slurm.SlurmJob`
reads it: the job's state, the pending reasons no waiting fixes, and how errors
describe them."""

from __future__ import annotations

from dataclasses import dataclass

#: States of a job that may still run its workers.
_ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
#: Pending reasons that no waiting fixes: the job as submitted can never start.
_NEVER_STARTS = {
    "BadConstraints": "its constraints match no node",
    "DependencyNeverSatisfied": "a job it depends on failed",
    "PartitionConfig": "the partition cannot satisfy it (node count, time or size)",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "InvalidAccount": "the account is invalid",
    "InvalidQOS": "the QOS is invalid",
    "AccountNotAllowed": "the partition does not allow the account",
    "QOSNotAllowed": "the partition does not allow the QOS",
}


@dataclass(frozen=True)
class _Status:
    """One line of ``squeue -o '%T|%r|%N'``; ``state`` is ``None`` when squeue no
    longer knows the job (it ended long enough ago)."""

    state: str | None
    reason: str = ""
    nodelist: str = ""

    @property
    def active(self) -> bool:
        return self.state in _ACTIVE

    def describe(self) -> str:
        if self.state is None:
            return "no longer known to squeue (it ended)"
        if self.state == "COMPLETING":
            return "COMPLETING (it is ending: cancelled, failed or finished)"
        reason = f" (reason: {self.reason})" if self.reason and self.reason != "None" else ""
        return f"{self.state}{reason}"
