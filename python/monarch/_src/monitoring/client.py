"""A client of the admin HTTP server of a running monarch program (JSON API version 1,
see docs/monitoring.md): standard library only, so that ``monarch top`` starts quickly.

The program prints its admin URL, ``http://127.0.0.1:PORT/?token=TOKEN``; the client
sends the token as ``Authorization: Bearer TOKEN``. Every failure is an
:class:`AdminError` whose message says what happened and what to do, for the command
line to print without a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = [
    "ENV_TOKEN",
    "ENV_URL",
    "AdminClient",
    "AdminError",
    "default_admin_url",
    "parse_admin_url",
    "summary_line",
]

#: The environment variable holding the admin URL of the current program.
ENV_URL = "MONARCH_ADMIN_URL"
#: The environment variable holding the token, when the URL does not carry one.
ENV_TOKEN = "MONARCH_ADMIN_TOKEN"

JSON = dict[str, Any]


class AdminError(Exception):
    """The admin server could not be asked, or refused: the message says why and what
    to do. ``status`` is the HTTP status (``None`` when nothing answered)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def default_admin_url() -> str | None:
    """The admin URL of the current program when one is known: ``$MONARCH_ADMIN_URL``."""
    url = os.environ.get(ENV_URL, "").strip()
    return url or None


def parse_admin_url(url: str, token: str | None = None) -> tuple[str, str | None]:
    """``(base_url, token)`` of what a program printed: ``http://host:port/?token=T``,
    ``host:port`` (then ``http``), with ``token`` (else the URL's, else
    ``$MONARCH_ADMIN_TOKEN``). The base URL ends with ``/``. :class:`ValueError` for a
    URL that is not one."""
    text = url.strip()
    if not text:
        raise ValueError("the admin URL is empty")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http(s) URL")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r} has a port that is not a number") from None
    if not parts.hostname or port is None:
        raise ValueError(f"{url!r} has no host:port, e.g. http://127.0.0.1:8265/?token=...")
    query = urllib.parse.parse_qs(parts.query)
    found = (query.get("token") or [""])[0]
    chosen = token or found or os.environ.get(ENV_TOKEN) or None
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return base, chosen


class AdminClient:
    """Asks the admin server at ``url`` (what the program printed; see
    :func:`parse_admin_url`). Each method is one GET of the JSON API and returns its
    object; ``timeout`` is in seconds."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 5.0) -> None:
        self.base_url, self.token = parse_admin_url(url, token)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"AdminClient({self.base_url!r})"

    # The routes of the API, version 1.

    def summary(self) -> JSON:
        return self.get("v1/summary")

    def snapshot(self) -> JSON:
        return self.get("v1/snapshot")

    def events(self, since: int = 0, limit: int | None = None) -> JSON:
        return self.get("v1/events", since=since, limit=limit)

    def logs(
        self,
        q: str | None = None,
        proc: str | None = None,
        actor: str | None = None,
        limit: int | None = None,
    ) -> JSON:
        return self.get("v1/logs", q=q, proc=proc, actor=actor, limit=limit)

    def actor(self, actor_id: str) -> JSON:
        return self.get("v1/actor", id=actor_id)

    def stack(self, proc: str) -> JSON:
        return self.get("v1/stack", proc=proc)

    def series(self, window: float = 60.0) -> JSON:
        return self.get("v1/series", window=f"{window:g}")

    def get(self, route: str, **params: object) -> JSON:
        """GET ``route`` (relative to the base URL) with the query ``params`` that are
        not ``None``; the JSON object it answered."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items() if v is not None})
        url = self.base_url + route + (f"?{query}" if query else "")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            raise self._refused(route, e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                what = f"no answer within {self.timeout:g} s"
            else:
                what = str(reason) or type(reason).__name__
            raise AdminError(
                f"cannot reach the admin server at {self.base_url} ({what}): the program "
                "may have ended, or this is not the URL it printed (each run prints a "
                "new one)"
            ) from None
        try:
            data = json.loads(body)
        except ValueError:
            raise AdminError(
                f"{self.base_url}{route} answered something that is not JSON: is "
                f"{self.base_url} the admin URL a monarch program printed?"
            ) from None
        if not isinstance(data, dict):
            raise AdminError(f"{self.base_url}{route} answered JSON that is not an object")
        return data

    def _refused(self, route: str, e: urllib.error.HTTPError) -> AdminError:
        detail = ""
        try:
            payload = json.loads(e.read() or b"{}")
            if isinstance(payload, dict) and isinstance(payload.get("error"), str):
                detail = payload["error"]
        except (ValueError, OSError):
            pass
        code = e.code
        if code == 401:
            said = "no token was given" if not self.token else "the token is wrong"
            message = (
                f"the admin server at {self.base_url} refused the request (401): {said}; "
                "use the whole URL the program printed (http://HOST:PORT/?token=...), "
                f"or give --token (or ${ENV_TOKEN})"
            )
        elif code == 403:
            message = (
                f"the admin server at {self.base_url} refused the request (403): "
                f"{detail or 'forbidden'}; the server only answers the host names it "
                "allows (127.0.0.1, localhost, [::1], its bound address and its "
                "allowed_hosts), and no foreign Origin"
            )
        else:
            message = (
                f"{self.base_url}{route} failed ({code} {e.reason}): {detail or 'no detail given'}"
            )
        return AdminError(message, code)


_SINGULAR = {"hosts": "host", "procs": "proc", "meshes": "mesh", "actors": "actor"}


def summary_line(summary: JSON) -> str:
    """One line of a summary: its health, counts and message rate."""
    counts = summary.get("counts") or {}
    messages = summary.get("messages") or {}

    def count(name: str, failed: str | None = None) -> str:
        n = int(counts.get(name) or 0)
        text = f"{n} {name if n != 1 else _SINGULAR[name]}"
        bad = int(counts.get(failed) or 0) if failed else 0
        return text + (f" ({bad} failed)" if bad else "")

    parts = [
        count("hosts"),
        count("procs", "failed_procs"),
        count("meshes"),
        count("actors", "failed_actors"),
        f"{float(messages.get('rate') or 0.0):.1f} msg/s",
    ]
    return f"health {summary.get('health', '?')}: " + ", ".join(parts)
