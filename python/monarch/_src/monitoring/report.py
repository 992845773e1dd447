"""The post-mortem report of a monarch program: one self-contained HTML file (inline
CSS, no script, nothing fetched from elsewhere) of its last state, written when the
program ends on a failure. Sections, the failures first: the failures with their cause
chains, the tree of hosts, procs and actors with their statuses, the events, the last
log lines of the procs that failed, and the counters of every actor. The inputs are the
admin server's JSON shapes (version 1): summary, snapshot, events and log records.
"""

from __future__ import annotations

import html
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

from monarch._src.monitoring.tui_render import STATUS_STYLE

__all__ = ["render_report", "write_report"]

JSON = dict[str, Any]

#: Log lines shown per failed proc.
LOG_LINES = 60

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 2px 10px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
tr:nth-child(even) td { background: #fafafa; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px/1.35 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
.s { font-weight: 600; padding: 0 0.4em; border-radius: 3px; }
.ok { color: #136c2e; } .busy { color: #0b5e8a; } .warn { color: #8a5a00; }
.bad { color: #b00020; } .dim { color: #777; }
.health { font-size: 1.1em; }
.failure { border-left: 4px solid #b00020; padding: 0.3em 0.8em; margin: 0.6em 0; }
.cause { margin: 0.2em 0 0 1.2em; padding: 0; }
.meta { color: #555; }
.err { color: #b00020; }
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _status(value: object) -> str:
    text = str(value or "?")
    return f'<span class="s {STATUS_STYLE.get(text, "dim")}">{_e(text)}</span>'


def _when(t: object) -> str:
    if not isinstance(t, (int, float)) or t <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _items(value: object) -> list[JSON]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        cells = (
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        out += ["<tr>", *cells, "</tr>"]
    out.append("</table>")
    return "".join(out)


def _chain(cause: object) -> str:
    items = [str(c) for c in cause] if isinstance(cause, list) else []
    if not items:
        return ""
    return '<ol class="cause">' + "".join(f"<li>{_e(c)}</li>" for c in items) + "</ol>"


def _label(actor: JSON) -> str:
    rank = actor.get("rank")
    name = f"{actor.get('name') or '?'}" + (f"[{rank}]" if rank is not None else "")
    return f"{name} {actor.get('class') or ''}".strip()


def _failures(snapshot: JSON, events: list[JSON]) -> str:
    procs = {str(p.get("id")): p for p in _items(snapshot.get("procs"))}
    hosts = {str(h.get("id")): h for h in _items(snapshot.get("hosts"))}
    parts: list[str] = []
    for a in _items(snapshot.get("actors")):
        f = a.get("failure")
        if not isinstance(f, dict) and a.get("status") != "failed":
            continue
        f = f if isinstance(f, dict) else {}
        proc = procs.get(str(a.get("proc")), {})
        host = hosts.get(str(proc.get("host")), {})
        where = f"proc rank {proc.get('rank')}, pid {proc.get('pid')}" if proc else "proc ?"
        if host:
            where += f", host {host.get('hostname') or host.get('id')}"
        parts.append(
            f'<div class="failure"><b>actor {_e(_label(a))}</b> '
            f'<span class="meta">({_e(f.get("class") or "unknown")}; {_e(where)})</span>'
            f"<div>{_e(f.get('reason') or 'failed')}</div>{_chain(f.get('cause'))}"
            f'<div class="meta"><code>{_e(a.get("id"))}</code></div></div>'
        )
    for p in procs.values():
        if p.get("status") not in ("failed", "lost"):
            continue
        ended = p.get("exit") if isinstance(p.get("exit"), dict) else None
        reason = (ended or {}).get("reason") or p.get("status")
        host = hosts.get(str(p.get("host")), {})
        parts.append(
            f'<div class="failure"><b>proc rank {_e(p.get("rank"))} (pid {_e(p.get("pid"))})'
            f"</b> {_status(p.get('status'))} "
            f'<span class="meta">on {_e(host.get("hostname") or p.get("host"))}</span>'
            f"<div>{_e(reason)}</div>"
            f'<div class="meta"><code>{_e(p.get("id"))}</code></div></div>'
        )
    for h in hosts.values():
        if h.get("status") == "lost":
            parts.append(
                f'<div class="failure"><b>host {_e(h.get("hostname") or h.get("id"))}</b> '
                f"{_status('lost')} <div>no heartbeat for "
                f"{_num(h.get('heartbeat_age_ms')) / 1000:.1f} s</div></div>"
            )
    for ev in events:
        if ev.get("kind") in ("actor_failed", "proc_exited", "proc_lost", "host_lost"):
            continue  # shown above through the snapshot
        if ev.get("class"):
            parts.append(
                f'<div class="failure"><b>{_e(ev.get("kind"))}</b> '
                f"<div>{_e(ev.get('message'))}</div>{_chain(ev.get('cause'))}</div>"
            )
    return "".join(parts) or "<p>No failures.</p>"


def _tree(snapshot: JSON) -> str:
    procs = _items(snapshot.get("procs"))
    actors = _items(snapshot.get("actors"))
    meshes = {str(m.get("id")): m for m in _items(snapshot.get("meshes"))}
    out = ["<ul>"]
    for h in _items(snapshot.get("hosts")):
        out.append(
            f"<li>host <b>{_e(h.get('hostname') or h.get('id'))}</b> {_status(h.get('status'))}"
            f' <span class="meta">{_e(h.get("addr"))}, {_e(h.get("cpus"))} cpus</span><ul>'
        )
        for p in (p for p in procs if p.get("host") == h.get("id")):
            ended = p.get("exit") if isinstance(p.get("exit"), dict) else None
            out.append(
                f"<li>proc rank {_e(p.get('rank'))} pid {_e(p.get('pid'))} "
                f"{_status(p.get('status'))}"
                f' <span class="meta">{_e(p.get("mesh"))}'
                f"{(': ' + _e(ended.get('reason'))) if ended else ''}</span><ul>"
            )
            for a in (a for a in actors if a.get("proc") == p.get("id")):
                mesh = meshes.get(str(a.get("mesh")), {})
                system = " (system)" if a.get("system") else ""
                out.append(
                    f"<li>{_e(_label(a))}{system} {_status(a.get('status'))}"
                    f' <span class="meta">mesh {_e(mesh.get("name") or "-")}</span></li>'
                )
            out.append("</ul></li>")
        out.append("</ul></li>")
    out.append("</ul>")
    return "".join(out)


def _events(events: list[JSON]) -> str:
    if not events:
        return "<p>No events.</p>"
    rows = [
        [
            _e(ev.get("seq")),
            _e(_when(ev.get("time"))),
            _e(ev.get("kind")),
            _e(ev.get("class") or ""),
            _e(ev.get("message")) + _chain(ev.get("cause")),
        ]
        for ev in events
    ]
    return _table(["#", "time", "kind", "class", "what"], rows, {0})


def _logs(snapshot: JSON, logs: list[JSON]) -> str:
    failed = [
        p
        for p in _items(snapshot.get("procs"))
        if p.get("status") in ("failed", "lost")
        or any(
            a.get("proc") == p.get("id") and a.get("status") == "failed"
            for a in _items(snapshot.get("actors"))
        )
    ]
    if not failed:
        return "<p>No proc failed.</p>"
    out = []
    for p in failed:
        lines = [r for r in logs if r.get("proc") == p.get("id")][-LOG_LINES:]
        text = "\n".join(
            (
                f'<span class="err">{_e(r.get("line"))}</span>'
                if r.get("stream") == "stderr"
                else _e(r.get("line"))
            )
            for r in lines
        )
        out.append(
            f"<h3>proc rank {_e(p.get('rank'))} (pid {_e(p.get('pid'))}): the last "
            f"{len(lines)} lines</h3><pre>{text or '(no log lines)'}</pre>"
        )
    return "".join(out)


def _counters(snapshot: JSON) -> str:
    rows = []
    for a in _items(snapshot.get("actors")):
        endpoints: JSON = a["endpoints"] if isinstance(a.get("endpoints"), dict) else {}
        per = ", ".join(
            f"{name} {int(_num(e.get('count')))}"
            + (f" ({int(_num(e.get('errors')))} errors)" if _num(e.get("errors")) else "")
            + (
                f" mean {_num(e.get('total_ms')) / _num(e.get('count')):.2f} ms"
                if _num(e.get("count"))
                else ""
            )
            for name, e in endpoints.items()
            if isinstance(e, dict)
        )
        current = a.get("current") if isinstance(a.get("current"), dict) else None
        rows.append(
            [
                _e(_label(a)) + (" (system)" if a.get("system") else ""),
                _status(a.get("status")),
                _e(int(_num(a.get("handled")))),
                _e(int(_num(a.get("errors")))),
                _e(f"{_num(a.get('busy_ms')):.1f}"),
                _e(int(_num(a.get("queue")))),
                _e(f"{current.get('endpoint')} for {_num(current.get('since_ms')):.0f} ms")
                if current
                else "-",
                _e(per or "-"),
            ]
        )
    head = ["actor", "status", "handled", "errors", "busy ms", "queue", "current", "endpoints"]
    return _table(head, rows, {2, 3, 4, 5}) if rows else "<p>No actors.</p>"


def render_report(
    summary: JSON | None,
    snapshot: JSON | None,
    events: Sequence[JSON] | None = None,
    logs: Sequence[JSON] | None = None,
) -> str:
    """The report as HTML text (see :func:`write_report`)."""
    s = summary or {}
    snap = snapshot or {}
    evs = [e for e in events or [] if isinstance(e, dict)]
    recs = [r for r in logs or [] if isinstance(r, dict)]
    counts = s.get("counts") or {}
    messages = s.get("messages") or {}
    program = s.get("program") or "monarch program"
    count_text = ", ".join(f"{_e(v)} {_e(k).replace('_', ' ')}" for k, v in counts.items())
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>monarch report: {_e(program)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(program)}</h1>"
        f'<p class="health">health {_status(s.get("health") or "unknown")}</p>'
        f'<p class="meta">pid {_e(s.get("pid", "?"))}, session {_e(s.get("session", "?"))}, '
        f"started {_e(_when(s.get('started_at')))}, last state "
        f"{_e(_when(s.get('now') or snap.get('time')))}</p>"
        f"<p>{count_text or 'no counts'}; {_e(int(_num(messages.get('handled'))))} messages "
        f"handled, {_e(int(_num(messages.get('errors'))))} errors</p>"
        f"<h2>Failures</h2>{_failures(snap, evs)}"
        f"<h2>Hosts, procs and actors</h2>{_tree(snap)}"
        f"<h2>Events</h2>{_events(evs)}"
        f"<h2>Last log lines of the failed procs</h2>{_logs(snap, recs)}"
        f"<h2>Counters per actor</h2>{_counters(snap)}"
        '<p class="meta">Written by monarch from the admin server\'s last snapshot.</p>'
        "</body></html>\n"
    )


def write_report(
    path: str | os.PathLike[str],
    summary: JSON | None,
    snapshot: JSON | None,
    events: Sequence[JSON] | None = None,
    logs: Sequence[JSON] | None = None,
) -> None:
    """Write the report of the program's last state to ``path`` (one HTML file; written
    to a temporary file beside it, then renamed, so a reader never sees half of it)."""
    text = render_report(summary, snapshot, events, logs)
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
