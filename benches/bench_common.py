"""What the benchmark scripts share: the metric catalogue, the JSON format of one run,
readings from ``/proc`` and the table layout.

``actor_bench.py`` (this project and upstream Monarch), ``ray_bench.py`` (Ray) and
``compare.py`` (the driver) import it. It uses the standard library only, because it runs
under every implementation's virtual environment.
"""

from __future__ import annotations

import datetime
import gc
import json
import multiprocessing
import os
import pickle
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# The metric catalogue: key -> (name, unit, which direction is better). The names are
# what the tables print (and what the smoke test looks for); the keys are what the JSON
# and the driver use. Every implementation reports the same keys.
SPAWN_4 = "spawn_4"
SPAWN_FIRST = "spawn_first"
SPAWN_16 = "spawn_16"
SPAWN_64 = "spawn_64"
STOP_64 = "stop_64"
SPAWN_256 = "spawn_256"
CALL_256 = "call_256"
BROADCAST_256 = "broadcast_256"
STOP_256 = "stop_256"
CALL_ONE = "call_one"
CALL_ONE_CPU = "call_one_cpu"
CALL_1 = "call_1"
CALL_4 = "call_4"
CALL_16 = "call_16"
CALL_64 = "call_64"
PIPELINED = "pipelined"
BROADCAST = "broadcast_16"
ECHO_1K = "echo_1k"
ECHO_1M = "echo_1m"
ECHO_64M = "echo_64m"
FAILURE = "failure"
RSS = "rss"
PIPE = "pipe"
PIPE_CPU = "pipe_cpu"
RAW_16 = "raw_fanout_16"
RAW_64 = "raw_fanout_64"
RAW_256 = "raw_fanout_256"

CATALOGUE: dict[str, tuple[str, str, str]] = {
    SPAWN_4: ("spawn 4 procs -> first reply", "s", "lower"),
    SPAWN_FIRST: ("first spawn of 4 (cold)", "s", "lower"),
    SPAWN_16: ("spawn 16 procs -> first reply", "s", "lower"),
    SPAWN_64: ("spawn 64 procs -> first reply", "s", "lower"),
    STOP_64: ("stop 64 procs -> all exited", "s", "lower"),
    SPAWN_256: ("spawn 256 procs -> first reply", "s", "lower"),
    STOP_256: ("stop 256 procs -> all exited", "s", "lower"),
    CALL_ONE: ("call_one round trip", "us", "lower"),
    CALL_ONE_CPU: ("CPU per call_one (client + proc)", "us", "lower"),
    CALL_1: ("call() to 1 actor", "us", "lower"),
    CALL_4: ("call() to 4 actors", "us", "lower"),
    CALL_16: ("call() to 16 actors", "us", "lower"),
    CALL_64: ("call() to 64 actors", "us", "lower"),
    CALL_256: ("call() to 256 actors", "us", "lower"),
    PIPELINED: ("pipelined call_one", "calls/s", "higher"),
    BROADCAST: ("broadcast to 16 actors", "casts/s", "higher"),
    BROADCAST_256: ("broadcast to 256 actors", "casts/s", "higher"),
    ECHO_1K: ("echo 1 KiB", "GB/s", "higher"),
    ECHO_1M: ("echo 1 MiB", "GB/s", "higher"),
    ECHO_64M: ("echo 64 MiB", "GB/s", "higher"),
    FAILURE: ("failure detection (SIGKILL)", "s", "lower"),
    RSS: ("RSS per proc", "MiB", "lower"),
    PIPE: ("multiprocessing.Pipe round trip", "us", "lower"),
    PIPE_CPU: ("CPU per Pipe round trip (both processes)", "us", "lower"),
    RAW_16: ("bare fan-out to 16 procs", "us", "lower"),
    RAW_64: ("bare fan-out to 64 procs", "us", "lower"),
    RAW_256: ("bare fan-out to 256 procs", "us", "lower"),
}

#: The bare fan-out references, by number of procs.
RAW_FANOUT = {16: RAW_16, 64: RAW_64, 256: RAW_256}

#: Echo payload sizes, by metric key.
ECHO_SIZES = {ECHO_1K: 1 << 10, ECHO_1M: 1 << 20, ECHO_64M: 64 << 20}

#: How long the failure-detection metric waits for the pending call to raise.
FAILURE_TIMEOUT_S = 20.0

#: Why a metric has no value in a ``--quick`` run.
SKIPPED = "skipped in --quick runs"

#: The metrics of the largest mesh, the edge of one machine (procs, keys).
EDGE = 256
EDGE_KEYS = [SPAWN_256, CALL_256, BROADCAST_256, STOP_256]


#: The metrics a mesh of n procs records besides its spawn and call() rows.
MESH_EXTRA_KEYS = {16: [BROADCAST, RSS], 64: [STOP_64], EDGE: [BROADCAST_256, STOP_256]}
#: The stop metric of a mesh of n procs, for the sizes that have one.
STOP_KEYS = {64: STOP_64, EDGE: STOP_256}


def mesh_not_run(p: Params, rec: Recorder, n: int) -> str | None:
    """Why the mesh of ``n`` procs is not measured in this run (not asked for, or too
    big for the memory), ``None`` when it is."""
    if n not in p.call_iters:
        return SKIPPED
    if n == EDGE:
        return edge_unfit(rec.value(RSS))
    return None


def edge_unfit(rss_per_proc_mib: float | None, n: int = EDGE) -> str | None:
    """Why ``n`` procs of ``rss_per_proc_mib`` each (the RSS measured on the 16-proc
    mesh) are not run here: more than three quarters of the memory available now.
    ``None`` when they fit."""
    if rss_per_proc_mib is None:
        return "not run: no RSS per proc was measured to size it by"
    available = mem_available_mib()
    need = rss_per_proc_mib * n
    if available is None or need > 0.75 * available:
        have = "unknown" if available is None else f"{available / 1024:.1f} GiB"
        return (
            f"not run: {n} procs of {rss_per_proc_mib:.0f} MiB need {need / 1024:.1f} GiB, "
            f"over three quarters of the memory available ({have})"
        )
    return None


def mem_available_mib() -> float | None:
    """``MemAvailable`` of this machine in MiB, ``None`` if unknown."""
    return _kib_field_mib("/proc/meminfo", "MemAvailable:")


#: An upper bound on any single wait for replies (spawns included), so that a hang
#: becomes an error in the table instead of a stuck run.
WAIT_TIMEOUT_S = 120.0


@dataclass
class Metric:
    """One measured value, or the reason there is none (``error``).

    ``budget`` is this project's own target for the metric, if it has one: the value
    must stay at or below it when lower is better, reach it when higher is better."""

    key: str
    value: float | None
    note: str = ""
    error: str | None = None
    budget: float | None = None
    samples: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return CATALOGUE[self.key][0]

    @property
    def unit(self) -> str:
        return CATALOGUE[self.key][1]

    @property
    def better(self) -> str:
        return CATALOGUE[self.key][2]

    @property
    def ratio(self) -> float | None:
        """The value divided by the budget (``None`` without one)."""
        if self.budget is None or self.value is None:
            return None
        return self.value / self.budget

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        if self.budget is None:
            return "info"
        ok = self.value <= self.budget if self.better == "lower" else self.value >= self.budget
        return "OK" if ok else "OVER"

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "name": self.name,
            "unit": self.unit,
            "better": self.better,
            "ratio": self.ratio,
            "verdict": self.verdict,
        }


def fmt(value: float | None, unit: str) -> str:
    """A value with its unit, at a precision that suits the unit."""
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "us":
        return f"{value:,.0f} us" if value >= 1000 else f"{value:.1f} us"
    if unit == "GB/s":
        return f"{value:.4f} GB/s" if value < 0.1 else f"{value:.3f} GB/s"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:,.0f} {unit}"


def print_rows(rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` (the first one the header) as aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


# ---------------------------------------------------------------------------------------
# Parameters and the reference


@dataclass
class Params:
    """How much work each measurement does."""

    spawn_repeats: int
    call_one_warmup: int
    call_one_iters: int
    # Mesh size -> number of timed calls (after a tenth as many warm-up calls). Sizes
    # left out are not measured.
    call_iters: dict[int, int]
    pipelined_calls: int
    pipelined_runs: int
    # Broadcasts to the 16-actor mesh per run (then one call() that follows them all).
    broadcasts: int = 2000
    # The same, to the 256-actor mesh.
    broadcasts_edge: int = 200
    # Metric key -> number of timed echoes (after one warm-up echo).
    echo_iters: dict[str, int] = field(default_factory=dict)
    pipe_warmup: int = 500
    pipe_iters: int = 5000
    # Number of procs -> timed rounds of the bare fan-out reference (after a tenth as
    # many warm-up rounds). Sizes left out are not measured.
    raw_fanout_iters: dict[int, int] = field(default_factory=lambda: {16: 1000, 64: 500, 256: 100})
    # Procs killed, one after another, for failure detection (the median is reported).
    failure_kills: int = 10


FULL = Params(
    spawn_repeats=3,
    call_one_warmup=200,
    call_one_iters=2000,
    call_iters={4: 500, 16: 200, 64: 200, EDGE: 30},
    pipelined_calls=5000,
    pipelined_runs=3,
    echo_iters={ECHO_1K: 500, ECHO_1M: 50, ECHO_64M: 5},
)
QUICK = Params(
    spawn_repeats=2,
    call_one_warmup=50,
    call_one_iters=300,
    call_iters={4: 100, 16: 30},
    pipelined_calls=1000,
    pipelined_runs=2,
    broadcasts=200,
    echo_iters={ECHO_1K: 50, ECHO_1M: 10},
    pipe_warmup=50,
    raw_fanout_iters={16: 200},
    pipe_iters=300,
    failure_kills=3,
)


def _pipe_echo(conn: Connection) -> None:
    """The reference child: echo every object back until ``None``."""
    while True:
        obj = conn.recv()
        if obj is None:
            break
        conn.send(obj)
    conn.close()


def cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU time every thread of the processes ``pids`` has had so far, in seconds:
    the scheduler's clock of each thread (``/proc/<pid>/task/<tid>/schedstat``), exact
    to the nanosecond where ``/proc/<pid>/stat`` counts ticks of 10 ms. Threads that
    already ended are not counted."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass  # the thread ended meanwhile
    return total / 1e9


def cpu_per_call(call: Callable[[int], object], iters: int, pids: Iterable[int]) -> float:
    """The CPU time of the processes ``pids`` (every thread) per ``call(i)``, over
    ``iters`` calls made one after another, in seconds."""
    pids = list(pids)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        before = cpu_seconds(pids)
        for i in range(iters):
            call(i)
        return (cpu_seconds(pids) - before) / iters
    finally:
        if gc_was:
            gc.enable()


def measure_pipe(p: Params) -> tuple[float, float]:
    """The median ``multiprocessing.Pipe`` round trip to a child process, and the CPU
    time of both processes per round trip, in seconds.

    The child is started with the ``spawn`` method, so it does not inherit the monarch
    runtime's threads (``fork`` after they start is unsafe)."""
    mp = multiprocessing.get_context("spawn")
    parent, child = mp.Pipe()
    proc = mp.Process(target=_pipe_echo, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        for i in range(p.pipe_warmup):
            parent.send(i)
            parent.recv()
        samples = []
        for i in range(p.pipe_iters):
            t0 = time.perf_counter()
            parent.send(i)
            parent.recv()
            samples.append(time.perf_counter() - t0)

        def round_trip(i: int) -> None:
            parent.send(i)
            parent.recv()

        assert proc.pid is not None
        cpu = cpu_per_call(round_trip, p.pipe_iters, [os.getpid(), proc.pid])
    finally:
        parent.send(None)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    return statistics.median(samples), cpu


#: The bare fan-out child: answer each datagram with a pickled ``(0, value)`` until the
#: socket closes.
_FANOUT_CHILD = """
import pickle, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
while True:
    data = sock.recv(65536)
    if not data:
        break
    sock.send(pickle.dumps((0, pickle.loads(data))))
"""


def measure_raw_fanout(n: int, iters: int) -> float:
    """The floor under ``call() to n actors`` on this machine, in seconds: ``n`` bare
    Python processes, each on its own ``SOCK_SEQPACKET`` socketpair, no framework; one
    round pickles an int, sends it to every child, and reads every child's pickled
    answer (in arrival order). The median of ``iters`` rounds, after a tenth as many
    warm-up rounds. Its growth from 16 to 64 procs is what this machine does when every
    actor is a process that wakes, unpickles, pickles and answers."""
    import selectors
    import socket
    import subprocess

    socks: list[socket.socket] = []
    children: list[subprocess.Popen[bytes]] = []
    sel = selectors.DefaultSelector()
    try:
        for _ in range(n):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            socks.append(mine)
            with theirs:
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _FANOUT_CHILD, str(theirs.fileno())],
                        pass_fds=[theirs.fileno()],
                    )
                )
            sel.register(mine, selectors.EVENT_READ)

        def one_round(i: int) -> None:
            msg = pickle.dumps(i)
            for sock in socks:
                sock.send(msg)
            got = 0
            while got < n:
                ready = sel.select(WAIT_TIMEOUT_S)
                if not ready:
                    raise TimeoutError(f"bare fan-out: {n - got} of {n} children silent")
                for key, _ in ready:
                    key.fileobj.recv(65536)  # type: ignore[union-attr]
                    got += 1

        for i in range(max(iters // 10, 1)):
            one_round(i)
        samples = []
        for i in range(iters):
            t0 = time.perf_counter()
            one_round(i)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)
    finally:
        sel.close()
        for sock in socks:
            sock.close()  # each child reads EOF and exits
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def add_pipe(p: Params, rec: Recorder) -> None:
    """Measure the ``multiprocessing.Pipe`` references: its round trip and its CPU."""

    def pipe() -> None:
        median, cpu = measure_pipe(p)
        rec.add(Metric(PIPE, median * 1e6, "reference"))
        rec.add(Metric(PIPE_CPU, cpu * 1e6, f"reference, over {p.pipe_iters} round trips"))

    rec.guard([PIPE, PIPE_CPU], pipe)


def add_raw_fanout(p: Params, rec: Recorder) -> None:
    """Measure the bare fan-out references ``p`` asks for (the others: skipped)."""
    for n, key in RAW_FANOUT.items():
        if n not in p.raw_fanout_iters:
            rec.fail([key], SKIPPED)
            continue
        iters = p.raw_fanout_iters[n]

        def measure(n: int = n, key: str = key, iters: int = iters) -> None:
            rec.add(
                Metric(key, measure_raw_fanout(n, iters) * 1e6, f"reference, median of {iters}")
            )

        rec.guard([key], measure)


# ---------------------------------------------------------------------------------------
# /proc


def _kib_field_mib(path: str, field: str) -> float | None:
    """The value of the ``field`` line (in kiB) of a /proc file, in MiB; ``None`` if the
    file or the line is missing."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """The resident set size of process ``pid`` in MiB (``VmRSS``), ``None`` if gone."""
    return _kib_field_mib(f"/proc/{pid}/status", "VmRSS:")


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it do not.
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent_of(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_with_env(name: str, value: str) -> list[int]:
    """The processes whose environment has ``name=value``: how the driver finds what a
    run left behind (every process a run starts inherits the marker the driver sets),
    whatever process tree it ended up in."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(entry))
    return found


def wait_gone(pids: Iterable[int], timeout: float) -> bool:
    """Wait until none of ``pids`` is alive (zombies count as gone); False on timeout."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(rss_mib(p) is None for p in pids):
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def other_rss_mib(proc_pids: Iterable[int]) -> float:
    """The RSS of this process's descendants other than ``proc_pids`` (the runtime's
    helpers: agents, daemons, idle workers), in MiB. The ``multiprocessing`` resource
    tracker, left by the Pipe reference, is not counted."""
    skip = set(proc_pids)
    return sum(
        rss_mib(p) or 0.0
        for p in descendants(os.getpid())
        if p not in skip and "resource_tracker" not in _cmdline(p)
    )


# ---------------------------------------------------------------------------------------
# Runs and their JSON


def loadavg() -> float | None:
    """The 1-minute load average, a hint that other work shared the CPUs (timings on a
    loaded machine are not comparable)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def cpu_busy(seconds: float = 0.5) -> float | None:
    """The share of the machine's CPU time (0-1) spent busy over the next ``seconds``,
    from ``/proc/stat``: taken between runs, it shows work running beside the benchmark
    (the load average cannot, as it still counts the benchmark's own last run)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return None
    return 1 - (idle1 - idle0) / (total1 - total0)


class Recorder:
    """Collects a run's metrics and rewrites its JSON file after each one, so that a run
    stopped half way (a hang, a crash) still leaves what it measured."""

    def __init__(
        self, implementation: str, version: str, mode: str, params: dict, path: str | None
    ):
        self.path = path
        self.metrics: list[Metric] = []
        self.t0 = time.perf_counter()
        self.info = {
            "implementation": implementation,
            "version": version,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mode": mode,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_1min_before": loadavg(),
            },
            "params": params,
        }
        self.flush()

    def add(self, metric: Metric) -> Metric:
        self.metrics = [m for m in self.metrics if m.key != metric.key] + [metric]
        self.flush()
        return metric

    def value(self, key: str) -> float | None:
        """The value recorded for ``key``, ``None`` if none (yet, or it failed)."""
        return next((m.value for m in self.metrics if m.key == key), None)

    def fail(self, keys: Iterable[str], error: str) -> None:
        """Record ``keys`` as not measured, for ``error``, unless already recorded."""
        have = {m.key for m in self.metrics}
        for key in keys:
            if key not in have:
                self.metrics.append(Metric(key, None, error=error))
        self.flush()

    def guard(self, keys: Iterable[str], fn: Callable[[], None]) -> None:
        """Run ``fn`` (which records some of ``keys``); if it raises, record the rest of
        ``keys`` as failed with the exception as the reason."""
        keys = list(keys)
        try:
            fn()
        except Exception as e:
            self.fail(keys, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    def flush(self, **extra: object) -> None:
        self.info.update(extra)
        if not self.path:
            return
        result = {
            **self.info,
            "elapsed_s": time.perf_counter() - self.t0,
            "metrics": [m.to_json() for m in self.metrics],
        }
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        os.replace(tmp, self.path)


def settle(limit: int = 20) -> float | None:
    """Let the previous run's teardown (processes, namespaces) finish: wait for a half
    second under 20% busy, at most ``limit`` half seconds. Returns the last share busy,
    recorded with the next run to compare runs by."""
    busy = cpu_busy(0.5)
    for _ in range(limit - 1):
        if busy is None or busy < 0.2:
            break
        busy = cpu_busy(0.5)
    return busy


def machine_line() -> str:
    """The machine in one line: CPUs, memory, Python, kernel."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} CPUs, {mem_gib:.0f} GiB, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def run_outcome(result: dict[str, Any]) -> str:
    """How one run of a side-by-side benchmark went, for its progress line."""
    extra = ""
    if result["leftover_processes_killed"]:
        extra = f"; killed {len(result['leftover_processes_killed'])} leftovers"
    return f"{result['wall_s']:.0f} s, {result['status']}{extra}"


class NotedCells:
    """Table cells for the medians in ``aggs`` (side -> metric -> ``{"value", "error"}``):
    a value with its unit, or ``n/a [k]`` where the k-th of ``notes`` says why there is
    none. Errors that ``as_is`` accepts are shown in the cell itself; values are written
    by ``show`` (``fmt`` unless given)."""

    def __init__(
        self,
        aggs: dict[str, dict[str, Any]],
        as_is: Callable[[str], bool] = lambda _: False,
        show: Callable[[float, str], str] | None = None,
    ):
        self.aggs = aggs
        self.as_is = as_is
        self.show = show or fmt
        self.notes: list[str] = []

    def __call__(self, key: str, unit: str, side: str) -> str:
        if side not in self.aggs:
            return "-"
        a = self.aggs[side][key]
        if a["value"] is not None:
            return self.show(a["value"], unit)
        err: str = a["error"]
        if self.as_is(err):
            return err
        if err not in self.notes:
            self.notes.append(err)
        return f"n/a [{self.notes.index(err) + 1}]"


def save_results(
    out: Path, logs: Path, result: dict[str, Any], ours_runs: list[dict[str, Any]]
) -> int:
    """Write ``result`` to ``out`` as JSON; the exit status: 1 when every run of ours
    failed, else 0."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} (logs in {logs})")
    return 1 if ours_runs and all(r["status"] != "ok" for r in ours_runs) else 0
