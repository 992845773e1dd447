"""``monarch top`` (and ``monarch-tui``): a terminal UI over the admin server of a
running monarch program, drawn by :mod:`monarch._src.monitoring.tui_render`.

``monarch top [URL] [--addr HOST:PORT] [--token T] [--refresh-ms N] [--once | --json]``:
the URL is the one the program printed (``http://127.0.0.1:PORT/?token=...``), else
``$MONARCH_ADMIN_URL``. ``--once`` prints one frame as plain text and ``--json`` the
snapshot, then exit. Exit status: 0, 1 when the server cannot be reached or refuses, 2
for arguments that are wrong. Standard library only (``curses``), so that the command
starts without the actor runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch._src.monitoring.client import AdminClient
    from monarch._src.monitoring.tui_render import Line

# The same as monarch._src.monitoring.client's, which is imported only once a command
# runs: parsing a command line imports neither urllib nor the renderer.
ENV_URL = "MONARCH_ADMIN_URL"
ENV_TOKEN = "MONARCH_ADMIN_TOKEN"

__all__ = ["add_arguments", "run"]

JSON = dict[str, Any]

USAGE = 2

DESCRIPTION = (
    "Show a running monarch program live: its health, the tree of hosts, procs, meshes "
    "and actors with their status and message counters, and its failures with their "
    "causes. Enter opens an actor (its endpoints and recent logs), s shows the stack of "
    "the selected proc, f only the failures, / filters, ? lists the keys, q quits. "
    "URL is the admin URL the program printed (http://127.0.0.1:PORT/?token=...); "
    f"default: ${ENV_URL}."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``monarch top`` and ``monarch-tui``."""
    parser.add_argument(
        "url",
        nargs="?",
        metavar="URL",
        help=f"the admin URL the program printed (default: ${ENV_URL})",
    )
    parser.add_argument(
        "--addr",
        metavar="HOST:PORT",
        help="the admin server's address, instead of URL (with --token)",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"the admin token, when URL does not carry it (default: ${ENV_TOKEN})",
    )
    parser.add_argument(
        "--refresh-ms",
        type=int,
        default=1000,
        metavar="MS",
        help="how often to refresh, in milliseconds (default: 1000)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long one request may take (default: 5)",
    )
    once = parser.add_mutually_exclusive_group()
    once.add_argument(
        "--once",
        action="store_true",
        help="print one frame as text (the whole tree and the failures) and exit",
    )
    once.add_argument("--json", action="store_true", help="print the snapshot as JSON and exit")
    parser.add_argument(
        "--width",
        type=int,
        metavar="COLUMNS",
        help="the width of the --once frame (default: the terminal's, else 120)",
    )


class _Usage(Exception):
    pass


def _client(args: argparse.Namespace) -> AdminClient:
    from monarch._src.monitoring.client import AdminClient, default_admin_url

    if args.url and args.addr:
        raise _Usage("give URL or --addr HOST:PORT, not both")
    if args.refresh_ms < 50:
        raise _Usage(f"--refresh-ms {args.refresh_ms}: give at least 50 (milliseconds)")
    if args.timeout <= 0:
        raise _Usage(f"--timeout {args.timeout:g}: give a positive number of seconds")
    url = args.url or args.addr or default_admin_url()
    if url is None:
        raise _Usage(
            "which program? Give the admin URL it printed at start (`monarch top "
            "http://127.0.0.1:PORT/?token=...`), or --addr HOST:PORT with --token, or "
            f"set ${ENV_URL}"
        )
    try:
        return AdminClient(url, token=args.token, timeout=args.timeout)
    except ValueError as e:
        raise _Usage(
            f"{e}; give the URL the program printed, e.g. http://127.0.0.1:PORT/?token=..."
        ) from None


def _ansi(line: Line) -> str:
    """``line`` with its styles as ANSI colours (for ``--once`` on a terminal)."""
    codes = {"ok": "32", "busy": "36", "warn": "33", "bad": "31", "dim": "2", "title": "1"}
    codes.update({"heading": "1", "selected": "7"})
    out, at = [], 0
    for span in sorted(line.spans, key=lambda s: s.start):
        if span.start < at or span.start >= len(line.text) or span.style == "selected":
            continue
        out.append(line.text[at : span.start])
        end = min(span.end, len(line.text))
        out.append(f"\x1b[{codes.get(span.style, '0')}m{line.text[span.start : end]}\x1b[0m")
        at = end
    out.append(line.text[at:])
    return "".join(out)


def _once(client: AdminClient, args: argparse.Namespace) -> int:
    from monarch._src.monitoring.tui_render import ViewState, render_lines

    if args.json:
        json.dump(client.snapshot(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    summary, snapshot = client.summary(), client.snapshot()
    tty = sys.stdout.isatty()
    width = args.width or (shutil.get_terminal_size((120, 40)).columns if tty else 120)
    lines = render_lines(snapshot, summary, ViewState(), width, 0)
    for line in lines:
        print(_ansi(line) if tty else line.text)
    return 0


def run(args: argparse.Namespace, prog: str = "monarch top") -> int:
    """Run ``monarch top`` with the parsed ``args``; the exit status."""
    from monarch._src.monitoring.client import AdminError

    try:
        client = _client(args)
    except _Usage as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return USAGE
    try:
        if args.once or args.json:
            return _once(client, args)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            print(
                f"{prog}: not a terminal; use --once (one frame as text) or --json",
                file=sys.stderr,
            )
            return USAGE
        # Asked before the screen is taken, so that an error prints plainly.
        first = (client.summary(), client.snapshot())
        from monarch._src.monitoring import tui_screen

        return tui_screen.loop(client, first, args.refresh_ms)
    except AdminError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `monarch top --once | head`: the reader left.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
