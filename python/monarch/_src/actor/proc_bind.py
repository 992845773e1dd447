"""``spawn_procs(proc_bind=...)``: CPU and memory binding of each proc of a host.

``proc_bind`` has one entry per proc of a host (``prod(per_host)`` of them); the proc
of local index ``i`` applies entry ``i`` as it starts, before its runtime starts any
thread (threads inherit the binding). An entry maps any of these keys to a list in
``numactl``'s syntax (``"0-3,8"``):

- ``cpus`` or ``physcpubind``: the CPUs the proc may run on;
- ``cpunodebind``: the NUMA nodes whose CPUs it may run on;
- ``membind``: the NUMA nodes it allocates memory from (through ``libnuma``, loaded at
  run time; where it is missing the proc says so on stderr and goes on unbound).

A binding that the machine refuses (a CPU it does not have) is reported on the proc's
stderr, naming the entry, and the proc runs unbound: a placement hint never stops a job.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ENV", "KEYS", "bind_this_proc", "check", "parse_list", "spawn_variables"]

#: The variable giving a spawned proc the host's binding entries.
ENV = "MONARCH_PROC_BIND"
#: The keys an entry may have.
KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")
_RANK_ENV = "HYPERACTOR_MESH_PROC_RANK"


def parse_list(text: str) -> set[int]:
    """``"0-3,8"`` as ``{0, 1, 2, 3, 8}`` (``ValueError`` when malformed)."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad range {part!r}")
        out.update(range(first, last + 1))
    if not out:
        raise ValueError(f"empty list {text!r}")
    return out


def check(entries: Any) -> list[dict[str, str]]:
    """``entries`` as given to ``spawn_procs(proc_bind=...)``, checked."""
    if not isinstance(entries, list):
        raise TypeError(
            f"spawn_procs(proc_bind=...): expected a list of dicts, one per proc, got "
            f"{type(entries).__name__}"
        )
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TypeError(f"spawn_procs(proc_bind=...): entry {i} is not a dict: {entry!r}")
        for key, value in entry.items():
            if key not in KEYS:
                raise ValueError(
                    f"spawn_procs(proc_bind=...): entry {i} has the key {key!r}; expected "
                    f"keys among {KEYS}"
                )
            try:
                parse_list(str(value))
            except ValueError as e:
                raise ValueError(
                    f"spawn_procs(proc_bind=...): entry {i}, {key}={value!r}: {e}; expected "
                    "a list like '0-3,8'"
                ) from None
    return [{k: str(v) for k, v in entry.items()} for entry in entries]


def spawn_variables(entries: list[dict[str, str]] | None) -> dict[str, str]:
    """The environment additions that carry ``entries`` to the procs."""
    if not entries:
        return {}
    return {ENV: json.dumps(entries)}


def _node_cpus(node: int) -> set[int]:
    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return parse_list(f.read().strip())


def bind_this_proc(environ: MutableMapping[str, str] | None = None) -> dict[str, str] | None:
    """In a spawned proc, before its runtime starts: apply its entry (see the module
    docs). Returns the entry applied, or ``None``."""
    env = os.environ if environ is None else environ
    request = env.pop(ENV, None)
    if request is None:
        return None
    try:
        entries = json.loads(request)
        entry: dict[str, str] = entries[int(env[_RANK_ENV]) % len(entries)]
    except (KeyError, ValueError, TypeError, ZeroDivisionError):
        return None
    cpus: set[int] = set()
    try:
        for key in ("cpus", "physcpubind"):
            if key in entry:
                cpus |= parse_list(entry[key])
        if "cpunodebind" in entry:
            for node in parse_list(entry["cpunodebind"]):
                cpus |= _node_cpus(node)
        if cpus:
            os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as e:
        _warn(f"cannot bind to CPUs {sorted(cpus) or entry}: {e}")
    if "membind" in entry:
        _membind(entry["membind"])
    return entry


def _membind(nodes: str) -> None:
    name = ctypes.util.find_library("numa")
    if name is None:
        _warn(f"membind={nodes!r} needs libnuma (the libnuma1 package), which is missing")
        return
    try:
        numa = ctypes.CDLL(name)
        numa.numa_parse_nodestring.restype = ctypes.c_void_p
        numa.numa_parse_nodestring.argtypes = [ctypes.c_char_p]
        numa.numa_set_membind.argtypes = [ctypes.c_void_p]
        if numa.numa_available() < 0:
            _warn(f"membind={nodes!r}: libnuma says this machine has no NUMA support")
            return
        mask = numa.numa_parse_nodestring(nodes.encode())
        if not mask:
            _warn(f"membind={nodes!r}: libnuma does not know these nodes")
            return
        numa.numa_set_membind(mask)
    except (OSError, AttributeError) as e:
        _warn(f"membind={nodes!r}: {e}")


def _warn(text: str) -> None:
    print(f"monarch: proc_bind: {text}; the proc runs unbound", file=sys.stderr, flush=True)
