"""Monitoring (issue 24): always-on actor counters, snapshots gathered per host, events,
and stack dumps, through the extension's JSON bindings."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fault_recorder import Faults, _record_faults, faults  # noqa: F401  (fixtures)
from monarch._rust_bindings import (
    monitor_events,
    monitor_kill_proc,
    monitor_logs,
    monitor_snapshot,
    monitor_stack,
)
from monarch.actor import Actor, ActorError, ProcMesh, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


class Counted(Actor):
    @endpoint
    def a(self) -> int:
        return 1

    @endpoint
    def b(self, fail: bool) -> int:
        if fail:
            raise ValueError("b was asked to fail")
        return 2

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def stuck(self, seconds: float) -> None:
        sleeping_in_an_endpoint_for_the_stack_test(seconds)


def sleeping_in_an_endpoint_for_the_stack_test(seconds: float) -> None:
    time.sleep(seconds)


Snapshot = dict[str, Any]


def snapshot() -> Snapshot:
    snap: Snapshot = json.loads(monitor_snapshot(10.0))
    return snap


def wait_until(what: str, check: Callable[[Snapshot], bool], timeout: float = 30) -> Snapshot:
    """Polls the snapshot every 50 ms until ``check`` holds; returns that snapshot."""
    deadline = time.monotonic() + timeout
    snap = snapshot()
    while not check(snap):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s: {json.dumps(snap)[:4000]}")
        time.sleep(0.05)
        snap = snapshot()
    return snap


def actors_of(snap: Snapshot, name: str) -> list[dict[str, Any]]:
    return sorted(
        (a for a in snap["actors"] if a["name"] == name),
        key=lambda a: a["rank"] if a["rank"] is not None else -1,
    )


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=30)
    yield pm
    pm.stop().get(timeout=30)


def test_counters_equal_the_calls_per_actor_and_endpoint(procs: ProcMesh) -> None:
    counted = procs.spawn("mon_counted", Counted)
    n, m = 5, 3
    for _ in range(n):
        counted.a.call().get(timeout=30)
    for i in range(m):
        if i == m - 1:
            with pytest.raises(ActorError):
                counted.b.call(True).get(timeout=30)
        else:
            counted.b.call(False).get(timeout=30)

    def counted_all(snap: Snapshot) -> bool:
        actors = actors_of(snap, "mon_counted")
        return len(actors) == 2 and all(a["handled"] == n + m for a in actors)

    snap = wait_until("all calls counted", counted_all)
    assert snap["version"] == 1
    assert len(snap["bucket_bounds_us"]) == 25
    for rank, actor in enumerate(actors_of(snap, "mon_counted")):
        assert actor["rank"] == rank
        assert actor["class"] is not None and actor["class"].endswith("Counted")
        assert actor["system"] is False
        assert actor["status"] == "idle", actor
        assert actor["current"] is None
        assert actor["errors"] == 1
        assert actor["queue"] == 0
        eps = actor["endpoints"]
        assert set(eps) == {"a", "b"}, eps
        assert (eps["a"]["count"], eps["a"]["errors"]) == (n, 0)
        assert (eps["b"]["count"], eps["b"]["errors"]) == (m, 1)
        for ep in eps.values():
            assert len(ep["buckets"]) == 26 and sum(ep["buckets"]) == ep["count"]
        assert actor["busy_ms"] > 0
        assert actor["busy_ms"] == pytest.approx(
            eps["a"]["total_ms"] + eps["b"]["total_ms"], rel=1e-6
        )
    # Its procs are in the snapshot, running, with their host and this process's meshes.
    proc_ids = {a["proc"] for a in actors_of(snap, "mon_counted")}
    procs_by_id = {p["id"]: p for p in snap["procs"]}
    for proc_id in proc_ids:
        p = procs_by_id[proc_id]
        assert p["status"] == "running" and p["pid"] and p["rss"] > 0 and p["threads"] > 0
        assert p["host"] in {h["id"] for h in snap["hosts"]}
        assert p["mesh"] is not None and p["rank"] in (0, 1)
        assert p["point"] == {"gpus": p["rank"]}
    meshes = {m["name"]: m for m in snap["meshes"]}
    assert meshes["mon_counted"]["kind"] == "actor" and meshes["mon_counted"]["status"] == "running"
    assert meshes["mon_counted"]["extent"] == {"gpus": 2}
    assert meshes["mon_counted"]["proc_mesh"] == p["mesh"]
    assert meshes[p["mesh"]]["kind"] == "proc" and meshes[p["mesh"]]["extent"] == {"gpus": 2}
    assert meshes[p["mesh"]]["class"] is None
    host = snap["hosts"][0]
    assert host["status"] == "alive" and host["cpus"] >= 1 and host["mem_total"] > 0
    kinds = {e["kind"] for e in json.loads(monitor_events(0, 10_000))["items"]}
    assert "mesh_spawned" in kinds


def test_a_stuck_actor_shows_its_endpoint_and_its_stack(procs: ProcMesh) -> None:
    counted = procs.spawn("mon_stuck", Counted)
    pending = counted.slice(gpus=0).stuck.call_one(4.0)

    def stuck_now(snap: Snapshot) -> bool:
        actors = actors_of(snap, "mon_stuck")
        return bool(actors) and (actors[0]["current"] or {}).get("endpoint") == "stuck"

    snap = wait_until("stuck in its endpoint", stuck_now)
    actor = actors_of(snap, "mon_stuck")[0]
    assert actor["status"] == "processing"
    assert actor["current"]["since_ms"] >= 0
    dump = json.loads(monitor_stack(actor["proc"], 5.0))
    assert dump["proc"] == actor["proc"] and dump["pid"] > 0
    assert dump["method"] in ("py-spy", "faulthandler")
    assert "sleeping_in_an_endpoint_for_the_stack_test" in dump["text"], dump["text"]
    pending.get(timeout=30)
    snap = wait_until("idle again", lambda s: actors_of(s, "mon_stuck")[0]["current"] is None)
    assert actors_of(snap, "mon_stuck")[0]["endpoints"]["stuck"]["count"] == 1


def test_the_client_can_dump_its_own_stack() -> None:
    snap = snapshot()
    me = next(p for p in snap["procs"] if p["pid"] == os.getpid())
    dump = json.loads(monitor_stack(me["id"], 5.0))
    assert dump["pid"] == os.getpid()
    assert "test_the_client_can_dump_its_own_stack" in dump["text"]


def test_proc_output_lands_in_the_logs_ring(procs: ProcMesh) -> None:
    counted = procs.spawn("mon_talker", Counted)
    marker = f"monitoring-log-marker-{os.getpid()}"
    counted.say.call(marker).get(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        items = json.loads(monitor_logs(marker.upper(), None, 10))["items"]
        if len(items) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(items) == 2, items
    assert {i["rank"] for i in items} == {0, 1}
    assert all(i["stream"] == "stdout" and marker in i["line"] for i in items)
    snap = snapshot()
    assert {i["proc"] for i in items} <= {p["id"] for p in snap["procs"]}


def test_a_sigkilled_proc_shows_failed_from_its_exit(
    procs: ProcMesh,
    faults: Faults,  # noqa: F811  (the fixture imported above)
) -> None:
    """A SIGKILLed proc shows failed with its exit (signal 9, reaped by its host), not
    lost by heartbeats, and its actor failed. How soon is measured by
    benches/monitoring_bench.py (failure visibility), not asserted here."""
    counted = procs.spawn("mon_killed", Counted)
    counted.a.call().get(timeout=30)
    snap = snapshot()
    victim = actors_of(snap, "mon_killed")[1]
    pid = next(p["pid"] for p in snap["procs"] if p["id"] == victim["proc"])
    assert pid == counted.slice(gpus=1).pid.call_one().get(timeout=30)
    since = json.loads(monitor_events(0, 10_000))["next"]

    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()

    def shows_failed(s: Snapshot) -> bool:
        proc = next((p for p in s["procs"] if p["id"] == victim["proc"]), None)
        actor = next((a for a in s["actors"] if a["id"] == victim["id"]), None)
        return (
            proc is not None
            and proc["status"] in ("failed", "exited", "lost")
            and actor is not None
            and actor["status"] == "failed"
        )

    snap = wait_until("showing the proc failed", shows_failed, timeout=60)
    print(f"SIGKILL -> the snapshot shows the death after {time.monotonic() - start:.3f} s")
    proc = next(p for p in snap["procs"] if p["id"] == victim["proc"])
    assert proc["status"] == "failed" and proc["exit"]["signal"] == 9, proc
    actor = next(a for a in snap["actors"] if a["id"] == victim["id"])
    assert actor["failure"]["class"] in ("infrastructure", "resource"), actor
    assert actor["failure"]["cause"], actor
    assert {m["name"]: m for m in snap["meshes"]}["mon_killed"]["status"] == "failed"
    faults.wait_for(1, "mon_killed")
    events = json.loads(monitor_events(since, 10_000))["items"]
    kinds = {(e["kind"], e["proc"]) for e in events}
    assert ("proc_exited", victim["proc"]) in kinds, events
    failed = [e for e in events if e["kind"] == "actor_failed" and e["mesh"] == "mon_killed"]
    assert len(failed) == 1 and failed[0]["rank"] == 1, events
    assert failed[0]["class"] in ("infrastructure", "resource")


def test_kill_proc_through_its_host(
    procs: ProcMesh,
    faults: Faults,  # noqa: F811  (the fixture imported above)
) -> None:
    counted = procs.spawn("mon_admin_killed", Counted)
    counted.a.call().get(timeout=30)
    victim = actors_of(snapshot(), "mon_admin_killed")[0]
    monitor_kill_proc(victim["proc"], "a test asked")

    def shows_lost(s: Snapshot) -> bool:
        proc = next((p for p in s["procs"] if p["id"] == victim["proc"]), None)
        return proc is not None and proc["status"] == "lost"

    snap = wait_until("showing the proc lost", shows_lost)
    proc = next(p for p in snap["procs"] if p["id"] == victim["proc"])
    assert "a test asked" in proc["exit"]["reason"], proc
    faults.wait_for(1, "mon_admin_killed")
    with pytest.raises(ValueError, match="not a proc id"):
        monitor_kill_proc("nonsense", None)
