"""The key reference of docs/config.md, rendered from the registry.

``python -m monarch._src.config.doc`` prints it; the test suite checks that the guide
holds exactly this text between its ``<!-- keys:begin -->`` and ``<!-- keys:end -->``
markers.
"""

from __future__ import annotations

from monarch._src.config.keys import GROUPS, KEYS, Key

BEGIN = "<!-- keys:begin -->"
END = "<!-- keys:end -->"
#: How the reference starts the "Here" cell of a key without an effect.
IGNORED = "Ignored, with a warning:"


def _default(key: Key) -> str:
    shown = key.kind.show(key.default)
    if key.default == 2**64 - 1:
        return "`2**64 - 1`"
    if isinstance(shown, str):
        return f'`"{shown}"`' if shown else '`""`'
    if hasattr(shown, "name"):
        return f"`Encoding.{shown.name}`"
    if key.default == 64 << 10:
        return "`65536` (64 KiB)"
    if key.default == 10 * 1024**3:
        return "`10737418240` (10 GiB)"
    return f"`{shown}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The key reference: one table per group."""
    out = []
    for group in GROUPS:
        out += [
            f"### {group}",
            "",
            "| Key | Environment variable | Type | Default | What it does | Here |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for key in KEYS.values():
            if key.group != group:
                continue
            here = key.effect or f"{IGNORED} {key.ignored}"
            out.append(
                f"| `{key.name}` | `{key.env}` | {_cell(key.kind.label)} | {_default(key)} "
                f"| {_cell(key.doc)} | {_cell(here)} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
