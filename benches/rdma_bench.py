"""RDMA benchmark, this project and upstream Monarch side by side: ``monarch.rdma``
transfers between procs on one host, and between hosts (network namespaces, as the
multi-host tests build them).

What it measures (every transfer is checked: a side whose bytes come out wrong is
reported with that reason, not with a rate):

- **same host**: two procs on this host, ``this_host().spawn_procs(per_host={"procs":
  2})``. An ``Owner`` actor in the first allocates a tensor of N bytes, makes an
  ``RDMABuffer`` of it (and only then fills it, so a reader seeing the pattern also shows
  that the buffer is the tensor's memory, not a copy) and returns the handle; a
  ``Reader`` actor in the second times ``await buf.read_into(dst)`` and ``await
  buf.write_from(src)`` of a local tensor, inside the reader, over several repetitions
  after one untimed (cold) one; N = 1 MiB, 64 MiB, 1 GiB. The rate is N over the median
  time, in GB/s (10^9 bytes/s).
- **RDMAAction**: one ``RDMAAction`` of 16 reads of 4 MiB (16 buffers over slices of one
  owner tensor, into 16 slices of one local tensor), submitted and awaited; 64 MiB over
  the median time.
- **registration**: ``RDMABuffer(t)`` in the client for fresh 1 MiB, 64 MiB and 1 GiB
  tensors (already written, as real weights are): the median time, the first
  registration of the process (cold) on its own, and how much the client's RSS grew
  across a 1 GiB registration (a copy would add 1024 MiB).
- **between hosts** (root only, else skipped with the reason): workers in two host
  namespaces, the client in a third; the owner on host 0, the reader on host 1, read and
  write of 64 MiB and 1 GiB as above, over TCP.

How it runs: this driver runs the same file, ``--child local`` or ``--child cross``,
under this project's venv (``.venv``) and under upstream Monarch's
(``.bench/venv-upstream``, PyPI ``torchmonarch``), alternating, ``--reps`` times each;
each value is the median over the runs of each run's own figure. Upstream has no
ibverbs device here, so it uses its TCP fallback everywhere (allowed explicitly:
``MONARCH_RDMA_ALLOW_TCP_FALLBACK=1`` for both sides); ours picks its backend per pair
(``buf.backend``: ``cma`` on one host, ``tcp`` between hosts), which the table's notes
give. The cross-host runs start workers the way ``multihost_bench.py`` does (its ``Side``).

Every wait has a timeout (a transfer 120 s, a run ``--run-timeout``); a side that cannot
run, or a metric that fails, is reported with its reason, never made up. Processes a run
leaves behind are killed by pid (they carry a marker in their environment).

Usage: ``.venv/bin/python benches/rdma_bench.py [--reps N] [--impls ours,upstream]
[--no-1g] [--quick] [--no-cross] [--out FILE]``; ``make bench-rdma``. Writes JSON
(default ``.bench/results/rdma.json``) and per-run logs beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20

#: Bytes -> the label the metric keys use.
LABELS = {1 * MIB: "1m", 64 * MIB: "64m", 1024 * MIB: "1g"}
#: Timed transfers per size (after one cold one), full and --quick runs.
TRANSFER_REPS = {1 * MIB: 30, 64 * MIB: 8, 1024 * MIB: 3}
QUICK_TRANSFER_REPS = {1 * MIB: 5, 64 * MIB: 2, 1024 * MIB: 1}
#: Registrations timed per size (each of a fresh tensor).
REGISTER_REPS = {1 * MIB: 20, 64 * MIB: 5, 1024 * MIB: 3}
#: The RDMAAction: this many reads of this many bytes each.
ACTION_OPS, ACTION_EACH = 16, 4 * MIB
ACTION_REPS, QUICK_ACTION_REPS = 8, 2
#: The longest a single transfer (or registration) may take before it counts as failed.
OP_TIMEOUT_S = 120.0
#: The longest a spawn or a small call may take.
CALL_TIMEOUT_S = 120.0

# ---------------------------------------------------------------------------------------
# The measuring side: ``--child local|cross``, run under each implementation's python.
# It prints "METRIC {key, value[, note]}", "ERROR {key, error}" and "INFO {key, value}"
# lines as it goes (so a run that hangs later still leaves what it measured), then DONE.


def emit(kind: str, payload: dict[str, Any]) -> None:
    print(kind + " " + json.dumps(payload), flush=True)


def record(key: str, value: float, note: str = "") -> None:
    emit("METRIC", {"key": key, "value": value, "note": note})


def fail(key: str, e: BaseException | str) -> None:
    text = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    emit("ERROR", {"key": key, "error": (text.strip().splitlines() or ["?"])[0][:300]})


def info(key: str, value: object) -> None:
    emit("INFO", {"key": key, "value": value})


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _actors() -> tuple[type, type]:
    """The two actors, defined here so that the driver never imports monarch (the
    classes travel to the procs by value)."""
    import asyncio

    import torch

    from monarch.actor import Actor, endpoint
    from monarch.rdma import RDMAAction, RDMABuffer

    row = 4096

    def pattern(seed: int) -> torch.Tensor:
        return ((torch.arange(row) * 7 + seed) % 251).to(torch.uint8)

    def fill(t: torch.Tensor, seed: int) -> None:
        t.view(-1, row).copy_(pattern(seed).expand(t.numel() // row, row))

    def holds(t: torch.Tensor, seed: int) -> bool:
        return torch.equal(t.view(-1, row), pattern(seed).expand(t.numel() // row, row))

    async def timed(make_future: Any) -> float:
        t0 = time.perf_counter()
        await asyncio.wait_for(make_future(), OP_TIMEOUT_S)
        return time.perf_counter() - t0

    class Owner(Actor):
        """Owns tensors and hands out RDMABuffers of them."""

        def __init__(self) -> None:
            self.tensors: dict[str, torch.Tensor] = {}
            self.buffers: dict[str, list[Any]] = {}

        @endpoint
        async def make(self, key: str, nbytes: int, parts: int, seed: int) -> list[Any]:
            """A tensor of ``nbytes``, registered as ``parts`` equal buffers, filled with
            the pattern of ``seed`` only after registration."""
            t = torch.empty(nbytes, dtype=torch.uint8)
            each = nbytes // parts
            bufs = [RDMABuffer(t[i * each : (i + 1) * each]) for i in range(parts)]
            fill(t, seed)
            self.tensors[key], self.buffers[key] = t, bufs
            return bufs

        @endpoint
        async def holds(self, key: str, seed: int) -> bool:
            return holds(self.tensors[key], seed)

        @endpoint
        async def free(self, key: str) -> str:
            """Drop the buffers of ``key`` and forget its tensor; what went wrong, if."""
            problem = ""
            for b in self.buffers.pop(key, []):
                try:
                    await asyncio.wait_for(b.drop(), 30)
                except Exception as e:
                    problem = f"drop failed: {type(e).__name__}: {e}"
            self.tensors.pop(key, None)
            return problem

    class Reader(Actor):
        """Times transfers between its own tensors and an owner's buffers."""

        @endpoint
        async def read(self, buf: Any, nbytes: int, reps: int, seed: int) -> dict[str, Any]:
            dst = torch.zeros(nbytes, dtype=torch.uint8)  # written once: no page faults
            cold = await timed(lambda: buf.read_into(dst))
            ok = holds(dst, seed)
            samples = [await timed(lambda: buf.read_into(dst)) for _ in range(reps)]
            return {
                "cold": cold,
                "samples": samples,
                "ok": ok and holds(dst, seed),
                "backend": str(getattr(buf, "backend", "?")),
            }

        @endpoint
        async def write(self, buf: Any, nbytes: int, reps: int, seed: int) -> dict[str, Any]:
            src = torch.empty(nbytes, dtype=torch.uint8)
            fill(src, seed)
            cold = await timed(lambda: buf.write_from(src))
            samples = [await timed(lambda: buf.write_from(src)) for _ in range(reps)]
            return {"cold": cold, "samples": samples}

        @endpoint
        async def action(self, bufs: list[Any], each: int, reps: int, seed: int) -> dict:
            dst = torch.zeros(each * len(bufs), dtype=torch.uint8)

            def submit() -> Any:
                action = RDMAAction()
                for i, b in enumerate(bufs):
                    action.read_remote(dst[i * each : (i + 1) * each], b)
                return action.submit()

            cold = await timed(submit)
            ok = holds(dst, seed)
            samples = [await timed(submit) for _ in range(reps)]
            return {"cold": cold, "samples": samples, "ok": ok and holds(dst, seed)}

    return Owner, Reader


def transfers(owner: Any, reader: Any, sizes: list[int], quick: bool, prefix: str) -> None:
    """Time reads and writes of each size between ``owner`` and ``reader`` (actor meshes
    of one actor each); ``prefix`` starts every metric key."""
    reps = QUICK_TRANSFER_REPS if quick else TRANSFER_REPS
    for k, n in enumerate(sizes):
        label = LABELS[n]
        rkey, wkey = f"{prefix}read_{label}_gbps", f"{prefix}write_{label}_gbps"
        key, seed = f"{prefix}{label}", 11 + k
        try:
            (buf,) = owner.make.call_one(key, n, 1, seed).get(timeout=CALL_TIMEOUT_S)
            if buf.size() != n:
                raise AssertionError(f"buf.size() is {buf.size()}, not {n}")
        except BaseException as e:
            fail(rkey, e)
            fail(wkey, e)
            continue
        timeout = OP_TIMEOUT_S * (reps[n] + 2)
        try:
            r = reader.read.call_one(buf, n, reps[n], seed).get(timeout=timeout)
            info(f"{prefix}backend", r["backend"])
            if not r["ok"]:
                fail(rkey, "the bytes read differ from the owner's")
            else:
                med = statistics.median(r["samples"])
                note = f"median of {len(r['samples'])}; cold {n / r['cold'] / 1e9:.3g} GB/s"
                record(rkey, n / med / 1e9, note)
        except BaseException as e:
            fail(rkey, e)
        try:
            w = reader.write.call_one(buf, n, reps[n], seed + 100).get(timeout=timeout)
            if not owner.holds.call_one(key, seed + 100).get(timeout=CALL_TIMEOUT_S):
                fail(wkey, "the owner's tensor does not hold the bytes written")
            else:
                med = statistics.median(w["samples"])
                note = f"median of {len(w['samples'])}; cold {n / w['cold'] / 1e9:.3g} GB/s"
                record(wkey, n / med / 1e9, note)
        except BaseException as e:
            fail(wkey, e)
        try:
            problem = owner.free.call_one(key).get(timeout=CALL_TIMEOUT_S)
            if problem:
                info(f"{prefix}{label}_free", problem)
        except BaseException as e:
            info(f"{prefix}{label}_free", f"{type(e).__name__}: {e}")


def action_bench(owner: Any, reader: Any, quick: bool) -> None:
    key = "action_16x4m_gbps"
    total = ACTION_OPS * ACTION_EACH
    try:
        bufs = owner.make.call_one("action", total, ACTION_OPS, 5).get(timeout=CALL_TIMEOUT_S)
        reps = QUICK_ACTION_REPS if quick else ACTION_REPS
        r = reader.action.call_one(bufs, ACTION_EACH, reps, 5).get(
            timeout=OP_TIMEOUT_S * (reps + 2)
        )
        if not r["ok"]:
            fail(key, "the bytes read differ from the owner's")
        else:
            med = statistics.median(r["samples"])
            note = f"median of {len(r['samples'])}; cold {total / r['cold'] / 1e9:.3g} GB/s"
            record(key, total / med / 1e9, note)
        owner.free.call_one("action").get(timeout=CALL_TIMEOUT_S)
    except BaseException as e:
        fail(key, e)


def registration_bench(sizes: list[int], quick: bool) -> None:
    """``RDMABuffer(t)`` in the client, for fresh tensors of each size."""
    import torch

    from monarch.rdma import RDMABuffer

    first = True
    for n in sizes:
        key = f"reg_{LABELS[n]}_us"
        samples: list[float] = []
        growth = 0.0
        try:
            for _ in range(1 if quick and n >= 1024 * MIB else REGISTER_REPS[n]):
                t = torch.empty(n, dtype=torch.uint8)
                t.fill_(1)  # resident, as real weights are
                rss0 = _rss_mib()
                t0 = time.perf_counter()
                buf = RDMABuffer(t)
                dt = time.perf_counter() - t0
                growth = max(growth, _rss_mib() - rss0)
                if first:
                    record("reg_first_us", dt * 1e6, f"{n // MIB} MiB, the process's first")
                    first = False
                else:
                    samples.append(dt)
                if buf.size() != n:
                    raise AssertionError(f"buf.size() is {buf.size()}, not {n}")
                buf.drop().get(timeout=30)
                del buf, t
            if samples:
                record(key, statistics.median(samples) * 1e6, f"median of {len(samples)}")
            if n >= 1024 * MIB:
                record("reg_rss_growth_mib", growth, "client RSS growth across 1 GiB")
        except BaseException as e:
            fail(key, e)


def child_local(args: argparse.Namespace) -> int:
    sizes = [int(s) * MIB for s in args.sizes.split(",")]
    try:
        from monarch.actor import this_host

        Owner, Reader = _actors()
        procs = this_host().spawn_procs(per_host={"procs": 2})
        owner = procs.slice(procs=0).spawn("owner", Owner)
        reader = procs.slice(procs=1).spawn("reader", Reader)
    except BaseException as e:
        fail("setup", e)
        print("DONE", flush=True)
        return 1
    transfers(owner, reader, sizes, args.quick, "")
    action_bench(owner, reader, args.quick)
    registration_bench(sizes, args.quick)
    try:
        from monarch.rdma import get_rdma_backend

        info("get_rdma_backend", get_rdma_backend())
    except BaseException as e:
        info("get_rdma_backend", f"{type(e).__name__}: {e}")
    try:
        procs.stop().get(timeout=30)
    except BaseException as e:
        info("stop", f"{type(e).__name__}: {e}")
    print("DONE", flush=True)
    return 0


def child_cross(args: argparse.Namespace) -> int:
    sizes = [int(s) * MIB for s in args.sizes.split(",")]
    try:
        from monarch.actor import attach_to_workers, enable_transport

        Owner, Reader = _actors()
        if args.impl == "upstream":
            # See multihost_bench.py: upstream needs the client's explicit address.
            enable_transport("tcp://" + args.client_ip + ":0")
            hosts = attach_to_workers(workers=args.workers, ca="trust_all_connections")
        else:
            enable_transport("tcp")
            hosts = attach_to_workers(workers=args.workers, ca=None)
        hosts.initialized.get(timeout=60)
        one = {"gpus": 1}
        owner = hosts.slice(hosts=0).spawn_procs(per_host=one).spawn("owner", Owner)
        reader = hosts.slice(hosts=1).spawn_procs(per_host=one).spawn("reader", Reader)
    except BaseException as e:
        fail("setup", e)
        print("DONE", flush=True)
        return 1
    transfers(owner, reader, sizes, args.quick, "x_")
    print("DONE", flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# The driver


# key, name, unit, budgets: (bound, kind) with kind "min"/"max" (ours' own value, in the
# unit) or "ratio-min" (ours/upstream at least bound).
ROWS: list[tuple[str, str, str, list[tuple[float, str]]]] = [
    ("read_1m_gbps", "same host: read_into 1 MiB", "GB/s", []),
    ("read_64m_gbps", "same host: read_into 64 MiB", "GB/s", [(6.0, "min"), (8.0, "ratio-min")]),
    ("read_1g_gbps", "same host: read_into 1 GiB", "GB/s", []),
    ("write_1m_gbps", "same host: write_from 1 MiB", "GB/s", []),
    ("write_64m_gbps", "same host: write_from 64 MiB", "GB/s", []),
    ("write_1g_gbps", "same host: write_from 1 GiB", "GB/s", []),
    ("action_16x4m_gbps", "same host: RDMAAction, 16 reads of 4 MiB", "GB/s", []),
    ("reg_first_us", "RDMABuffer(t): the process's first (cold)", "us", []),
    ("reg_1m_us", "RDMABuffer(t), 1 MiB", "us", [(1000.0, "max")]),
    ("reg_64m_us", "RDMABuffer(t), 64 MiB", "us", [(1000.0, "max")]),
    ("reg_1g_us", "RDMABuffer(t), 1 GiB", "us", [(1000.0, "max")]),
    ("reg_rss_growth_mib", "client RSS growth across RDMABuffer(1 GiB)", "MiB", [(16.0, "max")]),
    ("x_read_64m_gbps", "between hosts: read_into 64 MiB", "GB/s", [(2.0, "min")]),
    ("x_write_64m_gbps", "between hosts: write_from 64 MiB", "GB/s", [(2.0, "min")]),
    ("x_read_1g_gbps", "between hosts: read_into 1 GiB", "GB/s", []),
    ("x_write_1g_gbps", "between hosts: write_from 1 GiB", "GB/s", []),
]


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "GB/s":
        return f"{value:.3f} GB/s" if value < 10 else f"{value:.1f} GB/s"
    if unit == "us":
        return f"{value:,.0f} µs" if value >= 1000 else f"{value:.1f} µs"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:g} {unit}"


def run_child(
    side: Any,
    argv: list[str],
    popen: Any,
    run_timeout: float,
    log_path: Path,
    run_id: str,
) -> dict[str, Any]:
    """Run one measuring child (``popen(argv, **kwargs)`` starts it, in a namespace or
    not) and collect its lines until DONE, its exit, or the timeout."""
    metrics: dict[str, float] = {}
    notes: dict[str, str] = {}
    errors: dict[str, str] = {}
    infos: dict[str, object] = {}
    status = "ok"
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        child = popen(
            argv,
            env={**side.env(run_id), "MONARCH_RDMA_ALLOW_TCP_FALLBACK": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in child.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + run_timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                status = f"run timed out after {run_timeout:g} s"
                break
            if line is None:
                try:
                    rc = child.wait(10)
                except subprocess.TimeoutExpired:
                    rc = None
                status = f"the run ended early (exit {rc})"
                break
            kind, _, rest = line.strip().partition(" ")
            if kind == "METRIC":
                m = json.loads(rest)
                metrics[m["key"]] = m["value"]
                if m.get("note"):
                    notes[m["key"]] = m["note"]
            elif kind == "ERROR":
                e = json.loads(rest)
                errors[e["key"]] = e["error"]
            elif kind == "INFO":
                i = json.loads(rest)
                infos[i["key"]] = i["value"]
            elif kind == "DONE":
                break
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.wait()
    if "setup" in errors:
        status = f"failed: {errors['setup']}"
    elif status != "ok":
        tail = _last_line(log_path)
        status += f": {tail}" if tail else ""
    return {
        "status": status,
        "metrics": metrics,
        "notes": notes,
        "errors": errors,
        "info": infos,
        "wall_s": time.perf_counter() - t0,
        "log": str(log_path),
    }


def kill_leftovers(run_id: str) -> list[int]:
    """Kill, by pid, every process still carrying this run's marker (after the run's
    own teardown): what a run left behind."""
    from bench_common import processes_with_env
    from multihost_bench import MARKER

    time.sleep(0.3)
    killed = []
    for pid in processes_with_env(MARKER, run_id):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def _last_line(path: Path) -> str:
    from multihost_bench import _last_line as last

    return last(path)


def run_local(side: Any, rep: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    argv = [str(side.python), str(Path(__file__).resolve()), "--child", "local"]
    argv += ["--impl", side.key, "--sizes", args.sizes] + (["--quick"] if args.quick else [])
    run_id = uuid.uuid4().hex
    log = logs / f"{side.key}-{rep}-local.log"
    result = run_child(side, argv, subprocess.Popen, args.run_timeout, log, run_id)
    result["leftover_processes_killed"] = kill_leftovers(run_id)
    return result


def run_cross(side: Any, rep: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    from multihost_bench import PORT, start_workers, stop_workers
    from tests.multihost.netns import Cluster

    run_id = uuid.uuid4().hex
    workers: list[subprocess.Popen[bytes]] = []
    files: list[Any] = []
    cluster = Cluster.create(2)
    try:
        workers += start_workers(
            cluster.hosts,
            side,
            {**side.env(run_id), "MONARCH_RDMA_ALLOW_TCP_FALLBACK": "1"},
            [logs / f"{side.key}-{rep}-cross-worker-h{i}.log" for i in range(len(cluster.hosts))],
            files,
        )
        sizes = ",".join(s for s in args.sizes.split(",") if int(s) >= 64)
        argv = [str(side.python), str(Path(__file__).resolve()), "--child", "cross"]
        argv += ["--impl", side.key, "--sizes", sizes, "--client-ip", cluster.client.ip]
        argv += (["--quick"] if args.quick else []) + ["--workers"]
        argv += [f"tcp://{h.ip}:{PORT}" for h in cluster.hosts]
        result = run_child(
            side,
            argv,
            cluster.client.popen,
            args.run_timeout,
            logs / f"{side.key}-{rep}-cross-client.log",
            run_id,
        )
    finally:
        stop_workers(workers)
        time.sleep(0.3)
        left = [f"{p.pid} {p.cmdline[:80]}" for p in cluster.destroy()]
        for f in files:
            f.close()
    result["leftover_processes_killed"] = left + [str(p) for p in kill_leftovers(run_id)]
    return result


def aggregate(runs: list[dict[str, Any]], keys: list[str], missing: str | None) -> dict:
    """The median over the runs of every metric, or why there is none."""
    agg: dict[str, dict[str, Any]] = {}
    for key in keys:
        values, reasons, notes = [], [], []
        for run in runs:
            if key in run["metrics"]:
                values.append(run["metrics"][key])
                if key in run["notes"]:
                    notes.append(run["notes"][key])
            elif key in run["errors"]:
                reasons.append(run["errors"][key])
            elif run["status"] != "ok":
                reasons.append(run["status"])
            else:
                reasons.append("not measured")
        if values and len(values) * 2 > len(runs):
            agg[key] = {"value": statistics.median(values), "values": values, "notes": notes}
        else:
            why = missing or (reasons[0] if reasons else "not run")
            agg[key] = {"value": None, "values": values, "error": why}
    return agg


def _bound(bound: float, unit: str) -> str:
    if unit == "us" and bound >= 1000:
        return f"{bound / 1000:g} ms"
    return f"{bound:g} {unit}"


def budget_cells(budgets: list[tuple[float, str]], unit: str, ours, upstream) -> tuple[str, str]:
    texts, verdicts = [], []
    for bound, kind in budgets:
        if kind == "ratio-min":
            texts.append(f"ours/upstream >= {bound:g}")
            ok = None if ours is None or not upstream else ours / upstream >= bound
        elif kind == "min":
            texts.append(f">= {_bound(bound, unit)}")
            ok = None if ours is None else ours >= bound
        else:
            texts.append(f"< {_bound(bound, unit)}")
            ok = None if ours is None else ours < bound
        verdicts.append("n/a" if ok is None else "met" if ok else "NOT MET")
    return "; ".join(texts), "; ".join(verdicts)


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["local", "cross"], required=True)
    parser.add_argument("--impl", default="ours")
    parser.add_argument("--sizes", default="1,64,1024")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--client-ip", default="")
    parser.add_argument("--workers", nargs="*", default=[])
    args = parser.parse_args(argv)
    rc = child_local(args) if args.child == "local" else child_cross(args)
    sys.stdout.flush()
    os._exit(rc)  # the runtime's threads must not hold the exit


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return child_main(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benches"))
    from bench_common import (
        NotedCells,
        loadavg,
        machine_line,
        print_rows,
        run_outcome,
        save_results,
        settle,
    )
    from multihost_bench import make_sides
    from tests.multihost.netns import available, cleanup_stale

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results" / "rdma.json"))
    parser.add_argument("--reps", type=int, default=3, help="runs per side and part (3)")
    parser.add_argument("--impls", default="ours,upstream", help="which sides, in order")
    parser.add_argument("--no-1g", action="store_true", help="leave out the 1 GiB sizes")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 1 GiB")
    parser.add_argument("--no-cross", action="store_true", help="leave out the hosts part")
    parser.add_argument("--no-local", action="store_true", help="only the hosts part")
    parser.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--upstream-venv", default=str(ROOT / ".bench" / "venv-upstream"))
    parser.add_argument(
        "--run-timeout", type=float, default=420, help="seconds one run may take (420)"
    )
    args = parser.parse_args(argv)
    args.sizes = "1,64" if args.no_1g or args.quick else "1,64,1024"
    out = Path(args.out)
    logs = out.parent / "rdma-logs"
    logs.mkdir(parents=True, exist_ok=True)

    sides = make_sides(parser, args)
    versions = {s.key: s.missing or s.version() for s in sides}

    parts: list[tuple[str, Any]] = []
    if not args.no_local:
        parts.append(("same host", run_local))
    cross_skipped = None
    if args.no_cross:
        cross_skipped = "left out (--no-cross)"
    else:
        ok, reason = available()
        if ok:
            cleanup_stale()
            parts.append(("between hosts", run_cross))
        else:
            cross_skipped = f"skipped: {reason}"
            print(f"between-hosts part {cross_skipped}")

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {s.key: [] for s in sides}
    for part, fn in parts:
        active = [s for s in sides if not s.missing]
        for rep in range(args.reps):
            shift = rep % max(len(active), 1)
            for side in active[shift:] + active[:shift]:
                busy = settle()
                print(f"{part}, rep {rep + 1}/{args.reps}: {side.key} ...", end=" ", flush=True)
                try:
                    result = fn(side, rep, args, logs)
                except Exception as e:  # the cluster or a process could not be made
                    result = {
                        "status": f"failed: {type(e).__name__}: {e}",
                        "metrics": {},
                        "notes": {},
                        "errors": {},
                        "info": {},
                        "wall_s": 0.0,
                        "leftover_processes_killed": [],
                    }
                result.update(part=part, rep=rep, cpu_busy_before_run=busy, loadavg=loadavg())
                runs[side.key].append(result)
                print(run_outcome(result), flush=True)
            active = [s for s in active if "timed out" not in runs[s.key][-1]["status"]]
    elapsed = time.perf_counter() - t_start

    aggs: dict[str, dict[str, Any]] = {}
    for s in sides:
        aggs[s.key] = {}
        for part, _ in parts:
            part_runs = [r for r in runs[s.key] if r["part"] == part]
            keys = [k for k, *_ in ROWS if k.startswith("x_") == (part == "between hosts")]
            aggs[s.key].update(aggregate(part_runs, keys, s.missing))
        for key, *_ in ROWS:
            if key not in aggs[s.key]:
                why = cross_skipped if key.startswith("x_") else "left out (--no-local)"
                if key.endswith("_1g_gbps") or key == "reg_1g_us" or key == "reg_rss_growth_mib":
                    why = "left out (--no-1g / --quick)" if "1024" not in args.sizes else why
                aggs[s.key][key] = {"value": None, "error": why}
            elif key.endswith(("_1g_gbps", "reg_1g_us", "reg_rss_growth_mib")):
                if "1024" not in args.sizes:
                    aggs[s.key][key] = {"value": None, "error": "left out (--no-1g / --quick)"}
    cell = NotedCells(aggs, show=fmt)
    notes = cell.notes

    rows = [("metric", "ours", "upstream", "ours/upstream", "budget", "met")]
    for key, name, unit, budgets in ROWS:
        o = aggs.get("ours", {}).get(key, {}).get("value")
        u = aggs.get("upstream", {}).get(key, {}).get("value")
        ratio = "-"
        if o is not None and u:
            r = o / u
            ratio = f"{r:.2f}" if r < 10 else f"{r:.0f}"
        text, met = budget_cells(budgets, unit, o, u)
        rows.append((name, cell(key, unit, "ours"), cell(key, unit, "upstream"), ratio, text, met))

    machine = machine_line()
    print(f"\nmonarch.rdma, ours vs upstream ({started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s)")
    print(machine)
    for s in sides:
        done = sum(1 for r in runs[s.key] if r["status"] == "ok")
        state = s.missing or f"{done}/{len(runs[s.key])} runs completed"
        backends = sorted(
            {
                f"{'between hosts' if k.startswith('x_') else 'same host'}: {v}"
                for r in runs[s.key]
                for k, v in r["info"].items()
                if k in ("backend", "x_backend")
            }
        )
        print(f"  {s.key}: {versions[s.key]}; {state}; backend {', '.join(backends) or '?'}")
    busy = [r["cpu_busy_before_run"] for rs in runs.values() for r in rs]
    busy = [b for b in busy if b is not None]
    if busy:
        print(
            f"CPU busy in the 0.5 s before each run: {100 * min(busy):.0f}-"
            f"{100 * max(busy):.0f}% (other work on the machine skews the figures)"
        )
    mode = "quick" if args.quick else "full"
    print(f"median of {args.reps} {mode} run(s) per side and part; ratio = ours / upstream\n")
    print_rows(rows)
    for k, note in enumerate(notes, 1):
        print(f"[{k}] {note}")

    result = {
        "date": started.isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
        "machine": machine,
        "mode": mode,
        "reps": args.reps,
        "sizes_mib": [int(s) for s in args.sizes.split(",")],
        "versions": versions,
        "cross_host": cross_skipped or "run",
        "median": aggs,
        "runs": runs,
        "table": rows,
        "notes": notes,
    }
    return save_results(out, logs, result, runs.get("ours", []))


if __name__ == "__main__":
    sys.exit(main())
