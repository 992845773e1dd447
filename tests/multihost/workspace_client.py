"""Client programs of the multi-host ``sync_workspace`` tests, run in the client network
namespace: ``python workspace_client.py SCENARIO SCRATCH WORKER_ADDRESS...``.

``SCRATCH`` is a directory of the client's (on the file system the namespaces share):
the workspace is made under it. Each host's ``WORKSPACE_DIR`` is a tmpfs of its own
(``test_workspace_hosts.py``), so what reaches a host's copy came over the network.
Each scenario prints one line ``RESULT <json>`` at the end.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

from monarch.actor import (
    Actor,
    HostMesh,
    attach_to_workers,
    current_rank,
    enable_transport,
    endpoint,
)
from monarch.tools.config import HostOutOfSpaceError, Workspace

#: The longest one sync may take here.
SYNC_TIMEOUT = 120


class Probe(Actor):
    @endpoint
    def load(self, name: str) -> dict[str, Any]:
        """Import ``name`` in this proc: from where, its ``VALUE``, this host's copy."""
        module = importlib.import_module(name)
        root = os.environ["WORKSPACE_DIR"]
        return {
            "host": current_rank()["hosts"],
            "workspace_dir": root,
            "file": module.__file__,
            "value": getattr(module, "VALUE", None),
            "listing": sorted(os.listdir(os.path.join(root, "proj"))),
            "tool_mode": stat.S_IMODE(os.stat(os.path.join(root, "proj", "tool.sh")).st_mode),
        }

    @endpoint
    def mark(self) -> None:
        """Write a file into this host's copy only."""
        Path(os.environ["WORKSPACE_DIR"], "proj", "only-here.txt").write_text("mine")

    @endpoint
    def marked(self) -> bool:
        return Path(os.environ["WORKSPACE_DIR"], "proj", "only-here.txt").exists()


def sync(hosts: HostMesh, workspace: Workspace, **kwargs: Any) -> dict[str, Any]:
    start = time.monotonic()
    asyncio.run(asyncio.wait_for(hosts.sync_workspace(workspace, **kwargs), SYNC_TIMEOUT))
    seconds = time.monotonic() - start
    stats = hosts._workspace_sync.last  # type: ignore[attr-defined]
    return {
        "seconds": seconds,
        "files": stats.files,
        "sent_files": stats.sent_files,
        "sent_bytes": stats.sent_bytes,
        "changed": {str(k): v for k, v in stats.changed.items()},
        "roots": {str(k): v for k, v in stats.roots.items()},
        "reloaded": stats.reloaded,
    }


def mirror(hosts: HostMesh, scratch: Path) -> dict[str, Any]:
    src = scratch / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "wsmod.py").write_text("VALUE = 1\n")
    (src / "tool.sh").write_text("#!/bin/sh\n")
    (src / "tool.sh").chmod(0o755)
    (src / "gone.txt").write_text("to be deleted\n")
    workspace = Workspace(dirs=[src])
    out: dict[str, Any] = {"first": sync(hosts, workspace)}
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    try:
        probe = procs.spawn("probe", Probe)
        out["loaded"] = list(probe.load.call("pkg.wsmod").get(timeout=60).values())
        probe.slice(hosts=0).mark.call_one().get(timeout=60)
        out["marked"] = list(probe.marked.call().get(timeout=60).values())
        out["client_sees_copy"] = os.path.exists(os.path.join(out["first"]["roots"]["0"], "proj"))
        (src / "pkg" / "wsmod.py").write_text("VALUE = 'second'\n")
        (src / "gone.txt").unlink()
        (src / "tool.sh").chmod(0o700)
        out["second"] = sync(hosts, workspace, auto_reload=True)
        out["after"] = list(probe.load.call("pkg.wsmod").get(timeout=60).values())
    finally:
        procs.stop().get(timeout=60)
    return out


def nospace(hosts: HostMesh, scratch: Path) -> dict[str, Any]:
    """Host 2's copy is a tmpfs of 2 MiB and 64 inodes: a 3 MiB file is refused before
    anything is sent; 100 small files run it out of inodes while it writes."""
    out: dict[str, Any] = {}
    big = scratch / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(os.urandom(3 << 20))
    try:
        sync(hosts, Workspace(dirs={big: "big"}))
        out["big"] = None
    except HostOutOfSpaceError as e:
        out["big"] = str(e)
        out["big_errno"] = e.errno
    many = scratch / "many"
    many.mkdir()
    for i in range(100):
        (many / f"f{i:03}.txt").write_text(f"file {i}\n")
    try:
        sync(hosts, Workspace(dirs={many: "many"}))
        out["many"] = None
    except HostOutOfSpaceError as e:
        out["many"] = str(e)
    # The same names, emptied: each host's copy of them is deleted.
    for d in (big, many):
        for f in d.iterdir():
            f.unlink()
    out["cleaned"] = sync(hosts, Workspace(dirs={big: "big", many: "many"}))
    return out


SCENARIOS = {"mirror": mirror, "nospace": nospace}


def main() -> None:
    scenario, scratch, addresses = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    enable_transport("tcp")
    hosts = attach_to_workers(workers=addresses, ca=None)
    try:
        result = SCENARIOS[scenario](hosts, scratch)
    finally:
        hosts.stop().get(timeout=60)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
