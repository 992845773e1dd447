"""The post-mortem report: when the client ends the program because of an unhandled
failure and ``dashboard_report`` (``MONARCH_DASHBOARD_REPORT``) names a file, the last
state of the job is written there as one HTML page (:mod:`.report`).

The state comes from this process's monitor (a snapshot gathered from the hosts with
a short timeout, the events and the procs' last lines); nothing here may stop the
program from ending, so every error is reported on stderr and swallowed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

__all__ = ["summarize", "write_postmortem"]

#: How long the report waits for the hosts' snapshots.
SNAPSHOT_TIMEOUT_S = 2.0


def summarize(snapshot: dict[str, Any], program: str, health: str = "failed") -> dict[str, Any]:
    """A summary record (the API's shape) computed from a snapshot."""
    actors = [a for a in snapshot.get("actors", []) if not a.get("system")]
    procs = snapshot.get("procs", [])
    meshes = [m for m in snapshot.get("meshes", []) if not m.get("system")]
    return {
        "version": 1,
        "program": program,
        "pid": os.getpid(),
        "now": time.time(),
        "health": health,
        "counts": {
            "hosts": len(snapshot.get("hosts", [])),
            "procs": len(procs),
            "meshes": len(meshes),
            "actors": len(actors),
            "failed_actors": sum(a.get("status") == "failed" for a in actors),
            "failed_procs": sum(p.get("status") in ("failed", "lost") for p in procs),
        },
        "messages": {
            "handled": sum(int(a.get("handled", 0)) for a in actors),
            "errors": sum(int(a.get("errors", 0)) for a in actors),
            "rate": 0.0,
        },
    }


def write_postmortem(path: str | None = None) -> str | None:
    """Write the report to ``path`` (default: the ``dashboard_report`` config); returns
    the path written, or ``None`` when none is configured or it could not be written."""
    from monarch._src import config

    target = path or str(config.get("dashboard_report") or "")
    if not target:
        return None
    try:
        from monarch._rust_bindings import monitor_events, monitor_logs, monitor_snapshot
        from monarch._src.monitoring.report import write_report

        snapshot = json.loads(monitor_snapshot(SNAPSHOT_TIMEOUT_S))
        events = json.loads(monitor_events(0, 10_000)).get("items", [])
        logs = json.loads(monitor_logs(None, None, 5_000)).get("items", [])
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        write_report(target, summarize(snapshot, program), snapshot, events, logs)
    except Exception as e:
        print(
            f"monarch: could not write the post-mortem report to {target}: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        return None
    print(f"monarch: wrote a post-mortem report to {target}", file=sys.stderr, flush=True)
    return target
