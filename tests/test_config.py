"""monarch.config: keys, types, defaults, precedence, snapshots, errors, helpers, guide."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import monarch
import monarch.config
from monarch._src import config as registry
from monarch._src.config import doc, kinds
from monarch.config import (
    Encoding,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    parametrize_config,
    parametrize_config_pointwise,
)

# Tests here set keys that are ignored in this implementation (their warning is tested
# on its own, below, with pytest.warns).
pytestmark = pytest.mark.filterwarnings("ignore::monarch.config.IgnoredSettingWarning")

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "config.md"
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
TEXT_BLOCK = re.compile(r"^```text[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def clean_env() -> dict[str, str]:
    """This process's environment without any config variable."""
    drop = {k.env for k in registry.KEYS.values()} | {registry.SNAPSHOT_ENV}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in registry.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    monkeypatch.delenv(registry.SNAPSHOT_ENV, raising=False)
    clear_runtime_config()
    registry.clear_snapshot_config()
    registry._forget_warnings()
    yield
    clear_runtime_config()
    registry.clear_snapshot_config()
    registry._forget_warnings()


# Upstream Monarch's names, variables and defaults, written out independently of the
# registry so that a changed default or variable fails here (except the defaults this
# implementation changes on purpose, in DIFFERENT_HERE).
UPSTREAM = [
    ("cast_fanout", "HYPERACTOR_MESH_CAST_FANOUT", 16),
    ("default_transport", "HYPERACTOR_MESH_DEFAULT_TRANSPORT", "unix"),
    ("enable_log_forwarding", "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING", False),
    ("enable_file_capture", "HYPERACTOR_MESH_ENABLE_FILE_CAPTURE", False),
    ("tail_log_lines", "HYPERACTOR_MESH_TAIL_LOG_LINES", 0),
    ("force_file_log", "HYPERACTOR_FORCE_FILE_LOG", False),
    ("prefix_with_rank", "HYPERACTOR_PREFIX_WITH_RANK", True),
    ("read_log_buffer", "HYPERACTOR_READ_LOG_BUFFER", 100),
    ("codec_max_frame_length", "HYPERACTOR_CODEC_MAX_FRAME_LENGTH", 10 * 1024**3),
    ("message_delivery_timeout", "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", "30s"),
    ("host_spawn_ready_timeout", "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT", "30s"),
    ("mesh_proc_spawn_max_idle", "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE", "30s"),
    ("actor_spawn_max_idle", "HYPERACTOR_MESH_ACTOR_SPAWN_MAX_IDLE", "30s"),
    ("process_exit_timeout", "HYPERACTOR_PROCESS_EXIT_TIMEOUT", "10s"),
    ("stop_actor_timeout", "HYPERACTOR_STOP_ACTOR_TIMEOUT", "10s"),
    ("cleanup_timeout", "HYPERACTOR_CLEANUP_TIMEOUT", "3s"),
    ("supervision_watchdog_timeout", "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT", "2m"),
    ("mesh_bootstrap_enable_pdeathsig", "HYPERACTOR_MESH_BOOTSTRAP_ENABLE_PDEATHSIG", True),
    ("mesh_admin_addr", "HYPERACTOR_MESH_ADMIN_ADDR", "[::]:1729"),
    ("mesh_attach_config_timeout", "HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT", "10s"),
    ("default_encoding", "HYPERACTOR_DEFAULT_ENCODING", Encoding.Multipart),
    ("small_write_threshold", "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD", 256),
    ("tokio_worker_threads", "MONARCH_TOKIO_WORKER_THREADS", None),
    ("rdma_allow_tcp_fallback", "MONARCH_RDMA_ALLOW_TCP_FALLBACK", True),
    ("rdma_disable_ibverbs", "MONARCH_RDMA_DISABLE_IBVERBS", False),
    ("rdma_max_chunk_size_mb", "MONARCH_RDMA_MAX_CHUNK_SIZE_MB", 64),
    ("rdma_tcp_fallback_parallelism", "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM", 1),
    ("rdma_ibverbs_target", "MONARCH_RDMA_IBVERBS_TARGET", ""),
    ("rdma_peer_device_affinity", "MONARCH_RDMA_PEER_DEVICE_AFFINITY", ""),
    ("rdma_runtime_worker_threads", "MONARCH_RDMA_RUNTIME_WORKER_THREADS", 16),
    ("rdma_qp_init_timeout", "MONARCH_RDMA_QP_INIT_TIMEOUT", "30s"),
    ("rdma_qps_per_cq", "MONARCH_RDMA_QPS_PER_CQ", 1),
    ("rdma_cq_busy_poll_window", "MONARCH_RDMA_CQ_BUSY_POLL_WINDOW", None),
    ("hyperactor_tls_ca", "HYPERACTOR_TLS_CA", "/etc/hyperactor/tls/ca.crt"),
    ("hyperactor_tls_cert", "HYPERACTOR_TLS_CERT", "/etc/hyperactor/tls/tls.crt"),
    ("hyperactor_tls_key", "HYPERACTOR_TLS_KEY", "/etc/hyperactor/tls/tls.key"),
    ("file_log_level", "MONARCH_FILE_LOG", ""),
    ("enable_otel_tracing", "ENABLE_OTEL_TRACING", True),
    ("enable_otel_metrics", "ENABLE_OTEL_METRICS", True),
    ("remote_alloc_bind_to_inaddr_any", "HYPERACTOR_REMOTE_ALLOC_BIND_TO_INADDR_ANY", False),
    ("remote_alloc_bootstrap_addr", "HYPERACTOR_REMOTE_ALLOC_BOOTSTRAP_ADDR", ""),
    ("remote_alloc_allowed_port_range", "HYPERACTOR_REMOTE_ALLOC_ALLOWED_PORT_RANGE", None),
]

# Defaults changed on purpose (docs/logging.md): procs' output reaches the client, and
# log files, without opting in.
DIFFERENT_HERE = {
    "enable_log_forwarding": True,
    "enable_file_capture": True,
    # Several connections reach the TCP path's throughput budget (docs/rdma.md).
    "rdma_tcp_fallback_parallelism": 4,
    # A spawn whose proc dies before it is ready shows the proc's last stderr lines.
    "tail_log_lines": 20,
    # Below 64 KiB, copying into the pickle is cheaper than a message part of its own.
    "small_write_threshold": 64 << 10,
}


@pytest.mark.parametrize(("name", "env", "default"), UPSTREAM, ids=[u[0] for u in UPSTREAM])
def test_upstream_keys_have_their_variables_and_defaults(
    name: str, env: str, default: object
) -> None:
    assert registry.KEYS[name].env == env
    assert get_global_config()[name] == DIFFERENT_HERE.get(name, default)


@pytest.mark.parametrize("name", list(registry.KEYS))
def test_every_key_reads_its_default_and_its_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = registry.KEYS[name]
    assert get_global_config()[name] == key.kind.show(key.default)
    assert registry.get(name) == key.kind.native(key.default)
    # The default, written as environment text, reads back as the default.
    monkeypatch.setenv(key.env, key.kind.text(key.default))
    assert registry.get(name) == key.kind.native(key.default)
    # And configure() takes the value get_global_config() shows.
    configure(**{name: get_global_config()[name]})
    assert get_runtime_config() == {name: key.kind.show(key.default)}


def test_get_returns_values_for_code() -> None:
    assert registry.get("message_delivery_timeout") == 30.0
    assert registry.get("split_max_buffer_age") == pytest.approx(0.05)
    assert registry.get("default_encoding") is Encoding.Multipart
    assert registry.get("rdma_cq_busy_poll_window") is None
    with configured(rdma_cq_busy_poll_window="250us"):
        assert registry.get("rdma_cq_busy_poll_window") == pytest.approx(250e-6)


def test_configure_configured_and_clear() -> None:
    configure(cast_fanout=4, enable_log_forwarding=True)
    assert get_runtime_config() == {"cast_fanout": 4, "enable_log_forwarding": True}
    with configured(cast_fanout=8, tail_log_lines=5) as merged:
        assert merged["cast_fanout"] == 8
        assert merged["tail_log_lines"] == 5
        assert merged["enable_log_forwarding"] is True
        assert get_runtime_config() == {
            "cast_fanout": 8,
            "enable_log_forwarding": True,
            "tail_log_lines": 5,
        }
    assert get_runtime_config() == {"cast_fanout": 4, "enable_log_forwarding": True}
    clear_runtime_config()
    assert get_runtime_config() == {}
    assert get_global_config()["cast_fanout"] == 16


def test_configured_restores_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"), configured(cast_fanout=3):
        raise RuntimeError("boom")
    assert get_runtime_config() == {}


def test_a_rejected_configure_changes_nothing() -> None:
    configure(tail_log_lines=7)
    with pytest.raises(TypeError, match="cast_fanout"):
        configure(tail_log_lines=9, cast_fanout="2")
    with pytest.raises(TypeError), configured(tail_log_lines=9, cast_fanout=0):
        pass
    assert get_runtime_config() == {"tail_log_lines": 7}


def test_none_leaves_a_key_unchanged_unless_it_admits_none() -> None:
    configure(cast_fanout=4, rdma_cq_busy_poll_window="1ms")
    configure(cast_fanout=None, rdma_cq_busy_poll_window=None)
    assert get_runtime_config() == {"cast_fanout": 4, "rdma_cq_busy_poll_window": None}
    with pytest.raises(ValueError, match="unknown config key"):
        configure(no_such_key=None)


def test_cached_sees_configure() -> None:
    assert registry.cached("cast_fanout") == 16
    with configured(cast_fanout=3):
        assert registry.cached("cast_fanout") == 3
    assert registry.cached("cast_fanout") == 16


def test_the_top_level_package_re_exports_the_config_api() -> None:
    for name in monarch.config.__all__:
        assert getattr(monarch, name) is getattr(monarch.config, name), name


# --- precedence -------------------------------------------------------------------------


def test_env_beats_runtime_beats_snapshot_beats_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert get_global_config()["tail_log_lines"] == 20
    snapshot = json.dumps({"tail_log_lines": "10", "cast_fanout": "5"})
    applied = registry.apply_snapshot_from_env({registry.SNAPSHOT_ENV: snapshot})
    assert applied == {"tail_log_lines": 10, "cast_fanout": 5}
    assert get_global_config()["tail_log_lines"] == 10
    assert get_runtime_config() == {}  # the snapshot is a layer of its own
    configure(tail_log_lines=20)
    assert get_global_config()["tail_log_lines"] == 20
    assert get_global_config()["cast_fanout"] == 5
    monkeypatch.setenv("HYPERACTOR_MESH_TAIL_LOG_LINES", "30")
    assert get_global_config()["tail_log_lines"] == 30
    assert registry.get_snapshot_config() == {"tail_log_lines": 10, "cast_fanout": 5}


def test_an_invalid_variable_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT='soon'.*"):
        get_global_config()
    monkeypatch.setenv("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", "45")
    assert get_global_config()["message_delivery_timeout"] == "45s"


# --- snapshots --------------------------------------------------------------------------

CHILD = """
import json
from monarch._src.config import apply_snapshot_from_env, get_global_config, get_runtime_config
applied = apply_snapshot_from_env()
config = get_global_config()
print(json.dumps({"applied": sorted(applied), "runtime": get_runtime_config(),
                  "config": {k: config[k] for k in ("cast_fanout", "message_delivery_timeout",
                  "default_encoding", "tail_log_lines", "hyperactor_tls_ca")}}, default=str))
"""


def run_child(extra_env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**clean_env(), **extra_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_snapshot_round_trips_through_a_child_environment() -> None:
    registry.apply_snapshot_from_env({registry.SNAPSHOT_ENV: '{"tail_log_lines":"7"}'})
    with configured(
        cast_fanout=3,
        message_delivery_timeout="1h 30m",
        default_encoding=Encoding.Json,
        hyperactor_tls_ca="/my/ca.crt",
    ):
        env = registry.snapshot_for_children()
    assert list(env) == [registry.SNAPSHOT_ENV]
    child = run_child(env)
    # The runtime layer over the inherited snapshot; TLS files stay in this process.
    assert child["applied"] == [
        "cast_fanout",
        "default_encoding",
        "message_delivery_timeout",
        "tail_log_lines",
    ]
    assert child["runtime"] == {}
    assert child["config"] == {
        "cast_fanout": 3,
        "message_delivery_timeout": "1h 30m",
        "default_encoding": "Encoding.Json",
        "tail_log_lines": 7,
        "hyperactor_tls_ca": "/etc/hyperactor/tls/ca.crt",
    }
    # The child's own environment beats the snapshot.
    child = run_child({**env, "HYPERACTOR_MESH_CAST_FANOUT": "9"})
    assert child["config"]["cast_fanout"] == 9  # type: ignore[index]
    # Without the variable, a child has the defaults.
    child = run_child({})
    assert child["applied"] == []
    assert child["config"]["cast_fanout"] == 16  # type: ignore[index]


def test_an_empty_runtime_layer_snapshots_to_an_empty_object() -> None:
    assert registry.snapshot_for_children() == {registry.SNAPSHOT_ENV: "{}"}
    assert registry.apply_snapshot_from_env({}) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "is not valid JSON"),
        ('["cast_fanout"]', "must map key names to strings"),
        ('{"cast_fanout": 3}', "must map key names to strings"),
        ('{"cast_fanout_x": "3"}', "unknown config key 'cast_fanout_x'"),
        ('{"cast_fanout": "zero"}', "config key 'cast_fanout'='zero'"),
    ],
)
def test_a_bad_snapshot_is_rejected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.apply_snapshot_from_env({registry.SNAPSHOT_ENV: text})
    assert registry.get_snapshot_config() == {}


# --- errors -----------------------------------------------------------------------------


def test_unknown_keys_suggest_close_matches_or_list_all() -> None:
    with pytest.raises(ValueError, match=r"did you mean 'message_delivery_timeout'"):
        configure(message_delivery_timout="1s")
    with pytest.raises(ValueError) as info:
        configure(zzz=1)
    assert "known keys: actor_queue_dispatch, actor_spawn_max_idle" in str(info.value)
    for name in registry.KEYS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(cast_fanout="2"), TypeError, "config key 'cast_fanout': expected an int, got str"),
        (dict(cast_fanout=True), TypeError, "expected an int, got bool True"),
        (dict(cast_fanout=0), kinds.ConfigValueError, "expected an int >= 1, got 0"),
        (dict(message_ttl_default=256), kinds.ConfigValueError, "int in [0, 255], got 256"),
        (dict(enable_log_forwarding=1), TypeError, "expected a bool (True or False), got int"),
        (dict(tail_log_lines=-1), kinds.ConfigValueError, "expected an int >= 0, got -1"),
        (dict(message_latency_sampling_rate=2), kinds.ConfigValueError, "float in [0, 1]"),
        (dict(file_log_level=3), TypeError, "expected a str, got int 3"),
        (dict(mesh_admin_addr="localhost"), kinds.ConfigValueError, "HOST:PORT"),
        (dict(mesh_admin_addr="::1:80"), kinds.ConfigValueError, "IPv6 host in brackets"),
        (dict(default_transport="carrier pigeon"), kinds.ConfigValueError, "transport name"),
        (dict(default_transport=7), TypeError, "expected a transport name"),
        (dict(default_encoding="json"), TypeError, "expected an Encoding (Encoding.Bincode"),
        (dict(default_encoding=2), TypeError, "expected an Encoding"),
    ],
)
def test_bad_values_name_the_key_and_what_is_expected(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)) as info:
        configure(**kwargs)
    assert f"config key '{next(iter(kwargs))}'" in str(info.value)
    assert get_runtime_config() == {}


def test_a_rejected_value_is_both_a_type_and_a_value_error() -> None:
    with pytest.raises(TypeError):
        configure(cast_fanout=0)
    with pytest.raises(ValueError):
        configure(message_delivery_timeout="5 parsecs")


# --- durations --------------------------------------------------------------------------

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns", "canonical"),
    [
        ("30s", 30 * S, "30s"),
        ("1h 30m", 5400 * S, "1h 30m"),
        ("1h30m", 5400 * S, "1h 30m"),
        ("500ms", S // 2, "500ms"),
        ("2m 5s", 125 * S, "2m 5s"),
        ("90 seconds", 90 * S, "1m 30s"),
        ("1.5s", 3 * S // 2, "1s 500ms"),
        ("250us", 250_000, "250us"),
        ("7ns", 7, "7ns"),
        ("2 days 3 hours", (2 * 86400 + 3 * 3600) * S, "2days 3h"),
        ("1d", 86400 * S, "1day"),
        ("1w", 7 * 86400 * S, "7days"),
        ("1M", 2_630_016 * S, "1month"),
        ("2y", 2 * 31_557_600 * S, "2years"),
        ("45", 45 * S, "45s"),
        (" 0.25 ", S // 4, "250ms"),
        ("0", 0, "0s"),
        ("0s", 0, "0s"),
    ],
)
def test_durations_parse_and_format(text: str, ns: int, canonical: str) -> None:
    assert kinds.parse_duration(text) == ns
    assert kinds.format_duration(ns) == canonical
    assert kinds.parse_duration(canonical) == ns
    with configured(message_delivery_timeout=canonical) as merged:
        assert merged["message_delivery_timeout"] == canonical
    if text.strip().replace(".", "").isdigit():
        # A bare number is seconds in an environment variable; configure() wants a
        # unit, as upstream Monarch's does.
        with pytest.raises(TypeError, match="Invalid duration format"):
            configure(message_delivery_timeout=text)
    else:
        with configured(message_delivery_timeout=text) as merged:
            assert merged["message_delivery_timeout"] == canonical


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Invalid duration format ''"),
        ("soon", "Invalid duration format 'soon'"),
        ("5 parsecs", "unknown unit 'parsecs'"),
        ("-1s", "Invalid duration format '-1s'"),
        ("10s 5", "Invalid duration format '10s 5'"),
        ("30", "Invalid duration format '30': a number needs a unit"),
        ("1e3s", "unknown unit 'e'"),
        ("99999999999999999999999y", "too long"),
    ],
)
def test_bad_durations_say_how_to_write_one(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        configure(stop_actor_timeout=text)
    assert "config key 'stop_actor_timeout'" in str(info.value)
    if message != "too long":
        assert "e.g. '30s', '1h 30m', '500ms', '2m 5s'" in str(info.value)


def test_durations_take_humantime_strings_and_timedeltas_not_numbers() -> None:
    with configured(cleanup_timeout=datetime.timedelta(minutes=2, microseconds=5)) as merged:
        assert merged["cleanup_timeout"] == "2m 5us"
    with pytest.raises(ValueError, match="cleanup_timeout"):
        configure(cleanup_timeout=datetime.timedelta(seconds=-1))
    # As upstream Monarch: a number is the wrong type (which unit?), and says how to write it.
    for bad in (90, 0.1, -1, math.inf):
        with pytest.raises(TypeError, match=rf"cleanup_timeout.*for seconds, write '{bad}s'"):
            configure(cleanup_timeout=bad)
    with pytest.raises(TypeError, match=r"a humantime string such as '30s'"):
        configure(cleanup_timeout=True)


def test_duration_variables_use_the_same_syntax(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERACTOR_STOP_ACTOR_TIMEOUT", "1h 30m")
    assert get_global_config()["stop_actor_timeout"] == "1h 30m"
    assert registry.get("stop_actor_timeout") == 5400.0
    monkeypatch.setenv("MONARCH_RDMA_CQ_BUSY_POLL_WINDOW", "")
    assert get_global_config()["rdma_cq_busy_poll_window"] is None
    monkeypatch.setenv("MONARCH_RDMA_CQ_BUSY_POLL_WINDOW", "2ms")
    assert get_global_config()["rdma_cq_busy_poll_window"] == "2ms"


# --- enums and other kinds --------------------------------------------------------------


@pytest.mark.parametrize("member", list(Encoding))
def test_encoding_takes_its_members_not_names(member: Encoding) -> None:
    with configured(default_encoding=member) as merged:
        assert merged["default_encoding"] is member
        assert registry.get("default_encoding") is member
    # As upstream Monarch: a name is the wrong type (the environment variable takes it).
    with pytest.raises(TypeError, match=r"expected an Encoding \(Encoding\.Bincode"):
        configure(default_encoding=member.name.lower())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("json", Encoding.Json),
        ("Multipart", Encoding.Multipart),
        ("serde_json", Encoding.Json),
        ("SERDE_MULTIPART", Encoding.Multipart),
        ("bincode", Encoding.Bincode),
    ],
)
def test_encoding_variable_takes_names(
    text: str, expected: Encoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPERACTOR_DEFAULT_ENCODING", text)
    assert get_global_config()["default_encoding"] is expected


def test_encoding_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [e.name for e in Encoding] == ["Bincode", "Json", "Multipart"]
    monkeypatch.setenv("HYPERACTOR_DEFAULT_ENCODING", "serde_json")
    assert get_global_config()["default_encoding"] is Encoding.Json
    monkeypatch.setenv("HYPERACTOR_DEFAULT_ENCODING", "xml")
    with pytest.raises(ValueError, match="HYPERACTOR_DEFAULT_ENCODING='xml'"):
        registry.get("default_encoding")


def test_bool_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, value in [("1", True), ("TRUE", True), ("on", True), ("0", False), ("no", False)]:
        monkeypatch.setenv("MONARCH_RDMA_ALLOW_TCP_FALLBACK", text)
        assert get_global_config()["rdma_allow_tcp_fallback"] is value
    monkeypatch.setenv("MONARCH_RDMA_ALLOW_TCP_FALLBACK", "maybe")
    with pytest.raises(ValueError, match="expected true/false"):
        get_global_config()


def test_transports_take_names_addresses_and_enum_members() -> None:
    import enum

    class ChannelTransport(enum.Enum):  # the shape of upstream Monarch's enum
        Unix = 1
        TcpWithHostname = 2
        MetaTlsWithIpV6 = 3

    for value, shown in [
        ("TCP", "tcp"),
        ("local", "local"),
        ("tcp:127.0.0.1:8080", "tcp:127.0.0.1:8080"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
        ("tcp!10.0.0.1:0", "tcp!10.0.0.1:0"),
        (ChannelTransport.Unix, "unix"),
        (ChannelTransport.TcpWithHostname, "tcp"),
        (ChannelTransport.MetaTlsWithIpV6, "metatls"),
    ]:
        with configured(default_transport=value) as merged:
            assert merged["default_transport"] == shown


def test_optional_ints_and_socket_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    with configured(rdma_max_nics_per_buffer=None, tokio_worker_threads=3) as merged:
        assert merged["rdma_max_nics_per_buffer"] is None
        assert merged["tokio_worker_threads"] == 3
    monkeypatch.setenv("MONARCH_RDMA_MAX_NICS_PER_BUFFER", "")
    assert get_global_config()["rdma_max_nics_per_buffer"] is None
    with configured(mesh_admin_addr="0.0.0.0:8080") as merged:
        assert merged["mesh_admin_addr"] == "0.0.0.0:8080"


# --- pytest helpers ---------------------------------------------------------------------

HELPERS_TESTS = """
from monarch.config import (
    Encoding, get_global_config, get_runtime_config, parametrize_config,
    parametrize_config_pointwise,
)

seen = []

@parametrize_config(cast_fanout=[2, 16], default_encoding={Encoding.Multipart, Encoding.Json})
def test_product(tmp_path):
    config = get_global_config()
    seen.append(("product", config["cast_fanout"], config["default_encoding"].name))
    assert tmp_path.exists()  # fixtures still reach the test

@parametrize_config_pointwise(cast_fanout=[3, 5], message_delivery_timeout=["1s", "2m"])
def test_pointwise():
    config = get_global_config()
    seen.append(("pointwise", config["cast_fanout"], config["message_delivery_timeout"]))

@parametrize_config(tail_log_lines=[1, 2])
@parametrize_config(cast_fanout=[4])
def test_stacked():
    config = get_global_config()
    seen.append(("stacked", config["tail_log_lines"], config["cast_fanout"]))

def test_zz_every_run_saw_its_config_and_left_nothing_behind():
    assert get_runtime_config() == {}
    assert sorted(seen) == sorted([
        ("product", 2, "Json"), ("product", 2, "Multipart"),
        ("product", 16, "Json"), ("product", 16, "Multipart"),
        ("pointwise", 3, "1s"), ("pointwise", 5, "2m"),
        ("stacked", 1, 4), ("stacked", 2, 4),
    ])
"""


@pytest.mark.timeout(120)
def test_parametrize_helpers_run_a_test_per_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_helpers=HELPERS_TESTS)
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(
        [
            "*test_product?cast_fanout=2-default_encoding=Json? PASSED*",
            "*test_product?cast_fanout=16-default_encoding=Multipart? PASSED*",
            "*test_pointwise?cast_fanout=5-message_delivery_timeout=2m? PASSED*",
        ]
    )


def test_parametrize_helpers_support_async_tests() -> None:
    seen = []

    @parametrize_config(cast_fanout=[6])
    async def check() -> None:
        seen.append(get_global_config()["cast_fanout"])

    mark = check.pytestmark[0]  # type: ignore[attr-defined]
    argname, (overrides,) = mark.args[0], mark.args[1]
    asyncio.run(check(**{argname: overrides}))
    assert seen == [6]
    assert get_runtime_config() == {}


def test_parametrize_helpers_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="did you mean 'cast_fanout'"):
        parametrize_config(cast_fanot=[1])
    with pytest.raises(TypeError, match="expected an int >= 1, got 0"):
        parametrize_config(cast_fanout=[2, 0])
    with pytest.raises(TypeError, match=re.escape("wrap a single value in a list")):
        parametrize_config(default_transport="tcp")
    with pytest.raises(ValueError, match="at least one value"):
        parametrize_config(cast_fanout=[])
    with pytest.raises(ValueError, match="at least one key"):
        parametrize_config()
    with pytest.raises(ValueError, match="as many values for every key"):
        parametrize_config_pointwise(cast_fanout=[1, 2], tail_log_lines=[1])


@pytest.mark.timeout(60)
def test_importing_monarch_config_imports_neither_pytest_nor_torch() -> None:
    code = (
        "import sys, monarch.config\n"
        "assert 'pytest' not in sys.modules, 'monarch.config imported pytest'\n"
        "assert 'torch' not in sys.modules, 'monarch.config imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50, env=clean_env())


# --- the guide --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_config_guide_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    text = GUIDE.read_text()
    blocks = PYTHON_BLOCK.findall(text)
    assert len(blocks) >= 5, f"{GUIDE} lost its code"
    script = tmp_path / "config_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        env=clean_env(),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(TEXT_BLOCK.findall(text))


def test_the_guide_lists_every_key_as_the_registry_does() -> None:
    text = GUIDE.read_text()
    start, end = text.index(doc.BEGIN) + len(doc.BEGIN) + 1, text.index(doc.END)
    assert text[start:end] == doc.render(), (
        "docs/config.md's key reference is out of date: replace the text between its "
        "markers with the output of `python -m monarch._src.config.doc`"
    )
    for key in registry.KEYS.values():
        assert f"| `{key.name}` | `{key.env}` |" in text


def test_the_docs_index_links_the_guide() -> None:
    assert "(config.md)" in (ROOT / "docs" / "index.md").read_text()


# --- keys with no effect here -----------------------------------------------------------

IGNORED = sorted(name for name, key in registry.KEYS.items() if key.ignored)
EFFECTIVE = sorted(name for name, key in registry.KEYS.items() if key.effect)


def test_every_key_has_an_effect_or_a_reason_it_is_ignored() -> None:
    for key in registry.KEYS.values():
        assert bool(key.effect) != bool(key.ignored), key.name
        if key.ignored:
            assert key.ignored.endswith("."), key.name
    text = GUIDE.read_text().lower()
    assert "no effect in this implementation" not in text
    assert "accepted; no effect" not in text


def test_setting_an_ignored_key_warns_once_saying_why() -> None:
    key = registry.KEYS["message_ttl_default"]
    with pytest.warns(monarch.config.IgnoredSettingWarning) as caught:
        configure(message_ttl_default=8)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "'message_ttl_default' (HYPERACTOR_MESSAGE_TTL_DEFAULT)" in message
    assert "accepted for compatibility" in message
    assert "no effect in this implementation" in message
    assert key.ignored in message
    assert caught[0].filename == __file__  # it points at the caller
    assert issubclass(monarch.config.IgnoredSettingWarning, UserWarning)
    # Set again (or through configured()), it does not warn again.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        configure(message_ttl_default=16)
        with configured(message_ttl_default=32):
            pass
    assert get_runtime_config() == {"message_ttl_default": 16}


def test_configured_warns_too_pointing_at_the_with() -> None:
    with pytest.warns(monarch.config.IgnoredSettingWarning, match="default_encoding") as caught:
        with configured(default_encoding=Encoding.Json):
            pass
    assert [w.filename for w in caught] == [__file__]


@pytest.mark.parametrize("name", EFFECTIVE)
def test_a_key_with_an_effect_never_warns(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = registry.KEYS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        configure(**{name: get_global_config()[name]})
        monkeypatch.setenv(key.env, key.kind.text(key.default))
        registry.warn_ignored_from_env()


def test_a_rejected_value_of_an_ignored_key_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(kinds.ConfigValueError):
            configure(message_ttl_default=300)
        configure(message_ttl_default=None)  # None leaves it unset: nothing was set
    with pytest.warns(monarch.config.IgnoredSettingWarning):
        configure(message_ttl_default=1)


def test_every_ignored_key_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(monarch.config.IgnoredSettingWarning) as caught:
        for name in IGNORED:
            configure(**{name: get_global_config()[name]})
            configure(**{name: get_global_config()[name]})
    warned = [str(w.message).split("'")[1] for w in caught]
    assert warned == IGNORED


WARN_AT_START = """
import warnings

warnings.simplefilter("default")
from monarch._src import config
config.warn_ignored_from_env()
config.warn_ignored_from_env()
config.configure(scuba_log_enter_exit=True)
print("ok")
"""


@pytest.mark.timeout(60)
def test_an_ignored_variable_warns_once_when_the_runtime_starts() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WARN_AT_START],
        env={**clean_env(), "SCUBA_LOG_ENTER_EXIT": "1", "HYPERACTOR_MESH_CAST_FANOUT": "4"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"
    assert out.stderr.count("IgnoredSettingWarning") == 1, out.stderr
    assert "'scuba_log_enter_exit' (SCUBA_LOG_ENTER_EXIT) was set by the environment" in (
        out.stderr
    )
    assert "cast_fanout" not in out.stderr


def test_is_set_sees_the_environment_configure_and_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not registry.is_set("mesh_orphan_timeout")
    with configured(mesh_orphan_timeout=None):
        assert registry.is_set("mesh_orphan_timeout")  # set to None is set
    registry.apply_snapshot_from_env({registry.SNAPSHOT_ENV: '{"mesh_orphan_timeout":"5s"}'})
    assert registry.is_set("mesh_orphan_timeout")
    registry.clear_snapshot_config()
    monkeypatch.setenv("HYPERACTOR_MESH_ORPHAN_TIMEOUT", "5s")
    assert registry.is_set("mesh_orphan_timeout")
    with pytest.raises(ValueError, match="unknown config key"):
        registry.is_set("mesh_orphan")


def test_port_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "remote_alloc_allowed_port_range"
    for value in (slice(26600, 26610), "26600..26610", " 26600 .. 26610 "):
        with configured(**{name: value}) as merged:
            assert merged[name] == slice(26600, 26610)
    monkeypatch.setenv("HYPERACTOR_REMOTE_ALLOC_ALLOWED_PORT_RANGE", "1..2")
    assert registry.get(name) == slice(1, 2)
    monkeypatch.setenv("HYPERACTOR_REMOTE_ALLOC_ALLOWED_PORT_RANGE", "")
    assert registry.get(name) is None
    for bad in (slice(10, 5), slice(1, 2, 1), "1-2", slice(0, 70000), "a..b"):
        with pytest.raises(kinds.ConfigValueError, match=re.escape("START..STOP")):
            configure(**{name: bad})
    with pytest.raises(TypeError, match="port range"):
        configure(**{name: 26600})
