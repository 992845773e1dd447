"""The simulator's cost model and timeline (see :mod:`.simulator`).

:class:`CostModel` turns one command into a duration on an assumed accelerator;
:class:`Timeline` places the commands of every rank and stream in simulated time (a
discrete-event model: a command starts when its stream is free, when what it waits
for has happened, and, for a collective, when every member has reached it), and
writes the result as a Chrome trace (the ``traceEvents`` JSON that Perfetto and
``chrome://tracing`` open).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["CostModel", "Task", "Timeline"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The assumed accelerator and network (defaults: an H100 SXM-class GPU, 8 per
    host over NVLink, hosts over one 400 Gb/s NIC per GPU; peak numbers, so the
    simulated times are lower bounds).

    - ``matmul_tflops``: dense matmul/convolution/attention throughput by dtype name
      (``"bfloat16"``...); ``"default"`` for the others (float32 without TF32).
    - ``memory_gb_per_s``: device memory bandwidth; every operator moves at least the
      bytes of its tensor inputs and outputs at this rate (a roofline: an operator
      takes the longer of its compute and its memory time).
    - ``kernel_overhead_us``: the least time any operator takes.
    - ``intra_host_gb_per_s`` / ``inter_host_gb_per_s``: per-GPU bandwidth of a
      collective whose members share one host / span several;
      ``intra_host_latency_us`` / ``inter_host_latency_us``: its fixed cost.

    A collective over ``n`` ranks of ``b`` bytes per rank (ring algorithms) takes
    ``latency + f * b / bandwidth`` with ``f = 2(n-1)/n`` for an all-reduce,
    ``(n-1)/n`` for a reduce-scatter and an all-to-all, and ``n-1`` for an all-gather.
    """

    matmul_tflops: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {
            "bfloat16": 989.0,
            "float16": 989.0,
            "float8_e4m3fn": 1979.0,
            "float8_e5m2": 1979.0,
            "default": 67.0,
        }
    )
    memory_gb_per_s: float = 3350.0
    kernel_overhead_us: float = 2.0
    intra_host_gb_per_s: float = 450.0
    inter_host_gb_per_s: float = 50.0
    intra_host_latency_us: float = 5.0
    inter_host_latency_us: float = 15.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "matmul_tflops":
                if not isinstance(value, Mapping) or not all(
                    isinstance(v, (int, float)) and v > 0 for v in value.values()
                ):
                    raise ValueError(
                        f"CostModel: matmul_tflops must map dtype names to positive "
                        f"numbers, got {value!r}"
                    )
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"CostModel: {field.name} must be a number >= 0, got {value!r}")
            if field.name.endswith("gb_per_s") and value == 0:
                raise ValueError(f"CostModel: {field.name} must be > 0")

    @classmethod
    def of(cls, value: CostModel | Mapping[str, Any] | None) -> CostModel:
        """``value`` as a cost model: itself, the defaults with a dict's overrides, or
        the defaults."""
        if value is None:
            return cls()
        if isinstance(value, CostModel):
            return value
        if isinstance(value, Mapping):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ValueError(
                    f"Simulator(cost_model=...): unknown settings {unknown}; expected some "
                    f"of {sorted(names)}"
                )
            settings = dict(value)
            if "matmul_tflops" in settings:
                settings["matmul_tflops"] = {
                    **cls().matmul_tflops,
                    **settings["matmul_tflops"],
                }
            return cls(**settings)
        raise TypeError(
            f"Simulator(cost_model=...): expected a CostModel or a dict of its settings, got "
            f"{type(value).__name__}"
        )

    # --- durations (microseconds) -------------------------------------------------------

    def compute_us(self, flops: float, nbytes: float, dtype: str) -> float:
        """An operator of ``flops`` floating-point operations moving ``nbytes``."""
        rates = self.matmul_tflops
        tflops = rates.get(dtype, rates.get("default", 67.0))
        compute = flops / (tflops * 1e6) if flops else 0.0
        memory = nbytes / (self.memory_gb_per_s * 1e3)
        return self.kernel_overhead_us + max(compute, memory)

    def collective_us(self, kind: str, nbytes: float, n: int, inter_host: bool) -> float:
        """A collective ``kind`` (``all_reduce``, ``reduce_scatter``, ``all_gather``,
        ``all_to_all``, ``send``) of ``nbytes`` per rank over ``n`` ranks."""
        if n <= 1 and kind != "send":
            return self.kernel_overhead_us
        if inter_host:
            bw, latency = self.inter_host_gb_per_s, self.inter_host_latency_us
        else:
            bw, latency = self.intra_host_gb_per_s, self.intra_host_latency_us
        factor = {
            "all_reduce": 2 * (n - 1) / n,
            "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n,
            "all_gather": float(n - 1),
            "send": 1.0,
        }[kind]
        return latency + factor * nbytes / (bw * 1e3)


#: Task kinds.
RUN, SIGNAL, WAIT, GROUP = 0, 1, 2, 3


class Task:
    """One command on one rank's stream: ``kind`` (``RUN``; ``SIGNAL``/``WAIT`` with
    ``key`` the token; ``GROUP``: starts with the other ``n`` members of ``key``),
    ``dur`` (µs), ``earliest`` (µs: not before), and, once placed, ``start``/``end``."""

    __slots__ = ("args", "cat", "dur", "earliest", "end", "key", "kind", "n", "name", "start")

    def __init__(
        self,
        kind: int,
        name: str,
        dur: float,
        cat: str = "compute",
        key: Any = None,
        n: int = 1,
        args: dict[str, Any] | None = None,
        earliest: float = 0.0,
    ) -> None:
        self.kind = kind
        self.name = name
        self.dur = dur
        self.cat = cat
        self.key = key
        self.n = n
        self.args = args
        self.earliest = earliest
        self.start: float | None = None
        self.end: float | None = None


class Timeline:
    """Every rank's streams, as queues of tasks placed in time incrementally (tasks
    may be added after a :meth:`run`; the next run goes on from where it stopped)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        #: (rank, sid) -> tasks in order.
        self.queues: dict[tuple[int, int], list[Task]] = {}
        self.heads: dict[tuple[int, int], int] = {}
        self.free: dict[tuple[int, int], float] = {}
        self.stream_names: dict[int, str] = {0: "main"}
        self.signals: dict[Any, float] = {}
        self.arrivals: dict[Any, dict[tuple[int, int], float]] = {}
        self.pending: set[tuple[int, int]] = set()
        #: Controller (client) events: (name, start µs, end µs).
        self.controller: list[tuple[str, float, float]] = []

    def add(self, rank: int, sid: int, task: Task) -> None:
        key = (rank, sid)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = []
            self.heads[key] = 0
            self.free[key] = 0.0
        q.append(task)
        self.pending.add(key)

    def run(self) -> None:
        """Place every task that can be placed."""
        progress = True
        while progress:
            progress = False
            for skey in list(self.pending):
                if self._drain(skey):
                    progress = True

    def _drain(self, skey: tuple[int, int]) -> bool:
        q = self.queues[skey]
        moved = False
        while self.heads[skey] < len(q):
            t = q[self.heads[skey]]
            ready = max(self.free[skey], t.earliest)
            if t.kind == WAIT:
                at = self.signals.pop(t.key, None)
                if at is None:
                    break
                t.start = t.end = max(ready, at)
            elif t.kind == SIGNAL:
                t.start = t.end = ready
                self.signals[t.key] = ready
            elif t.kind == GROUP:
                arrived = self.arrivals.setdefault(t.key, {})
                arrived[skey] = ready
                if len(arrived) < t.n:
                    break
                start = max(arrived.values())
                del self.arrivals[t.key]
                for member in arrived:
                    if member == skey:
                        continue
                    mt = self.queues[member][self.heads[member]]
                    mt.start = start
                    mt.end = start + mt.dur
                    self.free[member] = mt.end
                    self.heads[member] += 1
                t.start = start
                t.end = start + t.dur
            else:
                t.start = ready
                t.end = ready + t.dur
            assert t.end is not None
            self.free[skey] = t.end
            self.heads[skey] += 1
            moved = True
        if self.heads[skey] >= len(q):
            self.pending.discard(skey)
        return moved

    # --- results ------------------------------------------------------------------------

    def stuck(self) -> list[tuple[int, str, str]]:
        """(rank, stream, task name) of every stream's first task that could not run."""
        out = []
        for (rank, sid), q in sorted(self.queues.items()):
            i = self.heads[(rank, sid)]
            if i < len(q):
                out.append((rank, self.stream_names.get(sid, str(sid)), q[i].name))
        return out

    def elapsed_us(self) -> float:
        return max((self.free[k] for k in self.queues), default=0.0)

    def stats(self) -> list[dict[str, Any]]:
        """Per rank and stream: busy, idle (of the whole simulated time) and overlap
        (busy while another stream of the rank is busy) in µs, and the command count."""
        total = self.elapsed_us()
        by_rank: dict[int, dict[int, list[tuple[float, float]]]] = {}
        counts: dict[tuple[int, int], int] = {}
        for (rank, sid), q in self.queues.items():
            spans = []
            n = 0
            for t in q[: self.heads[(rank, sid)]]:
                if t.kind in (RUN, GROUP):
                    n += 1
                    if t.dur > 0:
                        assert t.start is not None and t.end is not None
                        spans.append((t.start, t.end))
            by_rank.setdefault(rank, {})[sid] = spans
            counts[(rank, sid)] = n
        out = []
        for rank in sorted(by_rank):
            streams = by_rank[rank]
            for sid in sorted(streams):
                spans = streams[sid]
                busy = sum(e - s for s, e in spans)
                others = _union([iv for o, ivs in streams.items() if o != sid for iv in ivs])
                out.append(
                    {
                        "rank": rank,
                        "stream": self.stream_names.get(sid, str(sid)),
                        "busy_us": busy,
                        "idle_us": max(total - busy, 0.0),
                        "overlap_us": _intersection(_union(spans), others),
                        "commands": counts[(rank, sid)],
                    }
                )
        return out

    def trace(self, streams: bool, controller: bool) -> dict[str, Any]:
        """The Chrome trace: one process per rank (``pid`` = rank + 1, named
        ``rank N``: Perfetto treats pid 0 specially), one thread per stream (named as
        the stream; thread ids are unique across the trace, as Perfetto wants), one
        ``X`` event per command that takes time; with ``controller``, a ``controller``
        process with the client's batches."""
        events: list[dict[str, Any]] = []
        next_tid = self.world_size + 2
        if streams:
            for rank in sorted({r for r, _ in self.queues}):
                pid = rank + 1
                # Process metadata on the process's "main thread" (tid = pid, as on
                # Linux): no thread id is shared by two processes.
                events.append(_meta("process_name", pid, pid, f"rank {rank}"))
                events.append(_meta("process_sort_index", pid, pid, rank, key="sort_index"))
                for sid in sorted(s for r, s in self.queues if r == rank):
                    tid = next_tid
                    next_tid += 1
                    events.append(
                        _meta("thread_name", pid, tid, self.stream_names.get(sid, str(sid)))
                    )
                    events.append(_meta("thread_sort_index", pid, tid, sid, key="sort_index"))
                    q = self.queues[(rank, sid)]
                    for t in q[: self.heads[(rank, sid)]]:
                        if t.dur <= 0 or t.kind not in (RUN, GROUP):
                            continue
                        assert t.start is not None and t.end is not None
                        event: dict[str, Any] = {
                            "name": t.name,
                            "cat": t.cat,
                            "ph": "X",
                            "ts": round(t.start, 3),
                            "dur": round(round(t.end, 3) - round(t.start, 3), 3),
                            "pid": pid,
                            "tid": tid,
                        }
                        if t.args:
                            event["args"] = t.args
                        events.append(event)
        if controller:
            pid = self.world_size + 1
            tid = next_tid
            events.append(_meta("process_name", pid, pid, "controller"))
            events.append(_meta("process_sort_index", pid, pid, -1, key="sort_index"))
            events.append(_meta("thread_name", pid, tid, "client"))
            for name, start, end in self.controller:
                events.append(
                    {
                        "name": name,
                        "cat": "controller",
                        "ph": "X",
                        "ts": round(start, 3),
                        "dur": round(max(end - start, 0.0), 3),
                        "pid": pid,
                        "tid": tid,
                    }
                )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str, streams: bool, controller: bool) -> None:
        with open(path, "w") as f:
            json.dump(self.trace(streams, controller), f)


def _meta(name: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The total length of the intersection of two sorted, disjoint span lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def format_us(us: float) -> str:
    """A duration for people: µs, ms or s."""
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.3f} ms"
    return f"{us / 1e6:.3f} s"


def numel(size: Any) -> int:
    return math.prod(int(s) for s in size)
