"""The wheel users pip-install (docs/install.md), in an environment like theirs.

`make wheel` builds it (reusing the release build of `make install` in target/); it is
installed with pip into a fresh venv that has neither torch nor cargo and rustc on its
PATH, and run from a directory outside the repository: the seed README's first example
as a user writes it, a client driving two workers (``monarch worker``) over loopback
TCP, ``monarch --help``, and imports that must not pull in torch.

The venv is offline: its one dependency, cloudpickle, is copied from this test's own
environment (a pure-Python package: its files and its dist-info, as pip installs them),
so ``pip install --no-index`` finds it satisfied.
"""

from __future__ import annotations

import importlib.metadata
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The first example of the seed README, unchanged.
README_EXAMPLE = """\
from monarch.actor import Actor, endpoint, this_host

# spawn 8 trainer processes one for each gpu
training_procs = this_host().spawn_procs({"gpus": 8})


# define the actor to run on each process
class Trainer(Actor):
    @endpoint
    def train(self, step: int): ...


# create the trainers
trainers = training_procs.spawn("trainers", Trainer)

# tell all the trainers to to take a step
fut = trainers.train.call(step=0)

# wait for all trainers to complete
fut.get()
"""

#: A client of two workers on this machine (docs/hosts.md), over loopback TCP.
MULTIHOST_EXAMPLE = """\
import os
import sys

from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint


class Where(Actor):
    @endpoint
    def where(self) -> tuple[str, int]:
        return sys.prefix, os.getpid()


enable_transport("tcp-localhost")
hosts = attach_to_workers(workers=sys.argv[1:], ca=None)
hosts.initialized.get(timeout=60)
procs = hosts.spawn_procs(per_host={"gpus": 2})
answers = procs.spawn("where", Where).where.call().get(timeout=60)
assert answers.sizes == {"hosts": 2, "gpus": 2}, answers.sizes
assert {prefix for prefix, _ in answers.values()} == {sys.prefix}
assert len({pid for _, pid in answers.values()}) == 4
procs.stop().get(timeout=60)
print("4 procs on 2 workers")
"""

#: What a user without torch or a Rust toolchain gets.
IMPORTS_CHECK = """\
import importlib.util
import shutil
import sys

import monarch
import monarch.actor
import monarch.rdma

assert shutil.which("cargo") is None and shutil.which("rustc") is None
assert importlib.util.find_spec("torch") is None, "torch is installed"
assert "torch" not in sys.modules
assert monarch.__file__.startswith(sys.prefix), monarch.__file__
try:
    monarch.Tensor
except ModuleNotFoundError as e:
    assert "pip install torch" in str(e), str(e)
else:
    raise AssertionError("monarch.Tensor without torch did not fail")
print("imports ok")
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without this repository's build and test settings."""
    drop = ("MONARCH_", "PYO3_", "PYTHON", "VIRTUAL_ENV", "CARGO", "RUSTUP", "MAKE", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


def _run(
    args: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, f"{args} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


def _install_cloudpickle(venv_python: Path) -> None:
    """Copies cloudpickle's files and dist-info from this environment into the venv."""
    dist = importlib.metadata.distribution("cloudpickle")
    site = Path(
        subprocess.run(
            [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    origin = Path(str(dist.locate_file("")))
    for file in dist.files or []:
        if "__pycache__" in file.parts or file.parts[0].startswith(".."):
            continue
        dest = site / file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin / file, dest)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make wheel` into a temporary directory."""
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    start = time.monotonic()
    built = _run(
        ["make", "--no-print-directory", "wheel", f"DIST_DIR={out}"],
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    print(f"make wheel: {time.monotonic() - start:.1f} s\n{built.stdout}")
    wheels = list(out.glob("monarch-*.whl"))
    assert len(wheels) == 1, wheels
    assert "-abi3-manylinux_" in wheels[0].name, wheels[0].name
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel pip-installed, offline; its bin/ directory."""
    root = tmp_path_factory.mktemp("venv")
    env = _clean_env()
    _run([sys.executable, "-m", "venv", str(root)], env=env, cwd=root, timeout=300)
    python = root / "bin" / "python"
    _install_cloudpickle(python)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    _run([*pip, "install", "--no-index", str(wheel)], env=env, cwd=root, timeout=300)
    return root / "bin"


@pytest.fixture
def user_env(venv: Path) -> dict[str, str]:
    """A user's environment: the venv first on PATH, and no cargo or rustc on it."""
    path = [str(venv)]
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and not any(shutil.which(tool, path=entry) for tool in ("cargo", "rustc")):
            path.append(entry)
    env = _clean_env(PATH=os.pathsep.join(path), VIRTUAL_ENV=str(venv.parent))
    assert shutil.which("cargo", path=env["PATH"]) is None
    assert shutil.which("rustc", path=env["PATH"]) is None
    return env


@pytest.mark.timeout(1200)
def test_imports_without_torch_or_rust(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "imports_check.py"
    script.write_text(IMPORTS_CHECK)
    out = _run([str(venv / "python"), str(script)], env=user_env, cwd=tmp_path, timeout=120)
    assert "imports ok" in out.stdout


@pytest.mark.timeout(1200)
def test_the_seed_readme_example_runs(venv: Path, user_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(README_EXAMPLE)
    out = _run([str(venv / "python"), str(script)], env=user_env, cwd=tmp_path, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr[-4000:]


@pytest.mark.timeout(1200)
def test_the_monarch_command_helps(venv: Path, user_env: dict[str, str], tmp_path: Path) -> None:
    out = _run([str(venv / "monarch"), "--help"], env=user_env, cwd=tmp_path, timeout=60)
    assert "worker" in out.stdout, out.stdout


class _Worker:
    """A `monarch worker` on loopback TCP (an ephemeral port) in a session of its own."""

    def __init__(self, venv: Path, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [str(venv / "monarch"), "worker", "--address", "tcp://127.0.0.1:0"],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def address(self, timeout: float = 60) -> str:
        """Waits for the ready line; the address clients attach to."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"the worker did not start:\n{''.join(self.output)}")
            self.output.append(line)
            if line.startswith("monarch worker ready at tcp:"):
                return "tcp://" + line.split("tcp:", 1)[1].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its procs, if any are left
        except ProcessLookupError:
            pass
        self.proc.wait(15)
        self.drain.join(15)  # the pipe ends once the worker's whole group is gone
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def cluster_env(user_env: dict[str, str]) -> dict[str, str]:
    """The user's environment with the cluster secret every process shares."""
    return {**user_env, "MONARCH_CLUSTER_SECRET": "packaging-test-" + os.urandom(8).hex()}


@pytest.fixture
def workers(venv: Path, cluster_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    started: list[_Worker] = []
    try:
        for _ in range(2):
            started.append(_Worker(venv, cluster_env, tmp_path))
        yield [w.address() for w in started]
    finally:
        for w in started:
            w.stop()


@pytest.mark.timeout(1200)
def test_a_client_drives_two_loopback_workers(
    venv: Path, cluster_env: dict[str, str], workers: list[str], tmp_path: Path
) -> None:
    script = tmp_path / "two_hosts.py"
    script.write_text(MULTIHOST_EXAMPLE)
    out = _run(
        [str(venv / "python"), str(script), *workers], env=cluster_env, cwd=tmp_path, timeout=120
    )
    assert "4 procs on 2 workers" in out.stdout


TENSORS_LATER = """
import torch

import monarch
from monarch.actor import this_host

mesh = this_host().spawn_procs(per_host={"gpus": 2})
with mesh.activate():
    x = torch.ones(2, 3) * (mesh.rank_tensor("gpus") + 1)
    total = x.reduce("gpus", "sum")
print("tensors", monarch.inspect(total).tolist())
mesh.stop().get()
"""


@pytest.mark.timeout(1200)
def test_torch_installed_later_enables_tensors_without_a_rebuild(
    venv: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    """torch made importable in the wheel's venv afterwards (this environment's own,
    through a ``.pth`` file after the venv's packages, so the wheel's monarch still
    wins): distributed tensors work, with the same extension."""
    import torch

    site = Path(
        _run(
            [
                str(venv / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            env=user_env,
            cwd=tmp_path,
            timeout=60,
        ).stdout.strip()
    )
    torch_site = Path(torch.__file__).resolve().parents[1]
    pth = site / "zz_torch_later.pth"
    pth.write_text(f"{torch_site}\n")
    try:
        script = tmp_path / "tensors_later.py"
        script.write_text(TENSORS_LATER)
        out = _run([str(venv / "python"), str(script)], env=user_env, cwd=tmp_path, timeout=180)
        assert "tensors [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]" in out.stdout, out.stdout
        where = _run(
            [str(venv / "python"), "-c", "import monarch; print(monarch.__file__)"],
            env=user_env,
            cwd=tmp_path,
            timeout=60,
        ).stdout
        assert str(site) in where, where  # the wheel's monarch, not this checkout's
    finally:
        pth.unlink()
