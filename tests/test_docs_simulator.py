"""docs/simulator.md: its code runs (in a fresh interpreter, in a temporary folder) and
writes the trace the guide describes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.timeout(120)
def test_the_simulator_guide_runs(tmp_path: Path) -> None:
    blocks = _BLOCK.findall((ROOT / "docs" / "simulator.md").read_text())
    assert len(blocks) >= 2, "docs/simulator.md lost its runnable code"
    script = tmp_path / "simulator_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "torch.Size([4096, 4096])" in out.stdout
    assert "comms" in out.stdout and "main" in out.stdout  # display(): a row per stream
    trace = json.loads((tmp_path / "trace.json").read_text())
    threads = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert {"main", "comms"} <= threads
    ranks = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert {f"rank {r}" for r in range(4)} <= ranks
