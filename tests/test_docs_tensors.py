"""docs/tensors.md: its runnable code (blocks fenced ```python) runs, and prints what the
guide says; examples/distributed_tensors.py runs too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _as_users_run_it() -> dict[str, str]:
    """The environment without the suite's own fork-server setting (see conftest)."""
    env = dict(os.environ)
    env.pop("MONARCH_SPAWN_FORK_SERVER_PRELOAD", None)
    return env


@pytest.mark.timeout(240)
def test_the_tensors_guide_runs(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "tensors.md").read_text()
    blocks = _BLOCK.findall(guide)
    assert len(blocks) >= 5, "docs/tensors.md lost its runnable code"
    script = tmp_path / "tensors_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
        env=_as_users_run_it(),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout
    assert "tensor([[2., 2., 2.]," in lines  # rank 1's shard
    assert "tensor([[3., 3., 3.]," in lines  # the sum
    assert "failed on rank 0 : IndexError: index out of range in self" in lines
    assert "[2.0, 2.0, 2.0]" in lines  # the workers went on
    assert "5 3" in lines and "[0, 1, 2, 3]" in lines  # the collectives
    assert "[20.0, 20.0, 20.0]" in lines  # to_mesh
    assert "[3.0, 3.0] [6.0, 6.0]" in lines  # the remote function and its values
    assert "[1.0, 1.0, 1.0, 1.0]" in lines  # the reduce on the comms stream
    assert "[4950.0, 4950.0, 4950.0]" in lines  # coalescing()
    assert "[2.0, 4.0] [20.0, 20.0, 20.0, 20.0]" in lines  # tensors and actors
    assert "True (5, 2)" in lines  # builtins and OpaqueRef


@pytest.mark.timeout(240)
def test_the_distributed_tensors_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "distributed_tensors.py")],
        capture_output=True,
        text=True,
        timeout=220,
        cwd=ROOT,
        env=_as_users_run_it(),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "recovered from a failure on rank 0: IndexError" in out.stdout
    assert "every rank, gathered: [0, 1, 2, 3]" in out.stdout
    assert "distributed tensors: done" in out.stdout
