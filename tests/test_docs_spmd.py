"""docs/spmd.md: its runnable code (blocks fenced ```python, not ```python notest) runs;
docs/notebooks/ddp.ipynb runs in a real Jupyter kernel and prints every rank's losses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.timeout(180)
def test_the_spmd_guide_runs(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "spmd.md").read_text()
    blocks = _BLOCK.findall(guide)
    assert len(blocks) >= 3, "docs/spmd.md lost its runnable code"
    script = tmp_path / "spmd_guide.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert re.search(r"step 2: \{0: [\d.]+, 1: [\d.]+\}", out.stdout), out.stdout
    assert "rank 1 of 2: ['--lr', '0.1']" in out.stdout


def _client(notebook: Any, cwd: Path) -> Any:
    """A client that runs ``notebook`` in a fresh python3 kernel in ``cwd``, 120 s per
    cell. The kernel listens on Unix sockets in ``cwd`` (an absolute path: the kernel
    runs in ``cwd`` and its client does not): over TCP, jupyter picks five free ports
    and the kernel binds them later, and a port taken in between (the other tests' procs
    bind ports all the time) killed the kernel with "Address already in use"."""
    import nbclient
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(cwd / "kernel")  # sockets kernel-1 ... kernel-5
    return nbclient.NotebookClient(
        notebook,
        timeout=120,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
        config=config,
    )


def _text(cell: Any) -> str:
    """Everything a code cell printed or displayed; an error fails the test."""
    parts = []
    for output in cell["outputs"]:
        kind = output["output_type"]
        assert kind != "error", "\n".join(output["traceback"])
        if kind == "stream":
            parts.append(output["text"])
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.mark.timeout(240)
def test_the_ddp_notebook_runs_in_a_kernel(tmp_path: Path) -> None:
    # In the Makefile's DEV_REQUIREMENTS: `make install` puts them in the venv.
    import ipykernel  # noqa: F401  # the kernel nbclient starts
    import nbformat

    notebook = nbformat.read(ROOT / "docs" / "notebooks" / "ddp.ipynb", as_version=4)
    client = _client(notebook, tmp_path)
    # Starts the kernel, runs every cell, and shuts the kernel down (its procs end
    # with it; the leak check of conftest.py fails the test if one is left).
    client.execute()
    out = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "2 DDP actors ready" in out
    assert "Found 2 ranks in the mesh" in out
    assert re.search(r"Rank 1: PID=\d+, Device=\S+, GPU Memory=[\d.]+MB", out)
    losses = re.findall(r"Losses across ranks: \['([\d.]+)', '([\d.]+)'\]", out)
    norms = re.findall(r"Gradient norms: \['([\d.]+)', '([\d.]+)'\]", out)
    assert len(losses) == 3 and len(norms) == 3, out
    assert all(a == b for a, b in norms), norms  # DDP averaged the gradients
    assert "stopped" in out


@pytest.mark.timeout(180)
def test_actor_output_appears_in_the_cell_that_caused_it(tmp_path: Path) -> None:
    """What an actor prints during a cell is part of that cell's output, prefixed with
    its mesh and rank, and not of a later cell's."""
    import nbformat

    cells = [
        "from monarch.actor import Actor, endpoint, this_host\n"
        "class Talker(Actor):\n"
        "    @endpoint\n"
        "    def talk(self, word: str) -> int:\n"
        "        print(f'actor says {word}', flush=True)\n"
        "        return 1\n"
        "procs = this_host().spawn_procs(name='talkers', per_host={'gpus': 2})\n"
        "talkers = procs.spawn('talker', Talker)\n"
        "talkers.talk.call('warmup').get()",
        "talkers.talk.call('first').get()\nprint('cell 2 done')",
        "talkers.talk.call('second').get()\nprint('cell 3 done')",
        "procs.stop().get()",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    _client(notebook, tmp_path).execute()
    second, third = _text(notebook.cells[1]), _text(notebook.cells[2])
    for rank in (0, 1):
        assert f"[talkers {rank}] actor says first" in second, second
        assert f"[talkers {rank}] actor says second" in third, third
    assert "second" not in second and "first" not in third
