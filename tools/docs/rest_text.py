"""The bits of reST in Monarch's docstrings and examples, as Markdown (see ``griffe_rest.py``)."""

from __future__ import annotations

import re

# :class:`X`, :func:`~a.b.f`, :mod:`m` ... -> `X`, `f`, `m`
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`")
# A paragraph ending in "::" introduces a literal block: "Run it::" -> "Run it:".
_LITERAL = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)
# A line of only "::" introduces one too: drop it.
_BARE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)


def rest_to_markdown(text: str) -> str:
    """``text`` with reST roles as code spans and literal-block markers as colons."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).strip()}`", text)
    text = _BARE_LITERAL.sub("", text)
    return _LITERAL.sub(":", text)
