"""Casting over a tree of procs: every
rank gets a cast exactly once at the depth the fan-out implies, call() replies are
reduced per subtree, a cast followed by a direct send keeps its order, slices of slices
reach the right ranks, and a rank whose proc is gone is reported, not waited for.

The tree itself is pinned for 1..64 receivers in hyperactor_mesh/tests/cast.rs; these
tests run it across real procs."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import monarch
from monarch.actor import (
    Actor,
    ProcMesh,
    SupervisionError,
    context,
    current_rank,
    endpoint,
    this_host,
)

if TYPE_CHECKING:
    from conftest import Faults

pytestmark = pytest.mark.timeout(120)

N = 16


class Recorder(Actor):
    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    @endpoint
    def record(self, tag: str) -> tuple[int, int]:
        """Remember ``tag``; reply with (message rank, hops the message took)."""
        self.log.append((tag, context()._hops))
        return current_rank().rank, context()._hops

    @endpoint
    def note(self, tag: str) -> None:
        self.log.append((tag, context()._hops))

    @endpoint
    def take_log(self) -> list[tuple[str, int]]:
        log, self.log = self.log, []
        return log

    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return context().actor_instance.rank.rank


def expected_depth(n: int, fanout: int) -> int:
    """The depth of a balanced tree: chunks of at most ceil(n / fanout) receivers, each
    a head plus the rest of its chunk split the same way."""

    def chunk(m: int) -> int:
        if m <= 1:
            return m
        rest = m - 1
        return 1 + chunk(math.ceil(rest / min(rest, fanout)))

    return chunk(math.ceil(n / min(n, fanout)))


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"procs": N})
    assert pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture(scope="module")
def recorders(procs: ProcMesh) -> Recorder:
    mesh = procs.spawn("recorders", Recorder)
    mesh.initialized.get(timeout=60)
    return mesh


@pytest.mark.parametrize("fanout", [2, 16])
def test_every_rank_gets_a_cast_once_at_the_expected_depth(
    recorders: Recorder, fanout: int
) -> None:
    with monarch.configured(cast_fanout=fanout):
        for n in (1, 2, 3, 5, 8, 13, 16):
            view = recorders.slice(procs=slice(0, n))
            tag = f"f{fanout}n{n}"
            got = view.record.call(tag).get(timeout=30)
            ranks = [r for _, (r, _) in got.items()]
            assert ranks == list(range(n))
            depth = max(h for _, (_, h) in got.items())
            assert depth == expected_depth(n, fanout), (n, fanout)
            if n <= fanout:
                assert depth == 1
    # Exactly once: each rank's log holds each of its tags one time.
    logs = recorders.take_log.call().get(timeout=30)
    for p, log in logs.items():
        tags = [t for t, _ in log]
        assert len(tags) == len(set(tags)), (p, tags)
        assert tags == [f"f{fanout}n{n}" for n in (1, 2, 3, 5, 8, 13, 16) if p["procs"] < n]


@pytest.mark.parametrize("fanout", [2, 4, 16])
def test_call_replies_are_reduced_per_subtree(recorders: Recorder, fanout: int) -> None:
    with monarch.configured(cast_fanout=fanout):
        fut = recorders.rank.call()
        assert [v for _, v in fut.get(timeout=30).items()] == list(range(N))
    # One reply message per top-level subtree reached the caller, not one per actor.
    assert fut._impl.messages == min(fanout, N)  # type: ignore[attr-defined]


def test_a_cast_followed_by_a_direct_send_keeps_its_order(recorders: Recorder) -> None:
    with monarch.configured(cast_fanout=2):
        hops = recorders.record.call("probe").get(timeout=30)
        deepest = max(range(N), key=lambda r: hops.item(procs=r)[1])
        last = recorders.slice(procs=deepest)
        recorders.take_log.call().get(timeout=30)
        # The cast reaches that rank after several hops; the direct send after it takes
        # one, and must still be handled second.
        for i in range(30):
            recorders.note.broadcast(f"cast{i}")
            last.note.broadcast(f"direct{i}")
        log = last.take_log.call_one().get(timeout=30)
    assert max(h for t, h in log if t.startswith("cast")) == expected_depth(N, 2) > 1
    expected = [t for i in range(30) for t in (f"cast{i}", f"direct{i}")]
    assert [t for t, _ in log] == expected
    recorders.take_log.call().get(timeout=30)


def test_a_slice_of_a_slice_reaches_exactly_its_ranks(recorders: Recorder) -> None:
    odd = recorders.slice(procs=slice(1, N, 2))  # 1, 3, ..., 15
    inner = odd.slice(procs=slice(2, 6))  # of those: 5, 7, 9, 11
    with monarch.configured(cast_fanout=2):
        got = inner.rank.call().get(timeout=30)
        assert [v for _, v in got.items()] == [5, 7, 9, 11]
        ranks = inner.record.call("inner").get(timeout=30)
        assert [r for _, (r, _) in ranks.items()] == [0, 1, 2, 3]
    logs = recorders.take_log.call().get(timeout=30)
    reached = [p["procs"] for p, log in logs.items() if log]
    assert reached == [5, 7, 9, 11]


def test_stream_yields_every_rank_through_the_tree(recorders: Recorder) -> None:
    with monarch.configured(cast_fanout=2):
        got = sorted(f.get(timeout=30) for f in recorders.rank.stream())
    assert got == list(range(N))


def test_a_dead_relay_fails_the_ranks_behind_it_promptly(faults: Faults) -> None:
    """At fan-out 2 over 8 procs, rank 0 relays the cast to ranks 1..3. Once rank 0's
    proc is SIGKILLed, call() raises SupervisionError promptly; stream() answers every
    rank (the healthy ranks outside its subtree with their values); later casts skip
    the dead proc and still reach the ranks it used to relay to."""
    pm = this_host().spawn_procs(per_host={"procs": 8})
    try:
        mesh = pm.spawn("relayed", Recorder)
        pid0 = mesh.slice(procs=0).pid.call_one().get(timeout=60)
        with monarch.configured(cast_fanout=2):
            pending = mesh.sleep.call(2)
            start = time.monotonic()
            os.kill(pid0, signal.SIGKILL)
            with pytest.raises(SupervisionError):
                pending.get(timeout=30)
            assert time.monotonic() - start < 5
            faults.wait_for(1, "relayed")
            results: dict[int, object] = {}
            for i, fut in enumerate(mesh.slice(procs=slice(4, 8)).rank.stream()):
                results[i] = fut.get(timeout=30)
            assert sorted(results.values()) == [4, 5, 6, 7]
            outcomes = []
            for fut in mesh.rank.stream():
                try:
                    outcomes.append(fut.get(timeout=30))
                except SupervisionError:
                    outcomes.append("failed")
            assert sorted(o for o in outcomes if o != "failed") == [1, 2, 3, 4, 5, 6, 7]
            assert outcomes.count("failed") == 1
    finally:
        pm.stop().get(timeout=60)


def test_config_rejects_bad_keys_and_values() -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        monarch.configure(cast_fan_out=2)
    with pytest.raises(TypeError, match="cast_fanout"):
        monarch.configure(cast_fanout=0)
    with pytest.raises(TypeError, match="cast_fanout"):
        monarch.configure(cast_fanout="2")
    with monarch.configured(cast_fanout=3) as merged:
        assert merged["cast_fanout"] == 3
        assert monarch.get_runtime_config() == {"cast_fanout": 3}
    assert monarch.get_global_config()["cast_fanout"] == 16
    assert monarch.get_runtime_config() == {}


def test_the_environment_beats_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERACTOR_MESH_CAST_FANOUT", "5")
    with monarch.configured(cast_fanout=3) as merged:
        assert merged["cast_fanout"] == 5
    monkeypatch.setenv("HYPERACTOR_MESH_CAST_FANOUT", "zero")
    with pytest.raises(ValueError, match="HYPERACTOR_MESH_CAST_FANOUT"):
        monarch.get_global_config()
