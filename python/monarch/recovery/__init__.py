"""Fine-grained recovery of data-parallel training: a run that loses replicas replaces
them, copies a survivor's state to them one-sided and computes the interrupted step
again, without restarting the survivors; for actors running torch.distributed
(``ElasticTrainer``) and for distributed tensors from one controller (``TensorTrainer``).
Guide: [Recovery](../recovery.md)."""

from monarch._src.recovery import (
    ElasticTrainer,
    Membership,
    Recovery,
    RecoveryError,
    Replica,
    StepResult,
    TensorTrainer,
    WhenNoSpare,
)

__all__ = [
    "ElasticTrainer",
    "Membership",
    "Recovery",
    "RecoveryError",
    "Replica",
    "StepResult",
    "TensorTrainer",
    "WhenNoSpare",
]
