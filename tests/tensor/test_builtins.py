"""``monarch.builtins``: logging on the tensor workers and their random state."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import monarch
import monarch.builtins
from monarch import fetch_shard, inspect, remote
from monarch.actor import ProcMesh
from monarch.builtins.log import log_remote, set_logging_level_remote
from monarch.builtins.random import (
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

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
RANKS = [(h, g) for h in range(2) for g in range(2)]
LOGGER = "monarch.builtins.log"


# --- functions the workers run (imported by name) ---------------------------------------------

_records: list[tuple[int, str]] = []


class _ListHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        # (without the "[actor=...] " prefix monarch gives records inside actors)
        _records.append((record.levelno, record.getMessage().split(">] ", 1)[-1]))


def capture_builtin_logs(on: bool) -> None:
    logger = logging.getLogger(LOGGER)
    for h in [h for h in logger.handlers if isinstance(h, _ListHandler)]:
        logger.removeHandler(h)
    _records.clear()
    if on:
        logger.addHandler(_ListHandler())


def captured_logs() -> list[tuple[int, str]]:
    return list(_records)


def builtin_logger_level() -> int:
    return logging.getLogger(LOGGER).level


def deterministic_state() -> tuple[bool, bool, str | None]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        bool(torch.backends.cudnn.deterministic),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def undo_deterministic() -> None:
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def _values(fn: Any, *args: Any) -> list[Any]:
    values = fn.call(*args).get(timeout=60)
    return [v for _, v in sorted(values.items(), key=lambda pv: pv[0].rank)]


# --- the modules ------------------------------------------------------------------------------


def test_the_modules_export_upstreams_names() -> None:
    assert monarch.builtins.__all__ == ["log_remote", "set_logging_level_remote"]
    assert monarch.builtins.log_remote is log_remote
    for fn in (log_remote, set_manual_seed_remote, get_rng_state_all_cuda_remote):
        assert isinstance(fn, monarch._src.tensor_engine.client.api.Remote)
    assert repr(set_manual_seed_remote) == "monarch.remote(set_manual_seed_remote)"
    assert "seed ^ process_idx" in (set_manual_seed_remote.__doc__ or "")


# --- random state -----------------------------------------------------------------------------


def _local_rand(seed: int, n: int = 5) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.rand(n)


def test_one_seed_gives_every_rank_the_local_numbers(mesh: ProcMesh) -> None:
    with mesh.activate():
        set_manual_seed_remote(1234)
        a = torch.rand(5)
        b = torch.rand(5)
    for h, g in RANKS:
        torch.manual_seed(1234)
        assert torch.equal(inspect(a, hosts=h, gpus=g), torch.rand(5))
        assert torch.equal(inspect(b, hosts=h, gpus=g), torch.rand(5))


def test_a_seed_per_rank_and_saving_and_restoring_the_state(mesh: ProcMesh) -> None:
    with mesh.activate():
        rank = mesh.rank_tensor(("hosts", "gpus"))
        set_manual_seed_remote(77, process_idx=rank)
        state = get_rng_state_remote()
        first = torch.rand(6)
        torch.rand(100)  # move on
        set_rng_state_remote(state)
        again = torch.rand(6)
    assert state.shape == torch.get_rng_state().shape and state.dtype == torch.uint8
    states = []
    for r, (h, g) in enumerate(RANKS):
        expected = _local_rand(77 ^ r, 6)
        assert torch.equal(inspect(first, hosts=h, gpus=g), expected)
        assert torch.equal(inspect(again, hosts=h, gpus=g), expected)
        torch.manual_seed(77 ^ r)
        local_state = torch.get_rng_state()
        got_state = fetch_shard(state, hosts=h, gpus=g).get(timeout=60)
        assert torch.equal(got_state, local_state)
        states.append(got_state)
    assert not torch.equal(states[0], states[1])


def test_nondeterministic_seeds_differ_per_rank(mesh: ProcMesh) -> None:
    with mesh.activate():
        set_manual_seed_remote(5)
        seed_remote()
        a = torch.rand(8)
        random_seed_remote()
        b = torch.rand(8)
    shards = [inspect(a, hosts=h, gpus=g) for h, g in RANKS]
    assert not torch.equal(shards[0], _local_rand(5, 8))
    assert len({tuple(s.tolist()) for s in shards}) == 4
    assert not torch.equal(inspect(b, hosts=0, gpus=0), shards[0])


def test_the_cuda_variants_run_on_cpu_only_workers(mesh: ProcMesh) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the behaviour of workers without CUDA")
    with mesh.activate():
        manual_seed_cuda_remote(3)
        manual_seed_all_cuda_remote(3)
        states = get_rng_state_all_cuda_remote()
        set_rng_state_all_cuda_remote(states)
    assert states == []


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine (torch.cuda)"
)
def test_the_cuda_generators_are_seeded_saved_and_restored(mesh: ProcMesh) -> None:
    one = mesh.slice(hosts=0, gpus=0)
    with one.activate():
        manual_seed_all_cuda_remote(11)
        states = get_rng_state_all_cuda_remote()
        a = torch.rand(4, device="cuda")
        set_rng_state_all_cuda_remote(states)
        b = torch.rand(4, device="cuda")
        manual_seed_cuda_remote(11)
        c = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(11)
    expected = torch.rand(4, device="cuda").cpu()
    assert len(states) >= 1 and states[0].dtype == torch.uint8
    assert torch.equal(inspect(a), expected)
    assert torch.equal(inspect(b), expected)
    assert torch.equal(inspect(c), expected)


def test_make_deterministic(mesh: ProcMesh) -> None:
    # On one rank only: torch.use_deterministic_algorithms imports torch._inductor, which
    # takes seconds per proc.
    state = remote(deterministic_state)
    one = mesh.slice(hosts=1, gpus=0)
    with mesh.activate():
        assert _values(state) == [(False, False, None)] * 4
    with one.activate():
        make_deterministic()
        try:
            with mesh.activate():
                after = _values(state)
        finally:
            remote(undo_deterministic).call().get(timeout=60)
    off = (False, False, None)
    assert after == [off, off, (True, True, ":4096:8"), off]


# --- logging ----------------------------------------------------------------------------------


def test_log_remote_logs_at_the_level_given_and_the_level_can_change(mesh: ProcMesh) -> None:
    capture = remote(capture_builtin_logs)
    with mesh.activate():
        capture.call(True).get(timeout=60)
        try:
            set_logging_level_remote(logging.INFO)
            assert _values(remote(builtin_logger_level)) == [logging.INFO] * 4
            x = mesh.rank_tensor(("hosts", "gpus"))
            log_remote("hidden %d", 1, level=logging.DEBUG)
            log_remote("rank %s says %s", x, "hi", level=logging.INFO)
            log_remote("warned")
            set_logging_level_remote(logging.ERROR)
            log_remote("also hidden", level=logging.WARNING)
            got = _values(remote(captured_logs))
        finally:
            capture.call(False).get(timeout=60)
            set_logging_level_remote(logging.NOTSET)
    assert got == [
        [(logging.INFO, f"rank tensor({r}) says hi"), (logging.WARNING, "warned")] for r in range(4)
    ]


_LOGGING_CLIENT = """
import asyncio
import logging
import monarch
from monarch.actor import this_host
from monarch.builtins import log_remote, set_logging_level_remote

procs = this_host().spawn_procs(per_host={"gpus": 2}, name="loggers")
# a handler on the procs' root logger, which lets warnings through
asyncio.run(procs.logging_option(stream_to_client=True, level=logging.WARNING))
with procs.activate():
    log_remote("not shown: %s", "debug", level=logging.DEBUG)
    set_logging_level_remote(logging.DEBUG)
    log_remote("from the workers: %s", "debug", level=logging.DEBUG)
    log_remote("from the workers: %s", "warning")
procs.stop().get()
print("CLIENT DONE", flush=True)
"""


def test_the_workers_log_lines_reach_the_client() -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LOGGING_CLIENT)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        # procs forked from a template that imported torch, as a program gets them
        # by default (the suite turns it off)
        env={k: v for k, v in os.environ.items() if k != "MONARCH_SPAWN_FORK_SERVER_PRELOAD"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "CLIENT DONE"
    lines = out.stderr.splitlines()
    for rank in range(2):
        mine = [line for line in lines if line.startswith(f"[loggers {rank}] ")]
        assert any("DEBUG:monarch.builtins.log" in m and "workers: debug" in m for m in mine), mine
        assert any("WARNING:monarch.builtins.log" in m and "workers: warning" in m for m in mine)
        assert not any("not shown" in m for m in mine)
