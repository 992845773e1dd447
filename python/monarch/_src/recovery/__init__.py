"""Recovery of a data-parallel run that loses replicas, without restarting the others.

See :class:`~monarch._src.recovery.trainer.ElasticTrainer` and docs/recovery.md.
"""

from monarch._src.recovery.replica import Membership, Replica, StateOffer, StepDone
from monarch._src.recovery.trainer import (
    ElasticTrainer,
    Recovery,
    RecoveryError,
    StepResult,
    WhenNoSpare,
)

__all__ = [
    "ElasticTrainer",
    "Membership",
    "Recovery",
    "RecoveryError",
    "Replica",
    "StateOffer",
    "StepDone",
    "StepResult",
    "WhenNoSpare",
]
