"""docs/rdma.md: its runnable code (blocks fenced ```python, not ```python notest) runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.timeout(180)
def test_the_rdma_guide_runs(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "rdma.md").read_text()
    blocks = _BLOCK.findall(guide)
    assert len(blocks) >= 3, "docs/rdma.md lost its runnable code"
    script = tmp_path / "rdma_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "4096 bytes, backend cma" in out.stdout, out.stdout
    assert "refused:" in out.stdout, out.stdout
    assert "owner gone:" in out.stdout, out.stdout
