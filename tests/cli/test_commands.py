"""``monarch exec`` and ``monarch shell`` on the hosts of a ``ProcessJob`` applied with
``monarch apply jobs.job`` (meshes ``trainers``: 2 hosts, ``loaders``: 1 host)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from cli_helpers import TIMEOUT, Project, assert_gone, cli_env, without_logs

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    project = Project(tmp_path_factory.mktemp("project"))
    try:
        project.run("apply", "jobs.job")
        yield project
    finally:
        project.kill_all()


def test_default_is_rank_0_of_the_first_mesh_streamed(applied: Project) -> None:
    result = applied.run("exec", "--", "sh", "-c", "echo out; echo err >&2")
    assert result.out == "[rank 0] out\n"
    assert result.err == "[rank 0] err\n"


def test_exit_status_is_the_largest(applied: Project) -> None:
    assert applied.run("exec", "--", "sh", "-c", "exit 7", check=7).out == ""
    # trainers exit 1 and 2, loaders 1: the largest is 2.
    result = applied.run(
        "exec",
        "--all",
        "--",
        "sh",
        "-c",
        "echo rank $MONARCH_RANK_HOSTS; exit $((MONARCH_RANK_HOSTS + 1))",
        check=2,
    )
    # The directory of the per-rank files is printed, one per mesh.
    found = re.findall(r"(\S+)/trainers/rank_<N>\.log, (\S+)/loaders/rank_<N>\.log", result.err)
    assert found and found[0][0] == found[0][1], result.err
    out = applied.root / found[0][0]
    assert out.parent.parent.name == "default" and out.parent.name == "exec"
    assert (out / "trainers" / "rank_0.log").read_text() == "rank 0\n"
    assert (out / "trainers" / "rank_1.log").read_text() == "rank 1\n"
    assert (out / "loaders" / "rank_0.log").read_text() == "rank 0\n"
    assert result.out == ""


def test_mesh_with_per_host_copies_to_a_chosen_directory(applied: Project, tmp_path: Path) -> None:
    applied.run(
        "exec",
        "--mesh",
        "loaders",
        "--per-host",
        "gpus=2",
        "--output-dir",
        str(tmp_path),
        "--",
        "sh",
        "-c",
        "echo gpu $MONARCH_RANK_GPUS of $MONARCH_SIZE_GPUS",
    )
    logs = sorted(p.name for p in (tmp_path / "loaders").iterdir())
    assert logs == ["rank_0.log", "rank_1.log"]
    assert (tmp_path / "loaders" / "rank_1.log").read_text() == "gpu 1 of 2\n"
    assert not (tmp_path / "trainers").exists()


def test_point_picks_a_host(applied: Project) -> None:
    assert applied.run("exec", "--point", "hosts=1", "--", "echo", "hi").out == "[rank 1] hi\n"
    one = applied.run("exec", "--mesh", "loaders", "--one", "--", "echo", "hi")
    assert one.out == "[rank 0] hi\n"
    bad = applied.run("exec", "--point", "gpus=0", "--", "true", check=2)
    assert (
        "mesh 'trainers' has no dimension 'gpus'; its host dimensions are: hosts (0 to 1)"
        in bad.err
    )
    bad = applied.run("exec", "--mesh", "loaders", "--point", "hosts=1", "--", "true", check=2)
    assert "out of range for mesh 'loaders'" in bad.err
    bad = applied.run("exec", "--mesh", "nope", "--", "true", check=2)
    assert "the job has no mesh 'nope'; its meshes are: trainers, loaders" in bad.err


def test_env_and_workdir(applied: Project, tmp_path: Path) -> None:
    result = applied.run(
        "exec",
        "-e",
        "A=1",
        "-e",
        "B=x=y",
        "--workdir",
        str(tmp_path),
        "--",
        "sh",
        "-c",
        'echo "$A $B $(pwd)"',
    )
    assert result.out == f"[rank 0] 1 x=y {tmp_path}\n"
    # Without --workdir: this working directory (the host has it).
    assert applied.run("exec", "--", "pwd").out == f"[rank 0] {applied.root}\n"
    missing = applied.run("exec", "--workdir", str(tmp_path / "missing"), "--", "true", check=1)
    assert "does not exist on host" in missing.err


def test_script_from_a_file_and_from_stdin(applied: Project) -> None:
    (applied.root / "steps.sh").write_text('echo "args: $1 $2"\nexit 4\n')
    result = applied.run("exec", "--script", "steps.sh", "--", "a", "b", check=4)
    assert result.out == "[rank 0] args: a b\n"
    piped = applied.run("exec", "--script", "-", input="echo piped\n")
    assert piped.out == "[rank 0] piped\n"


def test_python_module(applied: Project) -> None:
    (applied.root / "hello.py").write_text("import sys\nprint('hello', sys.argv[1:])\n")
    assert applied.run("exec", "-m", "hello", "--", "x").out == "[rank 0] hello ['x']\n"
    assert applied.run("exec", "--", "hello.py", "y").out == "[rank 0] hello ['y']\n"


def test_missing_program(applied: Project) -> None:
    assert applied.run("exec", "--", "no-such-program-here", check=127).out == ""


def test_shell_without_a_terminal(applied: Project) -> None:
    result = applied.run(
        "shell", "--point", "hosts=1", "-e", "V=5", input="echo v=$V\nexit 3\n", check=3
    )
    assert result.out == "v=5\n"


def test_shell_on_a_terminal(applied: Project) -> None:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "monarch.tools.cli", "shell", "-e", "PS1=remote$ "],
        cwd=str(applied.root),
        env=cli_env(),
        timeout=TIMEOUT,
        encoding="utf-8",
        dimensions=(30, 100),
    )
    try:
        child.expect_exact("remote$ ")
        child.sendline("stty size; echo $((6 * 7))")
        child.expect(r"30 100\r\n42\r\n")
        child.expect_exact("remote$ ")
        # Ctrl-C interrupts the remote foreground command, not the shell. "started" is
        # written by the command itself, once it is the terminal's foreground job; the
        # interrupt is sent once its `sleep` runs. Before that, the command (sh) is
        # between its echo and its `sleep`, where dash defers an interrupt until the
        # child it is starting ends (a local terminal does the same): the sleep would
        # then run its 91 s, whatever relays the Ctrl-C.
        child.sendline("sh -c 'echo st\"\"arted; sleep 91.3'; echo after")
        child.expect_exact("started")
        wait_for_remote_process("sleep 91.3")
        child.sendintr()
        child.expect_exact("remote$ ")
        assert "after" not in child.before
        assert not remote_processes("sleep 91.3")
        child.sendline("exit 6")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 6


def remote_processes(command: str) -> list[str]:
    """The pids of the processes running ``command`` (exactly)."""
    found = subprocess.run(["pgrep", "-x", "-f", command], capture_output=True, text=True)
    return found.stdout.split()


def wait_for_remote_process(command: str) -> list[str]:
    """The pids of the processes running ``command`` (exactly), once there is one: a
    process that wrote its first line has not necessarily run (``exec``) the program it
    starts next. Polls (bounded by :data:`TIMEOUT`): nothing announces an ``exec``."""
    deadline = time.monotonic() + TIMEOUT
    while not (pids := remote_processes(command)):
        assert time.monotonic() < deadline, f"{command!r} did not start within {TIMEOUT} s"
        time.sleep(0.02)
    return pids


def test_ctrl_c_ends_the_remote_runs(applied: Project) -> None:
    """EXEC-3: an interrupted `monarch exec` ends its runs before it exits."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "monarch.tools.cli", "exec", "--", "sh", "-c", "echo started; exec sleep 92.5"],
        cwd=str(applied.root),
        env=cli_env(),
        timeout=TIMEOUT,
        encoding="utf-8",
    )
    try:
        child.expect_exact("[rank 0] started")
        # "started" is written before the `exec`: wait for the sleep to run.
        assert len(wait_for_remote_process("sleep 92.5")) == 1
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    assert "monarch exec: interrupted" in without_logs(child.before)
    assert not remote_processes("sleep 92.5")


def test_exec_kill_ends_the_job(tmp_path: Path) -> None:
    project = Project(tmp_path)
    try:
        project.run("apply", "jobs.one")
        pids = project.worker_pids()
        assert project.run("exec", "--kill", "--", "echo", "last").out == "[rank 0] last\n"
        assert_gone(pids)
        assert not (tmp_path / ".monarch" / "default" / "state.pkl").exists()
    finally:
        project.kill_all()
