"""Parsing the ``K=V`` (``-e``) and ``dim=N,...`` (``--point``, ``--per-host``)
arguments of the ``monarch`` command."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from monarch._src.cli.errors import USAGE, CliError

__all__ = ["check_point", "parse_coordinates", "parse_env"]

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIMENSION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """``["K=V", ...]`` as a dict (a later ``K`` wins); :class:`CliError` naming the
    item that is not ``NAME=VALUE``."""
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not _VARIABLE.fullmatch(name):
            raise CliError(
                f"-e {item!r}: expected NAME=VALUE with NAME a variable name, e.g. "
                "-e LOG_LEVEL=debug",
                USAGE,
            )
        env[name] = value
    return env


def parse_coordinates(option: str, text: str, *, positive: bool = False) -> dict[str, int]:
    """``"dim=N,dim=N"`` as a dict; :class:`CliError` naming ``option`` and what is
    wrong. ``positive``: sizes (at least 1) rather than coordinates (at least 0)."""
    result: dict[str, int] = {}
    example = "gpus=4" if positive else "hosts=1"
    for part in text.split(","):
        name, eq, value = (s.strip() for s in part.partition("="))
        lowest = 1 if positive else 0
        if not eq or not _DIMENSION.fullmatch(name) or not value.isdigit():
            raise CliError(
                f"{option} {text!r}: expected DIM=N[,DIM=N...] with N a number, e.g. "
                f"{option} {example}",
                USAGE,
            )
        if int(value) < lowest:
            raise CliError(f"{option} {text!r}: {name} must be at least {lowest}", USAGE)
        if name in result:
            raise CliError(f"{option} {text!r}: {name} is given twice", USAGE)
        result[name] = int(value)
    return result


def check_point(point: Mapping[str, int], mesh: str, sizes: Mapping[str, int]) -> None:
    """:class:`CliError` unless ``point`` picks coordinates of the host dimensions
    ``sizes`` of the mesh called ``mesh``."""
    dims = ", ".join(f"{d} (0 to {n - 1})" for d, n in sizes.items()) or "none"
    for name, index in point.items():
        if name not in sizes:
            raise CliError(
                f"--point {name}={index}: mesh {mesh!r} has no dimension {name!r}; its "
                f"host dimensions are: {dims}",
                USAGE,
            )
        if index >= sizes[name]:
            raise CliError(
                f"--point {name}={index}: out of range for mesh {mesh!r}, whose host "
                f"dimensions are: {dims}",
                USAGE,
            )
