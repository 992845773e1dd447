"""The handling of an unhandled failure does not depend on timing: the same script, run
10 times per case (``MONARCH_DETERMINISM_RUNS`` to change it; 11 cases, so 110 runs
in all), ends the same way every time.

``failing_script.py`` makes an actor fail (its proc exits with status 3, is killed with
SIGKILL, or its ``__init__`` raises) while the main thread is blocked in ``get()``,
awaiting, inside an ``except SupervisionError`` block, sleeping or computing. With the
default fault hook the program prints one report naming the mesh, class, rank, pid and
the true cause, runs its atexit handlers and exits with status 1, whatever the main
thread was doing. With a hook that returns, the program goes on: the pending call and
later calls raise ``SupervisionError``, the hook ran once, and the exit status is 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("failing_script.py")
RUNS = int(os.environ.get("MONARCH_DETERMINISM_RUNS", "10"))

pytestmark = pytest.mark.timeout(300)

CAUSES = {
    "exit": "its process died (exited with status 3)",
    "sigkill": "its process died (killed by signal 9, SIGKILL)",
    "init": "ValueError: __init__ failed on purpose",
}
CALL_CAUSES = {
    "exit": "died (exited with status 3)",
    "sigkill": "died (killed by signal 9, SIGKILL)",
    "init": "__init__ raised",
}


def run(main: str, failure: str, hook: str) -> tuple[int, str, str]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), main, failure, hook],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, out.stdout, out.stderr


def normalized(text: str) -> str:
    """``text`` without what differs between runs: pids, proc names, socket paths."""
    text = re.sub(r"pid \d+", "pid N", text)
    text = re.sub(r"anon-\d+-[0-9a-f]+@unix:\S+?\.sock", "PROC", text)
    return text


def runs(main: str, failure: str, hook: str) -> list[tuple[int, str, str]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda _: run(main, failure, hook), range(RUNS)))


def same_every_time(results: list[tuple[int, str, str]], what: str) -> tuple[int, str]:
    """The exit status and stdout shared by every run (asserting they are shared)."""
    outcomes = {(code, normalized(out)) for code, out, _ in results}
    assert len(outcomes) == 1, f"{what}: {len(outcomes)} different outcomes: {outcomes}"
    return outcomes.pop()


@pytest.mark.parametrize(
    "main, failure",
    [
        ("get", "exit"),
        ("await", "exit"),
        ("except", "exit"),
        ("sleep", "exit"),
        ("compute", "exit"),
        ("get", "sigkill"),
        ("sleep", "init"),
    ],
)
def test_the_default_hook_ends_the_program_the_same_way_every_time(main: str, failure: str) -> None:
    results = runs(main, failure, "default")
    code, out = same_every_time(results, f"{main}/{failure}")
    assert code == 1
    # Nothing after the failure ran in the main thread; the atexit handlers did.
    assert out == "ATEXIT\n", out
    for _, _, err in results:
        reports = [line for line in err.splitlines() if line.startswith("monarch: unhandled")]
        assert len(reports) == 1, err
        assert "actor mesh 'victim' (__main__.Victim) rank 0 on proc" in err, err
        assert re.search(r"\(pid \d+\) failed:", err), err
        assert CAUSES[failure] in err, err


@pytest.mark.parametrize(
    "main, failure",
    [("get", "exit"), ("await", "sigkill"), ("sleep", "exit"), ("compute", "init")],
)
def test_a_hook_that_returns_lets_the_program_go_on_the_same_way_every_time(
    main: str, failure: str
) -> None:
    results = runs(main, failure, "returns")
    code, out = same_every_time(results, f"{main}/{failure}")
    assert code == 0
    lines = out.splitlines()
    raised = [line for line in lines if line.startswith("OUTCOME SupervisionError")]
    assert len(raised) == 1, out
    assert "actor mesh 'victim' (__main__.Victim) rank 0" in raised[0], out
    assert "pid N" in raised[0] and CALL_CAUSES[failure] in raised[0], out
    assert lines[-3:] == [
        "OUTCOME later SupervisionError",
        "OUTCOME hook ran 1 time(s)",
        "ATEXIT",
    ], out
