"""Monitoring a running program: the admin server, its web dashboard and ``/metrics``.

::

    from monarch.monitoring import start_dashboard

    dashboard = start_dashboard()  # prints the URL (with its token)

``MONARCH_DASHBOARD=1`` does the same without a change to the program, and
``job.enable_telemetry()`` from a job. ``monarch top URL`` watches the same server from
a terminal. Guide: [Monitoring](../monitoring.md). Importing this module starts
nothing.
"""

from monarch._src.monitoring.dashboard import (
    Dashboard,
    current_dashboard,
    start_dashboard,
    stop_dashboard,
)
from monarch._src.monitoring.report import write_report

__all__ = ["Dashboard", "current_dashboard", "start_dashboard", "stop_dashboard", "write_report"]
