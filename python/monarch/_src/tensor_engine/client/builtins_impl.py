"""The remote functions of ``monarch.builtins``: logging and random state on the tensor
workers.

Each is a ``monarch.remote`` function: called under ``with mesh.activate():`` it runs
on every rank of the active mesh, in order with the torch operations recorded before
it. Those that return nothing use ``propagate="inspect"``: the call waits until rank 0
ran it, and an error there raises at the call.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from monarch._src.tensor_engine.client.api import Remote, remote

__all__ = [
    "LOGGER_NAME",
    "get_rng_state_all_cuda_remote",
    "get_rng_state_remote",
    "log_remote",
    "make_deterministic",
    "manual_seed_all_cuda_remote",
    "manual_seed_cuda_remote",
    "random_seed_remote",
    "seed_remote",
    "set_logging_level_remote",
    "set_manual_seed_remote",
    "set_rng_state_all_cuda_remote",
    "set_rng_state_remote",
]

#: The logger ``log_remote`` logs to on the workers (its level is the one
#: ``set_logging_level_remote`` sets).
LOGGER_NAME = "monarch.builtins.log"


def _builtin(fn: Any, name: str, propagate: Any) -> Remote:
    """``remote(fn)``, named ``name`` (in its repr and errors) and documented by
    ``fn``'s docstring; ``fn`` keeps its own name, by which the workers import it."""
    r: Remote = remote(fn, propagate=propagate)
    r._name = name
    r.__name__ = r.__qualname__ = name  # type: ignore[attr-defined]
    return r


# --- logging --------------------------------------------------------------------------------


def _log(*args: Any, level: int = logging.WARNING, **kwargs: Any) -> None:
    """``log_remote(msg, *args, level=logging.WARNING, **kwargs)``: log ``msg % args``
    on every rank of the active mesh, to the ``"monarch.builtins.log"`` logger (what
    ``logging.Logger.log`` takes). The procs' log lines reach the client like their
    other output."""
    logging.getLogger(LOGGER_NAME).log(level, *args, **kwargs)


def _set_logging_level(level: int | str) -> None:
    """``set_logging_level_remote(level)``: set the level of the
    ``"monarch.builtins.log"`` logger on every rank of the active mesh."""
    logging.getLogger(LOGGER_NAME).setLevel(level)


log_remote = _builtin(_log, "log_remote", "inspect")

set_logging_level_remote = _builtin(_set_logging_level, "set_logging_level_remote", "inspect")


# --- random state ---------------------------------------------------------------------------


def _set_manual_seed(seed: int, process_idx: Any = 0) -> None:
    """``set_manual_seed_remote(seed, process_idx=0)``: seed the random generators of
    every rank (CPU and every CUDA device, as ``torch.manual_seed``) with
    ``seed ^ process_idx``. The same ``seed`` gives every rank the same numbers (those
    of a local ``torch.manual_seed(seed)``); pass
    ``process_idx=mesh.rank_tensor(dims)`` (a monarch tensor) for a different seed per
    rank."""
    torch.manual_seed(int(seed) ^ int(process_idx))


def _cpu_state_like() -> torch.Tensor:
    # The CPU generator's state has the same size on every process: the client's own
    # tells the shape of the workers' (no data is read under shape propagation).
    return torch.empty(torch.get_rng_state().shape, dtype=torch.uint8)


def _get_rng_state() -> torch.Tensor:
    """``get_rng_state_remote()``: the state of each rank's CPU random generator
    (``torch.get_rng_state()``), as a monarch uint8 tensor; give it to
    ``set_rng_state_remote`` to restore it."""
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor) -> None:
    """``set_rng_state_remote(new_state)``: set each rank's CPU random generator to its
    shard of ``new_state`` (from ``get_rng_state_remote``)."""
    torch.set_rng_state(new_state)


def _seed() -> None:
    """``seed_remote()``: seed every rank's generators with a non-deterministic seed
    (``torch.seed()``; the seed is not returned)."""
    torch.seed()


def _random_seed() -> None:
    """``random_seed_remote()``: same as ``seed_remote()`` (``torch.random.seed()``)."""
    torch.random.seed()


def _manual_seed_cuda(seed: int) -> None:
    """``manual_seed_cuda_remote(seed)``: seed the current CUDA device's generator on
    every rank (``torch.cuda.manual_seed``; without CUDA torch keeps it for when CUDA
    starts). ``set_manual_seed_remote`` seeds CPU and CUDA."""
    torch.cuda.manual_seed(int(seed))


def _manual_seed_all_cuda(seed: int) -> None:
    """``manual_seed_all_cuda_remote(seed)``: seed every CUDA device's generator on
    every rank (``torch.cuda.manual_seed_all``)."""
    torch.cuda.manual_seed_all(int(seed))


def _get_rng_state_all_cuda() -> list[torch.Tensor]:
    """``get_rng_state_all_cuda_remote()``: the states of every CUDA device's generator
    on each rank (``torch.cuda.get_rng_state_all``), a list of monarch uint8 tensors
    (empty where the workers have no CUDA device); the CPU generator's is
    ``get_rng_state_remote()``."""
    return list(torch.cuda.get_rng_state_all())


def _set_rng_state_all_cuda(states: list[torch.Tensor]) -> None:
    """``set_rng_state_all_cuda_remote(states)``: restore the states from
    ``get_rng_state_all_cuda_remote`` on every rank."""
    torch.cuda.set_rng_state_all(states)


def _make_deterministic() -> None:
    """``make_deterministic()``: make torch choose deterministic algorithms on every
    rank (``torch.use_deterministic_algorithms(True)``, deterministic cuDNN without
    benchmarking, and the fixed cuBLAS workspace they need)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # cuBLAS is deterministic only with a fixed workspace (see torch's
    # use_deterministic_algorithms documentation).
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


set_manual_seed_remote = _builtin(_set_manual_seed, "set_manual_seed_remote", "inspect")

get_rng_state_remote = _builtin(_get_rng_state, "get_rng_state_remote", lambda: _cpu_state_like())

set_rng_state_remote = _builtin(_set_rng_state, "set_rng_state_remote", "inspect")

seed_remote = _builtin(_seed, "seed_remote", "inspect")

random_seed_remote = _builtin(_random_seed, "random_seed_remote", "inspect")

manual_seed_cuda_remote = _builtin(_manual_seed_cuda, "manual_seed_cuda_remote", "inspect")

manual_seed_all_cuda_remote = _builtin(
    _manual_seed_all_cuda, "manual_seed_all_cuda_remote", "inspect"
)

get_rng_state_all_cuda_remote = _builtin(
    _get_rng_state_all_cuda, "get_rng_state_all_cuda_remote", "inspect"
)

set_rng_state_all_cuda_remote = _builtin(
    _set_rng_state_all_cuda, "set_rng_state_all_cuda_remote", "inspect"
)

make_deterministic = _builtin(_make_deterministic, "make_deterministic", lambda: None)
