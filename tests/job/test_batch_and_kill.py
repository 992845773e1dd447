"""Batch mode (``apply(client_script=...)``: a script run as the job's own client) and
``job.kill()`` while actors on the job's hosts are busy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from monarch.job import LocalJob, job_load

pytestmark = pytest.mark.timeout(60)


#: A client script for batch mode: its own job asks for a mesh named "hosts", but inside
#: the batch job (MONARCH_BATCH_JOB=1) state() gives the batch job's meshes instead.
BATCH_SCRIPT = """
import os
from monarch.job import LocalJob

state = LocalJob().state()
print("batch env", os.environ.get("MONARCH_BATCH_JOB"))
print("hosts", getattr(state, "hosts", None) is not None)
print("batch_launched_hosts", getattr(state, "batch_launched_hosts", None) is not None)
"""


def test_local_job_batch_mode_runs_the_script_with_the_jobs_meshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(BATCH_SCRIPT)
    job = LocalJob(("batch_launched_hosts",))
    job.apply(client_script=str(script))
    assert job.active and job.process is not None and job.log_dir is not None
    assert job.process.wait(timeout=120) == 0, (Path(job.log_dir) / "stderr.log").read_text()
    out = (Path(job.log_dir) / "stdout.log").read_text()
    assert "batch env 1" in out and "batch_launched_hosts True" in out, out
    assert "hosts False" in out, out
    # The saved job is the batch job; outside batch mode a LocalJob never reuses it.
    assert job_load(str(tmp_path / ".monarch" / "job_state.pkl"))._batch
    assert getattr(LocalJob().state(), "hosts", None) is not None
    job.kill()


def test_local_job_batch_mode_needs_an_existing_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = LocalJob()
    with pytest.raises(FileNotFoundError, match="no such file"):
        job.apply(client_script="missing.py")
    assert not job.active and not (tmp_path / ".monarch").exists()


def test_killing_a_local_batch_job_ends_its_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "forever.py"
    script.write_text("import threading\nthreading.Event().wait()\n")
    job = LocalJob()
    job.apply(client_script=str(script))
    assert job.process is not None and job.process.poll() is None
    job.kill()
    assert job.process.returncode is not None and not job.active


#: A client whose actor on one host calls, in a loop, an actor on the other, and kills
#: the job while it does; with the default fault hook, so a failure judged after the
#: kill would end it with exit status 1.
KILL_WHILE_BUSY = """
import sys
sys.path[:0] = [{actor_tests!r}, {tests!r}]
from test_stop import Answerer, Asker  # an actor that calls the other in a loop
from monarch.actor import Channel, SupervisionError
from monarch.job import ProcessJob

job = ProcessJob({{"hosts": 2}})
procs = job.state(cached_path=None).hosts.spawn_procs(per_host={{"p": 1}})
port, looping = Channel[str].open()
answerer = procs.slice(hosts=0).spawn("answerer", Answerer)
procs.slice(hosts=1).spawn("asker", Asker, answerer, port).run.broadcast()
print(looping.recv().get(timeout=60), flush=True)
job.kill()
print("killed", flush=True)
try:
    answerer.ask.call_one().get(timeout=30)
except SupervisionError as e:
    print("after:", e, flush=True)
"""


@pytest.mark.timeout(120)
def test_killing_a_process_job_is_no_failure_of_what_ran_on_it() -> None:
    """job.kill() ends the workers and every proc on them: in the client, the meshes on
    them count as stopped first, so neither the procs' ends nor an actor that failed
    because its peer went first is an unhandled failure; later calls say why."""
    here = Path(__file__).parent
    script = KILL_WHILE_BUSY.format(actor_tests=str(here.parent / "actor"), tests=str(here.parent))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["looping", "killed"], out
    assert lines[2].startswith("after: ") and "its job (ProcessJob) was killed" in lines[2]
    assert "unhandled failure" not in out.stderr, out.stderr
    # The client expects the hosts' end: it warns of no lost host. (A proc may still see
    # the other host go first, and say so in its own forwarded output: "[anon N] ...".)
    client_lines = [line for line in out.stderr.splitlines() if not line.startswith("[anon")]
    assert not [line for line in client_lines if " is lost (" in line], out.stderr
