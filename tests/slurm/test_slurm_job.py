"""SlurmJob on a real Slurm (tests/slurm/harness.py): clients run on the login node (the
client namespace), workers are Slurm tasks on namespace hosts, over authenticated TCP.

The measured numbers (state() to first answer, kill() to job gone) are printed; run with
``-s`` to see them. benches/slurm_bench.py measures them against their budgets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from output_lines import LineReader

from .harness import SlurmCluster

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def client_env(slurm: SlurmCluster) -> dict[str, str]:
    env = dict(slurm.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python"), str(HERE), env.get("PYTHONPATH", "")]
    )
    for name in ("MONARCH_CLUSTER_SECRET", "MONARCH_CLUSTER_AUTH", "MONARCH_TLS_CA"):
        env.pop(name, None)
    env["MONARCH_HOST_CLIENT_LEASE"] = "3s"
    return env


def start_client(
    slurm: SlurmCluster, scenario: str, log_dir: Path, *args: str
) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE / "slurm_client.py"), scenario, str(log_dir), *args]
    return subprocess.Popen(
        slurm.client_argv(argv),
        env=client_env(slurm),
        cwd=log_dir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], tag: str, timeout: float) -> dict[str, Any]:
    """The JSON of the next ``TAG <json>`` line the client prints (other lines skipped)."""
    lines = LineReader.of(proc)
    line = lines.until(f"{tag} ", timeout)
    if line is not None:
        return dict(json.loads(line[len(tag) + 1 :]))
    proc.kill()
    _, err = proc.communicate(timeout=30)
    raise AssertionError(
        f"no {tag} line from the client; stdout: {''.join(lines.seen)}\nstderr: {err}"
    )


def run_client(
    slurm: SlurmCluster, scenario: str, log_dir: Path, *args: str, timeout: float = 90
) -> dict[str, Any]:
    proc = start_client(slurm, scenario, log_dir, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"client {scenario} timed out:\n{out}\n{err}") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"client {scenario} failed ({proc.returncode}):\n{out}\n{err}\n{slurm.logs_tail()}"
    )
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def hosts_of(answers: list[dict[str, Any]]) -> list[str]:
    return [a["host"] for a in answers]


@pytest.mark.timeout(120)
def test_two_meshes_end_to_end(slurm: SlurmCluster, tmp_path: Path) -> None:
    """SLURM-1: one allocation serves both meshes; the workers authenticate with the
    job's secret; kill() returns once the job ended (SLURM-3)."""
    result = run_client(slurm, "meshes", tmp_path)
    trainers, loaders = result["answers"]["trainers"], result["answers"]["dataloaders"]
    assert hosts_of(trainers) == ["node0", "node1"]
    assert hosts_of(loaders) == ["node2"]
    assert {a["job"] for a in trainers + loaders} == {result["job"]}, "SLURM-1: one allocation"
    assert all(a["secret_set"] for a in trainers + loaders)
    print(
        f"\nslurm: state() to first call answered (2-node mesh of a 3-node job): "
        f"{result['first_call_s']:.2f} s; kill() to job gone: {result['kill_s']:.2f} s"
    )
    # How fast (the budgets, 5 s each) is for benches/slurm_bench.py.
    assert slurm.jobs() == [], "SLURM-3: the job is gone once kill() returned"
    log = (tmp_path / f"slurm_{result['job']}_monarch_job.out").read_text()
    assert "monarch worker ready at" in log
    assert "trust" not in log.lower(), "workers never trust all connections"


@pytest.mark.timeout(120)
def test_a_new_client_reconnects_through_the_cache(slurm: SlurmCluster, tmp_path: Path) -> None:
    """JOB-2: a second client process with the same spec reuses the running allocation
    saved by the first (same Slurm job, same secret from the cache)."""
    first = run_client(slurm, "reconnect-first", tmp_path)
    assert slurm.jobs() == [first["job"]], "the first client leaves its job running"
    second = run_client(slurm, "reconnect-second", tmp_path)
    assert second["job"] == first["job"]
    assert hosts_of(second["answers"]["trainers"]) == ["node0", "node1"]
    assert hosts_of(second["answers"]["dataloaders"]) == ["node2"]
    print(f"\nslurm: reconnect from a new client to first answers: {second['reconnect_s']:.2f} s")
    assert slurm.jobs() == []
    assert oct((tmp_path / "job_state.pkl").stat().st_mode & 0o777) == "0o600", (
        "the cache holds the job's secret: only its owner may read it"
    )


@pytest.mark.timeout(60)
def test_a_held_job_times_out_with_its_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = run_client(slurm, "expect-error", tmp_path, "held")
    error = result["error"]
    assert error is not None and "did not start within job_start_timeout=2 s" in error, error
    assert "JobHeldUser" in error and "was cancelled" in error, error
    assert "raise job_start_timeout" in error, "the error says how to fix it"
    assert slurm.jobs() == []


@pytest.mark.timeout(60)
def test_more_nodes_than_exist_can_never_start(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Slurm 22.05 queues a job bigger than its partition (reason PartitionConfig):
    state() says it can never start, at once, and cancels it."""
    result = run_client(slurm, "expect-error", tmp_path, "too-many")
    error = result["error"]
    assert error is not None and "can never start" in error, error
    assert "PartitionConfig" in error and "it was cancelled" in error, error
    assert "sinfo" in error, "the error says how to fix it"
    assert result["s"] < 10, "no waiting for a job that can never start"
    assert slurm.jobs() == []


@pytest.mark.timeout(90)
def test_workers_that_cannot_start_fail_with_the_log(slurm: SlurmCluster, tmp_path: Path) -> None:
    """SLURM-2: the error ends with the tail of the job's log, which says why."""
    result = run_client(slurm, "expect-error", tmp_path, "bad-python")
    error = result["error"]
    assert error is not None and "check python_exe='/nonexistent/python'" in error, error
    assert "the job's log" in error, error
    assert "No such file or directory" in error, "the log tail shows the cause"


def wait_not_running(slurm: SlurmCluster, job: str, timeout: float) -> str:
    """Wait until Slurm reports ``job`` out of RUNNING; return its state."""
    deadline = time.monotonic() + timeout
    while True:
        state = slurm.command(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]).strip()
        if state != "RUNNING":
            return state
        assert time.monotonic() < deadline, f"job {job} still RUNNING after {timeout:g} s"
        time.sleep(0.05)  # polling Slurm: the state change is the event, squeue the only view


def _break_while_running(
    slurm: SlurmCluster, tmp_path: Path, action: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    proc = start_client(slurm, "broken", tmp_path)
    try:
        ready = read_line(proc, "READY", timeout=60)
        action(ready["job"])
        wait_not_running(slurm, ready["job"], timeout=45)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return ready, read_line(proc, "RESULT", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


@pytest.mark.timeout(120)
def test_a_job_cancelled_from_outside_is_a_clear_error(slurm: SlurmCluster, tmp_path: Path) -> None:
    _, result = _break_while_running(slurm, tmp_path, lambda job: slurm.command(["scancel", job]))
    error = result["error"]
    assert error is not None, "state() must raise once the job was cancelled"
    assert re.search(rf"Slurm job {result['job']} is (CANCELLED|COMPLETING)", error), error
    # The batch step writes "JOB <id> ... CANCELLED", each srun step "STEP <id>.<n> ...
    # CANCELLED"; which of them the log holds when the client looks depends on timing.
    assert re.search(
        rf"(JOB {result['job']}|STEP {result['job']}\.\d+) ON node0 CANCELLED", error
    ), "the log tail says who ended it"
    assert "call job.kill() and then job.state()" in error and "the job's log" in error, error


@pytest.mark.timeout(120)
def test_a_node_cut_off_ends_the_job_with_node_fail(
    slurm: SlurmCluster, tmp_path: Path, break_cluster: None
) -> None:
    """A node whose network is lost: slurmctld marks it DOWN after SlurmdTimeout and
    ends the job (NODE_FAIL); state() says so."""
    _, result = _break_while_running(slurm, tmp_path, lambda job: slurm.host_of("node1").cut())
    error = result["error"]
    assert error is not None, "state() must raise once the node failed"
    assert "NODE_FAIL" in error or "DUE TO NODE FAILURE" in error, error


@pytest.mark.timeout(120)
def test_a_dead_slurmd_ends_the_job_with_node_fail(
    slurm: SlurmCluster, tmp_path: Path, break_cluster: None
) -> None:
    _, result = _break_while_running(slurm, tmp_path, lambda job: slurm.kill_slurmd("node1"))
    error = result["error"]
    assert error is not None, "state() must raise once the node failed"
    assert "NODE_FAIL" in error or "DUE TO NODE FAILURE" in error, error


@pytest.mark.timeout(120)
def test_two_tasks_per_node_are_two_hosts_each(slurm: SlurmCluster, tmp_path: Path) -> None:
    """ntasks_per_node=2: each task is a worker at its own port; a mesh of 2 nodes has
    4 hosts, node-major, in Slurm's task order."""
    result = run_client(slurm, "two-tasks", tmp_path)
    answers = result["answers"]["trainers"]
    assert result["extent"] == {"hosts": 4}
    assert hosts_of(answers) == ["node0", "node0", "node1", "node1"]
    assert [a["task"] for a in answers] == ["0", "1", "2", "3"]
    assert [a["local"] for a in answers] == ["0", "1", "0", "1"]
    log = next(tmp_path.glob("slurm_*_monarch_job.out")).read_text()
    assert ":22222" in log and ":22223" in log, "task t serves at monarch_port + t"


@pytest.mark.timeout(120)
def test_batch_mode_runs_the_client_inside_the_allocation(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "batch-result.json"
    script = tmp_path / "batch_script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "from slurm_client import batch_client\n"
        f"batch_client({str(out)!r})\n"
    )
    result = run_client(slurm, "batch", tmp_path, str(script))
    deadline = time.monotonic() + 60
    while result["job"] in slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling Slurm for the batch job's end: no event to wait on
    log = Path(result["log"]).read_text()
    assert out.exists(), f"the client script did not finish; the job's log:\n{log}"
    data = json.loads(out.read_text())
    assert data["host"] == "node0", "the client runs on the allocation's first node"
    assert hosts_of(data["answers"]["trainers"]) == ["node0", "node1"]
    assert {a["job"] for a in data["answers"]["trainers"]} == {result["job"]}
    assert slurm.jobs() == [], "the job ends when the client script exits"


@pytest.mark.timeout(180)
def test_out_of_cluster_through_a_gateway_and_adopting_a_running_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Upstream's meanings: ``out_of_cluster=True`` attaches the client through the first
    allocated worker (its proc id carries that worker's address); a second client adopts
    the running job by ``slurm_job_id`` through an explicit ``attach_to`` gateway (the
    second node's worker). A Slurm job id as ``attach_to`` is refused naming the fix."""
    first = run_client(slurm, "gateway-first", tmp_path)
    hosts = [h.split("@", 1)[1] for h in first["hosts"]]
    assert first["client"].endswith(f"@{hosts[0]}"), first
    assert len(first["answers"]["trainers"]) == 2
    assert first["old_use"] is not None and "slurm_job_id=" in first["old_use"], first
    gateway = "tcp://" + hosts[1].removeprefix("tcp:")
    proc = subprocess.Popen(
        slurm.client_argv(
            [
                sys.executable,
                str(HERE / "slurm_client.py"),
                "gateway-adopt",
                str(tmp_path),
                first["job"],
                gateway,
            ]
        ),
        env={**client_env(slurm), "MONARCH_CLUSTER_SECRET": first["secret"]},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = read_line(proc, "RESULT", 120)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert second["job"] == first["job"]
    assert second["client"].endswith(f"@{hosts[1]}"), second
    assert sorted(hosts_of(second["answers"]["trainers"])) == sorted(
        hosts_of(first["answers"]["trainers"])
    )
    assert slurm.jobs() == [], "kill() cancelled the adopted job"


def test_attach_to_takes_a_gateway_and_slurm_job_id_the_job() -> None:
    """Argument checks (no Slurm needed): a job id given as ``attach_to`` names the fix;
    a job saved when ``attach_to`` held a job id loads with it as ``slurm_job_id``. In a
    subprocess: a ``SlurmJob`` chooses this process's transport."""
    code = """
import pickle
from monarch.job import SlurmJob
for old in (1234, "1234"):
    try:
        SlurmJob({"a": 1}, attach_to=old)
    except ValueError as e:
        assert "slurm_job_id='1234'" in str(e), e
    else:
        raise AssertionError("a job id as attach_to was accepted")
for bad in ("node0:22222", ""):
    try:
        SlurmJob({"a": 1}, attach_to=bad)
    except ValueError as e:
        assert "tcp://127.0.0.1:22222" in str(e), e
    else:
        raise AssertionError(f"attach_to={bad!r} was accepted")
try:
    SlurmJob({"a": 1}, slurm_job_id="abc")
except ValueError as e:
    assert "running Slurm job" in str(e), e
job = SlurmJob({"a": 1}, out_of_cluster=True, attach_to="tcp://127.0.0.1:22222")
assert job._through_gateway and job._slurm_job_id is None
old = SlurmJob({"a": 1}, slurm_job_id=77)
state = dict(old.__dict__)
state["_attach_to"] = "77"
del state["_slurm_job_id"], state["_out_of_cluster"]
loaded = object.__new__(SlurmJob)
loaded.__setstate__(state)
assert (loaded._slurm_job_id, loaded._attach_to, loaded._through_gateway) == ("77", None, False)
assert pickle.loads(pickle.dumps(job))._spec() == job._spec()
print("OK")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr
