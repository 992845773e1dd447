"""``monarch apply``, ``status``, ``kill`` and ``context`` (the ``.monarch/`` layout,
invariants CTX-1 and CTX-2 of ``monarch._src.job.context``), run as subprocesses on
``ProcessJob`` workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from cli_helpers import TIMEOUT, Project, assert_gone, cli_env

pytestmark = pytest.mark.timeout(300)

VERBS = ["apply", "exec", "shell", "kill", "context", "status", "worker", "debug"]


def test_every_verb_has_help(project: Project) -> None:
    top = project.run("--help")
    for verb in VERBS:
        assert verb in top.out
        text = project.run(verb, "--help").out
        assert f"usage: monarch {verb}" in text and len(text) > 200, text
    for action in ["create", "use", "rm", "ls"]:
        assert "usage: monarch context " + action in project.run("context", action, "--help").out


def test_importing_the_command_starts_nothing() -> None:
    code = textwrap.dedent(
        """
        import sys
        import monarch.tools.cli
        heavy = [m for m in sys.modules if m.split(".")[0] == "torch"
                 or m in ("monarch.actor", "monarch._src.actor.runtime", "monarch._src.job.job")]
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=TIMEOUT, env=cli_env())


def test_apply_status_kill(project: Project) -> None:
    applied = project.run("apply", "jobs.job")
    assert (
        "applied jobs.job" in applied.out and "trainers (2 hosts), loaders (1 host)" in applied.out
    )
    monarch_dir = project.root / ".monarch"
    # CTX-1: the cache path links to the context's state; the spec is beside it.
    assert os.readlink(monarch_dir / "job_state.pkl") == os.path.join("default", "state.pkl")
    assert (monarch_dir / "default" / "spec").read_text().strip() == "jobs.job"
    pids = project.worker_pids()

    status = project.run("status")
    assert "context default: jobs.job" in status.out
    lines = [line.strip() for line in status.out.splitlines()]
    assert "mesh trainers: {'hosts': 2}" in lines and "mesh loaders: {'hosts': 1}" in lines
    assert sum(line.endswith(": answering") for line in lines) == 3, status.out

    # Applying again reuses the running workers; so does a script's job.state().
    again = project.run("apply")
    assert "reused the running job jobs.job" in again.out
    assert project.worker_pids() == pids
    script = textwrap.dedent(
        """
        from monarch.job import load_current_job
        from jobs import job

        current = load_current_job()
        assert current.active, current
        hosts = job.state().trainers  # through .monarch/job_state.pkl
        assert job.apply_id == current.apply_id, (job.apply_id, current.apply_id)
        print(len(hosts))
        """
    )
    (project.root / "script.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "script.py"],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=cli_env(),
    )
    assert done.returncode == 0 and done.stdout.strip() == "2", done
    assert project.worker_pids() == pids

    killed = project.run("kill")
    assert "killed the job of context 'default'" in killed.out
    assert_gone(pids)
    assert not (monarch_dir / "default" / "state.pkl").exists()
    assert (monarch_dir / "default" / "spec").exists()
    gone = project.run("status", check=1)
    assert "run `monarch apply` (to apply jobs.job again)" in gone.err


def test_status_of_a_job_whose_worker_died(project: Project) -> None:
    project.run("apply", "jobs.two")
    pids = project.worker_pids()
    os.kill(pids[1], 9)
    status = project.run("status", check=1)
    assert "cannot reach the job of context 'default'" in status.err
    assert "run `monarch kill` and then `monarch apply`" in status.err
    project.run("kill")
    assert_gone(pids)


def test_a_function_returning_a_job(project: Project) -> None:
    applied = project.run("apply", "jobs.two")
    assert "hosts (2 hosts)" in applied.out
    project.run("kill")


def test_contexts_isolate_jobs(project: Project) -> None:
    project.run("apply", "jobs.one")
    default_pids = project.worker_pids("default")
    assert "created context 'b'" in project.run("context", "create", "b").out
    assert "now in context 'b'" in project.run("context", "use", "b").out
    project.run("apply", "jobs.two")
    b_pids = project.worker_pids("b")
    assert set(b_pids).isdisjoint(default_pids)

    listing = project.run("context", "ls").out.splitlines()
    assert [line.split() for line in listing] == [
        ["*", "b", "jobs.two", "(applied)"],
        ["default", "jobs.one", "(applied)"],
    ]
    assert "mesh hosts: {'hosts': 2}" in project.run("status").out
    project.run("context", "use", "default")
    assert "mesh hosts: {'hosts': 1}" in project.run("status").out

    # Killing another context by name leaves the current one alone.
    project.run("kill", "b")
    assert_gone(b_pids)
    assert "mesh hosts: {'hosts': 1}" in project.run("status").out

    # Removing the current context kills its job and falls back to `default`.
    project.run("context", "use", "b")
    project.run("apply")
    b_pids = project.worker_pids("b")
    assert "killed its job" in project.run("context", "rm", "b").out
    assert_gone(b_pids)
    assert project.run("context", "ls").out.split() == ["*", "default", "jobs.one", "(applied)"]
    project.run("kill")
    assert_gone(default_pids)


def test_a_plain_cache_file_moves_into_the_default_context(project: Project) -> None:
    """A job saved by a script's job.state() before the command was used becomes the
    default context's job."""
    (project.root / "first.py").write_text(
        "from jobs import one\none.state()\n"  # saves .monarch/job_state.pkl
    )
    subprocess.run(
        [sys.executable, "first.py"], cwd=project.root, check=True, timeout=TIMEOUT, env=cli_env()
    )
    link = project.root / ".monarch" / "job_state.pkl"
    assert link.is_file() and not link.is_symlink()
    applied = project.run("apply", "jobs.one")
    assert "reused the running job" in applied.out
    assert link.is_symlink()
    pids = project.worker_pids()
    project.run("kill")
    assert_gone(pids)


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (
            ["exec", "--", "true"],
            1,
            "no job is applied in context 'default': run `monarch apply module.attr` first",
        ),
        (["shell"], 1, "run `monarch apply module.attr` first"),
        (["status"], 1, "run `monarch apply module.attr` first"),
        (["kill"], 1, "no job is applied in context 'default'"),
        (["kill", "nope"], 2, "no context named 'nope' (contexts: "),
        (["apply"], 2, "context 'default' has no job yet: name one, e.g. `monarch apply jobs.job`"),
        (["apply", "jobs"], 2, "'jobs' does not name a job: give module.attr"),
        (["apply", "nomodule.job"], 2, "no module 'nomodule' in "),
        (["apply", "jobs.missing"], 2, "module 'jobs' ("),
        (["apply", "jobs.not_a_job"], 2, "jobs.not_a_job is not a job: expected a JobTrait"),
        (["apply", "jobs.ProcessJob"], 2, "the class ProcessJob; make an instance in jobs"),
        (
            ["context", "use", "nope"],
            1,
            "no context named 'nope' (contexts: default); create it with `monarch context create",
        ),
        (["context", "create", "../x"], 1, "'../x' is not a valid context name"),
        (["context", "create", "logs"], 1, "'logs' is not a valid context name"),
        (["context", "rm", "nope"], 1, "no context named 'nope'"),
        (["context"], 2, "the following arguments are required: ACTION"),
        (
            ["exec", "--all", "--mesh", "x", "--", "true"],
            2,
            "give --all (every mesh) or --mesh NAME, not both",
        ),
        (["exec", "--one", "--all", "--", "true"], 2, "not allowed with argument"),
        (["exec", "--script", "s.sh", "-m", "m"], 2, "not allowed with argument"),
        (["exec", "-e", "NOEQUALS", "--", "true"], 2, "-e 'NOEQUALS': expected NAME=VALUE"),
        (
            ["exec", "--point", "hosts", "--", "true"],
            2,
            "--point 'hosts': expected DIM=N[,DIM=N...]",
        ),
        (
            ["exec", "--per-host", "gpus=0", "--", "true"],
            2,
            "--per-host 'gpus=0': gpus must be at least 1",
        ),
        (["exec", "--script", "missing.sh"], 2, "--script missing.sh: cannot read it"),
        (["exec"], 2, "no command: give one after --"),
    ],
)
def test_misuse_is_explained(project: Project, argv: list[str], status: int, message: str) -> None:
    result = project.run(*argv, check=status)
    assert message in result.err, result
