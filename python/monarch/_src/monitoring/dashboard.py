"""The admin server of this process: a JSON API, ``/metrics`` and the web dashboard.

:func:`start_dashboard` starts it (once per process) on the Rust runtime, over the
meshes this process owns; it answers while Python is busy. It binds the loopback
interface on a free port unless told otherwise, and every request needs the
server's token: the URL it prints carries it (opening that URL trades it for a
cookie). ``MONARCH_DASHBOARD=1`` starts it when the program first uses the actor API;
``job.enable_admin()`` / ``job.enable_telemetry()`` start it from ``job.state()``.
Guide: ``docs/monitoring.md``.
"""

from __future__ import annotations

import html
import importlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Dashboard",
    "current_dashboard",
    "start_dashboard",
    "start_from_config",
    "stop_dashboard",
]

_lock = threading.Lock()
_current: Dashboard | None = None


@dataclass(frozen=True)
class _Options:
    addr: str
    allowed_hosts: tuple[str, ...]
    actions: bool
    tls_cert: str | None
    tls_key: str | None


class Dashboard:
    """A running admin server. ``url`` (with the token) opens the dashboard;
    ``metrics_url`` is for Prometheus (send the token as a bearer token); ``stop()``
    ends it (it also ends with the process)."""

    def __init__(self, server: Any, options: _Options) -> None:
        self._server = server
        self._options = options

    @property
    def url(self) -> str:
        """The dashboard's URL, with the token: open it in a browser."""
        return str(self._server.url)

    @property
    def base_url(self) -> str:
        """The server's URL without the token (for ``monarch top URL --token``)."""
        return str(self._server.base_url)

    @property
    def token(self) -> str:
        """The token every request needs (cookie, ``?token=`` or ``Authorization:
        Bearer``)."""
        return str(self._server.token)

    @property
    def port(self) -> int:
        return int(self._server.port)

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes (with ``authorization: {credentials: <token>}``)."""
        return self.base_url.rstrip("/") + "/metrics"

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        global _current
        self._server.stop()
        with _lock:
            if _current is self:
                _current = None

    def __repr__(self) -> str:
        return f"Dashboard({self.base_url})"

    def _repr_html_(self) -> str:
        url = html.escape(self.url, quote=True)
        return f'<a href="{url}" target="_blank" rel="noopener">Monarch dashboard</a>'


def _options(
    addr: str | None,
    allowed_hosts: tuple[str, ...] | list[str],
    actions: bool,
    tls_cert: str | None,
    tls_key: str | None,
) -> _Options:
    if addr is None or addr in ("", "1", "true", "yes", "on"):
        addr = "127.0.0.1:0"
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(
            f"the dashboard address {addr!r} is not host:port; give e.g. "
            "'127.0.0.1:8265', or '0.0.0.0:8265' to serve every interface (the token "
            "still guards it)"
        )
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("the dashboard's TLS needs both tls_cert and tls_key (PEM paths)")
    return _Options(addr, tuple(allowed_hosts), bool(actions), tls_cert, tls_key)


def start_dashboard(
    addr: str | None = None,
    *,
    allowed_hosts: tuple[str, ...] | list[str] = (),
    actions: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    announce: bool = True,
    agent: Any = None,
) -> Dashboard:
    """Start this process's admin server and dashboard, or return the running one.

    ``addr`` is ``host:port`` (default ``127.0.0.1:0``: loopback, a free port).
    ``allowed_hosts`` adds names the browser may use to reach it (behind a proxy, say:
    the ``Host`` header is checked against them, against DNS rebinding). ``actions``
    enables the admin actions (killing a proc); the server is read-only without.
    ``tls_cert``/``tls_key`` (PEM paths) serve HTTPS. ``announce`` prints the URL (to
    stderr; in a notebook, a link). Starts the actor runtime of this process if it is
    not running yet (``agent`` is for the runtime's own start, which passes its agent).
    """
    global _current
    options = _options(addr, allowed_hosts, actions, tls_cert, tls_key)
    with _lock:
        running = _current
        if running is not None:
            if options != running._options and (addr is not None or actions or tls_cert):
                raise RuntimeError(
                    f"a dashboard already runs in this process at {running.base_url} with "
                    "other settings; stop it first (current_dashboard().stop())"
                )
            return running
        from monarch._rust_bindings import AdminConfig, AdminServer
        from monarch._src.actor import process

        if agent is None:
            agent = process.get().agent
        config = AdminConfig(
            bind=options.addr,
            allowed_hosts=list(options.allowed_hosts),
            actions=options.actions,
            tls_cert=options.tls_cert,
            tls_key=options.tls_key,
        )
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        dashboard = Dashboard(AdminServer.serve_live(agent, config, program), options)
        _current = dashboard
    if announce:
        _announce(dashboard)
    return dashboard


def _announce(dashboard: Dashboard) -> None:
    print(f"Monarch dashboard: {dashboard.url}", file=sys.stderr, flush=True)
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    try:
        shell = ipython.get_ipython()
        if shell is not None and getattr(shell, "kernel", None) is not None:
            shown: Any = importlib.import_module("IPython.display")
            shown.display(shown.HTML(dashboard._repr_html_()))
    except Exception:  # a notebook link is a convenience: never fail the start for it
        pass


def current_dashboard() -> Dashboard | None:
    """The dashboard running in this process, if any."""
    return _current


def stop_dashboard() -> None:
    """Stop this process's dashboard, if one runs."""
    running = _current
    if running is not None:
        running.stop()


def configured_address() -> str | None:
    """What the config asks the client's dashboard to serve on: ``None`` (off), ``"1"``
    (the loopback interface, a free port) or ``HOST:PORT``. ``dashboard`` decides;
    when it only says on (``1``, ``true``) and ``mesh_admin_addr`` (upstream's admin
    server address) is set, that address."""
    from monarch._src import config

    value = str(config.get("dashboard") or "").strip()
    if value.lower() in ("", "0", "false", "no", "off"):
        return None
    if value.lower() in ("1", "true", "yes", "on") and config.is_set("mesh_admin_addr"):
        return str(config.get("mesh_admin_addr"))
    return value


def start_from_config(agent: Any) -> None:
    """Start the dashboard when the ``dashboard`` config (``MONARCH_DASHBOARD``) asks;
    a bad value or a port in use is reported on stderr and leaves the program running."""
    value = configured_address()
    if value is None:
        return
    try:
        start_dashboard(value, agent=agent)
    except Exception as e:
        print(
            f"monarch: MONARCH_DASHBOARD={value!r}: the dashboard did not start: {e}",
            file=sys.stderr,
            flush=True,
        )
