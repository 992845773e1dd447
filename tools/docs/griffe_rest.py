"""A griffe extension for the API reference: Monarch's docstrings use a little reST
(``:class:`X```, ``:func:`f```, literal blocks introduced by ``::``), which the site renders
as Markdown. This rewrites the roles as code spans and ``text::`` as ``text:`` (the
indented block after it is a code block in Markdown too).

mkdocs.yml loads it by path (``extensions: [tools/docs/griffe_rest.py]``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from griffe import Extension, GriffeLoader, Object

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rest_text import rest_to_markdown


class RestRoles(Extension):
    """Rewrite each docstring once the object tree is complete."""

    def on_object(self, *, obj: Object, loader: GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
