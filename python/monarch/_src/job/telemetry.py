"""Monitoring of a job: ``job.enable_admin()`` and ``job.enable_telemetry()``.

Both start this process's admin server (:mod:`monarch._src.monitoring.dashboard`) when
``job.state()`` connects, and put its URLs on the returned state: ``admin_url`` (the
JSON API and ``monarch top``), ``dashboard_url`` (the web page) and ``telemetry_url``.
The URLs carry the server's token. The settings travel with the job when it is saved;
the server itself lives in the process that called ``state()``.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch._src.job.job import JobState

__all__ = ["MeshAdminConfig", "TelemetryConfig", "config_from_kwargs", "start_for_state"]

logger = logging.getLogger(__name__)


@dataclass
class TelemetryConfig:
    """What ``job.enable_telemetry()`` turns on.

    ``include_dashboard`` prints the dashboard's URL when ``state()`` starts it and
    prefers ``dashboard_port`` (a free port when that one is taken).
    ``retention_secs`` bounds the history the server keeps (its time series keep at
    most 15 minutes); ``batch_size`` and ``snapshot_interval_secs`` are accepted for
    compatibility: snapshots here are taken on demand, while someone watches.
    """

    batch_size: int = 1000
    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


@dataclass
class MeshAdminConfig:
    """What ``job.enable_admin()`` turns on: the admin server, bound to ``admin_addr``
    (``host:port``; default: loopback, a free port)."""

    admin_addr: str | None = None


def config_from_kwargs(cls: type[Any], config: Any, kwargs: dict[str, Any], verb: str) -> Any:
    """``config``, or one built from ``kwargs`` (upstream accepts both forms)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise TypeError(
            f"{verb}() got unknown settings {unknown}; {cls.__name__} takes {sorted(names)}"
        )
    if config is None:
        return cls(**kwargs)
    if not isinstance(config, cls):
        raise TypeError(f"{verb}() takes a {cls.__name__}, got {type(config).__name__}")
    if kwargs:
        raise TypeError(f"{verb}() takes a {cls.__name__} or keyword settings, not both")
    return config


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_for_state(
    state: JobState, admin: MeshAdminConfig | None, telemetry: TelemetryConfig | None
) -> None:
    """Start (or reuse) this process's dashboard and set the state's URLs."""
    if admin is None and telemetry is None:
        return
    from monarch._src.monitoring.dashboard import current_dashboard, start_dashboard

    dashboard = current_dashboard()
    if dashboard is None:
        addr = admin.admin_addr if admin is not None else None
        if addr is None and telemetry is not None and telemetry.include_dashboard:
            port = telemetry.dashboard_port
            addr = f"127.0.0.1:{port}" if port and _port_free(port) else None
        announce = telemetry is not None and telemetry.include_dashboard
        dashboard = start_dashboard(addr, announce=announce)
    state.admin_url = dashboard.url
    state.telemetry_url = dashboard.base_url
    if telemetry is not None or admin is not None:
        state.dashboard_url = dashboard.url
