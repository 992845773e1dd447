"""Telemetry helpers of ``monarch.actor``: ``span``, ``traced`` and ``get_meter``.

They work with no extra package. When the ``opentelemetry`` API is installed, spans
are also OpenTelemetry spans (of the tracer ``monarch``) and ``get_meter`` returns the
global OpenTelemetry meter, so a program that configures an OpenTelemetry SDK exports
them as usual. Without it, ``get_meter`` returns a small meter of this module with the
same instrument methods (``create_counter``, ``create_up_down_counter``,
``create_histogram``, ``create_gauge``).

Either way every span and every instrument is also recorded in this process's
registry (:func:`metrics`), which the monitoring tools read: a span's count, errors
and total time, a counter's sum, a gauge's last value, a histogram's count and sum,
per name and attribute set. Recording costs a lock and a dictionary update.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, overload

__all__ = [
    "Counter",
    "Gauge",
    "Histogram",
    "Meter",
    "MetricValue",
    "UpDownCounter",
    "get_meter",
    "metrics",
    "span",
    "traced",
]

F = TypeVar("F", bound=Callable[..., Any])

Attributes = Mapping[str, Any] | None


@dataclass
class MetricValue:
    """One series of the registry: what was recorded under a name and attribute set."""

    name: str
    kind: str  # "counter", "up_down_counter", "gauge", "histogram" or "span"
    attributes: tuple[tuple[str, str], ...]
    count: int = 0
    value: float = 0.0  # a counter's sum, a gauge's last value, a histogram's or span's sum
    errors: int = 0  # spans that ended with an exception
    unit: str = ""
    description: str = ""


_lock = threading.Lock()
_registry: dict[tuple[str, str, tuple[tuple[str, str], ...]], MetricValue] = {}


def _key_attributes(attributes: Attributes) -> tuple[tuple[str, str], ...]:
    if not attributes:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def _record(
    name: str,
    kind: str,
    attributes: Attributes,
    amount: float,
    *,
    replace: bool = False,
    error: bool = False,
    unit: str = "",
    description: str = "",
) -> None:
    attrs = _key_attributes(attributes)
    key = (kind, name, attrs)
    with _lock:
        entry = _registry.get(key)
        if entry is None:
            entry = MetricValue(name, kind, attrs, unit=unit, description=description)
            _registry[key] = entry
        entry.count += 1
        entry.value = amount if replace else entry.value + amount
        if error:
            entry.errors += 1


def metrics() -> list[MetricValue]:
    """A copy of every series recorded in this process, sorted by kind and name."""
    with _lock:
        values = [MetricValue(**vars(v)) for v in _registry.values()]
    return sorted(values, key=lambda v: (v.kind, v.name, v.attributes))


def _reset_for_tests() -> None:
    with _lock:
        _registry.clear()


# --- OpenTelemetry, when installed ------------------------------------------------------


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _otel_trace() -> Any:
    return _optional("opentelemetry.trace")


def _otel_metrics() -> Any:
    return _optional("opentelemetry.metrics")


# --- spans --------------------------------------------------------------------------------


@contextmanager
def span(name: str, attributes: Attributes = None) -> Iterator[None]:
    """Time the block as a span called ``name``: its count, errors (an exception
    leaving the block) and total seconds are recorded; with OpenTelemetry installed
    it is also a span of the tracer ``monarch``, current inside the block.

    ::

        with span("load_batch", {"shard": 3}):
            batch = loader.next()
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"span() needs a non-empty name string, got {name!r}")
    trace = _otel_trace()
    started = time.perf_counter()
    failed = False
    try:
        if trace is not None:
            with trace.get_tracer("monarch").start_as_current_span(
                name, attributes=dict(attributes or {})
            ):
                yield
        else:
            yield
    except BaseException:
        failed = True
        raise
    finally:
        _record(name, "span", attributes, time.perf_counter() - started, error=failed)


@overload
def traced(fn: F, /) -> F: ...


@overload
def traced(*, name: str | None = None) -> Callable[[F], F]: ...


def traced(fn: F | None = None, /, *, name: str | None = None) -> Any:
    """Decorate a function (sync or async) so each call runs in a :func:`span` named
    after it (``module.qualname``), or ``name``: ``@traced`` or
    ``@traced(name="step")``."""

    def decorate(f: F) -> F:
        if not callable(f):
            raise TypeError(f"traced() decorates a function, got {f!r}")
        label = name or f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with span(label):
                    return await f(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with span(label):
                return f(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    if fn is not None:
        return decorate(fn)
    return decorate


# --- meters -------------------------------------------------------------------------------


class _Instrument:
    kind = ""

    def __init__(self, name: str, unit: str = "", description: str = "", otel: Any = None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"an instrument needs a non-empty name string, got {name!r}")
        self.name = name
        self.unit = unit
        self.description = description
        self._otel = otel

    def _put(self, amount: float, attributes: Attributes, *, replace: bool = False) -> None:
        _record(
            self.name,
            self.kind,
            attributes,
            float(amount),
            replace=replace,
            unit=self.unit,
            description=self.description,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Counter(_Instrument):
    """A monotonic sum: ``add(amount, attributes=None)`` with ``amount >= 0``."""

    kind = "counter"

    def add(self, amount: float, attributes: Attributes = None) -> None:
        if amount < 0:
            raise ValueError(
                f"counter {self.name!r} only goes up: add({amount}) is negative; "
                "use create_up_down_counter for a value that can decrease"
            )
        self._put(amount, attributes)
        if self._otel is not None:
            self._otel.add(amount, attributes)


class UpDownCounter(_Instrument):
    """A sum that can go down: ``add(amount, attributes=None)``."""

    kind = "up_down_counter"

    def add(self, amount: float, attributes: Attributes = None) -> None:
        self._put(amount, attributes)
        if self._otel is not None:
            self._otel.add(amount, attributes)


class Histogram(_Instrument):
    """A distribution: ``record(value, attributes=None)`` (count and sum are kept)."""

    kind = "histogram"

    def record(self, value: float, attributes: Attributes = None) -> None:
        self._put(value, attributes)
        if self._otel is not None:
            self._otel.record(value, attributes)


class Gauge(_Instrument):
    """The last value: ``set(value, attributes=None)``."""

    kind = "gauge"

    def set(self, value: float, attributes: Attributes = None) -> None:
        self._put(value, attributes, replace=True)
        if self._otel is not None:
            self._otel.set(value, attributes)


class Meter:
    """Creates instruments whose values land in this process's registry (and in
    OpenTelemetry's meter of the same name, when it is installed)."""

    def __init__(self, name: str, otel: Any = None) -> None:
        self.name = name
        self._otel = otel

    def _make(self, cls: type[Any], method: str, name: str, unit: str, description: str) -> Any:
        otel = None
        if self._otel is not None and hasattr(self._otel, method):
            otel = getattr(self._otel, method)(name, unit=unit, description=description)
        return cls(name, unit, description, otel)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return self._make(Counter, "create_counter", name, unit, description)  # type: ignore[no-any-return]

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        return self._make(UpDownCounter, "create_up_down_counter", name, unit, description)  # type: ignore[no-any-return]

    def create_histogram(self, name: str, unit: str = "", description: str = "") -> Histogram:
        return self._make(Histogram, "create_histogram", name, unit, description)  # type: ignore[no-any-return]

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Gauge:
        return self._make(Gauge, "create_gauge", name, unit, description)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Meter({self.name!r})"


def get_meter(name: str = "monarch", version: str | None = None) -> Meter:
    """A meter for custom metrics::

        steps = get_meter().create_counter("train_steps")
        steps.add(1, {"stage": "warmup"})

    Values are recorded in this process (see :func:`metrics`) and, when the
    ``opentelemetry`` API is installed, also through its global meter provider."""
    otel_metrics = _otel_metrics()
    otel = otel_metrics.get_meter(name, version) if otel_metrics is not None else None
    return Meter(name, otel)
