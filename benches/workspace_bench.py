"""``HostMesh.sync_workspace``: a workspace of 1,000 files mirrored to 3 hosts, then
10 of them changed and mirrored again.

The hosts are network namespaces on this machine (as the multi-host tests build them;
needs root, else the bench says why and runs on 3 workers of this namespace instead),
each worker in a mount namespace of its own whose ``WORKSPACE_DIR`` is a private tmpfs:
every byte a host gets crosses its network interface. The client runs in a fourth
namespace. The workspace is ``--files`` files (1,000) of 1 to 32 KiB (``--seed``d
random sizes; random bytes, so nothing compresses) in 50 directories.

Measured, for one run: the first sync (every file sent), then ``--reps`` times a sync
after rewriting ``--changed`` files (10) with new content, then a sync with nothing
changed. For each: the client's wall time (hashing included), the file bytes the
library sent, and the bytes that left the client's interface and each host's (from
``/proc/net/dev`` of each namespace, read by the client and by an actor on each host):
the client sends each content once, to host 0, which forwards it to hosts 1 and 2, so
the client sends about the workspace once, not three times.

Usage: ``sudo .venv/bin/python benches/workspace_bench.py [--files N] [--changed N]
[--reps N] [--out FILE]``; ``make bench-workspace``. Prints a table; writes JSON
(default ``.bench/results/workspace.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from bench_common import loadavg, machine_line, print_rows, save_results  # noqa: E402

PORT = 26700
SECRET = "workspace-bench-secret"
#: Each host's tmpfs.
TMPFS_SIZE = "512m"


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files in the workspace")
    parser.add_argument("--changed", type=int, default=10, help="files changed per rep")
    parser.add_argument("--reps", type=int, default=5, help="incremental syncs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the file sizes")
    parser.add_argument("--run-timeout", type=int, default=600, help="seconds for the client")
    parser.add_argument(
        "--out", default=str(ROOT / ".bench" / "results" / "workspace.json"), help="JSON"
    )
    # Internal: the client, run in the cluster's client namespace (or beside the workers).
    parser.add_argument("--attach", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --- the client ---------------------------------------------------------------------------


def _tx_bytes() -> dict[str, int]:
    """Bytes sent by each interface of this network namespace (but loopback)."""
    out = {}
    with open("/proc/self/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if name.strip() != "lo":
                out[name.strip()] = int(fields[8])
    return out


def _make_workspace(src: Path, files: int, seed: int) -> int:
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        path = src / f"pkg{i % 50:02}" / f"mod{i:04}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = rng.randint(1 << 10, 32 << 10)
        path.write_bytes(os.urandom(size))
        total += size
    return total


def client(args: argparse.Namespace) -> int:
    from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint
    from monarch.tools.config import Workspace

    class Counter(Actor):
        @endpoint
        def tx(self) -> int:
            return sum(_tx_bytes().values())

    addresses = args.attach.split(",")
    wire = addresses[0].startswith("tcp://")
    if wire:
        enable_transport("tcp")
    hosts = attach_to_workers(workers=addresses, ca=None)
    src = Path(args.scratch) / "workspace"
    total = _make_workspace(src, args.files, args.seed)
    workspace = Workspace(dirs={src: "proj"})
    counters = hosts.spawn_procs(name="counters").spawn("counters", Counter)
    rng = random.Random(args.seed + 1)
    names = sorted(src.rglob("*.py"))

    def measure(label: str) -> dict[str, Any]:
        hosts_before = counters.tx.call().get(timeout=60).values()
        client_before = sum(_tx_bytes().values())
        start = time.monotonic()
        asyncio.run(asyncio.wait_for(hosts.sync_workspace(workspace), args.run_timeout))
        seconds = time.monotonic() - start
        client_after = sum(_tx_bytes().values())
        hosts_after = counters.tx.call().get(timeout=60).values()
        stats = hosts._workspace_sync.last  # type: ignore[attr-defined]
        row = {
            "sync": label,
            "seconds": seconds,
            "files": stats.files,
            "sent_files": stats.sent_files,
            "sent_bytes": stats.sent_bytes,
            "manifest_bytes": stats.manifest_bytes,
            # Over Unix sockets (no namespaces) nothing crosses an interface.
            "client_tx": client_after - client_before if wire else None,
            "hosts_tx": [
                a - b if wire else None for a, b in zip(hosts_after, hosts_before, strict=True)
            ],
            "changed_per_host": [len(v) for v in stats.changed.values()],
        }
        print("RUN " + json.dumps(row), flush=True)
        return row

    rows = [measure("first")]
    for rep in range(args.reps):
        for path in rng.sample(names, args.changed):
            path.write_bytes(os.urandom(path.stat().st_size))
        rows.append(measure(f"changed {rep + 1}"))
    rows.append(measure("unchanged"))
    hosts.stop().get(timeout=60)
    print("RESULT " + json.dumps({"rows": rows, "workspace_bytes": total}), flush=True)
    return 0


# --- the driver ---------------------------------------------------------------------------


def _worker_argv(address: str, root: Path, private: bool) -> list[str]:
    worker = [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", address]
    if not private:
        return worker
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs -o "size=$1,mode=0755" tmpfs "$WORKSPACE_DIR" && shift && exec "$@"',
        "sh", TMPFS_SIZE, *worker,
    ]  # fmt: skip


def _run(args: argparse.Namespace, argv: list[str], scratch: Path, logs: Path) -> dict[str, Any]:
    """Start 3 workers (in namespace hosts when possible) and the client; its result."""
    from multihost_bench import stop_workers
    from tests.multihost.netns import Cluster, available, cleanup_stale

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "python")
    env["MONARCH_CLUSTER_SECRET"] = SECRET
    env.pop("MONARCH_CLUSTER_AUTH", None)
    ok, reason = available()
    where = "3 network-namespace hosts, each WORKSPACE_DIR a private tmpfs"
    if not ok:
        where = f"3 workers on this host, separate directories ({reason})"
    workers: list[subprocess.Popen[bytes]] = []
    cluster = None
    files = []
    try:
        places: list[tuple[Any, str]]
        if ok:
            cleanup_stale()
            cluster = Cluster.create(3)
            places = [(h, f"tcp://{h.ip}:{PORT}") for h in cluster.hosts]
        else:
            places = [(None, f"ipc://{scratch}/worker-{i}.sock") for i in range(3)]
        for i, (host, address) in enumerate(places):
            root = scratch / ("root" if ok else f"root-{i}")
            root.mkdir(exist_ok=True)
            log = open(logs / f"worker-{i}.log", "wb")
            files.append(log)
            argv_w = _worker_argv(address, root, ok)
            popen = host.popen if host is not None else subprocess.Popen
            workers.append(
                popen(
                    argv_w,
                    env={**env, "WORKSPACE_DIR": str(root)},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        command = [
            sys.executable, __file__, *argv,
            "--attach", ",".join(a for _, a in places), "--scratch", str(scratch),
        ]  # fmt: skip
        launch = cluster.client.popen if cluster is not None else subprocess.Popen
        proc = launch(command, env=env, stdout=subprocess.PIPE, text=True)
        try:
            out, _ = proc.communicate(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
            raise SystemExit(f"the client ran past --run-timeout ({args.run_timeout} s)") from None
        for line in out.splitlines():
            if line.startswith("RUN "):
                print(line[4:], flush=True)
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[7:])
                result["where"] = where
                return result
        raise SystemExit(f"the client exited with {proc.returncode} without a result")
    finally:
        stop_workers(workers)
        for f in files:
            f.close()
        if cluster is not None:
            cluster.destroy()


def _kib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1024:,.0f} KiB"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _args(argv)
    if args.attach:
        return client(args)
    out = Path(args.out)
    logs = out.parent / "workspace-logs"
    logs.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="monarch-workspace-bench-"))
    try:
        result = _run(args, argv, scratch, logs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = result["rows"]
    print(machine_line())
    print(
        f"workspace: {args.files} files, {_kib(result['workspace_bytes'])}; {args.changed} "
        f"changed per rep; {result['where']}"
    )
    table: list[tuple[str, ...]] = [
        (
            "sync", "time", "files sent", "file bytes sent", "client sent (wire)",
            "host 0 sent", "hosts 1, 2 sent",
        )
    ]  # fmt: skip
    for r in rows:
        table.append(
            (
                r["sync"],
                f"{r['seconds'] * 1000:.0f} ms",
                str(r["sent_files"]),
                _kib(r["sent_bytes"]),
                _kib(r["client_tx"]),
                _kib(r["hosts_tx"][0]),
                ", ".join(_kib(b) for b in r["hosts_tx"][1:]),
            )
        )
    print_rows(table)
    changed = [r for r in rows if r["sync"].startswith("changed")]
    summary = {
        "first_s": rows[0]["seconds"],
        "changed_s_median": statistics.median(r["seconds"] for r in changed) if changed else None,
        "changed_bytes_median": (
            statistics.median(r["sent_bytes"] for r in changed) if changed else None
        ),
        "unchanged_s": rows[-1]["seconds"],
    }
    print(json.dumps(summary))
    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_line(),
        "loadavg": loadavg(),
        "files": args.files,
        "changed": args.changed,
        "reps": args.reps,
        **result,
        "summary": summary,
    }
    return save_results(out, logs, record, [{"status": "ok"}])


if __name__ == "__main__":
    sys.exit(main())
