"""docs/workspace.md: its runnable code (blocks fenced ```python, not ```python notest)
runs, and prints what the guide says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.timeout(180)
def test_the_workspace_guide_runs(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "workspace.md").read_text()
    blocks = _BLOCK.findall(guide)
    assert blocks, "docs/workspace.md lost its runnable code"
    script = tmp_path / "workspace_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    # Each print is a ValueMesh of both hosts' answers: v1 twice, then v2 twice.
    answers = re.findall(r": '(v\d)'$", out.stdout, re.MULTILINE)
    assert answers == ["v1", "v1", "v2", "v2"], out.stdout
