"""docs/supervision.md: its code runs (issue 5).

The ```python blocks of the guide, joined in order, form one script (the later blocks
define classes the first one does not use, which is fine); it runs as a subprocess and
must print what the guide says it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "supervision.md"
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@pytest.mark.timeout(120)
def test_the_supervision_guide_runs(tmp_path: Path) -> None:
    blocks = PYTHON_BLOCK.findall(GUIDE.read_text())
    assert len(blocks) >= 2, f"{GUIDE} lost its code"
    script = tmp_path / "supervision_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("MeshFailure(mesh_name=workers, rank=1, crashed_ranks=[1], ")
    assert "event=actor mesh 'workers' (" in lines[0] and "rank 1 on proc" in lines[0]
    assert "worker gave up" in lines[0]
    assert lines[1:] == ["rank 1: SupervisionError", "rank 0: 0"]
