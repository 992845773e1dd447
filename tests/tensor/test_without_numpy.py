"""Distributed tensors where torch is installed without NumPy (``pip install torch``
alone does not bring it, nor does ``monarch[tensor]``): fetching values, small and
large, works in the client and on the workers.

The script runs in a fresh interpreter whose path starts with a ``numpy`` package that
refuses to import, as if NumPy were not installed; the procs it spawns inherit that path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CLIENT = """
import torch

import monarch
from monarch.actor import this_host

try:
    import numpy  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("numpy is importable: the test's stand-in was not used")


mesh = this_host().spawn_procs(per_host={"gpus": 2})
with mesh.activate():
    small = torch.ones(2, 3) * (mesh.rank_tensor("gpus") + 1)
    total = small.reduce("gpus", "sum")
    large = torch.arange(1 << 16, dtype=torch.float64)
print("small", monarch.inspect(total).tolist())
print("large", float(monarch.inspect(large, gpus=1).sum()))
mesh.stop().get()
print("CLIENT DONE", flush=True)
"""


@pytest.mark.timeout(150)
def test_tensors_are_fetched_without_numpy(tmp_path: Path) -> None:
    shim = tmp_path / "no_numpy" / "numpy"
    shim.mkdir(parents=True)
    # What importing a module that is not installed raises (torch checks for this one).
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy' (this test)\", name='numpy')\n"
    )
    path = os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CLIENT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "CLIENT DONE", out.stdout
    assert "small [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]" in lines, out.stdout
    assert f"large {float(sum(range(1 << 16)))}" in lines, out.stdout
