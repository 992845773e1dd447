"""Helpers of the distributed-tensor tests; the tensor workers import this module by
name too (``remote("tests_tensor_helpers.scale_by_path")``)."""

import contextlib
import os
from collections.abc import Iterator

import torch


def scale_by_path(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@contextlib.contextmanager
def preloading_torch() -> Iterator[None]:
    """Spawns in the block fork procs from a template that imported torch, as a
    program that imported torch gets them by default (the suite turns it off: see
    tests/conftest.py)."""
    saved = os.environ.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["MONARCH_SPAWN_FORK_SERVER_PRELOAD"] = saved
