"""Recovery of a data-parallel run that loses replicas, without restarting the others.

See :class:`~monarch._src.recovery.trainer.ElasticTrainer` (actors running
torch.distributed), :class:`~monarch._src.recovery.tensors.TensorTrainer` (distributed
tensors from one controller) and docs/recovery.md.
"""

from monarch._src.recovery.replica import Membership, Replica, StateOffer, StepDone
from monarch._src.recovery.tensors import TensorTrainer
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
    "TensorTrainer",
    "WhenNoSpare",
]
