"""A script that kills its worker hosts (or its procs) as its last statements and
returns ends promptly, with exit status 1, every time (``docs/supervision.md``, "At
the root"): the failures arrive while the interpreter exits, whatever moment of the
exit that is (``exit_script.py``).

The 20 runs (ipc and tcp workers; procs and hosts killed) go two at a time, each
bounded; a run still going after its limit counts as a hang, and what it left behind
is killed. (Four at a time, on two cores busy with the rest of the suite, once made a
killed proc's report take longer than the exit waits for it: the documented bound,
not a hang.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("exit_script.py")
#: The scenarios, each run 5 times: 20 runs in all.
CASES = [("ipc", "procs"), ("ipc", "hosts"), ("tcp", "procs"), ("tcp", "hosts")]
RUNS_PER_CASE = 5
#: A run still going after this long hangs.
RUN_LIMIT = 30.0
#: How long a run may take from its last statement to its end ("promptly").
EXIT_LIMIT = 10.0
REPORT = "stopping the program with exit status 1"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(transport: str, kill: str) -> dict[str, object]:
    """One run: its exit status (None for a hang), output, and how long its exit took."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), transport, kill],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_LIMIT)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate(timeout=30)
        code = None
    # Workers that outlived the run (a hang, or a failed start): their groups go.
    for line in out.splitlines():
        if line.startswith("WORKERS "):
            for pid in line.split()[1:]:
                _kill_group(int(pid))
    return {"case": f"{transport}/{kill}", "code": code, "out": out, "err": err}


@pytest.mark.timeout(300)
def test_killing_the_workers_or_procs_at_the_very_end_exits_1_every_time() -> None:
    runs = [case for case in CASES for _ in range(RUNS_PER_CASE)]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: _run(*case), runs))
    took = time.monotonic() - start
    hangs = [r["case"] for r in results if r["code"] is None]
    assert not hangs, f"{len(hangs)} of {len(results)} runs hung: {hangs}\n" + "\n".join(
        f"--- {r['case']}:\n{str(r['err'])[-3000:]}" for r in results if r["code"] is None
    )
    codes: dict[str, set[object]] = {str(r["case"]): set() for r in results}
    for r in results:
        codes[str(r["case"])].add(r["code"])
    assert all(c == {1} for c in codes.values()), f"exit statuses by case: {codes}\n" + "\n".join(
        f"--- {r['case']} exited {r['code']}:\n{str(r['err'])[-3000:]}"
        for r in results
        if r["code"] != 1
    )
    for r in results:
        err = str(r["err"])
        assert "CALLED" in str(r["out"]), err[-3000:]
        assert err.count(REPORT) == 1, f"{r['case']}: {err[-3000:]}"
        assert "actor mesh 'where'" in err, err[-3000:]
    print(f"{len(results)} runs, 0 hangs, exit status 1 each, {took:.1f} s in all")


@pytest.mark.timeout(120)
def test_the_exit_is_prompt() -> None:
    """From the kill to the end of the process: the exit judges the failures as soon as
    it learned of them, without waiting out a timeout (a killed host's connection is
    refused at once)."""
    for case in CASES:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        workers: list[int] = []
        try:
            assert proc.stdout is not None
            called = None
            for line in proc.stdout:
                if line.startswith("WORKERS "):
                    workers = [int(p) for p in line.split()[1:]]
                if line.startswith("CALLED"):
                    called = time.monotonic()
                    break
            assert called is not None, proc.communicate(timeout=RUN_LIMIT)[1][-3000:]
            _, err = proc.communicate(timeout=RUN_LIMIT)
            took = time.monotonic() - called
        finally:
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.communicate(timeout=30)
            for pid in workers:
                _kill_group(pid)
        assert proc.returncode == 1, err[-3000:]
        assert took < EXIT_LIMIT, f"{case}: the exit took {took:.1f} s"
