"""Value kinds of config keys.

A :class:`Kind` says which Python values a key accepts (``coerce``), how its environment
variable is read (``parse``), and how a value is shown: in ``get_global_config()``
(``show``), to code that uses it (``native``), and as environment text (``text``, also
the form a config snapshot travels in). Each key stores the value ``coerce``/``parse``
return; durations are stored as integer nanoseconds.

Errors: a value of the wrong Python type raises :class:`TypeError`; a value of the right
type that the kind rejects (out of range, a malformed duration) raises
:class:`ConfigValueError`, which is both a ``TypeError`` and a ``ValueError``.
"""

from __future__ import annotations

import datetime
import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


class ConfigValueError(TypeError, ValueError):
    """A value of the right type that a config key does not accept (out of range, a
    malformed duration or address...). Both a ``TypeError`` and a ``ValueError``, so
    code written against either catches it."""


class Encoding(enum.Enum):
    """How actor message payloads are serialized (the ``default_encoding`` key).

    The environment variable takes the member's value (``serde_multipart``) or its name
    in any case (``multipart``)."""

    Bincode = "bincode"
    Json = "serde_json"
    Multipart = "serde_multipart"


def _same(value: Any) -> Any:
    return value


def _type_name(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


@dataclass(frozen=True)
class Kind:
    """How the values of one type of key are checked, read and shown."""

    #: The type as the docs and error messages name it.
    label: str
    #: A Python value to the stored value (``TypeError`` / ``ConfigValueError``).
    coerce: Callable[[Any], Any]
    #: Environment text to the stored value (``ValueError``).
    parse: Callable[[str], Any]
    #: The stored value as ``get_global_config()`` shows it.
    show: Callable[[Any], Any] = _same
    #: The stored value as code reading the key gets it.
    native: Callable[[Any], Any] = _same
    #: The stored value as environment text (``parse`` reads it back).
    text: Callable[[Any], str] = str
    #: Whether ``None`` is a value of this kind (otherwise ``configure(key=None)`` is a
    #: no-op, as in upstream Monarch).
    optional: bool = False


# --- bool -------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a bool (True or False), got {_type_name(value)}")
    return value


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected true/false (or 1/0, yes/no, on/off)")


BOOL = Kind("bool", _coerce_bool, _parse_bool, text=lambda v: "true" if v else "false")


# --- integers ---------------------------------------------------------------------------


def integer(low: int = 0, high: int = 2**64 - 1) -> Kind:
    """Integers in ``[low, high]`` (the default range is a Rust ``usize``)."""
    label = f"int >= {low}" if high == 2**64 - 1 else f"int in [{low}, {high}]"

    def coerce(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an int, got {_type_name(value)}")
        if not low <= value <= high:
            raise ConfigValueError(f"expected an {label}, got {value}")
        return value

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected an {label}") from None
        return coerce(value)

    return Kind(label, coerce, parse)


def optional(kind: Kind) -> Kind:
    """``kind`` or ``None``; an empty environment variable means ``None``."""

    def coerce(value: Any) -> Any:
        return None if value is None else kind.coerce(value)

    def parse(text: str) -> Any:
        return None if not text.strip() else kind.parse(text)

    return Kind(
        f"{kind.label} or None",
        coerce,
        parse,
        show=lambda v: None if v is None else kind.show(v),
        native=lambda v: None if v is None else kind.native(v),
        text=lambda v: "" if v is None else kind.text(v),
        optional=True,
    )


# --- float ------------------------------------------------------------------------------


def _coerce_fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a float, got {_type_name(value)}")
    if not 0.0 <= value <= 1.0:
        raise ConfigValueError(f"expected a float in [0, 1], got {value}")
    return float(value)


def _parse_fraction(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a float in [0, 1]") from None
    return _coerce_fraction(value)


FRACTION = Kind("float in [0, 1]", _coerce_fraction, _parse_fraction)


# --- strings ----------------------------------------------------------------------------


def _coerce_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {_type_name(value)}")
    return value


STRING = Kind("str", _coerce_str, _same)

#: A TLS file: a path, or PEM text (starting with ``-----BEGIN``).
PEM = Kind("str (path or PEM text)", _coerce_str, _same)


def _coerce_socket_addr(value: Any) -> str:
    text = _coerce_str(value)
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if (
        not sep
        or not host
        or not port.isdigit()
        or int(port) > 65535
        or (":" in host and not bracketed)
    ):
        raise ConfigValueError(
            f"expected a socket address HOST:PORT such as '[::]:1729' or '0.0.0.0:8080' "
            f"(an IPv6 host in brackets), got {text!r}"
        )
    return text


SOCKET_ADDR = Kind("socket address", _coerce_socket_addr, _coerce_socket_addr)


# --- port ranges ------------------------------------------------------------------------

_PORT_RANGE_SYNTAX = "slice(start, stop) or 'START..STOP' with 0 <= START <= STOP <= 65535"


def _coerce_port_range(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        start_text, sep, stop_text = value.strip().partition("..")
        if not sep or not start_text.strip().isdigit() or not stop_text.strip().isdigit():
            raise ConfigValueError(f"expected a port range, {_PORT_RANGE_SYNTAX}; got {value!r}")
        start, stop = int(start_text), int(stop_text)
    elif isinstance(value, slice):
        start, stop = value.start, value.stop
        if value.step is not None or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)
        ):
            raise ConfigValueError(f"expected a port range, {_PORT_RANGE_SYNTAX}; got {value!r}")
    else:
        raise TypeError(f"expected a port range, {_PORT_RANGE_SYNTAX}; got {_type_name(value)}")
    if not 0 <= start <= stop <= 65535:
        raise ConfigValueError(f"expected a port range, {_PORT_RANGE_SYNTAX}; got {value!r}")
    return (start, stop)


#: A range of TCP ports, stored as ``(start, stop)``, shown as ``slice(start, stop)``.
PORT_RANGE = Kind(
    "port range",
    _coerce_port_range,
    _coerce_port_range,
    show=lambda r: slice(*r),
    native=lambda r: slice(*r),
    text=lambda r: f"{r[0]}..{r[1]}",
)


# --- transports -------------------------------------------------------------------------

#: Transport names, and the lowercased enum member names of upstream Monarch's
#: ``ChannelTransport`` that map to them.
TRANSPORTS = ("local", "unix", "tcp", "tls", "metatls")
_TRANSPORT_ALIASES = {
    "tcpwithlocalhost": "tcp",
    "tcpwithhostname": "tcp",
    "metatlswithhostname": "metatls",
    "metatlswithipv6": "metatls",
}
_ADDRESS = re.compile(r"^(?P<transport>[a-z]+)(?::|!|://)(?P<rest>.+)$", re.IGNORECASE)


def _coerce_transport(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.name
        name: str = _TRANSPORT_ALIASES.get(value.lower(), value.lower())
        if name in TRANSPORTS:
            return name
    if not isinstance(value, str):
        raise TypeError(
            f"expected a transport name ({', '.join(TRANSPORTS)}) or an address such as "
            f"'tcp:127.0.0.1:8080', got {_type_name(value)}"
        )
    name = value.strip().lower()
    if name in TRANSPORTS:
        return name
    match = _ADDRESS.match(value.strip())
    if match and match["transport"].lower() in TRANSPORTS:
        return value.strip()
    raise ConfigValueError(
        f"expected a transport name ({', '.join(TRANSPORTS)}) or an address "
        f"TRANSPORT:ADDRESS such as 'tcp:127.0.0.1:8080' or 'unix:/tmp/sock', got {value!r}"
    )


TRANSPORT = Kind("transport", _coerce_transport, _coerce_transport)


# --- encodings --------------------------------------------------------------------------

_ENCODINGS = {
    **{e.value: e for e in Encoding},
    **{e.name.lower(): e for e in Encoding},
    "serde_bincode": Encoding.Bincode,
}


def _coerce_encoding(value: Any) -> Encoding:
    """``configure()``'s values: an ``Encoding`` member only, as upstream Monarch."""
    if isinstance(value, Encoding):
        return value
    names = ", ".join(f"Encoding.{e.name}" for e in Encoding)
    raise TypeError(f"expected an Encoding ({names}), got {_type_name(value)}")


def _parse_encoding(value: str) -> Encoding:
    """An environment variable's text: an encoding's name, in any case."""
    encoding = _ENCODINGS.get(value.strip().lower())
    if encoding is None:
        names = ", ".join(f"Encoding.{e.name}" for e in Encoding)
        raise ConfigValueError(
            f"expected one of {names} (or 'bincode', 'json', 'multipart'), got {value!r}"
        )
    return encoding


ENCODING = Kind("Encoding", _coerce_encoding, _parse_encoding, text=lambda e: str(e.value))


# --- durations --------------------------------------------------------------------------

NS = 1
US = 1_000
MS = 1_000_000
S = 1_000_000_000
MINUTE = 60 * S
HOUR = 60 * MINUTE
DAY = 24 * HOUR
#: humantime's month and year: 30.44 and 365.25 days.
MONTH = 2_630_016 * S
YEAR = 31_557_600 * S

_UNITS = {
    **dict.fromkeys(("ns", "nsec", "nsecs", "nanos"), NS),
    **dict.fromkeys(("us", "µs", "usec", "usecs", "micros"), US),
    **dict.fromkeys(("ms", "msec", "msecs", "millis"), MS),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), S),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), MINUTE),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), HOUR),
    **dict.fromkeys(("d", "day", "days"), DAY),
    **dict.fromkeys(("w", "week", "weeks"), 7 * DAY),
    **dict.fromkeys(("M", "month", "months"), MONTH),
    **dict.fromkeys(("y", "year", "years"), YEAR),
}
_PIECE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([^\d\s.]+)\s*")
_BARE = re.compile(r"\s*\d+(?:\.\d+)?\s*")
#: The largest duration (a Rust ``Duration`` holds u64 seconds).
MAX_NS = (2**64 - 1) * S
DURATION_SYNTAX = (
    "write a number and a unit, e.g. '30s', '1h 30m', '500ms', '2m 5s' (units: ns, us, "
    "ms, s, m, h, d, w, M, y)"
)


def parse_duration(text: str, bare_seconds: bool = True) -> int:
    """Nanoseconds of a humantime duration (``"1h 30m"``), or of a bare number of
    seconds when ``bare_seconds`` (environment variables and files; ``configure()``
    takes humantime only, as upstream Monarch).

    Raises:
        ConfigValueError: ``text`` is not a duration.
    """
    if _BARE.fullmatch(text):
        if not bare_seconds:
            raise ConfigValueError(
                f"Invalid duration format {text!r}: a number needs a unit; {DURATION_SYNTAX}"
            )
        return _checked_ns(Decimal(text.strip()) * S, text)
    total, at = Decimal(0), 0
    for piece in _PIECE.finditer(text):
        if piece.start() != at:
            break
        number, unit = piece.groups()
        scale = _UNITS.get(unit)
        if scale is None:
            raise ConfigValueError(
                f"Invalid duration format {text!r}: unknown unit {unit!r}; {DURATION_SYNTAX}"
            )
        total += Decimal(number) * scale
        at = piece.end()
    if at == 0 or at != len(text):
        raise ConfigValueError(f"Invalid duration format {text!r}: {DURATION_SYNTAX}")
    return _checked_ns(total, text)


def _checked_ns(total: Decimal, text: str) -> int:
    ns = int(total.to_integral_value())
    if ns > MAX_NS:
        raise ConfigValueError(f"Invalid duration {text!r}: too long")
    return ns


def format_duration(ns: int) -> str:
    """``ns`` nanoseconds as humantime writes them: ``"1h 30m"``, ``"500ms"``, ``"0s"``."""
    if ns == 0:
        return "0s"
    secs, nanos = divmod(ns, S)
    years, secs = divmod(secs, YEAR // S)
    months, secs = divmod(secs, MONTH // S)
    days, secs = divmod(secs, DAY // S)
    hours, secs = divmod(secs, 3600)
    minutes, secs = divmod(secs, 60)
    parts = [
        f"{n}{unit}{'s' if n > 1 else ''}"
        for n, unit in ((years, "year"), (months, "month"), (days, "day"))
        if n
    ]
    millis, nanos = divmod(nanos, MS)
    micros, nanos = divmod(nanos, US)
    small = ((hours, "h"), (minutes, "m"), (secs, "s"), (millis, "ms"), (micros, "us"))
    parts += [f"{n}{unit}" for n, unit in (*small, (nanos, "ns")) if n]
    return " ".join(parts)


def _coerce_duration(value: Any) -> int:
    if isinstance(value, str):
        return parse_duration(value, bare_seconds=False)
    if isinstance(value, datetime.timedelta):
        seconds = Decimal(value.days * 86400 + value.seconds) + Decimal(value.microseconds) / 10**6
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        raise TypeError(
            f"expected a duration: a humantime string such as '30s' or '1h 30m', or a "
            f"datetime.timedelta; got {_type_name(value)} (for seconds, write '{value}s')"
        )
    else:
        raise TypeError(
            "expected a duration: a humantime string such as '30s' or '1h 30m', or a "
            f"datetime.timedelta; got {_type_name(value)}"
        )
    if seconds < 0:
        raise ConfigValueError(f"expected a duration >= 0, got {value!r}")
    return _checked_ns(seconds * S, str(value))


DURATION = Kind(
    "duration",
    _coerce_duration,
    parse_duration,
    show=format_duration,
    native=lambda ns: ns / S,
    text=format_duration,
)
