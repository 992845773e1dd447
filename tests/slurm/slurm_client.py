"""Client programs for the Slurm tests, run on the login node (the client namespace):
``python slurm_client.py SCENARIO LOG_DIR [ARGS...]``.

Each scenario prints one line ``RESULT <json>`` at the end, and ``READY <json>`` when it
waits for the test to do something to the cluster (it then reads one line from stdin).
The job's cache is ``LOG_DIR/job_state.pkl``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from monarch.actor import Actor, endpoint
from monarch.job import SlurmJob


class Where(Actor):
    @endpoint
    def where(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "task": os.environ.get("SLURM_PROCID"),
            "local": os.environ.get("SLURM_LOCALID"),
            "job": os.environ.get("SLURM_JOB_ID"),
            "secret_set": bool(os.environ.get("MONARCH_CLUSTER_SECRET")),
        }


def _job(log_dir: str, **kw: Any) -> SlurmJob:
    meshes = kw.pop("meshes", {"trainers": 2, "dataloaders": 1})
    return SlurmJob(meshes, python_exe=sys.executable, log_dir=log_dir, **kw)


def _report(tag: str, value: Any) -> None:
    print(f"{tag} {json.dumps(value)}", flush=True)


def _call_all(state: Any, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Spawn a proc per host of each mesh, ask each where it is, stop the procs (a proc
    killed under a running actor would be a failure reported to the fault hook)."""
    out = {}
    for name in names:
        procs = getattr(state, name).spawn_procs()
        out[name] = [r for _, r in procs.spawn("where", Where).where.call().get(timeout=60)]
        procs.stop().get(timeout=30)
    return out


def meshes(log_dir: str) -> None:
    """Two meshes end to end: time from state() to the first answer, then kill()."""
    job = _job(log_dir, job_start_timeout=60)
    t0 = time.monotonic()
    state = job.state(cached_path=None)
    procs = state.trainers.spawn_procs()
    first = procs.spawn("where", Where).where.call().get(timeout=60)
    t_first = time.monotonic() - t0
    procs.stop().get(timeout=30)
    answers = {"trainers": [r for _, r in first], **_call_all(state, ["dataloaders"])}
    job_id = job.slurm_job_id
    t1 = time.monotonic()
    job.kill()
    t_kill = time.monotonic() - t1
    _report(
        "RESULT",
        {"answers": answers, "first_call_s": t_first, "kill_s": t_kill, "job": job_id},
    )


def reconnect_first(log_dir: str) -> None:
    """Apply through the cache and leave the job running for the next client."""
    job = _job(log_dir)
    state = job.state(cached_path=os.path.join(log_dir, "job_state.pkl"))
    answers = _call_all(state, ["trainers"])
    _report("RESULT", {"job": job.slurm_job_id, "answers": answers})


def reconnect_second(log_dir: str) -> None:
    """A new client with the same spec: reuses the running job, then kills it."""
    job = _job(log_dir)
    t0 = time.monotonic()
    state = job.state(cached_path=os.path.join(log_dir, "job_state.pkl"))
    answers = _call_all(state, ["trainers", "dataloaders"])
    elapsed = time.monotonic() - t0
    job_id = job.slurm_job_id
    job.kill()
    _report("RESULT", {"job": job_id, "answers": answers, "reconnect_s": elapsed})


def expect_error(log_dir: str, kind: str) -> None:
    """A job that cannot start: state() raises; report the message."""
    kw: dict[str, Any] = {}
    if kind == "held":
        kw = {"slurm_args": ["--hold"], "job_start_timeout": 2}
    elif kind == "too-many":
        kw = {"meshes": {"trainers": 50}}
    elif kind == "bad-python":
        kw = {"meshes": {"trainers": 1}}
    job = _job(log_dir, **kw)
    if kind == "bad-python":
        job._python_exe = "/nonexistent/python"
    t0 = time.monotonic()
    try:
        job.state(cached_path=None)
    except Exception as e:
        job_id = job.slurm_job_id
        job.kill()
        _report(
            "RESULT",
            {"error": f"{type(e).__name__}: {e}", "job": job_id, "s": time.monotonic() - t0},
        )
        return
    job.kill()
    _report("RESULT", {"error": None})


def broken(log_dir: str) -> None:
    """Run, tell the test (READY), wait until it broke the job and Slurm noticed, then
    call state() and report its error."""
    job = _job(log_dir, meshes={"trainers": 2})
    state = job.state(cached_path=None)
    answers = _call_all(state, ["trainers"])
    _report("READY", {"job": job.slurm_job_id, "answers": answers})
    sys.stdin.readline()
    error = None
    try:
        job.state(cached_path=None)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    job_id = job.slurm_job_id
    job.kill()
    _report("RESULT", {"error": error, "job": job_id})


def two_tasks(log_dir: str) -> None:
    """Two tasks (workers) per node: a mesh of 2 nodes has 4 hosts."""
    job = _job(log_dir, meshes={"trainers": 2}, ntasks_per_node=2)
    state = job.state(cached_path=None)
    answers = _call_all(state, ["trainers"])
    extent = dict(state.trainers.extent)
    job.kill()
    _report("RESULT", {"answers": answers, "extent": extent})


def batch(log_dir: str, script: str) -> None:
    """Batch mode: submit the job with a client script and return."""
    job = _job(log_dir, meshes={"trainers": 2})
    job.apply(client_script=script)
    _report("RESULT", {"job": job.slurm_job_id, "log": job.log_path})


def batch_client(out: str) -> None:
    """The client script of ``batch``: runs inside the allocation."""
    from monarch.job import job_load

    job = job_load()
    state = job.state()
    answers = _call_all(state, ["trainers"])
    with open(out, "w") as f:
        json.dump({"answers": answers, "host": socket.gethostname()}, f)


def add_mesh(log_dir: str, then: str) -> None:
    """A mesh added to the running job (a second allocation) while actors run on the
    first; both answer one client. ``then``: ``kill`` the job, or ``leave`` it running
    (saved in the cache) for ``add-mesh-reconnect``."""
    from monarch.job import job_load

    cache = os.path.join(log_dir, "job_state.pkl")
    job = _job(log_dir, meshes={"trainers": 2}, job_start_timeout=60)
    state = job.state(cached_path=cache)
    procs = state.trainers.spawn_procs()
    first = procs.spawn("where", Where)
    first.where.call().get(timeout=60)
    taken = None
    try:
        job.add_mesh("trainers", 1)
    except ValueError as e:
        taken = str(e)
    t0 = time.monotonic()
    job.add_mesh("extra", 1)
    state = job.state(cached_path=cache)
    extra_procs = state.extra.spawn_procs()
    second = extra_procs.spawn("where", Where)
    pending = [first.where.call(), second.where.call()]
    trainers, extra = ([r for _, r in p.get(timeout=60)] for p in pending)
    added_s = time.monotonic() - t0
    extra_procs.stop().get(timeout=30)
    procs.stop().get(timeout=30)
    result = {
        "answers": {"trainers": trainers, "extra": extra},
        "meshes": list(state),
        "job": job.slurm_job_id,
        "jobs": job.slurm_job_ids,
        "saved_jobs": job_load(cache).slurm_job_ids,  # type: ignore[attr-defined]
        "taken": taken,
        "added_s": added_s,
    }
    if then == "kill":
        t1 = time.monotonic()
        job.kill()
        result["kill_s"] = time.monotonic() - t1
        result["jobs_after_kill"] = job.slurm_job_ids
    _report("RESULT", result)


def add_mesh_reconnect(log_dir: str) -> None:
    """A new client whose spec has every mesh, the added one included: it reconnects to
    both allocations through the cache, calls them, and kills the job."""
    job = _job(log_dir, meshes={"trainers": 2, "extra": 1})
    state = job.state(cached_path=os.path.join(log_dir, "job_state.pkl"))
    answers = _call_all(state, ["trainers", "extra"])
    jobs = job.slurm_job_ids
    job.kill()
    _report("RESULT", {"answers": answers, "jobs": jobs})


def _client_proc() -> str:
    from monarch._src.actor import process

    return process.get().proc_id


def gateway_first(log_dir: str) -> None:
    """Out of cluster (upstream's ``out_of_cluster=True``): the client attaches through
    the first allocated worker and drives every node through it; the job is left
    running for ``gateway-adopt``. Also: a Slurm job id as ``attach_to`` (its meaning
    in earlier versions) is refused, pointing to ``slurm_job_id``."""
    job = _job(log_dir, meshes={"trainers": 2}, job_start_timeout=60, out_of_cluster=True)
    state = job.state(cached_path=None)
    answers = _call_all(state, ["trainers"])
    old_use = None
    try:
        _job(log_dir, meshes={"trainers": 2}, attach_to=job.slurm_job_id)
    except ValueError as e:
        old_use = str(e)
    _report(
        "RESULT",
        {
            "job": job.slurm_job_id,
            "secret": job._secret,
            "client": _client_proc(),
            "hosts": state.trainers._handle.hosts(),
            "answers": answers,
            "old_use": old_use,
        },
    )


def gateway_adopt(log_dir: str, job_id: str, gateway: str) -> None:
    """A new client adopts the running Slurm job ``job_id`` (``slurm_job_id``, the
    secret in ``MONARCH_CLUSTER_SECRET``) through the explicit gateway ``gateway``
    (``attach_to``), calls every node, and kills the job."""
    job = _job(log_dir, meshes={"trainers": 2}, slurm_job_id=job_id, attach_to=gateway)
    state = job.state(cached_path=None)
    answers = _call_all(state, ["trainers"])
    client = _client_proc()
    adopted = job.slurm_job_id
    job.kill()
    _report("RESULT", {"job": adopted, "client": client, "answers": answers})


if __name__ == "__main__":
    scenario, *args = sys.argv[1:]
    scenarios: dict[str, Callable[..., None]] = {
        "meshes": meshes,
        "reconnect-first": reconnect_first,
        "reconnect-second": reconnect_second,
        "expect-error": expect_error,
        "broken": broken,
        "two-tasks": two_tasks,
        "batch": batch,
        "batch-client": batch_client,
        "add-mesh": add_mesh,
        "add-mesh-reconnect": add_mesh_reconnect,
        "gateway-first": gateway_first,
        "gateway-adopt": gateway_adopt,
    }
    scenarios[scenario](*args)
