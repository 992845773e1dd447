"""The screens of ``monarch top``, drawn as text: a pure function of the admin server's
snapshot and summary (JSON API version 1), the view state and the screen size, so that
tests compare text. The key bindings (:func:`handle_key`) are pure too: they change the
:class:`ViewState` and say what the UI must fetch.

A screen is a list of :class:`Line`: its text (at most ``width`` characters, ASCII only
unless the data is not, no trailing blanks) and the :class:`Span` styles the terminal
shows in colour (``ok``, ``busy``, ``warn``, ``bad``, ``dim``, ``heading``, ``title``,
``selected``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Line",
    "Row",
    "Span",
    "ViewState",
    "clamp_scroll",
    "failures",
    "handle_key",
    "render",
    "render_lines",
    "status_style",
    "tree_rows",
]

JSON = dict[str, Any]

#: The style of each status of a host, proc, mesh or actor (and of the health); the
#: post-mortem report uses the same classes.
STATUS_STYLE = {
    "alive": "ok",
    "running": "ok",
    "idle": "ok",
    "ok": "ok",
    "processing": "busy",
    "initializing": "busy",
    "stopping": "busy",
    "degraded": "warn",
    "stopped": "dim",
    "exited": "dim",
    "failed": "bad",
    "lost": "bad",
}

_FAILED = ("failed", "lost")

HELP = [
    "KEYS",
    "",
    "  j, Down         move down (scroll in a detail pane)",
    "  k, Up           move up",
    "  PgDn, PgUp      move by a page;  g, G: first, last",
    "  Enter, l, Right open the actor (its endpoints and recent logs); expand a host,",
    "                  proc or mesh",
    "  h, Left, BkSp   back; collapse; go to the parent",
    "  s               the stack of every thread of the selected proc",
    "  f               only the failures (and where they are)",
    "  /               filter by text (Enter keeps it, Esc clears it)",
    "  Esc             clear the filters; back",
    "  r               refresh now",
    "  ?               this help",
    "  q               quit",
    "",
    "Statuses: green ok, cyan busy, red failed or lost, grey ended.",
]


def status_style(status: object) -> str:
    """The style of a status (``ok``, ``busy``, ``warn``, ``bad`` or ``dim``)."""
    return STATUS_STYLE.get(str(status), "dim")


@dataclass(frozen=True)
class Span:
    """Columns ``start`` to ``end`` (excluded) of a line shown in ``style``."""

    start: int
    end: int
    style: str


@dataclass
class Line:
    """One line of the screen."""

    text: str = ""
    spans: list[Span] = field(default_factory=list)

    def styled(self, start: int, end: int, style: str) -> Line:
        if end > start:
            self.spans.append(Span(start, end, style))
        return self


@dataclass
class ViewState:
    """What ``monarch top`` shows: the view (``tree``, ``actor``, ``stack`` or
    ``help``), the selected tree row, the collapsed nodes, the filters, and what the UI
    fetched for the detail panes."""

    view: str = "tree"
    selected: str | None = None
    collapsed: set[str] = field(default_factory=set)
    failures_only: bool = False
    filter: str = ""
    typing: bool = False
    actor: str | None = None
    logs: list[JSON] = field(default_factory=list)
    stack_proc: str | None = None
    stack: JSON | None = None
    back: str = "tree"
    scroll: int = 0
    message: str = ""


@dataclass(frozen=True)
class Row:
    """A row of the tree: ``kind`` is ``host``, ``proc``, ``mesh`` or ``actor``."""

    key: str
    kind: str
    depth: int
    label: str
    record: JSON
    proc: str | None
    children: int
    collapsed: bool


# --- formatting ---------------------------------------------------------------------


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, a cut marked by a final ``~``."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - 1] + "~"


def fmt_bytes(n: object) -> str:
    value = float(n) if isinstance(n, (int, float)) else 0.0
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1000 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}T"


def fmt_ms(ms: object) -> str:
    value = float(ms) if isinstance(ms, (int, float)) else 0.0
    if value < 1000:
        return f"{value:.1f}ms"
    if value < 60_000:
        return f"{value / 1000:.1f}s"
    return fmt_duration(value / 1000)


def fmt_duration(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _actor_label(actor: JSON) -> str:
    name = actor.get("name") or "?"
    rank = actor.get("rank")
    where = f"[{rank}]" if rank is not None else ""
    cls = actor.get("class")
    return f"{name}{where} {cls}" if cls else f"{name}{where}"


def _proc_label(proc: JSON) -> str:
    rank = proc.get("rank")
    pid = proc.get("pid")
    head = f"proc r{rank}" if rank is not None else "proc"
    return f"{head} pid {pid}" if pid is not None else f"{head} {proc.get('id', '?')}"


def _host_label(host: JSON) -> str:
    name = host.get("hostname")
    return f"{host.get('id', '?')} {name}" if name else str(host.get("id", "?"))


def _current(actor: JSON) -> str:
    current = actor.get("current")
    if isinstance(current, dict) and current.get("endpoint"):
        return f"{current['endpoint']} {fmt_ms(current.get('since_ms'))}"
    return "-"


# --- the tree -----------------------------------------------------------------------


@dataclass
class _Node:
    row: Row
    text: str  # what the text filter looks at
    failed: bool
    children: list[_Node] = field(default_factory=list)


def _index(items: object) -> list[JSON]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _build(snapshot: JSON, collapsed: set[str]) -> list[_Node]:
    hosts = _index(snapshot.get("hosts"))
    procs = _index(snapshot.get("procs"))
    meshes = _index(snapshot.get("meshes"))
    actors = [a for a in _index(snapshot.get("actors")) if not a.get("system")]
    mesh_by_id = {str(m.get("id")): m for m in meshes}
    mesh_order = {str(m.get("id")): i for i, m in enumerate(meshes)}
    host_ids = {h.get("id") for h in hosts}
    orphans = [p for p in procs if p.get("host") not in host_ids]
    if orphans:
        hosts = [*hosts, {"id": "(unknown host)", "status": "lost"}]

    def row(key: str, kind: str, depth: int, label: str, record: JSON, proc: str | None) -> Row:
        return Row(key, kind, depth, label, record, proc, 0, key in collapsed)

    nodes: list[_Node] = []
    for host in hosts:
        hkey = f"host:{host.get('id')}"
        hnode = _Node(
            row(hkey, "host", 0, _host_label(host), host, None),
            f"{host.get('id')} {host.get('hostname')} {host.get('addr')}",
            host.get("status") in _FAILED,
        )
        on_host = [p for p in procs if p.get("host") == host.get("id")]
        if host.get("id") == "(unknown host)":
            on_host = orphans
        for proc in on_host:
            pid = str(proc.get("id"))
            pnode = _Node(
                row(f"proc:{pid}", "proc", 1, _proc_label(proc), proc, pid),
                f"{pid} {proc.get('pid')} {proc.get('mesh')}",
                proc.get("status") in _FAILED,
            )
            here = [a for a in actors if a.get("proc") == pid]
            groups: dict[str, list[JSON]] = {}
            for a in here:
                groups.setdefault(str(a.get("mesh")), []).append(a)
            for mid in sorted(groups, key=lambda m: mesh_order.get(m, len(mesh_order))):
                mesh = mesh_by_id.get(mid) or {
                    "id": mid,
                    "name": "(no mesh)",
                    "status": "running",
                }
                here_failed = any(a.get("status") in _FAILED for a in groups[mid])
                own = str(mesh.get("status") or "running")
                shown = "failed" if here_failed else own if own != "failed" else "running"
                mesh = {**mesh, "status": shown}
                label = str(mesh.get("name") or mid)
                if mesh.get("class"):
                    label += f" ({mesh['class']})"
                mnode = _Node(
                    row(f"mesh:{pid}:{mid}", "mesh", 2, label, mesh, pid),
                    f"{mesh.get('name')} {mesh.get('class')}",
                    mesh.get("status") in _FAILED,
                )
                for a in groups[mid]:
                    aid = str(a.get("id"))
                    mnode.children.append(
                        _Node(
                            row(f"actor:{aid}", "actor", 3, _actor_label(a), a, pid),
                            f"{aid} {a.get('name')} {a.get('class')} {a.get('status')}",
                            a.get("status") in _FAILED,
                        )
                    )
                pnode.children.append(mnode)
            hnode.children.append(pnode)
        nodes.append(hnode)
    return nodes


def _keep(node: _Node, needle: str, failures_only: bool, matched_above: bool) -> _Node | None:
    text_ok = matched_above or not needle or needle in node.text.lower()
    kept = [
        k
        for c in node.children
        if (k := _keep(c, needle, failures_only, text_ok and bool(needle))) is not None
    ]
    own = text_ok and (not failures_only or node.failed)
    if not own and not kept:
        return None
    return _Node(node.row, node.text, node.failed, kept)


def tree_rows(snapshot: JSON, state: ViewState) -> list[Row]:
    """The rows of the tree, hosts -> procs -> meshes -> actors (system actors hidden),
    after the filters of ``state``, without the children of collapsed nodes."""
    needle = state.filter.strip().lower()
    rows: list[Row] = []

    def walk(node: _Node) -> None:
        r = node.row
        rows.append(
            Row(r.key, r.kind, r.depth, r.label, r.record, r.proc, len(node.children), r.collapsed)
        )
        if not r.collapsed:
            for child in node.children:
                walk(child)

    for node in _build(snapshot, state.collapsed):
        kept = _keep(node, needle, state.failures_only, False)
        if kept is not None:
            walk(kept)
    return rows


def failures(snapshot: JSON) -> list[tuple[str, str, list[str]]]:
    """The failures of ``snapshot``, each as (where, class: reason, cause chain): the
    failed actors (system ones too), then the procs that ended badly, then lost hosts."""
    procs = {str(p.get("id")): p for p in _index(snapshot.get("procs"))}
    hosts = {str(h.get("id")): h for h in _index(snapshot.get("hosts"))}
    found: list[tuple[str, str, list[str]]] = []
    for a in _index(snapshot.get("actors")):
        f = a.get("failure")
        if a.get("status") != "failed" and not isinstance(f, dict):
            continue
        f = f if isinstance(f, dict) else {}
        proc = procs.get(str(a.get("proc")), {})
        host = hosts.get(str(proc.get("host")), {})
        where = f"{_actor_label(a)} on {_proc_label(proc)}" if proc else _actor_label(a)
        if host.get("hostname"):
            where += f" ({host['hostname']})"
        cls = f.get("class") or "unknown"
        cause = [str(c) for c in f.get("cause") or [] if str(c) != str(f.get("reason"))]
        found.append((where, f"{cls}: {f.get('reason') or 'failed'}", cause))
    for p in procs.values():
        if p.get("status") not in _FAILED:
            continue
        ended: JSON = p["exit"] if isinstance(p.get("exit"), dict) else {}
        host = hosts.get(str(p.get("host")), {})
        where = _proc_label(p) + (f" ({host['hostname']})" if host.get("hostname") else "")
        found.append((where, f"{p.get('status')}: {ended.get('reason') or 'no reason'}", []))
    for h in hosts.values():
        if h.get("status") == "lost":
            age = fmt_ms(h.get("heartbeat_age_ms"))
            found.append((_host_label(h), f"lost: no heartbeat for {age}", []))
    return found


# --- the screens ----------------------------------------------------------------------


def _header(summary: JSON | None, snapshot: JSON, width: int) -> list[Line]:
    s = summary or {}
    counts = s.get("counts") or {}
    messages = s.get("messages") or {}
    health = str(s.get("health") or "unknown")
    program = s.get("program") or "?"
    up = fmt_duration(_num(s.get("now")) - _num(s.get("started_at")))
    lead = f" monarch top  {program} (pid {s.get('pid', '?')})  health "
    first = Line(fit(lead + health.upper() + f"  up {up}", width)).styled(
        0, min(len(lead), width), "title"
    )
    first.styled(len(lead), min(len(lead) + len(health), width), status_style(health))

    def n(key: str) -> int:
        return int(_num(counts.get(key)))

    procs = f"procs {n('procs')}" + (f" ({n('failed_procs')} failed)" if n("failed_procs") else "")
    actors = f"actors {n('actors')}" + (
        f" ({n('failed_actors')} failed)" if n("failed_actors") else ""
    )
    second = (
        f" hosts {n('hosts')}  {procs}  meshes {n('meshes')}  {actors}  "
        f"{_num(messages.get('rate')):.1f} msg/s  handled {int(_num(messages.get('handled')))}"
        f"  errors {int(_num(messages.get('errors')))}"
    )
    return [first, Line(fit(second, width))]


def _columns(width: int) -> tuple[int, int]:
    """The widths of the name and the current columns of the tree."""
    rest = max(width - 33, 24)
    current = max(18, rest * 40 // 100)
    return rest - current, current


def _tree_line(row: Row, width: int, selected: bool) -> Line:
    name_w, cur_w = _columns(width)
    rec = row.record
    marker = (" " if not row.children else "+" if row.collapsed else "-") + " "
    name = fit("  " * row.depth + marker + row.label, name_w - 1).ljust(name_w)
    status = str(rec.get("status") or "?")
    handled = errors = busy = ""
    if row.kind == "actor":
        handled = str(int(_num(rec.get("handled"))))
        errors = str(int(_num(rec.get("errors"))))
        busy = fmt_ms(rec.get("busy_ms"))
        current = _current(rec)
    elif row.kind == "proc":
        ended = rec.get("exit")
        if isinstance(ended, dict) and ended.get("reason"):
            current = str(ended["reason"])
        else:
            current = f"rss {fmt_bytes(rec.get('rss'))} cpu {_num(rec.get('cpu_pct')):.0f}%"
    elif row.kind == "host":
        load = rec.get("load") or [0.0]
        current = f"load {_num(load[0]):.1f} mem {fmt_bytes(rec.get('mem_available'))}"
    else:
        extent = rec.get("extent") or {}
        current = " ".join(f"{k}={v}" for k, v in extent.items()) or "-"
    text = f"{name}{status:<11}{handled:>8}{errors:>5}{busy:>8} {fit(current, cur_w)}"
    line = Line(fit(text, width).rstrip())
    line.styled(name_w, min(name_w + len(status), width), status_style(status))
    if int(_num(rec.get("errors"))) and row.kind == "actor":
        line.styled(name_w + 11 + 8, min(name_w + 24, width), "bad")
    if selected:
        line.spans.insert(0, Span(0, width, "selected"))
    return line


def _heading(width: int) -> Line:
    name_w, _ = _columns(width)
    text = f"{'  NAME':<{name_w}}{'STATUS':<11}{'HANDLED':>8}{'ERRS':>5}{'BUSY':>8} CURRENT"
    return Line(fit(text, width)).styled(0, width, "heading")


def _failure_lines(snapshot: JSON, width: int) -> list[Line]:
    found = failures(snapshot)
    if not found:
        return []
    lines = [Line(fit(f" FAILURES ({len(found)})", width)).styled(0, width, "heading")]
    for where, reason, cause in found:
        lines.append(Line(fit(f" {where}: {reason}", width)).styled(0, width, "bad"))
        lines.extend(Line(fit(f"    <- {c}", width)) for c in cause)
    return lines


def _footer(state: ViewState, width: int, hints: str) -> Line:
    if state.typing:
        return Line(fit(f" filter: /{state.filter}_  (Enter keeps it, Esc clears it)", width))
    if state.message:
        return Line(fit(f" {state.message}", width)).styled(0, width, "warn")
    flags = []
    if state.failures_only:
        flags.append("[failures only]")
    if state.filter:
        flags.append(f"[filter: {state.filter}]")
    text = " " + "  ".join([*flags, hints])
    return Line(fit(text, width)).styled(0, width, "dim")


def _tree_screen(snapshot: JSON, state: ViewState, width: int, height: int) -> list[Line]:
    rows = tree_rows(snapshot, state)
    keys = [r.key for r in rows]
    cursor = keys.index(state.selected) if state.selected in keys else 0
    fails = _failure_lines(snapshot, width)
    body = [_heading(width)]
    if height <= 0:
        body += [_tree_line(r, width, False) for r in rows]
        if not rows:
            body.append(Line(" (nothing matches)" if state.filter else " (no hosts yet)"))
        return body + fails
    room = height - 2 - 1 - 1  # header, column heading, footer
    fail_h = min(len(fails), max(3, room // 3)) if fails else 0
    tree_h = max(room - fail_h, 1)
    if fail_h and len(fails) > fail_h:
        fails = [*fails[: fail_h - 1], Line(fit(f"   ... {len(fails) - fail_h + 1} more", width))]
    top = 0 if cursor < tree_h else cursor - tree_h + 1
    shown = [_tree_line(r, width, i == cursor) for i, r in enumerate(rows)][top : top + tree_h]
    if not rows:
        shown = [Line(" (nothing matches)" if state.filter or state.failures_only else "")]
    body += shown + [Line()] * (tree_h - len(shown)) + fails[:fail_h]
    hints = "j/k move  Enter open  h back  s stack  f failures  / filter  ? help  q quit"
    return [*body, _footer(state, width, hints)]


def _find(snapshot: JSON, kind: str, ident: str | None) -> JSON | None:
    for item in _index(snapshot.get(kind)):
        if str(item.get("id")) == ident:
            return item
    return None


def _quantile(buckets: list[Any], bounds: list[Any], q: float) -> str:
    total = sum(int(_num(b)) for b in buckets)
    if not total:
        return "-"
    seen = 0
    for i, b in enumerate(buckets):
        seen += int(_num(b))
        if seen >= q * total:
            if i >= len(bounds):
                return f">{_num(bounds[-1]) / 1000:.0f}" if bounds else "?"
            return f"{_num(bounds[i]) / 1000:.3g}"
    return "?"


def _actor_body(snapshot: JSON, state: ViewState, width: int) -> list[Line]:
    actor = _find(snapshot, "actors", state.actor)
    if actor is None:
        return [Line(fit(f" the actor {state.actor} is no longer in the snapshot", width))]
    proc = _find(snapshot, "procs", str(actor.get("proc"))) or {}
    host = _find(snapshot, "hosts", str(proc.get("host"))) or {}
    mesh = _find(snapshot, "meshes", str(actor.get("mesh"))) or {}
    status = str(actor.get("status") or "?")
    title = f" ACTOR {_actor_label(actor)}  "
    lines = [
        Line(fit(title + status, width))
        .styled(0, min(len(title), width), "title")
        .styled(len(title), min(len(title) + len(status), width), status_style(status)),
        Line(fit(f" id {actor.get('id')}", width)),
        Line(
            fit(
                f" {_proc_label(proc)} on {_host_label(host)}  mesh {mesh.get('name', '-')}"
                f"  point {actor.get('point') or {}}",
                width,
            )
        ),
        Line(
            fit(
                f" handled {int(_num(actor.get('handled')))}  errors "
                f"{int(_num(actor.get('errors')))}  busy {fmt_ms(actor.get('busy_ms'))}  "
                f"queue {int(_num(actor.get('queue')))}  current {_current(actor)}",
                width,
            )
        ),
    ]
    failure = actor.get("failure")
    if isinstance(failure, dict):
        lines.append(
            Line(
                fit(f" FAILED ({failure.get('class') or '?'}): {failure.get('reason')}", width)
            ).styled(0, width, "bad")
        )
        lines += [Line(fit(f"    <- {c}", width)) for c in failure.get("cause") or []]
    lines.append(Line())
    head = f" {'ENDPOINT':<20}{'COUNT':>8}{'ERRORS':>8}{'TOTAL_MS':>11}{'MEAN_MS':>9}"
    lines.append(Line(fit(head + f"{'P50_MS':>8}{'P99_MS':>8}", width)).styled(0, width, "heading"))
    bounds = snapshot.get("bucket_bounds_us") or []
    endpoints = actor.get("endpoints") or {}
    for name, e in sorted(endpoints.items(), key=lambda kv: -_num(kv[1].get("count"))):
        count = int(_num(e.get("count")))
        total = _num(e.get("total_ms"))
        mean = f"{total / count:.2f}" if count else "-"
        buckets = list(e.get("buckets") or [])
        text = (
            f" {fit(str(name), 19):<20}{count:>8}{int(_num(e.get('errors'))):>8}"
            f"{total:>11.1f}{mean:>9}{_quantile(buckets, bounds, 0.5):>8}"
            f"{_quantile(buckets, bounds, 0.99):>8}"
        )
        line = Line(fit(text, width).rstrip())
        if int(_num(e.get("errors"))):
            line.styled(29, min(37, width), "bad")
        lines.append(line)
    if not endpoints:
        lines.append(Line(" (no messages handled yet)"))
    lines.append(Line())
    lines.append(
        Line(fit(f" RECENT LOGS of {_proc_label(proc)} (newest last)", width)).styled(
            0, width, "heading"
        )
    )
    now = _num(snapshot.get("time"))
    for record in state.logs:
        age = fmt_duration(now - _num(record.get("time"))) if now else "?"
        stream = "err" if record.get("stream") == "stderr" else "out"
        line = Line(fit(f" -{age:<6} {stream} {record.get('line', '')}", width).rstrip())
        if stream == "err":
            line.styled(9, 12, "warn")
        lines.append(line)
    if not state.logs:
        lines.append(Line(" (no log lines)"))
    return lines


def _stack_body(snapshot: JSON, state: ViewState, width: int) -> list[Line]:
    proc = _find(snapshot, "procs", state.stack_proc) or {"id": state.stack_proc}
    stack = state.stack
    if stack is None:
        return [Line(fit(f" fetching the stack of {_proc_label(proc)} ...", width))]
    title = f" STACK of {_proc_label(proc)} ({stack.get('method', '?')})"
    lines = [Line(fit(title, width)).styled(0, width, "title")]
    text = str(stack.get("text") or "(empty)")
    lines += [Line(fit(" " + t.expandtabs(4), width).rstrip()) for t in text.splitlines()]
    return lines


def _detail(snapshot: JSON, state: ViewState, width: int) -> tuple[list[Line], str]:
    """The body and the key hints of the actor, stack and help views."""
    if state.view == "actor":
        return _actor_body(snapshot, state, width), "h back  j/k scroll  s stack  ? help  q quit"
    if state.view == "stack":
        return _stack_body(snapshot, state, width), "h back  j/k scroll  q quit"
    return [Line(fit(" " + t, width).rstrip()) for t in HELP], "h back  q quit"


def clamp_scroll(snapshot: JSON | None, state: ViewState, width: int, height: int) -> None:
    """Keep ``state.scroll`` within what the detail view has to scroll at this size."""
    if state.view == "tree":
        state.scroll = 0
        return
    body, _ = _detail(snapshot or {}, state, max(width, 20))
    room = max(height - 3, 1)
    state.scroll = max(0, min(state.scroll, len(body) - room))


def render_lines(
    snapshot: JSON | None, summary: JSON | None, state: ViewState, width: int, height: int
) -> list[Line]:
    """The screen for ``state``: ``height`` lines of at most ``width`` characters, or,
    with ``height <= 0``, every line of the view (for ``monarch top --once``)."""
    width = max(width, 20)
    snap = snapshot or {}
    lines = _header(summary, snap, width)
    if state.view == "tree":
        lines += _tree_screen(snap, state, width, height)
        return lines[:height] if height > 0 else lines
    body, hints = _detail(snap, state, width)
    if height <= 0:
        return lines + body
    room = max(height - len(lines) - 1, 1)
    start = min(state.scroll, max(len(body) - room, 0))
    shown = body[start : start + room]
    lines += shown + [Line()] * (room - len(shown))
    lines.append(_footer(state, width, hints))
    return lines[:height]


def render(
    snapshot: JSON | None, summary: JSON | None, state: ViewState, width: int, height: int
) -> list[str]:
    """The text of :func:`render_lines`."""
    return [line.text for line in render_lines(snapshot, summary, state, width, height)]


# --- the keys -------------------------------------------------------------------------


def _move(state: ViewState, rows: list[Row], index: int) -> None:
    if rows:
        state.selected = rows[max(0, min(index, len(rows) - 1))].key


def _parent(rows: list[Row], index: int) -> int:
    depth = rows[index].depth
    for i in range(index - 1, -1, -1):
        if rows[i].depth < depth:
            return i
    return index


def _edit_filter(state: ViewState, key: str) -> None:
    if key == "enter":
        state.typing = False
    elif key == "esc":
        state.typing = False
        state.filter = ""
    elif key == "backspace":
        state.filter = state.filter[:-1]
    elif len(key) == 1 and key.isprintable():
        state.filter += key


def handle_key(state: ViewState, key: str, snapshot: JSON | None) -> str | None:
    """Apply ``key`` (a character, or ``up``, ``down``, ``left``, ``right``, ``enter``,
    ``backspace``, ``esc``, ``pgup``, ``pgdn``, ``home``, ``end``) to ``state``; what
    the UI must do then: ``quit``, ``refresh``, ``logs`` (of ``state.actor``), ``stack``
    (of ``state.stack_proc``) or ``None``."""
    state.message = ""
    if state.typing:
        _edit_filter(state, key)
        return None
    if key == "q":
        return "quit"
    if key == "r":
        return "refresh"
    if key == "?":
        if state.view != "help":
            state.back, state.view, state.scroll = state.view, "help", 0
        return None
    snap = snapshot or {}
    if state.view != "tree":
        return _detail_key(state, key, snap)
    rows = tree_rows(snap, state)
    keys = [r.key for r in rows]
    index = keys.index(state.selected) if state.selected in keys else 0
    row = rows[index] if rows else None
    if key in ("j", "down"):
        _move(state, rows, index + 1)
    elif key in ("k", "up"):
        _move(state, rows, index - 1)
    elif key == "pgdn":
        _move(state, rows, index + 10)
    elif key == "pgup":
        _move(state, rows, index - 10)
    elif key in ("g", "home"):
        _move(state, rows, 0)
    elif key in ("G", "end"):
        _move(state, rows, len(rows) - 1)
    elif key in ("enter", "l", "right") and row is not None:
        state.selected = row.key
        if row.kind == "actor":
            state.view, state.actor, state.logs, state.scroll = "actor", row.record["id"], [], 0
            return "logs"
        if row.collapsed:
            state.collapsed.discard(row.key)
        elif key == "enter" and row.children:
            state.collapsed.add(row.key)
        elif row.children:
            _move(state, rows, index + 1)
    elif key in ("h", "left", "backspace") and row is not None:
        if row.children and not row.collapsed:
            state.collapsed.add(row.key)
            state.selected = row.key
        else:
            _move(state, rows, _parent(rows, index))
    elif key == "s":
        if row is None or row.proc is None:
            state.message = "select a proc or an actor (j/k) to see its stack"
            return None
        state.selected = row.key
        return _open_stack(state, row.proc)
    elif key == "f":
        state.failures_only = not state.failures_only
    elif key == "/":
        state.typing, state.filter = True, ""
    elif key == "esc":
        state.filter, state.failures_only = "", False
    return None


def _open_stack(state: ViewState, proc: str) -> str:
    state.back = state.view if state.view in ("tree", "actor") else "tree"
    state.view, state.stack_proc, state.stack, state.scroll = "stack", proc, None, 0
    return "stack"


def _detail_key(state: ViewState, key: str, snapshot: JSON) -> str | None:
    if key in ("h", "left", "backspace", "esc") or (key == "enter" and state.view == "help"):
        state.view = state.back if state.view in ("stack", "help") else "tree"
        state.back, state.scroll = "tree", 0
    elif key in ("j", "down"):
        state.scroll += 1
    elif key in ("k", "up"):
        state.scroll = max(state.scroll - 1, 0)
    elif key == "pgdn":
        state.scroll += 10
    elif key == "pgup":
        state.scroll = max(state.scroll - 10, 0)
    elif key in ("g", "home"):
        state.scroll = 0
    elif key == "s" and state.view == "actor":
        actor = _find(snapshot, "actors", state.actor)
        if actor is not None and actor.get("proc"):
            return _open_stack(state, str(actor["proc"]))
    return None


def lines_text(lines: Iterable[Line]) -> str:
    """The lines as one text, each ending with a newline."""
    return "".join(line.text + "\n" for line in lines)
