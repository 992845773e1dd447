"""``monarch debug``: a terminal for the debug server of a monarch client.

The client's debug controller runs the ``monarch_dbg>`` prompt and the pdb sessions
(see :mod:`.controller`); this command only shows what the server sends and sends back
the lines it asks for (:mod:`.protocol`). End it with ``quit``, Ctrl-D or Ctrl-C: the
paused actors stay paused.
"""

from __future__ import annotations

import socket
import sys

from monarch._src.actor.debugger import protocol

__all__ = ["run"]


def run(host: str | None = None, port: int | None = None) -> int:
    """Talk to the debug server at ``host:port`` (default: the
    ``MONARCH_DEBUG_SERVER_*`` variables, else ``localhost:27000``) until it or the
    user ends; the exit status."""
    try:
        host, port = protocol.server_address(host, port)
    except ValueError as e:
        print(f"monarch debug: {e}", file=sys.stderr)
        return 2
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError as e:
        print(
            f"monarch debug: cannot connect to the debug server at {host}:{port} ({e}). "
            "A monarch client serves it once one of its actors calls breakpoint(); "
            "give its --host/--port if it serves elsewhere "
            f"(${protocol.HOST_ENV}, ${protocol.PORT_ENV})",
            file=sys.stderr,
        )
        return 1
    sock.settimeout(None)
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    line = ""
    try:
        with sock, sock.makefile("rb") as messages:
            for raw in messages:
                kind, text = protocol.decode(raw)
                if kind == "out":
                    sys.stdout.write(text)
                    sys.stdout.flush()
                    continue
                try:
                    line = input(text)
                except EOFError:
                    print()
                    return 0
                sock.sendall((line + "\n").encode())
    except KeyboardInterrupt:
        print()
        return 130
    except ConnectionError:
        pass  # the client exited: said below
    except (OSError, ValueError) as e:
        print(f"monarch debug: lost the debug server at {host}:{port}: {e}", file=sys.stderr)
        return 1
    if line.strip() not in ("quit", "q", "exit"):
        print("monarch debug: the debug server closed the connection (did the client exit?)")
    return 0
