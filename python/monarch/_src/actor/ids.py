"""``ProcId`` and ``Uid``: the identities of procs, parsed from their printed form.

A proc's id prints as ``<name>@<address>`` (``worker-3f2a9c@unix:@/tmp/...``): the name
is a unique id, usually a label and a random suffix joined by ``-``. These classes give
the parts of such a string; they do not create procs.
"""

from __future__ import annotations

import re
import secrets

__all__ = ["ProcId", "Uid"]

_SUFFIX = re.compile(r"^(?P<label>.+)-(?P<hex>[0-9a-f]{4,})$")


class Uid:
    """A unique name: an optional label and a random part (``trainer-3f2a9c``); a
    singleton's uid is its bare label."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text or any(c in text for c in "@/ \t\n"):
            raise ValueError(
                f"{text!r} is not a uid: expected a non-empty name without '@', '/' or "
                "spaces (as printed before the '@' of a proc id)"
            )
        self._text = text

    @staticmethod
    def anonymous() -> Uid:
        """A fresh uid with no label."""
        return Uid(secrets.token_hex(6))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh uid with an optional label."""
        return Uid(f"{label}-{secrets.token_hex(6)}" if label else secrets.token_hex(6))

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> Uid:
        """The instance uid with the given random part ``value`` (a non-negative int,
        printed as 12 or more hex digits) and optional label: the same ``value`` and
        label always make the same uid (``Uid.instance_from_value(12, "service")`` is
        ``service-00000000000c``).

        Raises:
            TypeError: ``value`` is not an int.
            ValueError: ``value`` is negative, or ``label`` is not a valid name.
        """
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(
                f"Uid.instance_from_value(value={value!r}): expected a non-negative int"
            )
        if value < 0:
            raise ValueError(f"Uid.instance_from_value(value={value}): expected a non-negative int")
        return Uid(f"{label}-{value:012x}" if label else f"{value:012x}")

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse a uid from its printed form."""
        return Uid(uid)

    @property
    def label(self) -> str | None:
        """The label before the random part, or the whole name of a singleton; ``None``
        for an anonymous uid."""
        m = _SUFFIX.match(self._text)
        if m is not None:
            return m.group("label")
        if re.fullmatch(r"[0-9a-f]{8,}", self._text):
            return None
        return self._text

    @property
    def is_instance(self) -> bool:
        """Whether it has a random part (one of many instances)."""
        return _SUFFIX.match(self._text) is not None or self.label is None

    @property
    def is_singleton(self) -> bool:
        """Whether it is a bare label (a singleton)."""
        return not self.is_instance

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Uid({self._text!r})"

    def __hash__(self) -> int:
        return hash(self._text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uid) and other._text == self._text


class ProcId:
    """The identity of a proc: its uid and, when known, the address it serves."""

    __slots__ = ("_addr", "_uid")

    def __init__(self, uid: Uid, addr: str | None = None) -> None:
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId(uid) needs a Uid, got {type(uid).__name__}")
        self._uid = uid
        self._addr = addr

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        """Parse ``name@address`` (or a bare name)."""
        if not isinstance(proc_id, str):
            raise TypeError(f"ProcId.from_string needs a string, got {type(proc_id).__name__}")
        name, sep, addr = proc_id.partition("@")
        if sep and not addr:
            raise ValueError(f"{proc_id!r} is not a proc id: nothing after '@' (name@address)")
        return ProcId(Uid(name), addr or None)

    @property
    def uid(self) -> Uid:
        """The proc's unique name, the part before the ``@``."""
        return self._uid

    @property
    def label(self) -> str | None:
        """The label of the proc's name (``worker`` in ``worker-3f2a9c@...``), or
        ``None`` when the name has none (see ``Uid.label``)."""
        return self._uid.label

    @property
    def addr(self) -> str | None:
        """The channel address the proc serves, when the id carries one."""
        return self._addr

    def __str__(self) -> str:
        return f"{self._uid}@{self._addr}" if self._addr else str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __hash__(self) -> int:
        return hash(str(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and str(other) == str(self)
