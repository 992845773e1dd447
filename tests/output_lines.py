"""Reading a child process's output line by line with a deadline.

Waiting with ``select`` on a text pipe and then calling ``readline()`` loses lines: one
``readline`` may pull several lines into the file object's buffer, and the next
``select`` then waits on the (empty) pipe for data that is already read. A child that
printed its last two lines together and then waits for the test hangs the test. This
reader keeps its own buffer: it reads the pipe's descriptor directly and splits lines
itself, so a line that arrived is always seen.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from typing import Any


class LineReader:
    """The lines of ``proc``'s stdout (a pipe), each returned once, oldest first. Use one
    reader per process and do not read its stdout otherwise."""

    def __init__(self, proc: subprocess.Popen[Any]) -> None:
        assert proc.stdout is not None, "start the process with stdout=subprocess.PIPE"
        self._fd = proc.stdout.fileno()
        self._buffer = b""
        self._eof = False
        #: Every complete line read so far, for error messages.
        self.seen: list[str] = []

    @classmethod
    def of(cls, proc: subprocess.Popen[Any]) -> LineReader:
        """The reader of ``proc`` (made on first use and kept with it: it holds what it
        read ahead)."""
        reader = getattr(proc, "_output_lines", None)
        if reader is None:
            reader = cls(proc)
            proc._output_lines = reader  # type: ignore[attr-defined]
        return reader

    def _take_line(self) -> str | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            if self._eof and self._buffer:  # a last line without a newline
                end = len(self._buffer) - 1
            else:
                return None
        line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
        text = line.decode(errors="replace")
        self.seen.append(text)
        return text

    def next_line(self, timeout: float) -> str | None:
        """The next line (with its newline), or ``None`` when none came within
        ``timeout`` seconds or the output ended."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            while True:
                line = self._take_line()
                if line is not None:
                    return line
                if self._eof:
                    return None
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(self._fd, 65536)
                if chunk:
                    self._buffer += chunk
                else:
                    self._eof = True

    def until(self, match: str, timeout: float, *, prefix: bool = True) -> str | None:
        """The first line starting with ``match`` (containing it, when not ``prefix``)
        within ``timeout`` seconds, with the other lines before it skipped; ``None`` if
        none came."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(max(0.0, deadline - time.monotonic()))
            if line is None:
                return None
            if line.startswith(match) if prefix else match in line:
                return line
