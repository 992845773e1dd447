"""monarch.job: job state, the state cache, LocalJob and ProcessJob (invariants JOB-1 to
JOB-3 of ``monarch._src.job.job``).

Most tests run without the actor runtime: the cache logic uses a recording job type,
and ``FakeWorkerJob`` replaces the worker command with a process that only creates its
socket, while ``attach_to_workers`` is replaced by a recorder. The end-to-end tests at
the bottom start real workers and spawn actors on them.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import monarch.actor
import monarch.job
from monarch._src.actor import workers as workers_impl
from monarch._src.job import job as job_impl
from monarch.actor import Actor, HostMesh, MeshFailure, current_rank, endpoint, this_host
from monarch.job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    LocalJob,
    ProcessJob,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as exited)."""
    stat_ = job_impl._proc_stat(pid)
    return stat_ is not None and stat_[0] not in ("Z", "X")


# --- exports ------------------------------------------------------------------------


def test_exports_are_the_contract() -> None:
    assert set(monarch.job.__all__) == {
        "JobTrait", "LocalJob", "ProcessJob", "JobState", "job_load", "job_loads",
        "load_current_job", "set_current_job", "DEFAULT_JOB_PATH",
        "PortForwarder", "exec_command", "shell", "SlurmJob", "TelemetryConfig",
        "MeshAdminConfig", "SPMDJob", "SPMDRunError", "serve",
    }  # fmt: skip
    assert all(hasattr(monarch.job, name) for name in monarch.job.__all__)
    assert DEFAULT_JOB_PATH == ".monarch/job_state.pkl"


def test_import_is_light() -> None:
    code = (
        "import sys, monarch.job; "
        "heavy = [m for m in ('torch', 'monarch.actor', 'monarch._src.actor.proc_mesh') "
        "if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)


# --- JobState -----------------------------------------------------------------------


class FakeMesh:
    """Stands for a HostMesh where only identity matters."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeMesh) and other.tag == self.tag

    def __hash__(self) -> int:
        return hash(self.tag)

    def __repr__(self) -> str:
        return f"FakeMesh({self.tag!r})"


def _state(**meshes: object) -> JobState:
    return JobState(cast(dict[str, HostMesh], meshes))


def test_job_state_gives_meshes_by_attribute_and_item() -> None:
    trainers, loaders = FakeMesh("t"), FakeMesh("d")
    state = _state(trainers=trainers, dataloaders=loaders)
    assert state.trainers is trainers
    assert state["dataloaders"] is loaders
    assert list(state) == ["trainers", "dataloaders"]
    assert "trainers" in state and "nope" not in state and len(state) == 2
    assert "trainers" in dir(state)
    assert repr(state) == "JobState(trainers=FakeMesh('t'), dataloaders=FakeMesh('d'))"


def test_job_state_unknown_name_lists_the_available_ones() -> None:
    state = _state(trainers=FakeMesh("t"), dataloaders=FakeMesh("d"))
    with pytest.raises(
        AttributeError, match=r"no host mesh named 'generators'.*'trainers', 'dataloaders'"
    ):
        state.generators  # noqa: B018
    with pytest.raises(KeyError, match="'trainers', 'dataloaders'"):
        state["generators"]
    assert getattr(state, "generators", None) is None


def test_job_state_pickles() -> None:
    state = pickle.loads(pickle.dumps(_state(hosts=FakeMesh("h"))))
    assert state.hosts == FakeMesh("h")


# --- the cache logic of state(), with a recording job type ---------------------------

#: (event, apply_id) of every RecordingJob, in order, whichever copy ran it.
EVENTS: list[tuple[str, str | None]] = []


class RecordingJob(JobTrait):
    """A job type whose allocation is a flag; records _create and _kill."""

    def __init__(self, size: int = 1) -> None:
        super().__init__()
        self.size = size
        self.alive = False

    def _create(self, client_script: str | None) -> None:
        EVENTS.append(("create", None))
        self.alive = True

    def _state(self) -> JobState:
        return _state(hosts=FakeMesh(f"{self.size}:{self._apply_id}"))

    def can_run(self, spec: JobTrait) -> bool:
        return isinstance(spec, RecordingJob) and spec.size == self.size and self.alive

    def _kill(self) -> None:
        EVENTS.append(("kill", self._apply_id))
        self.alive = False


@pytest.fixture(autouse=True)
def _fresh_events() -> Iterator[None]:
    EVENTS.clear()
    yield
    EVENTS.clear()


def test_apply_creates_once_until_killed() -> None:
    """JOB-1."""
    job = RecordingJob()
    assert not job.active and job.apply_id is None
    job.apply()
    first = job.apply_id
    assert job.active and first is not None
    job.apply()
    assert EVENTS == [("create", None)] and job.apply_id == first
    job.kill()
    assert not job.active and job.apply_id is None
    assert EVENTS[-1] == ("kill", first)
    job.kill()  # inactive: a no-op
    job.apply()
    assert job.apply_id not in (None, first)
    assert [e for e, _ in EVENTS] == ["create", "kill", "create"]


def test_state_applies_and_saves_then_reuses_the_cache(tmp_path: Path) -> None:
    """JOB-2: a saved job that can run the spec is reused."""
    path = str(tmp_path / "cache" / "job.pkl")
    first = RecordingJob(size=2)
    state = first.state(cached_path=path)
    assert EVENTS == [("create", None)]
    assert state.hosts == FakeMesh(f"2:{first.apply_id}")
    assert job_load(path).apply_id == first.apply_id

    second = RecordingJob(size=2)
    state = second.state(cached_path=path)
    assert EVENTS == [("create", None)], "JOB-2: reusing must not create"
    assert second.active and second.apply_id == first.apply_id
    assert state.hosts == FakeMesh(f"2:{first.apply_id}")
    assert second.state(cached_path=path).hosts == state.hosts  # active: no reload

    # A reconnected job saves (and is reused as) the allocation it uses.
    again = str(tmp_path / "again.pkl")
    second.dump(again)
    third = RecordingJob(size=2)
    assert third.state(cached_path=again).hosts == state.hosts
    assert third.apply_id == first.apply_id and EVENTS == [("create", None)]

    second.kill()
    assert EVENTS[-1] == ("kill", first.apply_id)
    assert not second.active


def test_state_kills_a_cached_job_that_cannot_run_the_spec(tmp_path: Path) -> None:
    """JOB-2: a saved job that cannot run the spec is killed and replaced."""
    path = str(tmp_path / "job.pkl")
    old = RecordingJob(size=1)
    old.state(cached_path=path)
    new = RecordingJob(size=4)
    new.state(cached_path=path)
    assert EVENTS == [("create", None), ("kill", old.apply_id), ("create", None)]
    assert new.apply_id != old.apply_id
    saved = job_load(path)
    assert isinstance(saved, RecordingJob) and saved.size == 4
    assert saved.apply_id == new.apply_id


def test_state_without_cache_path_ignores_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    saved = RecordingJob()
    saved.state()  # the default path, under tmp_path
    assert Path(DEFAULT_JOB_PATH).is_file()
    before = Path(DEFAULT_JOB_PATH).read_bytes()
    EVENTS.clear()

    job = RecordingJob()
    job.state(cached_path=None)
    assert EVENTS == [("create", None)]
    assert job.apply_id != saved.apply_id
    assert Path(DEFAULT_JOB_PATH).read_bytes() == before


def test_state_replaces_an_unreadable_or_inactive_cache(tmp_path: Path) -> None:
    path = tmp_path / "job.pkl"
    path.write_bytes(b"not a pickle")
    job = RecordingJob()
    job.state(cached_path=str(path))
    assert job_load(str(path)).apply_id == job.apply_id

    RecordingJob().dump(str(path))  # never applied
    EVENTS.clear()
    other = RecordingJob()
    other.state(cached_path=str(path))
    assert EVENTS == [("create", None)]
    assert job_load(str(path)).apply_id == other.apply_id


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    job = RecordingJob(size=3)
    job.apply()
    path = tmp_path / "a" / "b" / "job.pkl"
    job.dump(str(path))  # creates the directories
    loaded = job_load(str(path))
    assert isinstance(loaded, RecordingJob)
    assert loaded.size == 3 and loaded.active and loaded.apply_id == job.apply_id
    copy = job_loads(job.dumps())
    assert isinstance(copy, RecordingJob) and copy.apply_id == job.apply_id
    spec = job_loads(ProcessJob({"trainers": 2}, env={"A": "1"}).dumps())
    assert repr(spec) == "ProcessJob({'trainers': 2}, env={'A': '1'})" and not spec.active
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["job.pkl"]


def test_loading_something_that_is_not_a_job_fails(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="expected a pickled job"):
        job_loads(pickle.dumps({"not": "a job"}))
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps(3))
    with pytest.raises(TypeError, match=re.escape(str(path))):
        job_load(str(path))
    with pytest.raises(FileNotFoundError):
        job_load(str(tmp_path / "missing.pkl"))


@pytest.fixture
def _no_current_job() -> Iterator[None]:
    set_current_job(None)
    yield
    set_current_job(None)


@pytest.mark.usefixtures("_no_current_job")
def test_current_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"monarch apply module\.attr"):
        load_current_job()
    saved = RecordingJob(size=5)
    saved.state()  # saves at DEFAULT_JOB_PATH
    loaded = load_current_job()
    assert isinstance(loaded, RecordingJob) and loaded.apply_id == saved.apply_id
    job = LocalJob()
    set_current_job(job)
    assert load_current_job() is job
    with pytest.raises(TypeError):
        set_current_job(cast(Any, 42))
    # A "module.attr" string is the monarch command's spec (tests/cli test it).
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        set_current_job("no_such_module.job")
    assert load_current_job() is job


# --- LocalJob -----------------------------------------------------------------------


def test_local_job_meshes_are_this_host() -> None:
    job = LocalJob(hosts=("trainers", "dataloaders"))
    state = job.state(cached_path=None)
    assert list(state) == ["trainers", "dataloaders"]
    assert state.trainers is this_host() and state.dataloaders is this_host()
    assert LocalJob().state(cached_path=None).hosts is this_host()
    job.kill()  # harmless
    assert not job.active


def test_local_job_never_reuses_the_cache(tmp_path: Path) -> None:
    path = str(tmp_path / "job.pkl")
    first = LocalJob()
    first.state(cached_path=path)
    assert job_load(path).apply_id == first.apply_id
    second = LocalJob()
    second.state(cached_path=path)
    assert second.apply_id != first.apply_id
    assert job_load(path).apply_id == second.apply_id


def test_local_job_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match="sequence of mesh names"):
        LocalJob(hosts=cast(Any, "trainers"))


def test_batch_mode_is_refused_by_process_job() -> None:
    job = ProcessJob({"hosts": 2})
    with pytest.raises(RuntimeError, match="batch mode is not supported by"):
        job.apply(client_script="train.py")
    assert not job.active


# --- ProcessJob with stand-in workers ------------------------------------------------

#: A stand-in worker: writes the value of JOB_TEST_VAR next to its socket, creates the
#: socket, then (after SERVE_AFTER seconds, if set) the ready file a worker creates once it
#: serves, and waits for a signal.
FAKE_WORKER = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    path = sys.argv[1].removeprefix("ipc://")
    with open(path + ".env", "w") as f:
        f.write(os.environ.get("JOB_TEST_VAR", "<unset>"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen()
    time.sleep(float(os.environ.get("SERVE_AFTER", "0")))
    with open(os.environ["MONARCH_WORKER_READY_FILE"], "w") as f:
        f.write(sys.argv[1])
    signal.pause()
    """
)


class FakeWorkerJob(ProcessJob):
    """A ProcessJob whose workers only create their socket and ready file."""

    def _worker_command(self, address: str) -> list[str]:
        return [sys.executable, "-c", FAKE_WORKER, address]


class DeadOnArrivalJob(ProcessJob):
    def _worker_command(self, address: str) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit(3)"]


def _record_attach(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def attach(**kwargs: Any) -> FakeMesh:
        calls.append(kwargs)
        return FakeMesh(f"{kwargs['name']}:{len(kwargs['workers'])}")

    # Where ProcessJob looks it up when it attaches (the public name re-exports it).
    monkeypatch.setattr(workers_impl, "attach_to_workers", attach)
    return calls


def _workers(job: ProcessJob) -> list[job_impl._Worker]:
    running = job._running
    assert isinstance(running, ProcessJob) and running._workers is not None
    return running._workers.all()


def test_process_job_starts_workers_and_attaches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record_attach(monkeypatch)
    job = FakeWorkerJob({"trainers": 2, "loaders": 1}, env={"JOB_TEST_VAR": "forty-two"})
    try:
        state = job.state(cached_path=None)
        workers = _workers(job)
        assert [w.mesh for w in workers] == ["trainers", "trainers", "loaders"]
        socket_dir = os.path.dirname(workers[0].address.removeprefix("ipc://"))
        assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700
        for w in workers:
            path = w.address.removeprefix("ipc://")
            assert w.address.startswith("ipc:///") and os.path.dirname(path) == socket_dir
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert Path(path + ".env").read_text() == "forty-two"
            assert os.getsid(w.pid) == w.pid, "each worker leads its own session"
        assert state.trainers == FakeMesh("trainers:2") and state.loaders == FakeMesh("loaders:1")
        assert job._workers in job_impl._unsaved, "JOB-3: never saved, so stopped at exit"
        assert calls == [
            {
                "name": "trainers",
                "ca": None,
                "workers": [w.address for w in workers[:2]],
            },
            {"name": "loaders", "ca": None, "workers": [workers[2].address]},
        ]
    finally:
        job.kill()
    assert not job.active and not job_impl._unsaved
    assert not any(_alive(w.pid) for w in workers)
    assert not os.path.exists(socket_dir)


def test_process_job_waits_until_its_workers_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's socket exists before its agent: a client's first heartbeat arriving in
    between is dropped, and its attach times out. apply() returns once each worker says
    it serves (its ready file), which the stand-ins here do 1 s after listening."""
    _record_attach(monkeypatch)
    job = FakeWorkerJob({"hosts": 2}, env={"SERVE_AFTER": "1"})
    try:
        job.apply()
        for w in _workers(job):
            ready = w.address.removeprefix("ipc://").removesuffix(".sock") + ".ready"
            assert Path(ready).read_text() == w.address
    finally:
        job.kill()


def test_process_job_lost_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    _record_attach(monkeypatch)
    job = FakeWorkerJob({"hosts": 2})
    try:
        job.apply()
        assert job.can_run(FakeWorkerJob({"hosts": 2}))
        workers = _workers(job)
        victim = workers[1]
        os.kill(victim.pid, signal.SIGKILL)
        job_impl._children[victim.pid].wait(timeout=30)
        with pytest.raises(
            RuntimeError, match=rf"lost connection to worker processes.*pid {victim.pid}"
        ):
            job.state(cached_path=None)
        assert job.active
        assert not job.can_run(FakeWorkerJob({"hosts": 2}))
    finally:
        job.kill()
    assert not _alive(workers[0].pid)


def test_process_job_can_run() -> None:
    job = FakeWorkerJob({"hosts": 2}, env={"A": "1"})
    assert not job.can_run(FakeWorkerJob({"hosts": 2}, env={"A": "1"})), "not applied"
    try:
        job.apply()
        assert job.can_run(FakeWorkerJob({"hosts": 2}, env={"A": "1"}))
        assert not job.can_run(FakeWorkerJob({"hosts": 3}, env={"A": "1"}))
        assert not job.can_run(FakeWorkerJob({"other": 2}, env={"A": "1"}))
        assert not job.can_run(FakeWorkerJob({"hosts": 2}))
        assert not job.can_run(ProcessJob({"hosts": 2}, env={"A": "1"}))
        assert not job.can_run(LocalJob())
    finally:
        job.kill()
    assert not job.can_run(FakeWorkerJob({"hosts": 2}, env={"A": "1"}))


def test_process_job_worker_that_exits_fails_apply() -> None:
    job = DeadOnArrivalJob({"hosts": 2})
    with pytest.raises(RuntimeError, match="exited before it listened"):
        job.apply()
    assert not job.active and not job_impl._unsaved


@pytest.mark.parametrize("meshes", [{}, {"hosts": 0}, {"hosts": True}, {"": 1}, ["hosts"]])
def test_process_job_rejects_bad_specs(meshes: Any) -> None:
    with pytest.raises(ValueError, match="positive host counts"):
        ProcessJob(meshes)


def test_process_job_rejects_a_bad_env() -> None:
    with pytest.raises(TypeError, match="dict of str to str"):
        ProcessJob({"hosts": 1}, env=cast(Any, {"A": 1}))


def test_process_job_reconnects_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOB-2 and JOB-3: the saved job's workers outlive its object; a new object with
    the same spec reuses them, and kill() on it ends them."""
    _record_attach(monkeypatch)
    path = str(tmp_path / "job.pkl")
    first = FakeWorkerJob({"hosts": 2})
    try:
        first.state(cached_path=path)
        workers = _workers(first)
        assert not job_impl._unsaved, "JOB-3: a saved job is not stopped at exit"
        second = FakeWorkerJob({"hosts": 2})
        second.state(cached_path=path)
        assert second.apply_id == first.apply_id
        assert [w.pid for w in _workers(second)] == [w.pid for w in workers]
        second.kill()
        assert not any(_alive(w.pid) for w in workers)
        third = FakeWorkerJob({"hosts": 2})
        third.state(cached_path=path)  # the saved workers are gone: start new ones
        assert third.apply_id != first.apply_id
        third.kill()
    finally:
        first.kill()


# --- ProcessJob.add_mesh ---------------------------------------------------------------


#: A worker that creates its socket, then exits before it serves.
EXIT_AFTER_LISTENING = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1].removeprefix("ipc://"))
    raise SystemExit(3)
    """
)


class FlakyWorkerJob(FakeWorkerJob):
    """Stand-in workers, except that those started while ``fail`` is set create their
    socket and exit."""

    fail = False

    def _worker_command(self, address: str) -> list[str]:
        if self.fail:
            return [sys.executable, "-c", EXIT_AFTER_LISTENING, address]
        return super()._worker_command(address)


def test_add_mesh_before_apply_extends_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record_attach(monkeypatch)
    job = FakeWorkerJob({"trainers": 2})
    job.add_mesh("loaders", 1)
    assert repr(job) == "FakeWorkerJob({'trainers': 2, 'loaders': 1})"
    assert job.can_run(FakeWorkerJob({"trainers": 2, "loaders": 1})) is False, "not applied"
    try:
        state = job.state(cached_path=None)
        assert list(state) == ["trainers", "loaders"]
        assert [c["name"] for c in calls] == ["trainers", "loaders"]
    finally:
        job.kill()


def test_add_mesh_on_a_running_job_starts_its_workers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _record_attach(monkeypatch)
    job = FakeWorkerJob({"trainers": 2}, env={"JOB_TEST_VAR": "seven"})
    try:
        job.state(cached_path=None)
        first = _workers(job)
        job.add_mesh("loaders", 2)
        workers = _workers(job)
        assert workers[:2] == first, "the running workers are not touched"
        added = workers[2:]
        assert [w.mesh for w in added] == ["loaders", "loaders"]
        socket_dir = os.path.dirname(first[0].address.removeprefix("ipc://"))
        for index, w in enumerate(added, start=2):
            path = w.address.removeprefix("ipc://")
            assert path == os.path.join(socket_dir, f"worker-{index}.sock")
            assert Path(_ready(w)).exists(), "add_mesh returns once the new workers serve"
            assert Path(path + ".env").read_text() == "seven", "the job's env"
            assert os.getsid(w.pid) == w.pid
        calls.clear()
        state = job.state(cached_path=None)
        assert state.loaders == FakeMesh("loaders:2") and state["loaders"] == state.loaders
        assert calls[-1] == {"name": "loaders", "ca": None, "workers": [w.address for w in added]}
        assert job._workers in job_impl._unsaved, "JOB-3: never saved, so stopped at exit"
        assert (
            repr(job)
            == "FakeWorkerJob({'trainers': 2, 'loaders': 2}, env={'JOB_TEST_VAR': 'seven'})"
        )
        assert job.can_run(
            FakeWorkerJob({"trainers": 2, "loaders": 2}, env={"JOB_TEST_VAR": "seven"})
        )
    finally:
        job.kill()
    assert not any(_alive(w.pid) for w in workers), "kill() ends the added workers too"
    assert not os.path.exists(socket_dir)


def _ready(worker: job_impl._Worker) -> str:
    return worker.address.removeprefix("ipc://").removesuffix(".sock") + ".ready"


@pytest.mark.parametrize("applied", [False, True], ids=["spec", "running"])
def test_add_mesh_refuses_a_name_the_job_has(
    monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    _record_attach(monkeypatch)
    job = FakeWorkerJob({"trainers": 2})
    try:
        if applied:
            job.apply()
        with pytest.raises(ValueError, match=r"already has a mesh named 'trainers'"):
            job.add_mesh("trainers", 1)
        for name, count in [("", 1), ("x", 0), ("x", True), (3, 1)]:
            with pytest.raises(ValueError, match="positive host count"):
                job.add_mesh(cast(Any, name), cast(Any, count))
        assert repr(job) == "FakeWorkerJob({'trainers': 2})"
        if applied:
            assert len(_workers(job)) == 2
    finally:
        job.kill()


def test_add_mesh_whose_worker_fails_leaves_the_job_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _record_attach(monkeypatch)
    job = FlakyWorkerJob({"hosts": 1})
    try:
        job.apply()
        job.fail = True
        with pytest.raises(RuntimeError, match="exited before it listened"):
            job.add_mesh("extra", 2)
        assert [w.mesh for w in _workers(job)] == ["hosts"]
        assert repr(job) == "FlakyWorkerJob({'hosts': 1})"
        job.fail = False
        job.add_mesh("extra", 1)
        # A socket of its own, past any file the failed workers left behind.
        assert _workers(job)[1].address != _workers(job)[0].address
        assert list(job.state(cached_path=None)) == ["hosts", "extra"]
    finally:
        job.kill()


def test_add_mesh_saves_the_job_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job saved by state() is saved again with the added mesh: a later process (a
    spec with every mesh) reconnects to all the workers, and its own add_mesh saves
    again too; kill() through the file ends them all."""
    _record_attach(monkeypatch)
    path = str(tmp_path / "job.pkl")
    first = FakeWorkerJob({"hosts": 1})
    try:
        first.state(cached_path=path)
        first.add_mesh("extra", 2)
        saved = job_load(path)
        assert repr(saved) == "FakeWorkerJob({'hosts': 1, 'extra': 2})"
        assert [w.pid for w in _workers(cast(ProcessJob, saved))] == [
            w.pid for w in _workers(first)
        ]
        assert not job_impl._unsaved, "JOB-3: the added workers belong to a saved job"
        second = FakeWorkerJob({"hosts": 1, "extra": 2})
        second.state(cached_path=path)
        assert second.apply_id == first.apply_id, "JOB-2: the grown job is reused"
        second.add_mesh("more", 1)
        assert list(job_load(path).state(cached_path=None)) == ["hosts", "extra", "more"]
        workers = _workers(cast(ProcessJob, job_load(path)))
        assert len(workers) == 4
        job_load(path).kill()
        assert not any(_alive(w.pid) for w in workers)
    finally:
        first.kill()


_CHILD_SCRIPT = """
import sys
sys.path[:0] = [{test_dir!r}, {root!r}]
import monarch.actor
monarch.actor.attach_to_workers = lambda **kwargs: None
from {module} import FakeWorkerJob
job = FakeWorkerJob({{"hosts": 2}})
job.state(cached_path={path!r})
print(" ".join(str(w.pid) for w in job._workers.all()), flush=True)
"""


def _run_child(path: str | None) -> list[int]:
    script = _CHILD_SCRIPT.format(
        test_dir=str(Path(__file__).parent),
        root=str(ROOT),
        module=FakeWorkerJob.__module__,
        path=path,
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return [int(pid) for pid in out.stdout.split()]


def test_unsaved_workers_end_with_the_process_that_started_them() -> None:
    """JOB-3."""
    pids = _run_child(None)
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)


def test_saved_workers_outlive_their_process_until_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOB-2 across processes; JOB-3."""
    _record_attach(monkeypatch)
    path = str(tmp_path / "job.pkl")
    try:
        pids = _run_child(path)
        assert all(_alive(pid) for pid in pids)
        job = FakeWorkerJob({"hosts": 2})
        job.state(cached_path=path)
        assert [w.pid for w in _workers(job)] == pids
        job.kill()
        assert not any(_alive(pid) for pid in pids)
    finally:
        # Whatever failed, the saved workers are no descendants of this process (the
        # leak check would not see them): end them through the saved job.
        if os.path.exists(path):
            job_load(path).kill()


# --- ProcessJob end to end: real workers ---------------------------------------------

#: Failures reaching the client during these tests (the default hook would end the test
#: run). Never restored: failures arrive asynchronously, possibly after a test ended.
FAULTS: list[MeshFailure] = []


@pytest.fixture
def record_faults() -> None:
    monarch.actor.unhandled_fault_hook = FAULTS.append


class Where(Actor):
    @endpoint
    def where(self) -> tuple[dict[str, int], int]:
        return dict(current_rank()), os.getpid()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("record_faults")
def test_process_job_end_to_end() -> None:
    job = ProcessJob({"hosts": 2})
    procs = None
    try:
        hosts = job.state(cached_path=None).hosts
        assert hosts.sizes == {"hosts": 2}
        worker_pids = [w.pid for w in _workers(job)]
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        am = procs.spawn("x", Where)
        result = am.where.call().get(timeout=60)
        assert result.sizes == {"hosts": 2, "gpus": 2}
        values = result.values()
        assert len(values) == 4
        assert [coords for coords, _ in values] == [
            {"hosts": h, "gpus": g} for h in range(2) for g in range(2)
        ]
        assert len({pid for _, pid in values}) == 4
        assert os.getpid() not in {pid for _, pid in values}
        procs.stop().get(timeout=30)
        procs = None
    finally:
        if procs is not None:
            procs.stop().get(timeout=30)
        job.kill()
    assert not any(_alive(pid) for pid in worker_pids)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("record_faults")
def test_process_job_end_to_end_reconnects_through_the_cache(tmp_path: Path) -> None:
    path = str(tmp_path / "job.pkl")
    first = ProcessJob({"hosts": 2})
    second = ProcessJob({"hosts": 2})
    try:
        first.state(cached_path=path)
        hosts = second.state(cached_path=path).hosts
        assert second.apply_id == first.apply_id
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        am = procs.spawn("reconnected", Where)
        assert len(am.where.call().get(timeout=60).values()) == 2
        procs.stop().get(timeout=30)
    finally:
        second.kill()
        first.kill()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("record_faults")
def test_process_job_end_to_end_lost_worker() -> None:
    job = ProcessJob({"hosts": 2})
    try:
        job.state(cached_path=None)
        victim = _workers(job)[0]
        os.killpg(victim.pid, signal.SIGKILL)
        job_impl._children[victim.pid].wait(timeout=30)
        with pytest.raises(RuntimeError, match="lost connection to worker processes"):
            job.state(cached_path=None)
    finally:
        job.kill()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("record_faults")
def test_process_job_end_to_end_add_mesh_while_actors_run() -> None:
    """Hosts added to a running job: actors on the first mesh keep running while the new
    workers start; the new mesh spawns procs, and both meshes answer one client; kill()
    ends every worker."""
    job = ProcessJob({"hosts": 1})
    procs = extra_procs = None
    try:
        hosts = job.state(cached_path=None).hosts
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        first = procs.spawn("first", Where)
        before = first.where.call().get(timeout=60).values()
        start = time.monotonic()
        job.add_mesh("extra", 2)
        added_s = time.monotonic() - start
        extra = job.state(cached_path=None).extra
        assert extra.sizes == {"hosts": 2}
        extra_procs = extra.spawn_procs(per_host={"gpus": 1})
        second = extra_procs.spawn("second", Where)
        pending = [first.where.call(), second.where.call()]
        after, added = (p.get(timeout=60).values() for p in pending)
        assert after == before, "the first mesh's actors ran on undisturbed"
        assert [coords for coords, _ in added] == [{"hosts": 0, "gpus": 0}, {"hosts": 1, "gpus": 0}]
        pids = {pid for _, pid in before} | {pid for _, pid in added}
        assert len(pids) == 4
        print(f"add_mesh of 2 hosts to a running ProcessJob: {added_s:.2f} s")
        worker_pids = [w.pid for w in _workers(job)]
        assert len(worker_pids) == 3
        for mesh in (extra_procs, procs):
            mesh.stop().get(timeout=30)
        procs = extra_procs = None
    finally:
        for mesh in (extra_procs, procs):
            if mesh is not None:
                mesh.stop().get(timeout=30)
        job.kill()
    assert not any(_alive(pid) for pid in worker_pids)


@pytest.mark.timeout(120)
def test_procs_stopped_before_their_host_is_lost_are_no_failure() -> None:
    """A proc mesh its owner is stopping when its host is lost (here the worker is
    frozen, so it never reports the procs' ends): only the meshes still running on that
    host fail. The stopped mesh's procs are spawned first, so the client handles their
    loss before the running mesh's: the running mesh's failure arriving means theirs
    would have arrived too."""
    from fault_recorder import Faults
    from proc_state import freeze

    recorder = Faults()
    monarch.actor.unhandled_fault_hook = recorder  # never restored, as FAULTS
    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts
        stopped = hosts.spawn_procs(per_host={"gpus": 2})
        stopped.spawn("stopped-then-lost", Where).where.call().get(timeout=60)
        running = hosts.spawn_procs(per_host={"gpus": 1})
        running.spawn("running-then-lost", Where).where.call().get(timeout=60)
        worker = _workers(job)[0].pid
        freeze(worker)
        try:
            # The stop waits for the frozen worker until its timeout; the client finds
            # the host lost meanwhile.
            stopped.stop().get(timeout=60)
            recorder.wait_for(1, "running-then-lost", timeout=60)
        finally:
            os.killpg(worker, signal.SIGKILL)
        assert [str(f) for f in recorder.failures if f.mesh_name == "stopped-then-lost"] == []
    finally:
        job.kill()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("record_faults")
def test_shutdown_ends_the_workers_and_is_bounded_by_a_dead_one() -> None:
    """HostMesh.shutdown() of an attached mesh stops its procs and ends every worker
    (they exit 0); a worker that was SIGKILLed before does not hold shutdown up."""
    job = ProcessJob({"hosts": 3})
    try:
        hosts = job.state(cached_path=None).hosts
        workers = _workers(job)
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        values = procs.spawn("ended", Where).where.call().get(timeout=60).values()
        proc_pids = [pid for _, pid in values]
        assert len(proc_pids) == 6
        dead = workers[2]
        os.killpg(dead.pid, signal.SIGKILL)
        job_impl._children[dead.pid].wait(timeout=30)
        procs.stop().get(timeout=30)
        start = time.monotonic()
        hosts.shutdown().get(timeout=60)
        took = time.monotonic() - start
        codes = [job_impl._children[w.pid].wait(timeout=30) for w in workers[:2]]
        assert codes == [0, 0], f"workers ended by shutdown exit 0, got {codes}"
        assert not any(_alive(pid) for pid in proc_pids)
        # The dead worker's link fails at once: nothing waits out a timeout for it.
        assert took < 10, f"shutdown took {took:.1f} s with one worker dead"
        with pytest.raises(RuntimeError, match="shut down"):
            hosts.spawn_procs(per_host={"gpus": 1})
        with pytest.raises(RuntimeError, match="only for the HostMesh that owns"):
            hosts.slice(hosts=0).shutdown()
    finally:
        job.kill()


_PYTHON_BLOCK = re.compile(
    r"(<!-- typecheck: skip -->\s*)?^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL
)


@pytest.mark.timeout(120)
def test_the_job_guide_runs(tmp_path: Path) -> None:
    """docs/job.md: its code blocks (those not marked skip) run and print what the guide
    says."""
    guide = (ROOT / "docs" / "job.md").read_text()
    blocks = [code for skip, code in _PYTHON_BLOCK.findall(guide) if not skip]
    assert len(blocks) >= 2, "docs/job.md lost its code"
    script = tmp_path / "job_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "{'hosts': 0, 'gpus': 0}",
        "{'hosts': 0, 'gpus': 1}",
        "{'hosts': 1, 'gpus': 0}",
        "{'hosts': 1, 'gpus': 1}",
    ]
    assert not (tmp_path / ".monarch").exists()
