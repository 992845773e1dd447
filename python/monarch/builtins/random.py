"""The random state of the tensor workers: seeding every rank, and saving and restoring
the generators' states.

``set_manual_seed_remote``, ``get_rng_state_remote``, ``set_rng_state_remote``,
``seed_remote`` and ``random_seed_remote`` work on CPU-only workers too (the CPU
generator; seeding also seeds CUDA devices); the ``*_cuda_remote`` functions are for the
CUDA generators. ``make_deterministic`` turns on torch's deterministic algorithms.
"""

from __future__ import annotations

from monarch._src.tensor_engine.client.builtins_impl import (
    get_rng_state_all_cuda_remote,
    get_rng_state_remote,
    make_deterministic,
    manual_seed_all_cuda_remote,
    manual_seed_cuda_remote,
    random_seed_remote,
    seed_remote,
    set_manual_seed_remote,
    set_rng_state_all_cuda_remote,
    set_rng_state_remote,
)

__all__ = [
    "get_rng_state_all_cuda_remote",
    "get_rng_state_remote",
    "make_deterministic",
    "manual_seed_all_cuda_remote",
    "manual_seed_cuda_remote",
    "random_seed_remote",
    "seed_remote",
    "set_manual_seed_remote",
    "set_rng_state_all_cuda_remote",
    "set_rng_state_remote",
]
