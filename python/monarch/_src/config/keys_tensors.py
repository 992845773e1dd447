"""The config keys of the section "Distributed tensors" of docs/config.md: how long
collectives, transfers and the tensor engine's start wait.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import Key, in_group
from monarch._src.config.kinds import DURATION, S

#: The docs section these keys are listed in.
GROUP = "Distributed tensors"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
        Key(
            "tensor_collective_timeout",
            "MONARCH_TENSOR_COLLECTIVE_TIMEOUT",
            DURATION,
            60 * S,
            "How long a collective, a to_mesh transfer or a process group's rendezvous "
            "of the tensor engine waits for its peers.",
            effect="How long a tensor worker waits for the other ranks of a collective "
            "(reduce, a process group's rendezvous) or for the sender of a to_mesh "
            "transfer before the command fails (RemoteException naming the ranks); "
            "read when a worker creates a process group or waits for a transfer.",
        ),
        Key(
            "tensor_engine_start_timeout",
            "MONARCH_TENSOR_ENGINE_START_TIMEOUT",
            DURATION,
            120 * S,
            "How long the first activation of a mesh waits for its tensor workers.",
            effect="How long the first use of a mesh for tensors waits for its tensor "
            "workers to start (an error names the mesh after it).",
        ),
    ),
]
