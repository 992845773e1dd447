"""The README's first program runs, and prints what the README says it prints.

The program is the first ```` ```python ```` block after the heading ``## A first
program`` of README.md; the ```` ```text ```` block right after it is its output. The
program runs as a user runs it (a script of its own, in a subprocess, with the
interpreter running the tests) and its stdout must equal that output, line for line.
docs/index.md, the front page of the documentation site, shows the same program: its
first ```` ```python ```` block must be the README's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FRONT_PAGE = ROOT / "docs" / "index.md"
HEADING = "## A first program"
#: The program's limit; it takes about a second.
RUN_TIMEOUT = 90.0

_BLOCK = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks_after(markdown: str, heading: str | None) -> list[tuple[str, str]]:
    """The fenced blocks (language, code) of ``markdown`` after the line ``heading``
    (from the top when None), up to the next heading of the same level."""
    if heading is not None:
        lines = markdown.splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.rstrip() == heading]
        assert starts, f"no line {heading!r}"
        level = heading.split(" ", 1)[0] + " "
        rest = lines[starts[0] + 1 :]
        end = next((i for i, line in enumerate(rest) if line.startswith(level)), len(rest))
        markdown = "".join(rest[:end])
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(markdown)]


def readme_program() -> tuple[str, list[str]]:
    """The README's first program and the output it shows for it."""
    blocks = blocks_after(README.read_text(), HEADING)
    languages = [language for language, _ in blocks]
    assert languages[:2] == ["python", "text"], (
        f"README.md: {HEADING!r} must be followed by a ```python block and its ```text "
        f"output; found {languages}"
    )
    return blocks[0][1], blocks[1][1].splitlines()


def run_script(script: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as a user would; on a timeout, kill it and every process it
    started (they share its new session), so that nothing is left behind."""
    env = dict(os.environ)
    env.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)  # the test suite's, not a user's
    with subprocess.Popen(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"the README's program ran past {RUN_TIMEOUT:g} s\n--- stdout\n{stdout}\n"
                f"--- stderr\n{stderr}",
                pytrace=False,
            )
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.timeout(30)
def test_blocks_after_a_heading() -> None:
    text = (
        "# T\n```python\nno\n```\n"
        "## A\nx\n```python\nyes\n```\n```text\nout\n```\n"
        "## B\n```sh\nls\n```\n"
    )
    assert blocks_after(text, "## A") == [("python", "yes\n"), ("text", "out\n")]
    assert [language for language, _ in blocks_after(text, None)] == [
        "python",
        "python",
        "text",
        "sh",
    ]


@pytest.mark.timeout(int(RUN_TIMEOUT) + 30)
def test_readme_program_prints_what_the_readme_shows(tmp_path: Path) -> None:
    code, expected = readme_program()
    for name in ("spawn_procs", "spawn(", ".call(", ".call_one(", ".broadcast(", "ActorError"):
        assert name in code, f"the README's program no longer shows {name}"
    script = tmp_path / "readme_program.py"
    script.write_text(code)
    result = run_script(script)
    assert result.returncode == 0, (
        f"the README's program exited with {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    assert result.stdout.splitlines() == expected, (
        f"the README's program printed\n{result.stdout}\nbut the README shows\n"
        + "\n".join(expected)
    )


@pytest.mark.timeout(30)
def test_front_page_shows_the_readme_program() -> None:
    code, _ = readme_program()
    front = [
        body
        for language, body in blocks_after(FRONT_PAGE.read_text(), None)
        if language == "python"
    ]
    assert front and front[0] == code, (
        "the first code block of docs/index.md must be the README's first program; "
        "change both together"
    )
