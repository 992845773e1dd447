"""The admin server through the Python binding, over the recorded job: the token flow,
the security refusals, ``/metrics`` as Prometheus parses it, and that the server answers
while the interpreter is busy."""

from __future__ import annotations

import http.client
import json
import mmap
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch._rust_bindings import AdminConfig, AdminServer

pytestmark = pytest.mark.timeout(60)

RECORDED = Path(__file__).parent / "fixtures" / "recorded.json"


@pytest.fixture
def server() -> Iterator[AdminServer]:
    srv = AdminServer.serve_recorded(str(RECORDED), AdminConfig())
    yield srv
    srv.stop()


def request(
    srv: AdminServer,
    path: str,
    headers: dict[str, str] | None = None,
    method: str = "GET",
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request (redirects not followed); ``(status, headers, body)``."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def bearer(srv: AdminServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {srv.token}"}


def get_json(srv: AdminServer, path: str) -> Any:
    status, _, body = request(srv, path, bearer(srv))
    assert status == 200, body
    return json.loads(body)


def test_urls_and_token(server: AdminServer) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/"
    assert server.url == f"{server.base_url}?token={server.token}"
    assert len(server.token) == 64 and int(server.token, 16) >= 0


def test_token_redirects_to_a_cookie(server: AdminServer) -> None:
    status, headers, _ = request(server, f"/?token={server.token}")
    assert status == 303
    assert headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert cookie == f"monarch_admin={server.token}; HttpOnly; SameSite=Strict; Path=/"
    status, headers, _ = request(server, "/", {"Cookie": cookie.split(";")[0]})
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert get_json(server, "/v1/summary")["health"] == "degraded"


def test_refusals(server: AdminServer) -> None:
    status, _, body = request(server, "/v1/summary")
    assert status == 401
    assert "dashboard_url" in json.loads(body)["error"]
    status, _, body = request(server, "/")
    assert status == 401 and b"JobState.dashboard_url" in body
    assert request(server, "/?token=wrong")[0] == 401
    assert request(server, "/v1/summary", {"Authorization": "Bearer wrong"})[0] == 401
    status, _, body = request(server, "/v1/summary", {**bearer(server), "Host": "evil.example"})
    assert status == 403 and "allowed_hosts" in json.loads(body)["error"]
    cross = {**bearer(server), "Origin": "http://evil.example"}
    assert request(server, "/v1/summary", cross)[0] == 403
    same = {**bearer(server), "Origin": f"http://127.0.0.1:{server.port}"}
    assert request(server, "/v1/summary", same)[0] == 200
    proc = "proc-11a1%40unix%3A%40%2Ftmp%2Fhyperactor-0%2Fp4103"
    status, _, body = request(server, f"/v1/actions/kill_proc?proc={proc}", bearer(server), "POST")
    assert status == 403 and "read-only" in json.loads(body)["error"]
    status, _, body = request(server, "/v1/nope", bearer(server))
    assert status == 404 and json.loads(body)["version"] == 1


def test_actions_enabled_and_allowed_hosts() -> None:
    config = AdminConfig(actions=True, allowed_hosts=["dash.example"], token="t0ken")
    srv = AdminServer.serve_recorded(str(RECORDED), config)
    try:
        assert srv.token == "t0ken"
        proc = "proc-11a1%40unix%3A%40%2Ftmp%2Fhyperactor-0%2Fp4103"
        status, _, body = request(srv, f"/v1/actions/kill_proc?proc={proc}", bearer(srv), "POST")
        assert status == 200, body
        status, _, _ = request(srv, "/v1/summary", {**bearer(srv), "Host": "dash.example"})
        assert status == 200
    finally:
        srv.stop()


def test_bad_settings_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="host:port"):
        AdminServer.serve_recorded(str(RECORDED), AdminConfig(bind="nowhere"))
    with pytest.raises(ValueError, match="tls_key"):
        AdminServer.serve_recorded(str(RECORDED), AdminConfig(tls_cert="/x.pem"))
    with pytest.raises(ValueError, match=r"no-such\.json"):
        AdminServer.serve_recorded("/no-such.json", AdminConfig())


def test_routes_over_the_recording(server: AdminServer) -> None:
    assert get_json(server, "/v1/actors")["total"] == 4
    assert get_json(server, "/v1/actors?system=1")["total"] == 8
    assert len(get_json(server, "/v1/procs")["items"]) == 4
    assert [e["seq"] for e in get_json(server, "/v1/events?since=2")["items"]] == [3, 4]
    assert len(get_json(server, "/v1/series?window=60")["points"]) == 60
    assert get_json(server, "/v1/logs?q=step+39")["items"][0]["line"] == "step 39 loss 0.0250"


def test_metrics_parse_with_prometheus_client(server: AdminServer) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    status, headers, body = request(server, "/metrics", bearer(server))
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in parser.text_string_to_metric_families(body.decode())}
    # prometheus_client drops `_total` from counter family names.
    for name in [
        "monarch_actor_messages",
        "monarch_actor_queue_depth",
        "monarch_endpoint_duration_seconds",
        "monarch_proc_up",
        "monarch_host_load1",
        "monarch_gpu_utilization_ratio",
        "monarch_events",
    ]:
        assert name in families, name
    hist = families["monarch_endpoint_duration_seconds"]
    assert hist.type == "histogram"
    steps = [s for s in hist.samples if s.labels.get("endpoint") == "step"]
    inf = [s.value for s in steps if s.labels.get("le") == "+Inf"]
    count = [s.value for s in steps if s.name.endswith("_count")]
    assert inf == count and inf[0] > 0


def test_stop_ends_serving(server: AdminServer) -> None:
    server.stop()
    with pytest.raises(OSError):
        request(server, "/v1/summary", bearer(server))
    server.stop()  # idempotent


_CHILD = textwrap.dedent(
    """
    import mmap, sys, time, urllib.request
    port, token, path = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(path, "r+b") as f:
        flags = mmap.mmap(f.fileno(), 2)
    while flags[0] != 1:  # until the parent spins
        time.sleep(0.001)
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/summary", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        spinning = flags[0]  # read before saying "answered": the parent then stops
        flags[1] = 1  # answered
        print(r.status, spinning)
    """
)


def test_answers_while_python_is_busy(server: AdminServer, tmp_path: Path) -> None:
    """A request from another process is answered while this interpreter spins in pure
    Python (holding the GIL): the two processes share two flags in a file mapping, which
    the spin reads without releasing the GIL. The child sends its request once the spin
    started, and the spin goes on until the answer came (or 60 s, to end a hang)."""
    path = tmp_path / "flags"
    path.write_bytes(b"\0\0")
    with open(path, "r+b") as f:
        flags = mmap.mmap(f.fileno(), 2)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(server.port), server.token, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        flags[0] = 1  # spinning
        give_up = time.monotonic() + 60
        while flags[1] != 1 and time.monotonic() < give_up:
            pass
        answered_while_spinning = flags[1] == 1
        flags[0] = 2  # the spin ended
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        flags.close()
    assert answered_while_spinning, f"the request was not answered during the spin ({out})"
    assert out.split() == ["200", "1"], out


def test_serve_live_over_this_process() -> None:
    from monarch._rust_bindings import monitor_record_event
    from monarch._src.actor import process

    srv = AdminServer.serve_live(process.get().agent, AdminConfig())
    try:
        snapshot = get_json(srv, "/v1/snapshot")
        assert snapshot["version"] == 1 and len(snapshot["bucket_bounds_us"]) == 25
        assert len(snapshot["procs"]) >= 1
        summary = get_json(srv, "/v1/summary")
        # Earlier tests of the session may have left failures: any health is a health.
        assert summary["health"] in ("ok", "degraded", "failed") and summary["pid"] > 0
        seq = monitor_record_event("breakpoint", "from test_serve_live")
        since = get_json(srv, f"/v1/events?since={seq - 1}")["items"]
        assert [e["message"] for e in since] == ["from test_serve_live"]
        status, _, body = request(srv, "/metrics", bearer(srv))
        assert status == 200 and b"monarch_proc_up{" in body
    finally:
        srv.stop()
