"""The web dashboard in a real (headless) browser over a LIVE job: procs spawned by this
test process, whose own admin server (``start_dashboard``) serves the page.

- a live actor mesh shows in the page, with its class and message counts;
- a SIGKILLed proc's failure reaches the page on the event stream, the event triggers a
  refresh (the page records why it refreshed), that refresh's snapshot has the actor
  failed, the failures panel shows it, and its detail gives the cause. The kill lands
  just after the page got a snapshot, the worst case for a server that would reuse that
  snapshot for the refresh the failure event triggers (it must not: a snapshot collected
  before an event is not served after it). How soon the page shows a failure is
  measured by benches/monitoring_bench.py (failure visibility), not asserted here;
- a proc's stack button dumps the Python stacks of that live proc.

A killed proc's failure goes to the session's fault recorder (``tests/fault_recorder.py``),
never to the default hook, which would end the test run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from browser_helpers import Browser
from selenium.webdriver.common.by import By

import monarch.actor

# The fixtures of the session's fault recorder. tests/ is on pytest's path, not on mypy's
# (`MYPYPATH=tests mypy tests/browser` checks these types too).
from fault_recorder import (  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    Faults,
    _record_faults,
    faults,
)
from monarch.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host
from monarch.monitoring import Dashboard, current_dashboard, start_dashboard

pytestmark = pytest.mark.timeout(120)

#: How many calls each actor of the mesh handles before the page is opened.
CALLS = 3


class PageWorker(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[Dashboard]:
    """This process's admin server (one per process: reuse it if it runs already)."""
    running = current_dashboard()
    yield running if running is not None else start_dashboard(announce=False)


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield pm
    finally:
        pm.stop().get(timeout=60)


def open_live(browser: Browser, dashboard: Dashboard, mesh: str) -> None:
    """Load the page and wait until it draws the live mesh ``mesh``."""
    browser.driver.get(dashboard.url)
    browser.wait(
        "the first snapshot", lambda d: d.find_element(By.CSS_SELECTOR, "body[data-ready]")
    )
    browser.visible_testid(f"mesh-{mesh}")
    # A long test session leaves many ended procs in the host's list, and the page folds
    # the procs of large jobs: unfold them all.
    browser.driver.find_element(By.ID, "expand-all").click()


def assert_no_console_errors(browser: Browser) -> None:
    severe = browser.severe_console_entries()
    assert not severe, f"the console has errors: {severe}"


def shown_text(browser: Browser, testid: str) -> str:
    """The text of the displayed element ``testid``. The page redraws parts of itself on
    each refresh: the element is looked up again until its text is read."""
    return str(browser.wait(f"the text of {testid}", lambda _: browser.visible_testid(testid).text))


def click(browser: Browser, what: str, find: Callable[[], Any]) -> None:
    """Click the element ``find()`` returns, looking it up again if a redraw replaced it."""

    def clicked(_: Any) -> bool:
        element = find()
        if not element:
            return False
        element.click()
        return True

    browser.wait(what, clicked)


def actor_rows_in(element: Any, mesh: str) -> list[Any]:
    """The actor rows of ``mesh`` under ``element`` of the tree."""
    return list(
        element.find_elements(By.CSS_SELECTOR, f'[data-mesh="{mesh}"] a[data-testid^="actor-"]')
    )


def proc_row_with_pid(browser: Browser, pid: int) -> Any:
    """The tree's proc node (a ``details``) whose row shows ``pid``, or None."""
    shows = re.compile(rf"\bpid {pid}\b")
    for proc in browser.by_testid("tree").find_elements(
        By.CSS_SELECTOR, 'details[data-testid^="proc-"]'
    ):
        summary = proc.find_element(By.CSS_SELECTOR, ":scope > summary")
        if shows.search(summary.text):
            return proc
    return None


def test_the_page_shows_a_live_mesh_with_its_counts(
    browser: Browser, dashboard: Dashboard, procs: ProcMesh
) -> None:
    workers = procs.spawn("live_page", PageWorker)
    for _ in range(CALLS):
        workers.ping.call().get(timeout=30)
    open_live(browser, dashboard, "live_page")
    mesh = shown_text(browser, "mesh-live_page")
    assert "PageWorker" in mesh, mesh

    def counted(_: Any) -> Any:
        rows = actor_rows_in(browser.by_testid("tree"), "live_page")
        texts = [r.text for r in rows if r.is_displayed()]
        ok = len(texts) == 2 and all(f"{CALLS} msgs" in t for t in texts)
        return texts if ok else False

    texts = browser.wait(f"2 live_page actors showing {CALLS} msgs each", counted)
    for text in texts:
        assert "PageWorker" in text and "live_page[" in text, text
    assert_no_console_errors(browser)


class _Stamped:
    """A fault hook noting when (wall clock, ms) each failure reached the client, then
    handing it to the session's recorder."""

    def __init__(self, recorder: Faults) -> None:
        self.recorder = recorder
        self.arrived_ms: dict[str, float] = {}

    def __call__(self, failure: MeshFailure) -> None:
        self.arrived_ms.setdefault(failure.mesh_name, time.time() * 1000.0)
        self.recorder(failure)


#: Notes in ``window.__monarchFailSeen`` the wall clock (ms) at which the failures panel
#: first holds a failure of the actor ``arguments[0]`` (a MutationObserver: no polling),
#: and in ``window.__monarchSnapshots`` each snapshot the page fetches: when it was asked
#: for and answered, its ``time`` (what the page's refresh log names it by), and whether
#: it had the actor failed.
_WATCH_FAILURE_JS = """
const actor = arguments[0];
window.__monarchFailSeen = null;
const shown = () => [...document.querySelectorAll('[data-testid="failure"]')]
  .some((e) => e.dataset.actor === actor);
const note = () => {
  if (window.__monarchFailSeen === null && shown()) {
    window.__monarchFailSeen = Date.now();
    obs.disconnect();
  }
};
const obs = new MutationObserver(note);
obs.observe(document.body, { childList: true, subtree: true, attributes: true });
note();
window.__monarchSnapshots = [];
const fetch0 = window.fetch;
window.fetch = async (url, ...rest) => {
  const asked = Date.now();
  const r = await fetch0(url, ...rest);
  if (String(url).startsWith("v1/snapshot")) {
    const answered = Date.now();
    const done = window.__monarchOnSnapshot;
    window.__monarchOnSnapshot = null;
    if (done) done(answered);
    r.clone().json().then((snap) => window.__monarchSnapshots.push({
      asked, answered, time: snap.time,
      failed: (snap.actors || []).some((a) => a.id === actor && a.status === "failed"),
    }), () => {});
  }
  return r;
};
return window.__monarchFailSeen;
"""

#: Returns (async) the wall clock (ms) at which the page's next snapshot request is
#: answered (within the 2 s of its polling; the script timeout bounds it).
_NEXT_SNAPSHOT_JS = "window.__monarchOnSnapshot = arguments[arguments.length - 1];"

#: The page's own log of its refreshes (``app.js``): why each ran (``event:SEQ`` for the
#: stream's event that triggered it), when it asked and drew, and its snapshot's ``time``.
_REFRESHES_JS = "return window.__monarchRefreshes"


def _event_refresh(browser: Browser, seq: int) -> Any:
    """The page's refresh that the stream's event ``seq`` triggered, once its snapshot
    was drawn and the test's fetch hook parsed it: ``(refresh, snapshot)``, or None."""
    refreshes = browser.driver.execute_script(_REFRESHES_JS) or []
    snapshots = browser.driver.execute_script("return window.__monarchSnapshots") or []
    for refresh in refreshes:
        if f"event:{seq}" in refresh["why"]:
            # Its own request: the same snapshot, asked for once the refresh started.
            drawn = [
                s
                for s in snapshots
                if s["time"] == refresh["snapshot"] and s["asked"] >= refresh["asked"]
            ]
            return (refresh, drawn[0]) if drawn else None
    return None


def get_json(dashboard: Dashboard, route: str) -> Any:
    """``route`` of the admin server's API, as JSON."""
    req = urllib.request.Request(
        dashboard.base_url + route, headers={"Authorization": f"Bearer {dashboard.token}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_a_sigkilled_proc_shows_in_the_failures_panel_on_its_event(
    browser: Browser,
    dashboard: Dashboard,
    procs: ProcMesh,
    faults: Faults,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "live_page_killed"
    workers = procs.spawn(name, PageWorker)
    pid = workers.slice(gpus=1).pid.call_one().get(timeout=30)
    open_live(browser, dashboard, name)

    def actor_on_pid(_: Any) -> Any:
        proc = proc_row_with_pid(browser, pid)
        rows = [] if proc is None else actor_rows_in(proc, name)
        return rows[0].get_attribute("data-testid") if len(rows) == 1 else False

    testid = browser.wait(f"the {name} actor of the proc of pid {pid}", actor_on_pid)
    actor = str(testid).removeprefix("actor-")
    assert browser.driver.execute_script(_WATCH_FAILURE_JS, actor) is None, "failed already"
    stamped = _Stamped(faults)
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", stamped)

    # Kill just after the page got a snapshot: the event-driven refresh that follows
    # must still get the failure (the worst case of the server's snapshot reuse).
    browser.driver.execute_async_script(_NEXT_SNAPSHOT_JS)
    os.kill(pid, signal.SIGKILL)
    (failure,) = faults.wait_for(1, name)
    learned_ms = stamped.arrived_ms[name]
    seen_ms = browser.wait(
        "the failure in the failures panel",
        lambda d: d.execute_script("return window.__monarchFailSeen"),
        timeout=60,
    )
    print(
        f"client learned of the failure -> page shows it after {float(seen_ms) - learned_ms:.0f}"
        " ms (measured, not asserted: see benches/monitoring_bench.py)"
    )
    assert failure.mesh_name == name

    # The mechanism: the failure's event came on the page's stream and triggered a
    # refresh, whose snapshot (collected after the event) had the actor failed.
    events = get_json(dashboard, "v1/events?since=0&limit=100000")["items"]
    failed = [
        e
        for e in events
        if e["kind"] == "actor_failed" and e.get("mesh") == name and e.get("rank") == 1
    ]
    assert len(failed) == 1, [e for e in events if e.get("mesh") == name]
    seq = failed[0]["seq"]

    def event_refresh(_: Any) -> Any:
        return _event_refresh(browser, seq)

    try:
        refresh, snapshot = browser.wait(
            f"the refresh event {seq} triggered", event_refresh, timeout=60
        )
    except Exception as e:
        raise AssertionError(
            f"no refresh of the page was triggered by the actor_failed event {seq} (or its "
            f"snapshot was not fetched): {_timeline(browser, learned_ms)}"
        ) from e
    assert snapshot["failed"], (
        f"the refresh triggered by event {seq} ({refresh}) drew a snapshot without the "
        f"failure: {_timeline(browser, learned_ms)}"
    )
    print(
        f"event {seq} triggered a refresh ({', '.join(refresh['why'])}) that asked "
        f"{refresh['asked'] - learned_ms:+.0f} ms and drew {refresh['drawn'] - learned_ms:+.0f}"
        " ms after the client learned of the failure"
    )

    def failure_item() -> Any:
        for item in browser.driver.find_elements(By.CSS_SELECTOR, '[data-testid="failure"]'):
            if item.get_attribute("data-actor") == actor and item.is_displayed():
                return item
        return None

    item_text = browser.wait(
        "the failure item", lambda _: (item := failure_item()) is not None and item.text
    )
    assert "PageWorker" in item_text and f"{name}[1]" in item_text, item_text
    click(
        browser,
        "the failure's link",
        lambda: (
            (item := failure_item())
            and item.find_element(By.CSS_SELECTOR, '[data-testid="failure-link"]')
        ),
    )
    cause = shown_text(browser, "failure-cause")
    assert "signal 9" in cause or "SIGKILL" in cause, cause
    assert actor in shown_text(browser, "actor-detail")
    assert "failed" in shown_text(browser, "detail-status")
    assert_no_console_errors(browser)


def _timeline(browser: Browser, learned_ms: float) -> str:
    """The page's refreshes and snapshots, in ms relative to when the client learned of
    the failure, for the message of a failed check."""
    refreshes = browser.driver.execute_script(_REFRESHES_JS) or []
    snapshots = browser.driver.execute_script("return window.__monarchSnapshots") or []
    rs = [
        f"{','.join(r['why'])}: asked {r['asked'] - learned_ms:+.0f}, drawn "
        f"{r['drawn'] - learned_ms:+.0f}, snapshot {r['snapshot']}"
        for r in refreshes
        if r["drawn"] >= learned_ms - 5000
    ]
    ss = [
        f"asked {s['asked'] - learned_ms:+.0f}, answered {s['answered'] - learned_ms:+.0f}, "
        f"time {s['time']}, {'failed' if s['failed'] else 'not failed'}"
        for s in snapshots
    ]
    return f"refreshes {rs}; snapshots {ss}"


def test_the_stack_button_of_a_live_proc_shows_python_frames(
    browser: Browser, dashboard: Dashboard, procs: ProcMesh
) -> None:
    name = "live_page_stack"
    workers = procs.spawn(name, PageWorker)
    pid = workers.slice(gpus=0).pid.call_one().get(timeout=30)
    open_live(browser, dashboard, name)
    testid = browser.wait(
        f"the proc row of pid {pid}",
        lambda _: (row := proc_row_with_pid(browser, pid)) and row.get_attribute("data-testid"),
    )
    proc_id = str(testid).removeprefix("proc-")
    click(browser, "the proc's stack button", lambda: browser.by_testid(f"stack-{proc_id}"))
    panel = browser.visible_testid("stack-panel")

    def answered(_: Any) -> Any:
        found = panel.find_elements(
            By.CSS_SELECTOR, '[data-testid="stack-text"], [data-testid="stack-error"]'
        )
        return found[0] if found else False

    shown = browser.wait("the stack text or its error", answered)
    assert shown.get_attribute("data-testid") == "stack-text", shown.text
    text = shown.text
    # Python frames: faulthandler writes `Thread 0x...` and `File "....py", line N`,
    # py-spy (when on PATH) `Thread N` and `function (file.py:N)`.
    assert "Thread" in text and ".py" in text, text
    assert f"pid {pid}" in panel.text, panel.text
    assert_no_console_errors(browser)
