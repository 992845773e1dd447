"""Monarch's container image (docker/Dockerfile), checked without a container builder.

No container builder can build it where monarch is tested: Debian has Buildah and Podman,
but the image starts from ``python:3.11-slim``, which only a container registry serves,
and none is reachable there. What the build does is checked instead:
``docker/check_build.sh`` runs the Dockerfile's RUN step (``docker/install.sh``) in a
fresh venv with the wheel ``make wheel`` builds, offline (``PIP_NO_INDEX=1``; its one
dependency, cloudpickle, copied in as in test_wheel.py; torch and the extra packages,
which come from their indexes, left out), and checks that monarch imports from the venv
and ``monarch worker --help`` runs. Then the image's default command (its ``ENTRYPOINT``
and ``CMD``) starts a worker from that venv. The build context (``.dockerignore``), the
Dockerfile's steps, and the guides and manifests that name the image are checked as
text.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
#: Upstream Monarch's image: holds upstream's monarch, not this one.
UPSTREAM_IMAGE = "ghcr.io/meta-pytorch/monarch"


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without this repository's build and test settings."""
    drop = ("MONARCH_", "PYO3_", "PYTHON", "VIRTUAL_ENV", "CARGO", "RUSTUP", "MAKE", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k != "PIP_USER"}
    env.update(extra)
    return env


def _copy_cloudpickle(venv_python: Path) -> None:
    """The wheel's one dependency, copied from this environment (files and dist-info)."""
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
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make wheel` into a temporary directory (the release build is reused)."""
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    start = time.monotonic()
    built = subprocess.run(
        ["make", "--no-print-directory", "wheel", f"DIST_DIR={out}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    print(f"make wheel: {time.monotonic() - start:.1f} s")
    assert len(list(out.glob("monarch-*.whl"))) == 1
    return out


def _dockerfile() -> str:
    return (DOCKER / "Dockerfile").read_text()


def _exec_form(instruction: str) -> list[str]:
    """The JSON (exec) form of the Dockerfile's ENTRYPOINT or CMD."""
    match = re.search(rf"^{instruction} (\[.*\])$", _dockerfile(), re.MULTILINE)
    assert match, f"docker/Dockerfile has no {instruction} in exec form"
    value: list[str] = json.loads(match.group(1))
    return value


@pytest.mark.timeout(1200)
def test_the_image_install_steps_pass_in_a_fresh_venv(wheel_dir: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _copy_cloudpickle(venv / "bin" / "python")
    env = _clean_env(
        VENV=str(venv),
        PIP_NO_INDEX="1",
        TORCH_SPEC="none",
        EXTRA_PACKAGES="",
        HOST_PYTHON=sys.executable,
    )
    start = time.monotonic()
    done = subprocess.run(
        ["sh", str(DOCKER / "check_build.sh"), str(wheel_dir)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "check_build.sh: the image's install steps passed" in done.stdout
    assert f"monarch at {venv}" in done.stdout, done.stdout
    print(f"check_build.sh: {time.monotonic() - start:.1f} s")

    # The image's default command starts a worker (on an ephemeral port here).
    command = [*_exec_form("ENTRYPOINT"), *_exec_form("CMD")]
    assert command == ["monarch", "worker", "--address", "tcp://0.0.0.0:26600"]
    command = [str(venv / "bin" / command[0]), *command[1:-1], "tcp://0.0.0.0:0"]
    worker_env = _clean_env(MONARCH_CLUSTER_SECRET="image-test-" + os.urandom(8).hex())
    worker = subprocess.Popen(
        command,
        env=worker_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()  # the worker's first line, or "" once it exits
        assert line.startswith("monarch worker ready at tcp:"), line
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(15)
        assert worker.stdout is not None
        worker.stdout.close()


def test_install_refuses_a_directory_without_the_wheel(tmp_path: Path) -> None:
    done = subprocess.run(
        ["sh", str(DOCKER / "install.sh"), str(tmp_path)],
        env=_clean_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "expected exactly one monarch-*.whl in the wheel directory" in done.stderr
    assert "run `make wheel` first" in done.stderr


def test_the_dockerfile_and_its_build_context() -> None:
    dockerfile = _dockerfile()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim$", dockerfile, re.MULTILINE)
    assert "ARG PYTHON_VERSION=3.11" in dockerfile
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    copied = re.findall(r"^COPY (\S+) ", dockerfile, re.MULTILINE)
    assert copied == ["dist/monarch-*.whl", "docker/install.sh"]
    # The context is only what the Dockerfile copies (not target/ and .venv/).
    ignore = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ignore == ["*", *(f"!{path}" for path in copied)]


def test_the_guides_and_manifests_use_our_image() -> None:
    named = [
        ROOT / "docs" / "kubernetes.md",
        ROOT / "docs" / "slurm.md",
        ROOT / "examples" / "kubernetes" / "ddp-workers.yaml",
        ROOT / "examples" / "kubernetes" / "ddp-client.yaml",
        ROOT / "python" / "monarch" / "_src" / "job" / "manifests" / "monarch-workers.yaml",
    ]
    for path in named:
        text = path.read_text()
        assert UPSTREAM_IMAGE not in text, f"{path} names upstream's image"
    for guide in ("kubernetes.md", "slurm.md"):
        text = (ROOT / "docs" / guide).read_text()
        assert "docker build -f docker/Dockerfile -t monarch:latest ." in text, guide
        assert "docker push " in text, guide
    for manifest in named[2:]:
        assert "image: monarch:latest\n" in manifest.read_text(), manifest
