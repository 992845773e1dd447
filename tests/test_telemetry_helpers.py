"""``span``, ``traced`` and ``get_meter`` of ``monarch.actor``, and ``ProcId``/``Uid``."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator

import pytest

from monarch._src.actor import telemetry
from monarch.actor import ProcId, Uid, get_meter, span, traced


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    telemetry._reset_for_tests()
    yield
    telemetry._reset_for_tests()


def _series(kind: str, name: str) -> telemetry.MetricValue:
    matches = [v for v in telemetry.metrics() if v.kind == kind and v.name == name]
    assert len(matches) == 1, telemetry.metrics()
    return matches[0]


def test_a_span_counts_calls_errors_and_time() -> None:
    with span("load"):
        pass
    with pytest.raises(KeyError), span("load"):
        raise KeyError("x")
    s = _series("span", "load")
    assert (s.count, s.errors) == (2, 1)
    assert s.value > 0


def test_traced_wraps_sync_and_async_functions_with_their_names() -> None:
    @traced
    def double(x: int) -> int:
        return 2 * x

    @traced(name="fetch")
    async def fetch() -> str:
        return "ok"

    assert double(4) == 8
    assert double.__name__ == "double"
    assert asyncio.run(fetch()) == "ok"
    assert (
        _series(
            "span",
            f"{__name__}.test_traced_wraps_sync_and_async_functions_with_their_names.<locals>.double",
        ).count
        == 1
    )
    assert _series("span", "fetch").count == 1


def test_the_meter_records_each_instrument_kind_per_attribute_set() -> None:
    meter = get_meter("trainer")
    steps = meter.create_counter("steps", description="training steps")
    steps.add(1, {"stage": "warmup"})
    steps.add(2, {"stage": "warmup"})
    steps.add(5, {"stage": "main"})
    meter.create_gauge("lr").set(0.1)
    meter.create_gauge("lr").set(0.05)
    meter.create_histogram("batch_s").record(0.5)
    meter.create_histogram("batch_s").record(1.5)
    meter.create_up_down_counter("inflight").add(-3)
    values = {(v.kind, v.name, v.attributes): v for v in telemetry.metrics()}
    assert values[("counter", "steps", (("stage", "warmup"),))].value == 3
    assert values[("counter", "steps", (("stage", "main"),))].value == 5
    assert values[("gauge", "lr", ())].value == 0.05
    hist = values[("histogram", "batch_s", ())]
    assert (hist.count, hist.value) == (2, 2.0)
    assert values[("up_down_counter", "inflight", ())].value == -3


def test_bad_instrument_use_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="create_up_down_counter"):
        get_meter().create_counter("c").add(-1)
    with pytest.raises(TypeError, match="non-empty name"):
        get_meter().create_counter("")
    with pytest.raises(TypeError, match="non-empty name"):
        with span(""):
            pass


def test_proc_ids_parse_their_printed_form() -> None:
    p = ProcId.from_string("worker-3f2a9c@unix:@/tmp/hyperactor-0/abc")
    assert p.label == "worker"
    assert str(p.uid) == "worker-3f2a9c"
    assert p.addr == "unix:@/tmp/hyperactor-0/abc"
    assert str(p) == "worker-3f2a9c@unix:@/tmp/hyperactor-0/abc"
    assert ProcId.from_string(str(p)) == p
    assert Uid.from_string("mesh").is_singleton
    assert Uid.instance("trainer").label == "trainer"
    assert Uid.anonymous().label is None
    # An instance uid with an explicit value: the same value, the same uid.
    first = ProcId(Uid.instance_from_value(12, "service"))
    assert str(first) == "service-00000000000c" and first.label == "service"
    assert first.uid.is_instance and ProcId.from_string(str(first)) == first
    assert first == ProcId(Uid.instance_from_value(12, "service"))
    assert first != ProcId(Uid.instance_from_value(13, "service"))
    assert pickle.loads(pickle.dumps(first)) == first
    assert Uid.instance_from_value(255).label is None
    with pytest.raises(ValueError, match="non-negative"):
        Uid.instance_from_value(-1, "service")
    with pytest.raises(TypeError, match="non-negative int"):
        Uid.instance_from_value("12", "service")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a proc id"):
        ProcId.from_string("worker@")
    with pytest.raises(ValueError, match="not a uid"):
        Uid.from_string("a b")
