"""The config keys that take effect: each test here fails if its key is ignored.

The registry itself (types, precedence, the warning of ignored keys) is tested in
tests/test_config.py.
"""

from __future__ import annotations

import os
import pickle
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch._src import config as registry
from monarch._src.actor import pickling, runtime
from monarch._src.monitoring import dashboard
from monarch.actor import Actor, ActorMesh, endpoint
from monarch.config import clear_runtime_config, configured
from proc_state import running, voluntary_switches

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in registry.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    clear_runtime_config()
    yield
    clear_runtime_config()


# --- upstream's names for the mechanisms of this implementation -------------------------


def test_supervision_timeouts_are_the_heartbeat_timeout_when_set() -> None:
    assert runtime.liveness()["heartbeat_timeout"] == 2.0
    with configured(supervision_liveness_timeout="9s"):
        assert runtime.liveness()["heartbeat_timeout"] == 9.0
        with configured(supervision_watchdog_timeout="7s"):
            assert runtime.liveness()["heartbeat_timeout"] == 7.0
            # The key of this implementation wins over upstream's names.
            with configured(host_heartbeat_timeout="3s"):
                assert runtime.liveness()["heartbeat_timeout"] == 3.0


def test_the_orphan_timeout_is_the_client_lease_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert runtime.liveness()["client_lease"] == 10.0
    with configured(mesh_orphan_timeout="45s"):
        assert runtime.liveness()["client_lease"] == 45.0
        with configured(host_client_lease="4s"):
            assert runtime.liveness()["client_lease"] == 4.0
    with configured(mesh_orphan_timeout=None):  # never
        assert runtime.liveness()["client_lease"] == runtime.NEVER
    monkeypatch.setenv("HYPERACTOR_MESH_ORPHAN_TIMEOUT", "1m")
    assert runtime.liveness()["client_lease"] == 60.0


def test_the_admin_address_places_a_dashboard_turned_on_with_1() -> None:
    assert dashboard.configured_address() is None
    with configured(dashboard="1"):
        assert dashboard.configured_address() == "1"  # loopback, a free port
        with configured(mesh_admin_addr="127.0.0.1:18265"):
            assert dashboard.configured_address() == "127.0.0.1:18265"
    # An address in `dashboard` itself wins; off stays off.
    with configured(dashboard="127.0.0.1:9999", mesh_admin_addr="127.0.0.1:18265"):
        assert dashboard.configured_address() == "127.0.0.1:9999"
    with configured(mesh_admin_addr="127.0.0.1:18265"):
        assert dashboard.configured_address() is None


# --- small_write_threshold --------------------------------------------------------------


def test_small_write_threshold_sets_which_buffers_travel_out_of_band() -> None:
    blob = bytes(range(256)) * 16  # 4 KiB
    buffer = pickle.PickleBuffer(bytearray(blob))
    # Below the default (64 KiB): copied into the pickle, one part.
    assert len(pickling.dumps_call((blob,), {})) == 1
    assert len(pickling.dumps_parts(buffer)) == 1
    with configured(small_write_threshold=1024):
        parts = pickling.dumps_call((blob,), {})
        assert len(parts) == 3  # the pickle, the kinds, the buffer
        assert parts[2] is blob  # shared, not copied
        assert pickling.loads_parts(parts) == ((blob,), {})
        assert len(pickling.dumps_parts(buffer)) == 3
        assert len(pickling.dumps_value(blob)) == 3
    with configured(small_write_threshold=1 << 20):
        assert len(pickling.dumps_call((bytes(100_000),), {})) == 1


# --- mesh_terminate_timeout -------------------------------------------------------------

CLIENT = """
import sys, time
from monarch.actor import Actor, attach_to_workers, endpoint
from monarch.config import configured

class Stuck(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def hang(self) -> None:
        time.sleep(300)

hosts = attach_to_workers(workers=[sys.argv[1]], ca=None)
with configured(stop_actor_timeout="60s"):
    procs = hosts.spawn_procs(per_host={"gpus": 1}, name="stuck")
stuck = procs.spawn("s", Stuck)
stuck.ping.call().get(timeout=60)
stuck.hang.broadcast()
print("HUNG", flush=True)
sys.stdin.read()
import os
os._exit(0)
"""


def _env(**extra: str) -> dict[str, str]:
    drop = {k.env for k in registry.KEYS.values()} | {
        registry.SNAPSHOT_ENV,
        "MONARCH_CLUSTER_SECRET",
        "MONARCH_CLUSTER_AUTH",
        "MONARCH_TLS_CA",
        "MONARCH_TLS_CERT",
        "MONARCH_TLS_KEY",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return {**env, **extra}


class Lines:
    """The lines a process writes to its stdout, as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put(None)

        self.stdout = stdout
        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def close(self) -> None:
        """Once the process ended: wait for the rest of its output, close the pipe."""
        self.reader.join(timeout=10)
        self.stdout.close()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {text!r} within {timeout} s: {''.join(self.seen)[-3000:]}")
            if line is None:
                pytest.fail(f"the stream ended before {text!r}: {''.join(self.seen)[-3000:]}")
            self.seen.append(line)
            if text in line:
                return


def _end(proc: subprocess.Popen[str], lines: Lines) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    if proc.stdin is not None:
        proc.stdin.close()
    lines.close()


@pytest.mark.timeout(240)
def test_an_ending_worker_gives_its_procs_the_terminate_timeout(tmp_path: Path) -> None:
    """SIGTERM ends a worker: it gives each proc mesh_terminate_timeout, not the 30 s of
    its stop_actor_timeout, then kills it."""
    from monarch._src.actor.workers import READY_LINE

    address = f"ipc://{tmp_path}/worker.sock"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from monarch.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(address={address!r}, ca=None)\n",
        ],
        env=_env(
            HYPERACTOR_MESH_TERMINATE_TIMEOUT="1s",
            HYPERACTOR_STOP_ACTOR_TIMEOUT="30s",
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    worker_lines = Lines(worker)
    client = None
    try:
        worker_lines.wait_for(READY_LINE, timeout=60)
        client = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CLIENT), address],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        client_lines = Lines(client)
        client_lines.wait_for("HUNG", timeout=120)
        start = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        elapsed = time.monotonic() - start
        assert worker.returncode == 0
        assert elapsed < 10, f"the worker took {elapsed:.1f} s to end"
    finally:
        _end(worker, worker_lines)
        if client is not None:
            _end(client, client_lines)


# --- keys the runtime reads (Rust) ------------------------------------------------------


def test_the_channel_keys_reach_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []
    spins: list[float] = []
    monkeypatch.setattr(runtime, "set_channel_settings", lambda **kw: calls.append(kw))
    monkeypatch.setattr(runtime, "set_call_spin", spins.append)
    runtime.apply_channel_settings()
    assert spins[-1] == pytest.approx(200e-6)
    assert calls[-1] == {
        "delivery_timeout": 30.0,
        "tcp_keepalive_idle": 60.0,
        "tcp_congestion": None,
    }
    with configured(
        message_delivery_timeout="5s",
        channel_tcp_keepalive_idle="20s",
        channel_tcp_congestion="bbr",
    ):
        runtime.apply_channel_settings()
    assert calls[-1] == {
        "delivery_timeout": 5.0,
        "tcp_keepalive_idle": 20.0,
        "tcp_congestion": "bbr",
    }
    with configured(call_spin="0s"):
        runtime.apply_channel_settings()
    assert spins[-1] == 0.0


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def _sleeps_per_call(ping: ActorMesh[Ping], calls: int) -> float:
    """How often the calling thread slept per call_one, over ``calls`` calls."""
    tid = threading.get_native_id()
    before = voluntary_switches(tid)
    for _ in range(calls):
        ping.ping.call_one().get(timeout=30)
    return (voluntary_switches(tid) - before) / calls


@pytest.mark.timeout(180)
def test_call_spin_keeps_the_caller_of_short_calls_awake() -> None:
    """With call_spin 0 the caller sleeps until each reply wakes it; with a limit above
    the round trip it watches for the reply instead, and sleeps in few calls."""
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        ping = procs.spawn("spin-ping", Ping)
        ping.ping.call_one().get(timeout=60)
        with configured(call_spin="0s"):
            runtime.apply_channel_settings()
            off = _sleeps_per_call(ping, 300)
        with configured(call_spin="20ms"):
            runtime.apply_channel_settings()
            _sleeps_per_call(ping, 50)  # the average of recent waits settles
            on = _sleeps_per_call(ping, 300)
    finally:
        runtime.apply_channel_settings()
        procs.stop().get(timeout=60)
    assert off >= 0.5, f"without spinning the caller slept in only {off:.2f} of the calls"
    assert on < off / 2, f"spinning: slept {on:.2f} per call, against {off:.2f} without"


DELIVERY = """
import os, signal, sys, time
sys.path.insert(0, TESTS)
from proc_state import freeze
from monarch.actor import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"gpus": 1}, name="frozen")
echo = procs.spawn("echo", Echo)
pid = echo.pid.call_one().get(timeout=60)
freeze(pid)  # every thread stopped, not only the signal queued
start = time.monotonic()
try:
    echo.pid.call_one().get(timeout=60)
    print("DELIVERED", flush=True)
except BaseException as e:
    print(f"FAILED after {time.monotonic() - start:.1f} s: {e}", flush=True)
finally:
    os.kill(pid, signal.SIGCONT)
"""


@pytest.mark.timeout(180)
def test_a_message_a_frozen_proc_never_takes_fails_after_the_delivery_timeout() -> None:
    script = textwrap.dedent(DELIVERY).replace("TESTS", repr(str(ROOT / "tests")))
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT="2s"),
        capture_output=True,
        text=True,
        timeout=150,
    )
    text = out.stdout + out.stderr
    assert "DELIVERED" not in out.stdout, text
    # The link to the frozen proc failed after 2 s (not the call's 60 s): its host
    # killed it as unreachable, and the program ended on that unhandled failure.
    assert "message delivery timeout (2s)" in text, text
    assert "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT" in text, text
    assert "its process was lost: the host lost its connection to it" in text, text
    assert out.returncode == 1, text
    assert "FAILED after 6" not in out.stdout, text  # not the call's own timeout


def _noisy_exit() -> None:
    for i in range(1, 41):
        print(f"tail line {i}", file=sys.stderr, flush=True)
    os._exit(3)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("lines", "first"), [(None, 21), (30, 11), (0, None)])
def test_tail_log_lines_is_how_much_stderr_a_failed_spawn_shows(
    lines: int | None, first: int | None
) -> None:
    from monarch.actor import this_host

    settings = {} if lines is None else {"tail_log_lines": lines}
    with configured(**settings):
        procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_noisy_exit)
    with pytest.raises(RuntimeError, match="failed to start") as info:
        procs.initialized.get(timeout=90)
    text = str(info.value)
    shown = [int(n) for n in re.findall(r"tail line (\d+)", text)]
    if first is None:
        assert shown == [], text
        assert "tail_log_lines is 0" in text
    else:
        assert shown == list(range(first, 41)), text
    procs.stop().get(timeout=60)


class Stuck(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hang(self) -> None:
        time.sleep(300)


@pytest.mark.timeout(180)
def test_process_exit_timeout_bounds_the_wait_for_a_stopping_proc() -> None:
    """The proc's actors get 60 s to stop (stop_actor_timeout), but stopping the mesh
    waits process_exit_timeout for its process, then its host kills it."""
    from monarch.actor import this_host

    with configured(stop_actor_timeout="60s"):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    stuck = procs.spawn("stuck", Stuck)
    pid = stuck.pid.call_one().get(timeout=60)
    stuck.hang.broadcast()
    start = time.monotonic()
    with configured(process_exit_timeout="1s"):
        procs.stop().get(timeout=90)
    elapsed = time.monotonic() - start
    assert elapsed < 8, f"stopping took {elapsed:.1f} s"
    assert not running(pid)
