"""Helpers for the tests of ``monarch top`` and the report: the recorded job, and an
admin server serving it. A module of its own name, so that the tests import it
whichever ``conftest`` was imported first.

:func:`serve_recorded` starts the real server (``monarch._rust_bindings.AdminServer``)
when the extension has it, else :class:`StubServer`: a small ``http.server`` speaking
the same routes (section 1 of the monitoring spec) with the same bearer token and Host
check, so that the client and the UI are tested before, and then against, the real one.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

#: The recorded job: {"summary", "snapshot", "events", "logs", "series"}.
RECORDED = Path(__file__).parent / "fixtures" / "recorded.json"

#: Where the golden screens live.
FIXTURES = Path(__file__).parent / "fixtures"

#: What the stub answers for a stack dump.
STUB_STACK = 'Thread 0x7f00 (most recent call first):\n  File "train.py", line 12 in step'


def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDED.read_text())
    return data


class Server(Protocol):
    url: str
    base_url: str
    token: str

    def stop(self) -> None: ...


class StubServer:
    """The admin JSON API over the recorded job, on 127.0.0.1 (a free port)."""

    def __init__(self, data: dict[str, Any], allowed_hosts: tuple[str, ...] = ()) -> None:
        self.data = data
        self.token = secrets.token_hex(32)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stub._answer(self)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        port = self._http.server_address[1]
        self.allowed = set(allowed_hosts) or {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.base_url = f"http://127.0.0.1:{port}/"
        self.url = f"{self.base_url}?token={self.token}"
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="stub-admin-server", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        def send(status: int, body: dict[str, Any]) -> None:
            payload = json.dumps({"version": 1, **body}).encode()
            request.send_response(status)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)

        if request.headers.get("Host") not in self.allowed:
            send(403, {"error": f"Host {request.headers.get('Host')!r} is not allowed"})
            return
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            send(401, {"error": "no valid token: use the URL the program printed"})
            return
        parts = urllib.parse.urlsplit(request.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
        d = self.data
        route = parts.path
        if route == "/v1/summary":
            send(200, d["summary"])
        elif route == "/v1/snapshot":
            send(200, d["snapshot"])
        elif route == "/v1/events":
            since = int(q.get("since", 0))
            items = [e for e in d["events"] if e["seq"] > since][: int(q.get("limit", 1000))]
            send(200, {"items": items, "next": items[-1]["seq"] if items else since})
        elif route == "/v1/logs":
            items = [
                r
                for r in d["logs"]
                if q.get("q", "").lower() in r["line"].lower()
                and q.get("proc", r["proc"]) == r["proc"]
            ]
            send(200, {"items": items[-int(q.get("limit", 200)) :]})
        elif route == "/v1/series":
            send(200, d["series"])
        elif route == "/v1/stack":
            proc = q.get("proc", "")
            found = [p for p in d["snapshot"]["procs"] if p["id"] == proc]
            if not found:
                send(404, {"error": f"no proc {proc!r}"})
                return
            body = {"proc": proc, "pid": found[0]["pid"], "method": "faulthandler"}
            send(200, {**body, "text": STUB_STACK})
        else:
            send(404, {"error": f"no route {route}"})


def real_server_class() -> Any:
    """``(AdminServer, AdminConfig)`` of the extension, or ``None`` before they land."""
    try:
        from monarch._rust_bindings import (
            AdminConfig,
            AdminServer,
        )
    except ImportError:
        return None
    return AdminServer, AdminConfig


@contextlib.contextmanager
def serve_recorded(stub: bool = False) -> Iterator[Server]:
    """An admin server over the recorded job: the real one when it is built (unless
    ``stub``), else :class:`StubServer`; stopped after."""
    real = None if stub else real_server_class()
    server: Server
    if real is not None:
        admin_server, admin_config = real
        server = admin_server.serve_recorded(str(RECORDED), admin_config())
    else:
        server = StubServer(recorded())
    try:
        yield server
    finally:
        server.stop()
