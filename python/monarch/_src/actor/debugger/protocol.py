"""Settings of the remote debugger and the wire format of the ``monarch debug`` server.

Everything here is read from environment variables (as upstream Monarch does), at the
moment it is needed, in the process that needs it:

- ``MONARCH_DEBUG_SERVER_HOST`` (``localhost``), ``MONARCH_DEBUG_SERVER_PORT``
  (``27000``), ``MONARCH_DEBUG_SERVER_PROTOCOL`` (``tcp``, the only one): where the
  client's debug controller serves ``monarch debug``, and where ``monarch debug``
  connects by default;
- ``MONARCH_DEBUG_ATTACH_TIMEOUT`` (seconds; unset, empty or ``0``: wait forever), read
  by a proc at a breakpoint: how long it waits for somebody to attach before it
  continues with a warning;
- ``MONARCH_DEBUG_POST_MORTEM`` (``1``/``true``/``yes``/``on``; unset: off), read by a
  proc when an endpoint raises: open a post-mortem session on every endpoint exception.

The server speaks newline-delimited JSON to its clients: ``{"out": TEXT}`` (print TEXT
as it is) and ``{"input": PROMPT}`` (show PROMPT, read one line and send it back, with
its newline). A client sends nothing else; closing the connection means ``quit``.

This module imports nothing of the runtime, so that ``monarch debug`` starts fast.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = [
    "ATTACH_TIMEOUT_ENV",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HOST_ENV",
    "PORT_ENV",
    "POST_MORTEM_ENV",
    "PROTOCOL_ENV",
    "attach_timeout",
    "decode",
    "encode",
    "post_mortem_enabled",
    "server_address",
]

HOST_ENV = "MONARCH_DEBUG_SERVER_HOST"
PORT_ENV = "MONARCH_DEBUG_SERVER_PORT"
PROTOCOL_ENV = "MONARCH_DEBUG_SERVER_PROTOCOL"
ATTACH_TIMEOUT_ENV = "MONARCH_DEBUG_ATTACH_TIMEOUT"
POST_MORTEM_ENV = "MONARCH_DEBUG_POST_MORTEM"

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 27000

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def server_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where the debug server is: the arguments, else the environment, else
    ``localhost:27000``.

    Raises:
        ValueError: the port is not a port number, or the protocol is not ``tcp``.
    """
    protocol = os.environ.get(PROTOCOL_ENV, "tcp").strip().lower() or "tcp"
    if protocol != "tcp":
        raise ValueError(
            f"{PROTOCOL_ENV}={protocol!r}: the debug server speaks tcp only; unset it or "
            "set it to tcp"
        )
    if host is None:
        host = os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
    if port is None:
        raw = os.environ.get(PORT_ENV, "").strip()
        if not raw:
            port = DEFAULT_PORT
        else:
            try:
                port = int(raw)
            except ValueError:
                raise ValueError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"debug server port {port} is not a port number (0 to 65535)")
    return host, port


def attach_timeout() -> float | None:
    """Seconds a breakpoint waits for somebody to attach (``None``: forever).

    Raises:
        ValueError: the variable is not a number of seconds.
    """
    raw = os.environ.get(ATTACH_TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{ATTACH_TIMEOUT_ENV}={raw!r} is not a number of seconds (unset or 0: wait "
            "until somebody attaches)"
        ) from None
    if value != value or value < 0:
        raise ValueError(f"{ATTACH_TIMEOUT_ENV}={raw!r} must be a number of seconds >= 0")
    return value or None


def post_mortem_enabled() -> bool:
    """Whether every endpoint exception opens a post-mortem session.

    Raises:
        ValueError: the variable is neither true nor false.
    """
    raw = os.environ.get(POST_MORTEM_ENV, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{POST_MORTEM_ENV}={raw!r}: set it to 1 or 0")


def encode(kind: str, text: str) -> bytes:
    """One message of the server: ``{kind: text}`` and a newline."""
    return (json.dumps({kind: text}) + "\n").encode()


def decode(line: bytes) -> tuple[str, str]:
    """``(kind, text)`` of one message line of the server.

    Raises:
        ValueError: the line is not a message of the server.
    """
    try:
        msg: Any = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not a message of a monarch debug server: {line[:80]!r}") from e
    if not isinstance(msg, dict) or len(msg) != 1:
        raise ValueError(f"not a message of a monarch debug server: {line[:80]!r}")
    ((kind, text),) = msg.items()
    if kind not in ("out", "input") or not isinstance(text, str):
        raise ValueError(f"not a message of a monarch debug server: {line[:80]!r}")
    return kind, text
