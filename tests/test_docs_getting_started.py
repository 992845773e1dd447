"""docs/getting_started.md and the examples it is built on (issue 3).

The guide must show exactly the code of ``examples/getting_started.py``. The rule: the
```` ```python ```` blocks of the guide, concatenated in order, equal the example file once
both are *normalised*, which drops every blank line and every comment-only line (first
non-blank character ``#``) and strips trailing whitespace; everything else, indentation
included, must match line for line. So the example may carry comments and spacing that
the guide says in prose, but every statement of one is in the other, in the same order.
Other fenced blocks of the guide (``sh``, ``text``) are not compared.

The examples themselves run as subprocesses, the way ``make demo`` runs them.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "getting_started.md"
EXAMPLES = ROOT / "examples"

#: A fenced ```python block: the fence lines are not part of the code.
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def normalise(code: str) -> list[str]:
    """The lines of ``code`` that the comparison looks at (see the module docs)."""
    lines = (line.rstrip() for line in code.splitlines())
    return [line for line in lines if line and not line.lstrip().startswith("#")]


def guide_code() -> str:
    blocks = PYTHON_BLOCK.findall(GUIDE.read_text())
    assert blocks, f"{GUIDE} has no ```python blocks"
    return "".join(blocks)


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"examples/{name} exited with {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


@pytest.mark.timeout(30)
def test_normalise_keeps_code_and_indentation() -> None:
    code = "# title\n\nimport x  # why\n\n\ndef f():\n    # note\n    return 1   \n"
    assert normalise(code) == ["import x  # why", "def f():", "    return 1"]


@pytest.mark.timeout(30)
def test_guide_shows_the_example_code() -> None:
    example = normalise((EXAMPLES / "getting_started.py").read_text())
    guide = normalise(guide_code())
    if guide != example:
        diff = "\n".join(
            difflib.unified_diff(
                example,
                guide,
                "examples/getting_started.py",
                "docs/getting_started.md (python blocks)",
                lineterm="",
            )
        )
        pytest.fail(
            "docs/getting_started.md no longer shows the code of "
            f"examples/getting_started.py; change both together:\n{diff}",
            pytrace=False,
        )


@pytest.mark.timeout(150)
def test_getting_started_runs() -> None:
    out = run_example("getting_started.py").stdout
    lines = out.splitlines()
    for expected in [
        "procs: {'gpus': 4}",
        "call: [11, 11, 11, 11]",
        "call_one: 16",
        "after broadcast: [116, 111, 111, 111]",
        "values(): [116, 111, 111, 111]",
        "item(gpus=2): 111",
        "split: {'row': 2, 'col': 2}",
        "flatten: {'all': 4}",
        "  actor {'gpus': 2} got this message as {'col': 0}",
        "  actor {'gpus': 3} got this message as {'gpus': 1}",
        "async total: 449",
        "ValueError: counter 111 refuses",
        "still alive: 111",
        "registered: ['worker 0', 'worker 1', 'worker 2', 'worker 3']",
        "done",
    ]:
        assert expected in lines, f"{expected!r} missing from the output:\n{out}"
    assert sorted(line for line in lines if line.startswith("stream: ")) == [
        "stream: 11",
        "stream: 11",
        "stream: 11",
        "stream: 16",
    ]
    assert "Traceback of where the remote call failed" in out
    assert "Actor call counters.fail failed." in lines, out
    assert any(line.startswith("after stop: actor mesh 'counters'") for line in lines), out
    assert lines[-1] == "done"


@pytest.mark.timeout(150)
def test_ping_pong_runs() -> None:
    out = run_example("ping_pong.py", "100").stdout
    assert re.search(r"^ping -> pong: 100 round trips, [0-9.]+ us each$", out, re.M), out
    assert re.search(r"^pong -> ping: 100 round trips, [0-9.]+ us each$", out, re.M), out
