"""The web crawler, reinforcement learning and pdb examples of ``examples/`` run as
users run them (a subprocess each, with a timeout) and print what they promise."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pexpect
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def user_env() -> dict[str, str]:
    """The environment a user's shell would give: without the suite's own settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "MONARCH_SPAWN_FORK_SERVER_PRELOAD" and not k.startswith("MONARCH_DEBUG_")
    }


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=user_env(),
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout


@pytest.mark.timeout(150)
def test_web_crawler_finds_exactly_the_sites_pages(tmp_path: Path) -> None:
    out = run_example("web_crawler.py", tmp_path)
    assert re.search(r"^serving 40 pages at http://127\.0\.0\.1:\d+/$", out, re.M), out
    assert re.search(r"^crawler \d got 200 from ", out, re.M), out
    counts = [int(n) for n in re.findall(r"^  crawler \d fetched (\d+) pages$", out, re.M)]
    assert len(counts) == 4 and sum(counts) == 40, out
    assert re.search(r"^found 40 pages in [\d.]+ s with 4 crawlers; \d+ duplicate", out, re.M)
    assert "1 broken: http://127.0.0.1:" in out and "/missing.html" in out, out
    assert "example.com" not in out, out
    assert "the crawl found exactly the site's pages" in out, out


@pytest.mark.timeout(150)
def test_reinforcement_learning_improves_the_policy(tmp_path: Path) -> None:
    out = run_example("reinforcement_learning.py", tmp_path)
    assert re.search(r"^2 generators read the learner's weights over \{'\w+'\}$", out, re.M), out
    m = re.search(r"first 5 rounds ([\d.]+), last 5 rounds ([\d.]+)", out)
    assert m, out
    start, end = float(m.group(1)), float(m.group(2))
    # A random policy wins 1 time in 4; the trained one most of the time.
    assert start < 0.5 and end > 0.75 and end > start + 0.3, out
    assert "the policy improved" in out, out


#: What the script prints on its stderr when a rank pauses.
PAUSED = re.compile(r"monarch: actor 'scorers' rank (\d+) is paused at a breakpoint .*--port (\d+)")
PROMPT = "monarch_dbg> "
PDB = "(Pdb) "


class Lines:
    """The lines of a pipe, collected by a thread; ``wait`` for one matching a pattern."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.queue.put(line)
        self.queue.put(None)

    def wait(self, pattern: str | re.Pattern[str], timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"the script ended without {pattern!r}; saw {self.seen}")
            self.seen.append(line)
            if m := re.search(pattern, line):
                return m


@pytest.fixture
def debug_script(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**user_env(), "MONARCH_DEBUG_SERVER_PORT": "0"}  # a free port, named on stderr
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "debugging.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        pipe.close()


@pytest.mark.timeout(180)
def test_debugging_example_attach_inspect_continue(
    debug_script: subprocess.Popen[str],
) -> None:
    stdout, stderr = Lines(debug_script.stdout), Lines(debug_script.stderr)
    paused = stderr.wait(PAUSED)
    assert paused.group(1) == "2", paused.string
    # The healthy ranks are done while rank 2 waits in pdb.
    for _ in range(3):
        assert "nan" not in stdout.wait(r"^rank \d: score ").string

    child = pexpect.spawn(
        sys.executable,
        ["-m", "monarch.tools.cli", "debug", "--port", paused.group(2)],
        env={**user_env(), "TERM": "dumb"},
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 250),
    )

    def cmd(line: str, prompt: str) -> str:
        child.sendline(line)
        child.expect_exact(prompt)
        return str(child.before).partition("\n")[2].replace("\r\n", "\n")

    try:
        child.expect_exact(PROMPT)
        assert re.search(
            r"scorers\s+2\s+ranks=2\s+\S+\s+score\s+\S*debugging\.py:\d+\s+waiting",
            str(child.before),
        ), child.before
        out = cmd("attach scorers 2", PDB)
        assert "debugging.py" in out and "-> return self.rank, mean" in out, out
        assert cmd("p total_weight", PDB).strip() == "0.0"
        assert cmd("p self.weights", PDB).strip() == "[0.0, 0.0, 0.0]"
        assert cmd("p self.values", PDB).strip() == "[7.0, 8.0, 9.0]"
        assert cmd("p mean", PDB).strip() == "nan"
        assert "ended" in cmd("c", PROMPT)
        # Rank 2 answers, so the script stops its procs and ends: its debug server may
        # be gone before the next command, and the debugger then says so and exits.
        child.sendline("list")
        gone = child.expect_exact(["No sessions", "the debug server closed the connection"])
        if gone == 0:
            child.expect_exact(PROMPT)
            child.sendline("quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)

    assert stdout.wait(r"^rank 2: ").string.strip() == "rank 2: score nan"
    assert stdout.wait(r"^ranks with a bad score").string.strip() == "ranks with a bad score: [2]"
    assert debug_script.wait(timeout=60) == 0
