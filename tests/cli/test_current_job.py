"""set_current_job("module.attr") and load_current_job() over the ``.monarch/`` layout
of the ``monarch`` command (CTX-1 of ``monarch._src.job.context``). No job is applied
here: nothing starts."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import JOBS

from monarch._src.job import context
from monarch.job import ProcessJob, load_current_job, set_current_job


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "jobs.py").write_text(JOBS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    set_current_job(None)
    yield tmp_path
    set_current_job(None)
    sys.modules.pop("jobs", None)


def test_a_spec_is_recorded_in_the_current_context(project: Path) -> None:
    set_current_job("jobs.two")
    assert (project / ".monarch" / "default" / "spec").read_text() == "jobs.two\n"
    assert os.readlink(project / ".monarch" / "job_state.pkl") == os.path.join(
        "default", "state.pkl"
    )
    job = load_current_job()  # a new job from the spec: nothing applied yet
    assert isinstance(job, ProcessJob) and not job.active
    assert job._meshes == {"hosts": 2}

    context.create("other")
    context.use("other")
    with pytest.raises(FileNotFoundError, match="context 'other' has none"):
        load_current_job()
    set_current_job("jobs.one")
    assert load_current_job()._meshes == {"hosts": 1}  # type: ignore[attr-defined]
    context.use("default")
    assert load_current_job()._meshes == {"hosts": 2}  # type: ignore[attr-defined]


def test_an_object_wins_over_the_spec(project: Path) -> None:
    set_current_job("jobs.job")
    job = ProcessJob({"x": 1})
    set_current_job(job)
    assert load_current_job() is job
    set_current_job("jobs.one")  # a spec replaces the object
    assert load_current_job() is not job


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("jobs", ValueError, "does not name a job: give module.attr"),
        ("jobs.missing", ValueError, "has no attribute 'missing'"),
        ("jobs.not_a_job", TypeError, "is not a job"),
        ("no_module.job", ValueError, "cannot import 'no_module'"),
    ],
)
def test_a_bad_spec_is_refused(
    project: Path, spec: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        set_current_job(spec)
    assert not (project / ".monarch" / "default" / "spec").exists()
