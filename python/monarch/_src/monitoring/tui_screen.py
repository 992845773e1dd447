"""The curses side of ``monarch top``: reads the keys, refreshes the data every
``--refresh-ms`` and draws what :func:`~monarch._src.monitoring.tui_render.render_lines`
composed. Everything that decides what is shown lives in ``tui_render`` (tested as text);
this module only talks to the terminal and to the server."""

from __future__ import annotations

import curses
import locale
import os
import time
from typing import Any

from monarch._src.monitoring.client import AdminClient, AdminError
from monarch._src.monitoring.tui_render import (
    ViewState,
    clamp_scroll,
    handle_key,
    render_lines,
)

__all__ = ["loop"]

JSON = dict[str, Any]

_KEYS = {
    curses.KEY_UP: "up",
    curses.KEY_DOWN: "down",
    curses.KEY_LEFT: "left",
    curses.KEY_RIGHT: "right",
    curses.KEY_ENTER: "enter",
    curses.KEY_BACKSPACE: "backspace",
    curses.KEY_NPAGE: "pgdn",
    curses.KEY_PPAGE: "pgup",
    curses.KEY_HOME: "home",
    curses.KEY_END: "end",
}
_CHARS = {"\n": "enter", "\r": "enter", "\x7f": "backspace", "\x08": "backspace", "\x1b": "esc"}


def key_name(key: int | str) -> str | None:
    """The name :func:`handle_key` takes for what ``get_wch`` returned, or ``None``."""
    if isinstance(key, int):
        return _KEYS.get(key)
    return _CHARS.get(key, key if key.isprintable() else None)


class _Screen:
    def __init__(self, client: AdminClient, first: tuple[JSON, JSON], refresh_ms: int) -> None:
        self.client = client
        self.summary, self.snapshot = first
        self.refresh_s = refresh_ms / 1000
        self.state = ViewState()
        self.styles: dict[str, int] = {}
        self.events_since = 0

    def _colours(self) -> None:
        self.styles = {
            "title": curses.A_BOLD,
            "heading": curses.A_BOLD,
            "dim": curses.A_DIM,
            "selected": curses.A_REVERSE,
        }
        base = {"ok": curses.A_NORMAL, "busy": curses.A_NORMAL}
        base.update({"warn": curses.A_BOLD, "bad": curses.A_BOLD})
        self.styles.update(base)
        if not curses.has_colors():
            return
        try:
            curses.start_color()
            curses.use_default_colors()
            background = -1
        except curses.error:
            background = curses.COLOR_BLACK
        colours = {
            "ok": curses.COLOR_GREEN,
            "busy": curses.COLOR_CYAN,
            "warn": curses.COLOR_YELLOW,
            "bad": curses.COLOR_RED,
        }
        for pair, (name, colour) in enumerate(colours.items(), start=1):
            try:
                curses.init_pair(pair, colour, background)
                self.styles[name] = self.styles[name] | curses.color_pair(pair)
            except curses.error:
                pass

    def _draw(self, screen: curses.window) -> None:
        height, width = screen.getmaxyx()
        lines = render_lines(self.snapshot, self.summary, self.state, width, height)
        screen.erase()
        for y, line in enumerate(lines[:height]):
            # Never the last cell of the last row: curses cannot write it.
            room = width - 1 if y == height - 1 else width
            selected = any(s.style == "selected" for s in line.spans)
            base = self.styles["selected"] if selected else curses.A_NORMAL
            text = line.text.ljust(room) if selected else line.text
            try:
                screen.addnstr(y, 0, text, room, base)
            except curses.error:
                continue
            for span in line.spans:
                if span.style == "selected":
                    continue
                start, end = span.start, min(span.end, len(line.text), room)
                if end > start:
                    try:
                        screen.chgat(y, start, end - start, base | self.styles.get(span.style, 0))
                    except curses.error:
                        pass
        screen.noutrefresh()
        curses.doupdate()

    def _ask(self, what: str) -> None:
        state = self.state
        try:
            if what == "refresh":
                self.summary = self.client.summary()
                self.snapshot = self.client.snapshot()
                if state.message.endswith("(retrying)"):
                    state.message = ""
                if state.view == "actor":
                    self._ask("logs")
            elif what == "logs":
                actor = next(
                    (a for a in self.snapshot.get("actors") or [] if a.get("id") == state.actor),
                    None,
                )
                if actor is not None:
                    state.logs = self.client.logs(proc=actor.get("proc"), limit=200)["items"]
            elif what == "stack" and state.stack_proc is not None:
                state.stack = self.client.stack(state.stack_proc)
        except AdminError as e:
            state.message = f"{e} (retrying)" if what == "refresh" else str(e)
            if what == "stack":
                state.stack = {"method": "unavailable", "text": str(e)}
        except (KeyError, TypeError):
            state.message = f"the admin server answered {what} in a shape this UI does not know"

    def run(self, screen: curses.window) -> int:
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        screen.keypad(True)
        self._colours()
        due = time.monotonic() + self.refresh_s
        while True:
            self._draw(screen)
            wait = max(due - time.monotonic(), 0.0)
            screen.timeout(int(wait * 1000))
            try:
                key: int | str | None = screen.get_wch()
            except curses.error:
                key = None  # the wait ended: time to refresh
            if key is None:
                self._ask("refresh")
                due = time.monotonic() + self.refresh_s
                continue
            if key == curses.KEY_RESIZE:
                curses.update_lines_cols()
                continue
            name = key_name(key)
            if name is None:
                continue
            command = handle_key(self.state, name, self.snapshot)
            height, width = screen.getmaxyx()
            clamp_scroll(self.snapshot, self.state, width, height)
            if command == "quit":
                return 0
            if command is not None:
                self._ask(command)
                if command == "refresh":
                    due = time.monotonic() + self.refresh_s


def loop(client: AdminClient, first: tuple[JSON, JSON], refresh_ms: int) -> int:
    """Run the UI on this terminal until ``q``; the exit status."""
    locale.setlocale(locale.LC_ALL, "")
    os.environ.setdefault("ESCDELAY", "25")
    screen = _Screen(client, first, refresh_ms)
    status: int = curses.wrapper(screen.run)
    return status
