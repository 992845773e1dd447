"""Fine-grained recovery of data-parallel training: a run that loses replicas replaces
them, copies a survivor's state to them one-sided and computes the interrupted step
again, without restarting the survivors. Guide: docs/recovery.md."""

from monarch._src.recovery import (
    ElasticTrainer,
    Membership,
    Recovery,
    RecoveryError,
    Replica,
    StepResult,
    WhenNoSpare,
)

__all__ = [
    "ElasticTrainer",
    "Membership",
    "Recovery",
    "RecoveryError",
    "Replica",
    "StepResult",
    "WhenNoSpare",
]
