"""``monarch.rdma`` on its own: importing it stays light (no torch, no runtime), and a
script that imports nothing else from monarch can register and transfer (the client
starts on first use, as with any first use of monarch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
import sys
import monarch.rdma
assert "torch" not in sys.modules, "import monarch.rdma imported torch"
import torch
from monarch.rdma import RDMABuffer
src = torch.arange(100, dtype=torch.uint8)
buf = RDMABuffer(src)
dst = torch.zeros(100, dtype=torch.uint8)
buf.read_into(dst).get()
assert torch.equal(src, dst)
buf.write_from(torch.full((10,), 7, dtype=torch.uint8)).get()
assert src[:10].tolist() == [7] * 10 and src[10] == 10
buf.drop().get()
print("ok", buf.backend)
"""


def test_a_script_that_imports_only_monarch_rdma_works() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok cma"
