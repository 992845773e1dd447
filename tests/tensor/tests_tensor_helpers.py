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


#: A barrier only two threads of one worker process can pass together (see
#: ``test_streams.py``: two streams of one worker run concurrently).
_BARRIER_LOCK = __import__("threading").Lock()
_BARRIERS: dict[str, object] = {}


def meet_on_two_streams(x: torch.Tensor, name: str, timeout: float) -> torch.Tensor:
    """Wait at barrier ``name`` for one other thread of this process; ``x + 1`` when
    both came, else raise."""
    import threading

    with _BARRIER_LOCK:
        barrier = _BARRIERS.setdefault(name, threading.Barrier(2))
    assert isinstance(barrier, threading.Barrier)
    barrier.wait(timeout)
    return x + 1


def my_actor_rank(x: torch.Tensor) -> torch.Tensor:
    """``x`` plus the rank of the worker actor running this (its context)."""
    from monarch.actor import context

    return x + context().actor_instance.rank.rank
