"""Procs' output reaches the client (``docs/logging.md``; LOG-1 to LOG-3 of
``hyperactor_mesh::output``): stdout, stderr and ``logging`` of every rank, prefixed
``[mesh rank]``, in order per stream; a crashing proc's last lines before its failure
report; procs on workers; aggregation; ``logging_option``; per-proc log files; the
``[actor=...]`` prefix of log records.

Clients whose whole output is checked run as subprocesses with captured pipes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import monarch.actor.config
from monarch._src.actor import logs
from monarch.actor import Actor, current_rank, endpoint, this_host, this_proc

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def run_client(script: str, *, merge: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as a client process, its stdout and stderr captured (``merge``:
    both in one pipe, so their relative order shows)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
        timeout=100,
        cwd=ROOT,
        env={**os.environ, **env},
    )


_TALKERS = """
import logging, sys
from monarch.actor import Actor, current_rank, endpoint, this_host

class Talker(Actor):
    @endpoint
    def talk(self, n: int) -> None:
        rank = current_rank().rank
        for i in range(n):
            print(f"out {rank} {i}")
            print(f"err {rank} {i}", file=sys.stderr)
            logging.warning("log %d %d", rank, i)

procs = this_host().spawn_procs(per_host={"gpus": 4}, name="talkers")
procs.spawn("t", Talker).talk.call(N).get()
procs.stop().get()
print("CLIENT DONE", flush=True)
"""


def _lines_of(text: str, rank: int, what: str) -> list[str]:
    prefix = f"[talkers {rank}] "
    return [
        line[len(prefix) :]
        for line in text.splitlines()
        if line.startswith(prefix) and what in line
    ]


def test_stdout_stderr_and_logging_of_four_ranks_reach_the_client_in_order() -> None:
    """LOG-1: every line of every rank, prefixed [mesh rank], in order per stream;
    all written before ProcMesh.stop() returned."""
    n = 200
    out = run_client(_TALKERS.replace("N)", f"{n})"))
    assert out.returncode == 0, out.stderr
    stdout = out.stdout.splitlines()
    assert stdout[-1] == "CLIENT DONE", "the procs' lines come before stop() returns"
    for rank in range(4):
        assert _lines_of(out.stdout, rank, "out ") == [f"out {rank} {i}" for i in range(n)]
        assert _lines_of(out.stderr, rank, "err ") == [f"err {rank} {i}" for i in range(n)]
        records = _lines_of(out.stderr, rank, "log ")
        assert len(records) == n, records[:3]
        assert records[0].startswith("WARNING:root:[actor=<root>.<__main__.Talker t{'gpus': ")
        assert [r.rsplit("] ", 1)[1] for r in records] == [f"log {rank} {i}" for i in range(n)]


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_crashing_procs_last_lines_come_before_its_failure_report(how: str) -> None:
    """LOG-2: the host reads the proc's pipes to the end before it reports the exit;
    the client writes what arrived before it reports the failure."""
    crash = "os._exit(3)" if how == "exit" else "os.kill(os.getpid(), signal.SIGKILL)"
    script = f"""
        import os, signal, sys
        from monarch.actor import Actor, endpoint, this_host

        class Crasher(Actor):
            @endpoint
            def crash(self) -> None:
                for i in range(100):
                    print(f"line {{i}}")
                print("last words on stdout", flush=True)
                print("last words on stderr", file=sys.stderr, flush=True)
                {crash}

        procs = this_host().spawn_procs(per_host={{"gpus": 1}}, name="crashers")
        procs.spawn("c", Crasher).crash.call_one().get()
        print("NOT REACHED", flush=True)
    """
    out = run_client(script, merge=True)
    assert out.returncode == 1, out.stdout
    text = out.stdout
    report = text.index("monarch: unhandled failure")
    for words in ("[crashers 0] last words on stdout", "[crashers 0] last words on stderr"):
        assert words in text, text
        assert text.index(words) < report, f"LOG-2: {words!r} after the report:\n{text}"
    assert text.index("[crashers 0] line 99") < report
    assert "NOT REACHED" not in text


@pytest.mark.timeout(150)
def test_a_proc_on_a_worker_gets_its_output_to_the_client() -> None:
    """Workers write their own output to files (the client's stdout is a pipe); the
    procs' lines come to the client as messages, with their mesh-wide ranks."""
    script = """
        import os, sys
        from monarch.actor import Actor, current_rank, endpoint
        from monarch.job import ProcessJob

        class Remote(Actor):
            @endpoint
            def talk(self) -> int:
                rank = current_rank().rank
                print(f"stdout of remote rank {rank}")
                print(f"stderr of remote rank {rank}", file=sys.stderr)
                return os.getppid()

        job = ProcessJob({"hosts": 2})
        try:
            hosts = job.state(cached_path=None).hosts
            procs = hosts.spawn_procs(per_host={"gpus": 2}, name="remote")
            parents = procs.spawn("r", Remote).talk.call().get(timeout=60).values()
            assert os.getpid() not in parents, parents
            procs.stop().get(timeout=30)
        finally:
            job.kill()
        print("CLIENT DONE", flush=True)
    """
    out = run_client(script)
    assert out.returncode == 0, out.stderr
    for rank in range(4):
        assert f"[remote {rank}] stdout of remote rank {rank}" in out.stdout.splitlines()
        assert f"[remote {rank}] stderr of remote rank {rank}" in out.stderr.splitlines()
    assert out.stdout.splitlines()[-1] == "CLIENT DONE"


def test_without_forwarding_the_host_prints_the_lines_itself() -> None:
    out = run_client(_TALKERS.replace("N)", "3)"), HYPERACTOR_MESH_ENABLE_LOG_FORWARDING="false")
    assert out.returncode == 0, out.stderr
    # This machine's host is the client process: it writes to its own fds 1 and 2.
    assert _lines_of(out.stdout, 2, "out ") == ["out 2 0", "out 2 1", "out 2 2"]
    assert _lines_of(out.stderr, 2, "err ") == ["err 2 0", "err 2 1", "err 2 2"]


# --- in this process: logging_option, log files, the actor prefix ----------------


class Printer(Actor):
    @endpoint
    def say(self, text: str) -> int:
        print(text.format(rank=current_rank().rank), flush=True)
        return os.getpid()

    @endpoint
    def root_level(self) -> int:
        return logging.getLogger().level


def _unique(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:8]}"


def test_aggregation_prints_similar_lines_once_with_a_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = _unique("agg")
    procs = this_host().spawn_procs(per_host={"gpus": 4}, name=name)
    try:

        async def configure() -> None:
            # A long window: stop() ends it (its flush), so the test waits for no timer.
            await procs.logging_option(stream_to_client=True, aggregate_window_sec=600)

        asyncio.run(configure())
        procs.spawn("p", Printer).say.call("step 7 loss 0.{rank}").get()
        procs.stop().get()
    finally:
        procs.stop().get()
    out = capsys.readouterr().out
    mine = [line for line in out.splitlines() if f"[{name} " in line]
    assert len(mine) == 1, out
    expected = rf"\[4 similar log lines\] \[{name} \d\] step 7 loss 0\.\d"
    assert re.fullmatch(expected, mine[0]), mine[0]


def test_a_mesh_not_streamed_keeps_its_lines_in_its_log_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = _unique("quiet")
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name=name)
    try:
        asyncio.run(procs.logging_option(stream_to_client=False, level=logging.DEBUG))
        printers = procs.spawn("p", Printer)
        pids = printers.say.call("hidden line of rank {rank}").get().values()
        assert printers.root_level.call().get().values() == [logging.DEBUG] * 2
        procs.stop().get()
    finally:
        procs.stop().get()
    assert name not in capsys.readouterr().out
    log_dir = logs.proc_log_dir()
    assert log_dir is not None
    for rank, pid in enumerate(pids):
        path = Path(log_dir) / f"{name}-{rank}-{pid}.log"
        assert path.read_text().splitlines() == [f"hidden line of rank {rank}"], path
        assert path.stat().st_mode & 0o077 == 0, "log files are private to their user"
        path.unlink()


def test_logging_option_validates_its_arguments() -> None:
    procs = this_proc()

    async def call(**kwargs: object) -> None:
        await procs.logging_option(**kwargs)  # type: ignore[arg-type]

    for bad in (-1, 256, 1.5, True):
        with pytest.raises(ValueError, match="logging level from 0 to 255"):
            asyncio.run(call(level=bad))
    with pytest.raises(ValueError, match="needs stream_to_client=True"):
        asyncio.run(call(aggregate_window_sec=3))
    with pytest.raises(ValueError, match="seconds > 0"):
        asyncio.run(call(stream_to_client=True, aggregate_window_sec=0))


def test_streaming_without_forwarding_warns() -> None:
    import monarch

    root = logging.getLogger()
    level = root.level  # this_proc() is this process: its root logger gets the level
    try:
        with monarch.configured(enable_log_forwarding=False):
            with pytest.warns(UserWarning, match="log forwarding is disabled"):
                asyncio.run(this_proc().logging_option(stream_to_client=True, level=level))
    finally:
        root.setLevel(level)


class Recorder(Actor):
    @endpoint
    def message(self) -> str:
        record = logging.getLogger("t").makeRecord("t", logging.INFO, "f", 1, "hi %s", ("x",), None)
        return record.getMessage()


def test_log_records_inside_an_actor_name_it() -> None:
    recorder = this_proc().spawn(_unique("rec"), Recorder)
    message = recorder.message.call_one().get()
    assert re.fullmatch(r"\[actor=<root>\.<.*Recorder rec[0-9a-f]{8}.*>\] hi x", message), message
    outside = logging.getLogger("t").makeRecord("t", logging.INFO, "f", 1, "hi", (), None)
    assert outside.getMessage() == "hi", "the client's own records are left alone"
    monarch.actor.config.prefix_python_logs_with_actor = False
    try:
        assert recorder.message.call_one().get() == "hi x"
    finally:
        monarch.actor.config.prefix_python_logs_with_actor = True


GUIDE = ROOT / "docs" / "logging.md"


def test_the_logging_guide_runs_as_it_says() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 1, f"{GUIDE} should have one Python example"
    out = run_client(blocks[0])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for rank in range(4):
        assert f"[trainers {rank}] step 0 loss {0.5 / (rank + 1):.3f}" in lines, out.stdout
    assert re.search(r"^\[4 similar log lines\] \[trainers \d\] step 1 loss ", out.stdout, re.M)
    err = out.stderr
    assert "] [actor=<root>.<__main__.Trainer trainer{'gpus': " in err, err
    assert re.search(
        r"^\[4 similar log lines\] \[trainers \d\] WARNING:trainer:\[actor=<root>.* step 1 done$",
        err,
        re.M,
    ), err


_WHILE_CLIENT_PRINTS = """
import sys, threading
from monarch.actor import Actor, current_rank, endpoint, this_host

class Talker(Actor):
    @endpoint
    def talk(self, n: int) -> None:
        for i in range(n):
            print(f"proc {current_rank().rank} line {i}")

procs = this_host().spawn_procs(per_host={"gpus": 2}, name="talkers")
talking = threading.Thread(target=procs.spawn("t", Talker).talk.call(ROUNDS).get)
talking.start()
i = 0
while talking.is_alive() or i < ROUNDS:  # while the procs print
    print(f"client {type(sys.stdout).__name__} line {i}")
    i += 1
procs.stop().get()
"""


def test_proc_lines_never_land_inside_a_client_line() -> None:
    """With an unbuffered stdout, ``print`` writes its text and its newline in two
    writes; the procs' lines, written by another thread, come between lines only."""
    n = 10000
    out = run_client(_WHILE_CLIENT_PRINTS.replace("ROUNDS", str(n)), PYTHONUNBUFFERED="1")
    assert out.returncode == 0, out.stderr
    line = re.compile(r"^(client LineGate line \d+|\[talkers [01]\] proc [01] line \d+)$")
    glued = [text for text in out.stdout.splitlines() if not line.match(text)]
    assert not glued, f"{len(glued)} lines glued together, e.g. {glued[:3]}"
    assert len(_lines_of(out.stdout, 0, "proc 0 line")) == n
    assert len(_lines_of(out.stdout, 1, "proc 1 line")) == n


class _Recorder:
    """A stream that records each write."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def fileno(self) -> int:
        return 7


def test_line_gate_holds_proc_lines_until_the_client_ends_its_line() -> None:
    import threading

    stream = _Recorder()
    gate = logs.LineGate(stream)
    gate.write("client text")  # print() has written its text, not yet its newline
    wrote = threading.Event()

    def writer() -> None:
        gate.write_lines("[m 0] proc line\n", wait=30)
        wrote.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert not wrote.wait(0.2), "the proc line was written inside the client's line"
    gate.write("\n")
    assert wrote.wait(30)
    thread.join(30)
    assert "".join(stream.writes) == "client text\n[m 0] proc line\n"
    assert gate.fileno() == 7 and gate.wrapped is stream  # the rest is the stream's


def test_line_gate_starts_a_new_line_when_the_client_leaves_one_open() -> None:
    stream = _Recorder()
    gate = logs.LineGate(stream)
    gate.write("Loading...")
    gate.write_lines("[m 1] proc line", wait=0.01)  # no newline of its own either
    gate.write("done\n")
    assert "".join(stream.writes) == "Loading...\n[m 1] proc line\ndone\n"
