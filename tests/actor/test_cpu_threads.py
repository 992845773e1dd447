"""Procs spawned several to a host share its cores: each runs max(1, cores // procs)
torch threads unless OMP_NUM_THREADS is set or the procs are bound to CPUs."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch  # imported first, so that the fork server preloads it: the harder case

from monarch._src.actor.cpu_threads import (
    SHARE_ENV,
    THREADS_ENV,
    share_this_proc,
    spawn_variables,
    threads_for,
)
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured

CPUS = len(os.sched_getaffinity(0))


class Threads(Actor):
    @endpoint
    def get(self) -> tuple[int, str | None, str | None]:
        return torch.get_num_threads(), os.environ.get(THREADS_ENV), os.environ.get(SHARE_ENV)


def threads_of(procs: ProcMesh) -> list[tuple[int, str | None, str | None]]:
    try:
        probe = procs.spawn("threads", Threads)
        return list(probe.get.call().get(timeout=60).values())
    finally:
        procs.stop().get(timeout=60)


@pytest.fixture(autouse=True)
def _no_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)


def test_threads_for() -> None:
    assert [threads_for(c, p) for c, p in [(2, 4), (2, 2), (16, 4), (16, 3), (8, 1)]] == [
        1,
        1,
        4,
        5,
        8,
    ]
    assert threads_for(0, 3) == 1 and threads_for(4, 0) == 4


def test_spawn_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert spawn_variables({"gpus": 4}, False) == {SHARE_ENV: "4"}
    assert spawn_variables({"nodes": 2, "gpus": 3}, False) == {SHARE_ENV: "6"}
    # One proc a host, procs bound to CPUs, or an explicit count: nothing.
    assert spawn_variables({}, False) == {} and spawn_variables({"gpus": 1}, False) == {}
    assert spawn_variables({"gpus": 4}, True) == {}
    assert spawn_variables({"gpus": 4}, False, {THREADS_ENV: "3"}) == {}
    with configured(spawn_cpu_threads=False):
        assert spawn_variables({"gpus": 4}, False) == {}
    monkeypatch.setenv(THREADS_ENV, "2")
    assert spawn_variables({"gpus": 4}, False) == {}


def test_share_this_proc() -> None:
    env = {SHARE_ENV: "4"}
    assert share_this_proc(env, cpus=16) == 4
    assert env == {THREADS_ENV: "4"}  # the request is consumed
    env = {SHARE_ENV: "4"}
    assert share_this_proc(env, cpus=2) == 1 and env[THREADS_ENV] == "1"
    # The host's own setting wins; a malformed request or none is ignored.
    env = {SHARE_ENV: "4", THREADS_ENV: "7"}
    assert share_this_proc(env, cpus=16) == 7 and env == {THREADS_ENV: "7"}
    env = {SHARE_ENV: "many"}
    assert share_this_proc(env, cpus=16) is None and THREADS_ENV not in env
    assert share_this_proc({}, cpus=16) is None
    assert share_this_proc({THREADS_ENV: "0"}, cpus=16) is None


def test_procs_of_one_host_share_its_cores() -> None:
    want = threads_for(CPUS, 4)
    got = threads_of(this_host().spawn_procs(per_host={"gpus": 4}))
    assert got == [(want, str(want), None)] * 4


def test_a_single_proc_keeps_every_core() -> None:
    ((threads, omp, request),) = threads_of(this_host().spawn_procs(per_host={"gpus": 1}))
    assert omp is None and request is None
    assert threads >= 1  # torch's own default, untouched


@pytest.mark.parametrize(
    "how",
    ["env", "config", "bound"],
)
def test_an_explicit_choice_wins(how: str) -> None:
    # ``env=`` reaches torch even though the fork server's template imported it first.
    kwargs: dict[str, Any] = {}
    if how == "env":
        # Not the share (1 on 2 CPUs); torch caps its threads at the CPUs.
        kwargs["env"] = {THREADS_ENV: str(CPUS)}
    elif how == "bound":
        kwargs["proc_bind"] = [{"cpus": f"0-{CPUS - 1}"}] * 2
    if how == "config":
        with configured(spawn_cpu_threads=False):
            procs = this_host().spawn_procs(per_host={"gpus": 2}, **kwargs)
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 2}, **kwargs)
    got = threads_of(procs)
    assert len(got) == 2
    for threads, omp, request in got:
        assert request is None
        if how == "env":
            assert (threads, omp) == (CPUS, str(CPUS))
        else:
            assert omp is None
