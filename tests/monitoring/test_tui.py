"""``monarch top``: the renderer's screens (golden text at 80x24 and 120x40), the keys
as state transitions, the client's errors, the command end to end (``--once``,
``--json``, its exit statuses) against an admin server over the recorded job, and the
curses UI in a pseudo-terminal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from tui_helpers import FIXTURES, STUB_STACK, StubServer, recorded, serve_recorded

from monarch._src.cli import parser as cli_parser
from monarch._src.monitoring import tui
from monarch._src.monitoring.client import (
    ENV_TOKEN,
    ENV_URL,
    AdminClient,
    AdminError,
    parse_admin_url,
    summary_line,
)
from monarch._src.monitoring.tui_render import (
    ViewState,
    clamp_scroll,
    failures,
    handle_key,
    render,
    render_lines,
    tree_rows,
)

pytestmark = pytest.mark.timeout(60)

#: Seconds a command (or one wait for the terminal UI) may take.
TIMEOUT = 30.0

DATA = recorded()
SNAPSHOT: dict[str, Any] = DATA["snapshot"]
SUMMARY: dict[str, Any] = DATA["summary"]
BUSY = "proc-00a1@unix:@/tmp/hyperactor-0/p4100/trainers[0]"
FAILED = "proc-11a1@unix:@/tmp/hyperactor-0/p4103/trainers[3]"
FAILED_PROC = "proc-11a1@unix:@/tmp/hyperactor-0/p4103"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_URL, ENV_TOKEN)}
    env.update(extra)
    return env


def _top(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch.tools.cli", "top", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(**env),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with serve_recorded() as s:
        yield s


# --- the screens ----------------------------------------------------------------------


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40)])
def test_tree_screen_matches_the_golden_text(width: int, height: int) -> None:
    screen = render(SNAPSHOT, SUMMARY, ViewState(), width, height)
    assert len(screen) == height
    assert all(len(line) <= width for line in screen)
    golden = (FIXTURES / f"top_{width}x{height}.txt").read_text().splitlines()
    assert screen == golden, "\n".join(screen)


def test_tree_screen_key_lines() -> None:
    screen = render(SNAPSHOT, SUMMARY, ViewState(), 80, 24)
    assert "train.py (pid 4000)  health DEGRADED  up 5m10s" in screen[0]
    assert "procs 4 (1 failed)" in screen[1] and "actors 4 (1 failed)" in screen[1]
    text = "\n".join(screen)
    for expected in [
        "- host-0 node1",
        "trainers[0] Trainer  processing       40    0 812.5ms step 2.4s",
        "proc r3 pid 4103         failed",
        "FAILURES (2)",
        "<- trainers rank 3 failed: its process died (killed by signal 9, SIGKILL)",
    ]:
        assert expected in text, text
    # System actors are hidden; the selected row is the first.
    assert "ProcAgent" not in text
    spans = render_lines(SNAPSHOT, SUMMARY, ViewState(), 80, 24)
    assert any(s.style == "selected" for s in spans[3].spans)
    failed_row = next(line for line in spans if "trainers[3] Trainer" in line.text)
    assert [s.style for s in failed_row.spans] == ["bad"]


@pytest.mark.parametrize("width,height", [(20, 5), (40, 10), (80, 3), (200, 60), (80, 1)])
def test_any_size_renders(width: int, height: int) -> None:
    for view in ["tree", "actor", "stack", "help"]:
        state = ViewState(view=view, actor=BUSY, stack_proc=FAILED_PROC, logs=DATA["logs"])
        screen = render(SNAPSHOT, SUMMARY, state, width, height)
        assert len(screen) == min(height, len(screen)) and len(screen) <= height
        assert all(len(line) <= max(width, 20) for line in screen)


def test_empty_data_renders() -> None:
    screen = render(None, None, ViewState(), 80, 24)
    assert len(screen) == 24 and "health UNKNOWN" in screen[0]
    assert render({}, {}, ViewState(view="actor", actor="x"), 80, 24)[2].startswith(" the actor x")


def test_actor_detail() -> None:
    state = ViewState(view="actor", actor=BUSY, logs=DATA["logs"][-3:])
    screen = render(SNAPSHOT, SUMMARY, state, 80, 24)
    text = "\n".join(screen)
    assert " ACTOR trainers[0] Trainer  processing" in screen[2]
    assert "handled 40  errors 0  busy 812.5ms  queue 3  current step 2.4s" in text
    step = next(line for line in screen if line.startswith(" step"))
    assert step.split() == ["step", "40", "0", "800.0", "20.00", "8.19", "16.4"]
    assert "-21s    out step 39 loss 0.0250" in text
    failed = render(SNAPSHOT, SUMMARY, ViewState(view="actor", actor=FAILED), 80, 24)
    assert " FAILED (infrastructure): its process died (killed by signal 9, SIGKILL)" in failed


def test_stack_and_help() -> None:
    state = ViewState(view="stack", stack_proc=FAILED_PROC)
    assert "fetching the stack of proc r3 pid 4103" in render(SNAPSHOT, SUMMARY, state, 80, 24)[2]
    state.stack = {"method": "py-spy", "text": STUB_STACK}
    screen = render(SNAPSHOT, SUMMARY, state, 80, 24)
    assert screen[2] == " STACK of proc r3 pid 4103 (py-spy)"
    assert screen[3] == " Thread 0x7f00 (most recent call first):"
    help_screen = render(SNAPSHOT, SUMMARY, ViewState(view="help"), 80, 24)
    assert help_screen[2] == " KEYS"


def test_once_frame_has_every_row() -> None:
    screen = render(SNAPSHOT, SUMMARY, ViewState(), 100, 0)
    assert sum("] Trainer  " in line for line in screen) == 4
    assert screen[-1].startswith(" proc r3 pid 4103 (node2): failed")


def test_failures_list_causes() -> None:
    found = failures(SNAPSHOT)
    assert found[0][1] == "infrastructure: its process died (killed by signal 9, SIGKILL)"
    assert found[0][2] == ["trainers rank 3 failed: its process died (killed by signal 9, SIGKILL)"]
    assert found[1][0] == "proc r3 pid 4103 (node2)"


# --- the keys -------------------------------------------------------------------------


def _labels(state: ViewState) -> list[str]:
    return [r.label for r in tree_rows(SNAPSHOT, state)]


def test_moving_and_opening_an_actor() -> None:
    state = ViewState()
    for key in ["j", "down", "j"]:
        assert handle_key(state, key, SNAPSHOT) is None
    assert state.selected == f"actor:{BUSY}"
    assert handle_key(state, "k", SNAPSHOT) is None
    assert handle_key(state, "up", SNAPSHOT) is None
    assert state.selected == f"proc:{BUSY.rsplit('/', 1)[0]}"
    handle_key(state, "G", SNAPSHOT)
    assert state.selected == f"actor:{FAILED}"
    handle_key(state, "j", SNAPSHOT)  # stays on the last row
    assert state.selected == f"actor:{FAILED}"
    assert handle_key(state, "enter", SNAPSHOT) == "logs"
    assert (state.view, state.actor) == ("actor", FAILED)
    handle_key(state, "j", SNAPSHOT)
    assert state.scroll == 1
    assert handle_key(state, "s", SNAPSHOT) == "stack"
    assert (state.view, state.stack_proc, state.stack) == ("stack", FAILED_PROC, None)
    handle_key(state, "h", SNAPSHOT)
    assert state.view == "actor"
    handle_key(state, "backspace", SNAPSHOT)
    assert state.view == "tree" and state.selected == f"actor:{FAILED}"
    assert handle_key(state, "q", SNAPSHOT) == "quit"


def test_collapse_expand_and_parent() -> None:
    state = ViewState()
    assert len(_labels(state)) == 14
    handle_key(state, "h", SNAPSHOT)  # collapses host-0
    assert _labels(state)[:2] == ["host-0 node1", "host-1 node2"]
    handle_key(state, "l", SNAPSHOT)  # expands it again
    handle_key(state, "l", SNAPSHOT)  # then goes to its first child
    assert state.selected == "proc:proc-00a1@unix:@/tmp/hyperactor-0/p4100"
    handle_key(state, "enter", SNAPSHOT)  # Enter toggles a proc
    assert len(_labels(state)) == 12
    handle_key(state, "enter", SNAPSHOT)
    handle_key(state, "j", SNAPSHOT)
    handle_key(state, "j", SNAPSHOT)
    handle_key(state, "left", SNAPSHOT)  # a leaf: to its parent, the mesh
    assert state.selected.startswith("mesh:")


def test_failures_only_and_text_filter() -> None:
    state = ViewState()
    handle_key(state, "f", SNAPSHOT)
    only = ["host-1 node2", "proc r3 pid 4103", "trainers (Trainer)", "trainers[3] Trainer"]
    assert _labels(state) == only
    assert "[failures only]" in render(SNAPSHOT, SUMMARY, state, 80, 24)[-1]
    handle_key(state, "f", SNAPSHOT)
    handle_key(state, "/", SNAPSHOT)
    for key in "node1x":
        handle_key(state, key, SNAPSHOT)
    handle_key(state, "backspace", SNAPSHOT)
    assert state.typing and state.filter == "node1"
    assert "filter: /node1_" in render(SNAPSHOT, SUMMARY, state, 80, 24)[-1]
    assert handle_key(state, "q", SNAPSHOT) is None  # typed, not quit
    handle_key(state, "backspace", SNAPSHOT)
    handle_key(state, "enter", SNAPSHOT)
    assert not state.typing
    labels = _labels(state)
    assert labels[0] == "host-0 node1" and "host-1 node2" not in labels and len(labels) == 7
    handle_key(state, "esc", SNAPSHOT)
    assert state.filter == "" and len(_labels(state)) == 14
    handle_key(state, "/", SNAPSHOT)
    for key in "nothing":
        handle_key(state, key, SNAPSHOT)
    handle_key(state, "enter", SNAPSHOT)
    assert (
        _labels(state) == [] and "(nothing matches)" in render(SNAPSHOT, SUMMARY, state, 80, 24)[3]
    )


def test_stack_needs_a_proc_and_help_comes_back() -> None:
    state = ViewState()
    assert handle_key(state, "s", SNAPSHOT) is None
    assert "select a proc or an actor" in render(SNAPSHOT, SUMMARY, state, 80, 24)[-1]
    handle_key(state, "j", SNAPSHOT)
    assert handle_key(state, "s", SNAPSHOT) == "stack"
    assert state.stack_proc == "proc-00a1@unix:@/tmp/hyperactor-0/p4100"
    handle_key(state, "?", SNAPSHOT)
    assert state.view == "help"
    handle_key(state, "esc", SNAPSHOT)
    assert state.view == "stack"
    assert handle_key(state, "r", SNAPSHOT) == "refresh"


# --- the client -----------------------------------------------------------------------


def test_parse_admin_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    assert parse_admin_url("http://127.0.0.1:8000/?token=abc") == ("http://127.0.0.1:8000/", "abc")
    assert parse_admin_url("localhost:9", "t") == ("http://localhost:9/", "t")
    assert parse_admin_url("https://h:1/x?token=a", "b") == ("https://h:1/x/", "b")
    monkeypatch.setenv(ENV_TOKEN, "fromenv")
    assert parse_admin_url("127.0.0.1:5") == ("http://127.0.0.1:5/", "fromenv")
    for bad in ["", "ftp://h:1/", "http://h/", "http://h:x/"]:
        with pytest.raises(ValueError):
            parse_admin_url(bad)


def test_client_routes(server: Any) -> None:
    client = AdminClient(server.url)
    assert client.summary()["health"] == "degraded"
    assert len(client.snapshot()["actors"]) == len(SNAPSHOT["actors"])
    events = client.events(since=2)
    assert [e["seq"] for e in events["items"]] == [3, 4]
    logs = client.logs(proc=FAILED_PROC, limit=3)["items"]
    assert [r["line"] for r in logs] == [
        r["line"] for r in DATA["logs"] if r["proc"] == FAILED_PROC
    ][-3:]
    assert client.series(60)["step_s"] == 1.0
    assert summary_line(client.summary()) == (
        "health degraded: 2 hosts, 4 procs (1 failed), 2 meshes, 4 actors (1 failed), 4.2 msg/s"
    )


def test_client_stack_against_the_stub() -> None:
    with serve_recorded(stub=True) as s:
        stack = AdminClient(s.url).stack(FAILED_PROC)
        assert stack["text"] == STUB_STACK
        with pytest.raises(AdminError, match="404"):
            AdminClient(s.url).stack("nope")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_client_errors(server: Any) -> None:
    port = _free_port()
    with pytest.raises(AdminError) as e:
        AdminClient(f"http://127.0.0.1:{port}/?token=x", timeout=2).summary()
    assert f"cannot reach the admin server at http://127.0.0.1:{port}/" in str(e.value)
    assert "the program may have ended" in str(e.value) and e.value.status is None
    with pytest.raises(AdminError) as e:
        AdminClient(server.base_url, token="wrong").summary()
    assert e.value.status == 401 and "the token is wrong" in str(e.value)
    assert "use the whole URL the program printed" in str(e.value)
    with pytest.raises(AdminError, match="no token was given"):
        AdminClient(server.base_url).summary()
    stub = StubServer(DATA, allowed_hosts=("elsewhere:1",))
    try:
        with pytest.raises(AdminError) as e:
            AdminClient(stub.url).summary()
        assert e.value.status == 403 and "host names it allows" in str(e.value)
    finally:
        stub.stop()


def test_status_adds_the_health(
    server: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    cli_parser._admin_status()
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(ENV_URL, server.url)
    cli_parser._admin_status()
    out = capsys.readouterr().out
    assert (
        out.startswith(f"admin {server.base_url}: health degraded: 2 hosts") and "?token" not in out
    )
    monkeypatch.setenv(ENV_URL, f"http://127.0.0.1:{_free_port()}/?token=x")
    cli_parser._admin_status()
    assert "not answering: cannot reach" in capsys.readouterr().out


# --- the command ----------------------------------------------------------------------


#: What the ``monarch-tui`` script runs.
_MONARCH_TUI = "import sys; from monarch.tools.cli import main_tui; sys.exit(main_tui())"


def test_once_and_json(server: Any) -> None:
    once = _top(server.url, "--once", "--width", "80")
    assert once.returncode == 0, once.stderr
    lines = once.stdout.splitlines()
    assert "health DEGRADED" in lines[0] and "\x1b[" not in once.stdout
    assert "trainers[3] Trainer  failed" in once.stdout and "FAILURES (2)" in once.stdout
    assert all(len(line) <= 80 for line in lines)
    as_json = _top(server.url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    snapshot = json.loads(as_json.stdout)
    assert [a["id"] for a in snapshot["actors"]] == [a["id"] for a in SNAPSHOT["actors"]]
    host, _, _ = server.base_url.removeprefix("http://").partition("/")
    by_addr = _top("--addr", host, "--token", server.token, "--once")
    assert by_addr.returncode == 0 and by_addr.stdout == _top(server.url, "--once").stdout
    by_env = _top("--once", MONARCH_ADMIN_URL=server.url)
    assert by_env.returncode == 0 and "FAILURES" in by_env.stdout
    tui_cmd = subprocess.run(
        # monarch-tui, the upstream name of `monarch top`
        [sys.executable, "-c", _MONARCH_TUI, server.url, "--once"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(),
    )
    assert tui_cmd.returncode == 0 and "FAILURES" in tui_cmd.stdout


def test_exit_statuses_and_messages(server: Any) -> None:
    port = _free_port()
    gone = _top(f"http://127.0.0.1:{port}/?token=x", "--once")
    assert gone.returncode == 1 and gone.stdout == ""
    assert f"monarch top: cannot reach the admin server at http://127.0.0.1:{port}/" in gone.stderr
    assert "Traceback" not in gone.stderr
    wrong = _top(server.base_url + "?token=nottheone", "--json")
    assert wrong.returncode == 1 and "(401): the token is wrong" in wrong.stderr
    none = _top("--once")
    assert none.returncode == 2 and "which program? Give the admin URL it printed" in none.stderr
    both = _top(server.url, "--addr", "127.0.0.1:1", "--once")
    assert both.returncode == 2 and "not both" in both.stderr
    bad = _top("http://nohost/", "--once")
    assert bad.returncode == 2 and "has no host:port" in bad.stderr
    usage = _top(server.url, "--once", "--json")
    assert usage.returncode == 2
    not_tty = _top(server.url)
    assert not_tty.returncode == 2 and "not a terminal; use --once" in not_tty.stderr
    assert tui.ENV_URL == ENV_URL and tui.ENV_TOKEN == ENV_TOKEN


def test_importing_the_command_loads_no_client() -> None:
    code = (
        "import sys, monarch.tools.cli as c\n"
        "c._parser()\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or m in "
        "('urllib.request', 'curses', 'monarch._src.monitoring.client', 'monarch.actor')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=TIMEOUT, env=_env())


# --- the terminal UI ------------------------------------------------------------------


def test_the_terminal_ui(server: Any) -> None:
    pexpect = pytest.importorskip("pexpect")
    env = _env(TERM="xterm-256color", LANG="C.UTF-8")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "monarch.tools.cli", "top", server.url, "--refresh-ms", "300"],
        env=env,
        dimensions=(24, 80),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    try:
        child.expect("DEGRADED")
        child.expect("FAILURES")
        child.send("jjj")
        child.send("\r")
        child.expect("ENDPOINT")
        child.expect("RECENT LOGS")
        child.send("h")
        child.expect("HANDLED")
        child.send("?")
        child.expect("KEYS")
        child.send("\x1b")
        child.expect("HANDLED")
        child.setwinsize(30, 100)  # resize-safe
        child.send("f")
        child.expect("failures only")
        child.send("js")  # the failed proc's stack
        child.expect("STACK of proc r3 pid 4103")
        child.send("h")
        child.expect("HANDLED")
        child.send("q")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, child.before
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_detail_scroll_stays_within_the_pane() -> None:
    state = ViewState(view="actor", actor=BUSY, logs=DATA["logs"])
    for _ in range(100):
        handle_key(state, "j", SNAPSHOT)
    clamp_scroll(SNAPSHOT, state, 80, 24)
    bottom = render(SNAPSHOT, SUMMARY, state, 80, 24)
    assert 0 < state.scroll < 100 and "step 39 loss 0.0250" in bottom[-2]
    handle_key(state, "k", SNAPSHOT)
    assert render(SNAPSHOT, SUMMARY, state, 80, 24)[3:-1] == bottom[2:-2]
    handle_key(state, "h", SNAPSHOT)
    clamp_scroll(SNAPSHOT, state, 80, 24)
    assert state.scroll == 0
