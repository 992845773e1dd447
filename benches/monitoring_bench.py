"""Monitoring benchmark: what the always-on counters and an open dashboard cost, and how
fast the monitoring tools see what happens (``docs/monitoring.md``).

Run it with ``python benches/monitoring_bench.py``; ``make bench`` runs it after the
others. It measures, on this machine's host:

* ``counters on/off``: ``call_one`` round-trip latency (median of many calls) and
  pipelined ``call_one`` throughput (calls issued back to back, then every ``get()``),
  each in a fresh client process with ``MONARCH_ACTOR_STATS=1`` and ``=0``, alternated
  ``--reps`` times; the ratio of the medians. Budgets: throughput at least 99% with the
  counters on, latency at most +1 us.
* ``dashboard open, 64 procs``: pipelined ``call_one`` throughput on a 64-proc job with
  the admin server running, alternately with nobody watching and with a watcher process
  that does what an open page does (the event stream open, ``v1/snapshot`` every 2 s,
  ``v1/summary`` and ``v1/series`` with it); the ratio of the medians. Budget: 98%.
* ``failure visibility``: a proc is SIGKILLed; the time until the client's fault hook
  has the failure, until the event stream delivers it, and until ``v1/snapshot`` shows
  the proc failed (medians over a few kills). Budgets: the event stream within 1 s of
  the kill, the API within 1 s of the client.
* ``failure in the page``: with Selenium and Chromium installed, the dashboard open in a
  browser while a proc is SIGKILLed, a few times: the time from the client's fault hook
  to the failures panel holding the failure (the page's refresh on the failure's
  events), and how often the refresh that first drew it was one an event triggered
  (not the 2 s poll). Budget: 1 s after the client.
* ``/metrics with 1,000 actors``: 8 procs with 125 actor meshes; the median time of
  ``GET /metrics`` and of ``GET v1/snapshot`` (gathered from the procs each time the
  250 ms reuse window has passed). Budget: 20 ms for ``/metrics``.
* ``page first load``: with Selenium and Chromium installed (``make browser-deps``), the
  dashboard over the 1,000-actor job opened in a fresh page a few times: DOMContentLoaded
  and the first drawn snapshot. Budget: 0.5 s.

Options: ``--quick`` (fewer repetitions, smaller jobs, for smoke tests), ``--json PATH``
(also write the results as JSON), ``--check`` (exit 1 when a result is over budget).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from monarch.actor import Actor, endpoint, this_host

THROUGHPUT_RATIO_BUDGET = 0.99
LATENCY_DELTA_BUDGET_US = 1.0
OPEN_RATIO_BUDGET = 0.98
VISIBLE_BUDGET_S = 1.0
METRICS_BUDGET_MS = 20.0
FIRST_LOAD_BUDGET_MS = 500.0


class Ping(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _call_rates(calls: int, pipelined: int, runs: int) -> dict[str, float]:
    """In this process: call_one latency (us) and pipelined calls per second."""
    pm = this_host().spawn_procs(per_host={"procs": 1})
    actor = pm.spawn("bench", Ping)
    for i in range(200):
        actor.ping.call_one(i).get(timeout=60)
    lat = []
    for i in range(calls):
        t = time.perf_counter()
        actor.ping.call_one(i).get(timeout=60)
        lat.append(time.perf_counter() - t)
    rates = [_pipelined(actor, pipelined) for _ in range(runs)]
    pm.stop().get(timeout=60)
    return {"latency_us": statistics.median(lat) * 1e6, "pipelined": statistics.median(rates)}


def _pipelined(actor: Any, n: int) -> float:
    t = time.perf_counter()
    futures = [actor.ping.call_one(i) for i in range(n)]
    for f in futures:
        f.get(timeout=120)
    return n / (time.perf_counter() - t)


def measure_counters(reps: int, quick: bool) -> dict[str, Any]:
    calls, pipelined, runs = (300, 1000, 2) if quick else (2000, 5000, 3)
    samples: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for _ in range(reps):
        for mode, value in (("on", "1"), ("off", "0")):
            out = subprocess.run(
                [sys.executable, __file__, "--child-calls", f"{calls},{pipelined},{runs}"],
                env={**os.environ, "MONARCH_ACTOR_STATS": value},
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            samples[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def med(mode: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[mode])

    return {
        "latency_on_us": med("on", "latency_us"),
        "latency_off_us": med("off", "latency_us"),
        "pipelined_on": med("on", "pipelined"),
        "pipelined_off": med("off", "pipelined"),
        "throughput_ratio": med("on", "pipelined") / med("off", "pipelined"),
        "latency_delta_us": med("on", "latency_us") - med("off", "latency_us"),
        "samples": samples,
    }


_WATCHER = r"""
import json, sys, threading, time, urllib.request
base, token = sys.argv[1], sys.argv[2]
headers = {"Authorization": "Bearer " + token}
def get(route):
    req = urllib.request.Request(base + route, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()
def stream():
    req = urllib.request.Request(base + "v1/events/stream", headers=headers)
    with urllib.request.urlopen(req, timeout=3600) as r:
        for _ in r:
            pass
threading.Thread(target=stream, daemon=True).start()
print("watching", flush=True)
while True:
    get("v1/summary"); get("v1/snapshot"); get("v1/series?window=900")
    time.sleep(2.0)
"""


def _get(dash: Any, route: str) -> bytes:
    req = urllib.request.Request(
        dash.base_url + route, headers={"Authorization": f"Bearer {dash.token}"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


@contextmanager
def _watching(dash: Any) -> Iterator[None]:
    """A watcher process doing what an open page does, for the block's duration."""
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, dash.base_url, dash.token],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None and watcher.stdout.readline().strip() == "watching"
        _get(dash, "v1/snapshot")  # the watcher's first round has started
        yield
    finally:
        watcher.kill()
        watcher.wait(timeout=30)


def measure_dashboard_open(dash: Any, procs: int, reps: int, quick: bool) -> dict[str, Any]:
    pm = this_host().spawn_procs(per_host={"procs": procs})
    mesh = pm.spawn("bench_open", Ping)
    mesh.ping.call(0).get(timeout=120)
    actor = mesh.slice(procs=0)
    n = 1000 if quick else 4000
    _pipelined(actor, n)
    rates: dict[str, list[float]] = {"closed": [], "open": []}
    for _ in range(reps):
        rates["closed"].append(_pipelined(actor, n))
        with _watching(dash):
            rates["open"].append(_pipelined(actor, n))
    snapshot_bytes = len(_get(dash, "v1/snapshot"))
    idle_s = 4.0 if quick else 10.0
    time.sleep(31)  # past the server's 30 s watch window: nobody watches now
    idle_closed = _cpu_ms_per_s(idle_s)
    with _watching(dash):
        idle_open = _cpu_ms_per_s(idle_s)
    pm.stop().get(timeout=120)
    closed, opened = statistics.median(rates["closed"]), statistics.median(rates["open"])
    return {
        "procs": procs,
        "closed": closed,
        "open": opened,
        "ratio": opened / closed,
        "snapshot_bytes": snapshot_bytes,
        "idle_cpu_ms_per_s_closed": idle_closed,
        "idle_cpu_ms_per_s_open": idle_open,
        "samples": rates,
    }


def _tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its descendants that
    are still running (the procs), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        fields = stats.get(pid)
        if fields is not None:
            total += (int(fields[11]) + int(fields[12])) / tick
        todo.extend(children.get(pid, []))
    return total


def _cpu_ms_per_s(seconds: float) -> float:
    """CPU milliseconds per second the job (client and procs) uses while idle."""
    start, t = _tree_cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (_tree_cpu_s() - start) * 1000 / (time.monotonic() - t)


class _Recorder:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[tuple[float, str]] = []

    def __call__(self, failure: Any) -> None:
        with self.cond:
            self.seen.append((time.monotonic(), failure.mesh_name))
            self.cond.notify_all()

    def wait(self, mesh: str, timeout: float) -> float:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(m == mesh for _, m in self.seen), timeout)
            assert ok, f"no failure of {mesh} within {timeout} s"
            return next(t for t, m in self.seen if m == mesh)


def measure_visibility(dash: Any, kills: int) -> dict[str, Any]:
    import monarch.actor

    recorder = _Recorder()
    previous = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = recorder
    results: dict[str, list[float]] = {"client_ms": [], "stream_ms": [], "api_ms": []}
    try:
        for k in range(kills):
            name = f"bench_kill_{k}"
            pm = this_host().spawn_procs(per_host={"procs": 2})
            mesh = pm.spawn(name, Ping)
            pid = mesh.slice(procs=1).pid.call_one().get(timeout=60)
            since = json.loads(_get(dash, "v1/events?since=0&limit=100000"))["next"]
            arrived: list[float] = []
            req = urllib.request.Request(
                dash.base_url + f"v1/events/stream?since={since}",
                headers={"Authorization": f"Bearer {dash.token}"},
            )
            stream = urllib.request.urlopen(req, timeout=60)
            done = threading.Event()

            def read(
                stream: Any = stream,
                name: str = name,
                arrived: list[float] = arrived,
                done: threading.Event = done,
            ) -> None:
                try:
                    for raw in stream:
                        line = raw.decode()
                        if line.startswith("data: ") and f'"mesh":"{name}"' in line.replace(
                            " ", ""
                        ):
                            arrived.append(time.monotonic())
                            done.set()
                            return
                except Exception:
                    pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            api = None
            while api is None and time.monotonic() - killed < 30:
                snap = json.loads(_get(dash, "v1/snapshot"))
                if any(p["pid"] == pid and p["status"] != "running" for p in snap["procs"]):
                    api = time.monotonic()
            client = recorder.wait(name, 30)
            done.wait(30)
            stream.close()
            reader.join(timeout=10)
            results["client_ms"].append((client - killed) * 1000)
            results["stream_ms"].append(((arrived[0] if arrived else float("nan")) - killed) * 1000)
            results["api_ms"].append(((api or float("nan")) - killed) * 1000)
            pm.stop().get(timeout=60)
    finally:
        monarch.actor.unhandled_fault_hook = previous
    out: dict[str, Any] = {k: statistics.median(v) for k, v in results.items()}
    out["api_after_client_ms"] = out["api_ms"] - out["client_ms"]
    out["samples"] = results
    return out


#: Notes in ``window.__benchFailSeen`` when (``Date.now()``) the failures panel first
#: holds a failure of the actor ``arguments[0]``, and in ``window.__benchFailRefresh``
#: the page's newest refresh record (``window.__monarchRefreshes``) at that moment.
_WATCH_FAILURE_JS = """
const actor = arguments[0];
window.__benchFailSeen = null;
window.__benchFailRefresh = null;
const note = () => {
  const shown = [...document.querySelectorAll('[data-testid="failure"]')]
    .some((e) => e.dataset.actor === actor);
  if (window.__benchFailSeen === null && shown) {
    window.__benchFailSeen = Date.now();
    const log = window.__monarchRefreshes || [];
    window.__benchFailRefresh = log.length ? log[log.length - 1] : null;
    obs.disconnect();
  }
};
const obs = new MutationObserver(note);
obs.observe(document.body, { childList: true, subtree: true, attributes: true });
note();
return window.__benchFailSeen;
"""


def measure_page_visibility(dash: Any, kills: int) -> dict[str, Any] | str:
    """The failure visibility of an open page: client's fault hook -> failures panel."""
    import monarch.actor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    try:
        from browser_helpers import Browser, find_browser
    except ImportError as e:
        return f"skipped: {e}"
    paths = find_browser()
    if isinstance(paths, str):
        return f"skipped: {paths}"
    learned: dict[str, float] = {}

    def hook(failure: Any) -> None:
        learned.setdefault(failure.mesh_name, time.time() * 1000)

    previous = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = hook
    browser = Browser(paths)
    after_ms: list[float] = []
    by_event = 0
    try:
        browser.driver.get(dash.url)
        for k in range(kills):
            name = f"bench_page_kill_{k}"
            pm = this_host().spawn_procs(per_host={"procs": 2})
            mesh = pm.spawn(name, Ping)
            pid = mesh.slice(procs=1).pid.call_one().get(timeout=60)
            snap = json.loads(_get(dash, "v1/snapshot"))
            proc = next(p["id"] for p in snap["procs"] if p["pid"] == pid)
            actor = next(a["id"] for a in snap["actors"] if a["proc"] == proc and a["name"] == name)
            # Kill once the page drew a snapshot taken after the spawn (a steady page).
            spawned_ms = time.time() * 1000
            browser.wait(
                "the page to draw a snapshot with the mesh",
                lambda d, spawned_ms=spawned_ms: d.execute_script(
                    "const log = window.__monarchRefreshes || [];"
                    "return log.length > 0 && log[log.length - 1].asked > arguments[0];",
                    spawned_ms,
                ),
                timeout=60,
            )
            browser.driver.execute_script(_WATCH_FAILURE_JS, actor)
            os.kill(pid, signal.SIGKILL)
            seen = browser.wait(
                "the failure in the page",
                lambda d: d.execute_script("return window.__benchFailSeen"),
                timeout=60,
            )
            refresh = browser.driver.execute_script("return window.__benchFailRefresh")
            deadline = time.monotonic() + 60
            while name not in learned and time.monotonic() < deadline:
                time.sleep(0.01)
            after_ms.append(float(seen) - learned[name])
            if refresh and any(str(w).startswith("event:") for w in refresh["why"]):
                by_event += 1
            pm.stop().get(timeout=60)
    finally:
        browser.close()
        monarch.actor.unhandled_fault_hook = previous
    return {
        "page_after_client_ms": statistics.median(after_ms),
        "drawn_by_an_event": by_event,
        "kills": kills,
        "samples": after_ms,
    }


def measure_metrics(dash: Any, procs: int, meshes: int, reps: int) -> tuple[dict[str, Any], Any]:
    pm = this_host().spawn_procs(per_host={"procs": procs})
    spawned = [pm.spawn(f"bench_m{i}", Ping) for i in range(meshes)]
    for m in spawned:
        m.ping.call(0).get(timeout=120)
    times: dict[str, list[float]] = {"metrics_ms": [], "snapshot_ms": []}
    actors = 0
    for _ in range(reps):
        time.sleep(0.3)  # past the server's 250 ms reuse window: a fresh gathering each time
        t = time.perf_counter()
        snap = json.loads(_get(dash, "v1/snapshot"))
        times["snapshot_ms"].append((time.perf_counter() - t) * 1000)
        actors = sum(1 for a in snap["actors"] if a["name"].startswith("bench_m"))
        t = time.perf_counter()
        _get(dash, "metrics")
        times["metrics_ms"].append((time.perf_counter() - t) * 1000)
    result = {k: statistics.median(v) for k, v in times.items()}
    result["actors"] = actors
    return result, pm


def measure_first_load(dash: Any, loads: int) -> dict[str, Any] | str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    try:
        from browser_helpers import Browser, find_browser
    except ImportError as e:
        return f"skipped: {e}"
    paths = find_browser()
    if isinstance(paths, str):
        return f"skipped: {paths}"
    browser = Browser(paths)
    dcl, drawn = [], []
    try:
        browser.driver.get(dash.url)  # trades the token for the cookie
        browser.wait(
            "the first snapshot", lambda d: d.execute_script("return !!document.body.dataset.ready")
        )
        for _ in range(loads):
            browser.driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
            browser.driver.get(dash.base_url)
            browser.wait(
                "the first snapshot",
                lambda d: d.execute_script("return !!document.body.dataset.ready"),
            )
            dcl.append(browser.dom_content_loaded_ms())
            drawn.append(browser.first_render_ms())
    finally:
        browser.close()
    return {
        "dom_content_loaded_ms": statistics.median(dcl),
        "first_snapshot_ms": statistics.median(drawn),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child-calls", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_calls:
        calls, pipelined, runs = (int(x) for x in args.child_calls.split(","))
        print(json.dumps(_call_rates(calls, pipelined, runs)))
        return 0

    from monarch.monitoring import start_dashboard

    quick = args.quick
    results: dict[str, Any] = {"loadavg": os.getloadavg()[0]}
    over: list[str] = []
    c = measure_counters(2 if quick else 3, quick)
    results["counters"] = c
    print(
        f"counters on/off: call_one {c['latency_on_us']:.1f} / {c['latency_off_us']:.1f} us "
        f"(delta {c['latency_delta_us']:+.1f} us, budget +{LATENCY_DELTA_BUDGET_US:g}); "
        f"pipelined {c['pipelined_on']:,.0f} / {c['pipelined_off']:,.0f} calls/s "
        f"(ratio {c['throughput_ratio']:.3f}, budget {THROUGHPUT_RATIO_BUDGET})",
        flush=True,
    )
    if c["throughput_ratio"] < THROUGHPUT_RATIO_BUDGET:
        over.append("counters throughput")
    if c["latency_delta_us"] > LATENCY_DELTA_BUDGET_US:
        over.append("counters latency")

    dash = start_dashboard(announce=False)
    o = measure_dashboard_open(dash, 16 if quick else 64, 2 if quick else 3, quick)
    results["dashboard_open"] = o
    print(
        f"dashboard open, {o['procs']} procs: pipelined {o['open']:,.0f} vs "
        f"{o['closed']:,.0f} calls/s closed (ratio {o['ratio']:.3f}, budget "
        f"{OPEN_RATIO_BUDGET}); snapshot {o['snapshot_bytes'] / 1024:.0f} KiB; idle job "
        f"{o['idle_cpu_ms_per_s_closed']:.0f} ms CPU/s closed, "
        f"{o['idle_cpu_ms_per_s_open']:.0f} ms CPU/s with the page open",
        flush=True,
    )
    if o["ratio"] < OPEN_RATIO_BUDGET:
        over.append("dashboard open")

    v = measure_visibility(dash, 2 if quick else 5)
    results["visibility"] = v
    print(
        f"failure visibility (SIGKILL ->): client {v['client_ms']:.0f} ms, event stream "
        f"{v['stream_ms']:.0f} ms, API {v['api_ms']:.0f} ms ({v['api_after_client_ms']:+.0f} ms "
        f"after the client; budgets {VISIBLE_BUDGET_S * 1000:.0f} ms after the kill for the "
        f"stream, after the client for the API)",
        flush=True,
    )
    if v["api_after_client_ms"] > VISIBLE_BUDGET_S * 1000:
        over.append("failure visibility")
    if v["stream_ms"] > VISIBLE_BUDGET_S * 1000:
        over.append("failure on the event stream")

    pv = measure_page_visibility(dash, 2 if quick else 5)
    results["page_visibility"] = pv
    if isinstance(pv, str):
        print(f"failure in the page: {pv}", flush=True)
    else:
        print(
            f"failure in the page: {pv['page_after_client_ms']:.0f} ms after the client "
            f"(budget {VISIBLE_BUDGET_S * 1000:.0f} ms); first drawn by an event's refresh "
            f"{pv['drawn_by_an_event']} of {pv['kills']} times",
            flush=True,
        )
        if pv["page_after_client_ms"] > VISIBLE_BUDGET_S * 1000:
            over.append("failure in the page")

    m, pm = measure_metrics(dash, 2 if quick else 8, 10 if quick else 125, 5 if quick else 10)
    results["metrics"] = m
    print(
        f"/metrics with {m['actors']} actors: {m['metrics_ms']:.1f} ms (budget "
        f"{METRICS_BUDGET_MS:g}); v1/snapshot gathered: {m['snapshot_ms']:.1f} ms",
        flush=True,
    )
    if m["metrics_ms"] > METRICS_BUDGET_MS:
        over.append("/metrics")
    f = measure_first_load(dash, 3 if quick else 5)
    results["first_load"] = f
    if isinstance(f, str):
        print(f"page first load: {f}", flush=True)
    else:
        print(
            f"page first load ({m['actors']} actors): DOMContentLoaded "
            f"{f['dom_content_loaded_ms']:.0f} ms, first snapshot drawn "
            f"{f['first_snapshot_ms']:.0f} ms (budget {FIRST_LOAD_BUDGET_MS:g})",
            flush=True,
        )
        if f["first_snapshot_ms"] > FIRST_LOAD_BUDGET_MS:
            over.append("first load")
    pm.stop().get(timeout=120)
    dash.stop()
    results["over_budget"] = over
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("over budget: " + (", ".join(over) if over else "none"), flush=True)
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
