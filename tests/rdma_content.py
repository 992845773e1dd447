"""Content helpers shared by the ``monarch.rdma`` tests on one host (``tests/rdma``) and
between namespace hosts (``tests/multihost``): byte patterns that depend on position,
their comparison, and a read loop that runs until the buffer's owner goes away.

Actors of either test suite call these in other processes; those processes import this
module by name (it sits on the path the client hands its procs) or, for the multi-host
client, receive it pickled by value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from monarch.actor import SupervisionError
from monarch.rdma import RDMABuffer

MiB = 1 << 20
SENTINEL = 0xA5
#: An odd multiplier (below 2**63): consecutive words of a pattern differ in every byte.
_MIX = 0x1E3779B97F4A7C15


def pattern(n: int, seed: int) -> Any:
    """``n`` bytes (a 1-D contiguous uint8 tensor) that depend on ``seed`` and position."""
    words = torch.arange(seed, seed + (n + 7) // 8, dtype=torch.int64)
    words.mul_(_MIX)
    return words.view(torch.uint8)[:n]


def sentinel(n: int) -> Any:
    return torch.full((n,), SENTINEL, dtype=torch.uint8)


def mismatch(got: Any, want: Any, what: str = "content") -> str:
    """'' if the two byte tensors are equal, else a description of the first difference."""
    if got.numel() != want.numel():
        return f"{what}: {got.numel()} bytes, expected {want.numel()}"
    if torch.equal(got, want):
        return ""
    diff = (got != want).nonzero().flatten()
    i = int(diff[0])
    return (
        f"{what}: {diff.numel()} of {got.numel()} byte(s) differ, the first at {i}: "
        f"{int(got[i])} instead of {int(want[i])}"
    )


def outcome(fn: Callable[[], object]) -> tuple[str, str]:
    """``("ok", "")``, or the kind and message of what ``fn`` raised: "SupervisionError",
    "dropped" (a RuntimeError other than SupervisionError), else the exception's type."""
    try:
        fn()
    except SupervisionError as e:
        return "SupervisionError", str(e)
    except RuntimeError as e:
        return ("dropped" if "dropped" in str(e) else type(e).__name__), str(e)
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok", ""


def read_until_gone(
    buf: RDMABuffer, seed: int, notify: Callable[[], None], limit_s: float = 60
) -> dict[str, Any]:
    """Read ``buf`` in a loop until a read fails (the owner is killed meanwhile), checking
    each successful read's content; then try a read and a write more. ``notify`` is
    called once the first read is over."""
    n = buf.size()
    want = pattern(n, seed)
    dst = torch.empty(n, dtype=torch.uint8)
    report: dict[str, Any] = {"ok": 0, "bad": [], "error": None, "failed_at": None, "after": []}
    notified = False
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        dst.fill_(SENTINEL)
        kind, message = outcome(lambda: buf.read_into(dst, timeout=30).get(timeout=45))
        if kind == "ok":
            if bad := mismatch(dst, want):
                report["bad"].append(bad)
            else:
                report["ok"] += 1
        else:
            report["failed_at"] = time.monotonic()
            report["error"] = (kind, message)
        if not notified:
            notify()
            notified = True
        if kind != "ok":
            break
    if not notified:
        notify()
    if report["error"] is not None:
        for op in (
            lambda: buf.read_into(dst, timeout=30).get(timeout=45),
            lambda: buf.write_from(want, timeout=30).get(timeout=45),
        ):
            start = time.monotonic()
            kind, message = outcome(op)
            report["after"].append((kind, message, time.monotonic() - start))
    return report
