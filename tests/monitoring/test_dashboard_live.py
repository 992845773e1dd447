"""The admin server over a live job, through HTTP as users reach it: the token, the
counters of real calls, a SIGKILLed proc pushed as failed on the event stream and then
shown failed by the API, the job API's URLs, ``MONARCH_DASHBOARD=1``, the post-mortem
report, and ``monarch top`` on a live program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fault_recorder import Faults, _record_faults, faults  # noqa: F401  (fixtures)
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.monitoring import Dashboard, current_dashboard, start_dashboard

pytestmark = pytest.mark.timeout(120)

JSON = dict[str, Any]


class Worker(Actor):
    @endpoint
    def ok(self) -> int:
        return os.getpid()

    @endpoint
    def bad(self) -> None:
        raise ValueError("bad on purpose")


@pytest.fixture(scope="module")
def dashboard() -> Iterator[Dashboard]:
    running = current_dashboard()
    dash = running if running is not None else start_dashboard(announce=False)
    yield dash


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


def get(dash: Dashboard, route: str, token: str | None = None) -> JSON:
    headers = {"Authorization": f"Bearer {token or dash.token}"}
    req = urllib.request.Request(dash.base_url + route, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)  # type: ignore[no-any-return]


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)  # polling an HTTP API: there is no event to wait on here


def test_the_url_carries_the_token_and_nothing_works_without_it(dashboard: Dashboard) -> None:
    assert dashboard.url.startswith("http://127.0.0.1:") and "?token=" in dashboard.url
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(dashboard.base_url + "v1/summary", timeout=30)
    info.value.close()
    assert info.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as info:
        get(dashboard, "v1/summary", token="0" * 64)
    info.value.close()
    assert info.value.code == 401
    summary = get(dashboard, "v1/summary")
    assert summary["version"] == 1 and summary["pid"] == os.getpid()


def test_counters_of_real_calls_through_the_api(dashboard: Dashboard, procs: ProcMesh) -> None:
    workers = procs.spawn("live_counted", Worker)
    for _ in range(7):
        workers.ok.call().get(timeout=30)
    for _ in range(2):
        with pytest.raises(Exception, match="bad on purpose"):
            workers.bad.call().get(timeout=30)

    # The API promises no read-your-writes (docs/monitoring.md): a snapshot is shared
    # with requests that come while it is being collected and reused for 250 ms, and an
    # actor counts a message once its handler ended, after the reply went out. So the
    # counts may lag the calls for a moment: wait until each actor counted 9 messages
    # (counts only grow), then check every count exactly.
    def counted() -> list[JSON] | None:
        page = get(dashboard, "v1/actors?limit=1000")
        mine = [a for a in page["items"] if a["name"] == "live_counted"]
        return mine if len(mine) == 2 and all(a["handled"] >= 9 for a in mine) else None

    mine = wait_until("both live_counted actors to count 9 messages", counted, timeout=60)
    for actor in mine:
        assert actor["class"].endswith("Worker")
        assert actor["endpoints"]["ok"]["count"] == 7
        assert actor["endpoints"]["bad"]["count"] == 2
        assert actor["endpoints"]["bad"]["errors"] == 2
        assert (actor["handled"], actor["errors"]) == (9, 2)
    detail = get(dashboard, "v1/actor?id=" + urllib.parse.quote(mine[0]["id"], safe=""))
    assert detail["actor"]["id"] == mine[0]["id"]

    def scraped() -> list[str] | None:
        # /metrics reads the same snapshots: it may lag as well (see above).
        req = urllib.request.Request(
            dashboard.metrics_url, headers={"Authorization": f"Bearer {dashboard.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            metrics = r.read().decode()
        lines = [
            ln for ln in metrics.splitlines() if ln.startswith("monarch_actor_messages_total{")
        ]
        ours = [ln for ln in lines if 'mesh="live_counted"' in ln]
        return ours if len(ours) == 2 and all(float(ln.split()[-1]) >= 9 for ln in ours) else None

    ours = wait_until("/metrics to count 9 messages of each live_counted actor", scraped, 60)
    assert all(ln.endswith(" 9") for ln in ours), ours


class _Stream:
    """Reads the server's event stream on a thread, noting when each event arrives."""

    def __init__(self, dash: Dashboard, since: int) -> None:
        req = urllib.request.Request(
            dash.base_url + f"v1/events/stream?since={since}",
            headers={"Authorization": f"Bearer {dash.token}"},
        )
        self._response = urllib.request.urlopen(req, timeout=30)
        self.events: list[tuple[float, JSON]] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="sse-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._response:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    with self._changed:
                        self.events.append((time.monotonic(), json.loads(line[6:])))
                        self._changed.notify_all()
        except Exception:
            pass  # the response was closed under the reader by close()

    def wait_for(self, check: Callable[[JSON], bool], timeout: float) -> tuple[float, JSON]:
        def found() -> tuple[float, JSON] | None:
            return next(((t, e) for t, e in self.events if check(e)), None)

        with self._changed:
            hit = self._changed.wait_for(found, timeout)
        assert hit, f"no such event within {timeout} s; got {[e for _, e in self.events]}"
        return hit

    def close(self) -> None:
        self._response.close()
        self._thread.join(timeout=10)


def test_a_sigkilled_proc_is_failed_in_the_api_and_on_the_stream(
    dashboard: Dashboard,
    procs: ProcMesh,
    faults: Faults,  # noqa: F811
) -> None:
    """The failure is pushed: its events arrive on a stream opened before the kill, and
    from then on the API never answers with a snapshot collected before them, so the
    next request shows the proc and its actor failed. How soon is measured by
    benches/monitoring_bench.py (failure visibility), not asserted here."""
    workers = procs.spawn("live_killed", Worker)
    pid = workers.slice(gpus=1).ok.call_one().get(timeout=30)
    since = get(dashboard, "v1/events?since=0&limit=100000")["next"]
    stream = _Stream(dashboard, since)
    try:
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        failed_at, event = stream.wait_for(
            lambda e: e["kind"] == "actor_failed" and e["mesh"] == "live_killed", timeout=60
        )
        exited_at, _ = stream.wait_for(
            lambda e: e["kind"] in ("proc_exited", "proc_lost") and e.get("proc") == event["proc"],
            timeout=60,
        )
        # The first request after the events: no waiting for the API to catch up.
        snap = get(dashboard, "v1/snapshot")
        in_api = time.monotonic() - killed
    finally:
        stream.close()
    print(
        f"SIGKILL -> on the stream after {(failed_at - killed) * 1000:.0f} ms (actor) and "
        f"{(exited_at - killed) * 1000:.0f} ms (proc), then in the API after "
        f"{in_api * 1000:.0f} ms"
    )
    proc = next((p for p in snap["procs"] if p["pid"] == pid), None)
    assert proc is not None and proc["id"] == event["proc"], snap["procs"]
    assert proc["status"] in ("failed", "exited", "lost"), proc
    actor = next(
        (a for a in snap["actors"] if a["proc"] == proc["id"] and a["name"] == "live_killed"),
        None,
    )
    assert actor is not None and actor["status"] == "failed", actor
    assert actor["failure"]["class"] == "infrastructure", actor
    assert "signal 9" in " ".join(actor["failure"]["cause"]) + actor["failure"]["reason"]
    assert event["rank"] == 1 and event["class"] == "infrastructure"
    faults.wait_for(1, "live_killed")
    summary = get(dashboard, "v1/summary")
    assert summary["health"] in ("degraded", "failed")


def test_the_job_api_gives_the_urls(dashboard: Dashboard) -> None:
    from monarch.job import LocalJob, TelemetryConfig

    job = LocalJob().enable_telemetry(TelemetryConfig(include_dashboard=False))
    state = job.state(cached_path=None)
    assert state.dashboard_url == dashboard.url
    assert state.admin_url == dashboard.url
    assert state.telemetry_url == dashboard.base_url
    with pytest.raises(TypeError, match="unknown settings"):
        LocalJob().enable_admin(admin_port=3)


def _run(script: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "prog.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )


_FAILING = """
import os, time
from monarch.actor import Actor, endpoint, this_host

class W(Actor):
    @endpoint
    def die(self) -> None:
        print("last words", flush=True)
        os._exit(3)

pm = this_host().spawn_procs(per_host={"gpus": 2})
w = pm.spawn("workers", W)
w.slice(gpus=1).die.broadcast()
time.sleep(60)
"""


def test_monarch_dashboard_env_and_the_post_mortem_report(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    done = _run(
        _FAILING,
        {"MONARCH_DASHBOARD": "1", "MONARCH_DASHBOARD_REPORT": str(report)},
        tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "Monarch dashboard: http://127.0.0.1:" in done.stderr
    assert f"wrote a post-mortem report to {report}" in done.stderr
    text = report.read_text()
    assert "exited with status 3" in text
    assert "last words" in text
    assert "workers" in text


def test_monarch_top_once_on_a_live_program(dashboard: Dashboard, procs: ProcMesh) -> None:
    workers = procs.spawn("live_top", Worker)
    workers.ok.call().get(timeout=30)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "monarch.tools.cli",
            "top",
            "--once",
            "--width",
            "160",
            dashboard.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "live_top" in done.stdout
    assert "Worker" in done.stdout
