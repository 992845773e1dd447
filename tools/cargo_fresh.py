"""Reads cargo's JSON messages (``cargo build --message-format json-render-diagnostics``)
on stdin, prints a line per compiled crate as cargo would, and warns when crates other
than the expected ones were compiled rather than found up to date.

``make demo-build`` pipes the Rust demos' build through it: that build must reuse every
crate the extension's release build compiled, so anything else compiled means the two
builds stopped agreeing (features, flags or the PyO3 environment).

Usage: ``cargo build ... --message-format json-render-diagnostics | python
tools/cargo_fresh.py PACKAGE [PACKAGE ...]``. The exit status is cargo's: 1 when the build
failed or ended without saying how.
"""

from __future__ import annotations

import json
import sys


def package_name(package_id: str) -> str:
    """The package's name in a cargo package id, old (``name 0.1.0 (source)``) or new
    (``source#name@0.1.0``, or ``path#0.1.0`` when the name is the path's last part)."""
    if " " in package_id:
        return package_id.split(" ", 1)[0]
    source, _, fragment = package_id.partition("#")
    if "@" in fragment:
        return fragment.split("@", 1)[0]
    return source.rstrip("/").rsplit("/", 1)[-1]


def main(argv: list[str]) -> int:
    expected = set(argv[1:])
    compiled: list[str] = []
    success: bool | None = None
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            print(line, end="")  # not a message: pass it on
            continue
        reason = message.get("reason")
        if reason == "compiler-artifact" and not message.get("fresh", True):
            package = package_name(message["package_id"])
            print(f"   Compiled {package} ({message['target']['name']})", flush=True)
            compiled.append(package)
        elif reason == "build-finished":
            success = bool(message.get("success"))
    unexpected = sorted(set(compiled) - expected)
    if unexpected:
        print(
            f"warning: this build compiled {', '.join(unexpected)} again, where only "
            f"{', '.join(sorted(expected))} should need compiling: it no longer shares the "
            "extension's release build (its features, flags or PyO3 environment differ); "
            "see the demo-build target of the Makefile",
            file=sys.stderr,
        )
    if success is None:
        print("error: cargo ended without a build-finished message", file=sys.stderr)
        return 1
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
