"""The tests' reader of a child's output lines (``output_lines.py``) sees every line,
also lines that arrive together, before the child goes quiet."""

from __future__ import annotations

import subprocess
import sys

import pytest

from output_lines import LineReader

# Prints two lines in one write, then waits for its stdin to close.
CHILD = "import sys; sys.stdout.write('STEP 2\\nREADY 7\\n'); sys.stdout.flush(); sys.stdin.read()"


@pytest.mark.timeout(60)
def test_two_lines_written_at_once_are_both_seen() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = LineReader.of(proc)
        assert lines.until("STEP ", 30) == "STEP 2\n"
        # Already read with the first line: no more data will come on the pipe.
        assert lines.until("READY ", 30) == "READY 7\n"
        assert lines.next_line(0.05) is None, "nothing else was printed"
        assert LineReader.of(proc) is lines, "one reader per process"
        assert proc.stdin is not None
        proc.stdin.close()  # the child ends: its output with it
        assert lines.next_line(30) is None, "the output ended"
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


@pytest.mark.timeout(60)
def test_a_last_line_without_a_newline_is_returned() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('a'); print('RESULT {}', end='')"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert LineReader.of(proc).until("RESULT", 30) == "RESULT {}"
    finally:
        proc.communicate(timeout=30)
