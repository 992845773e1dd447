"""The package imports, reports its version and build, and stays cheap to import."""

import subprocess
import sys

import pytest

import monarch
from monarch import _rust_bindings


def test_version_is_the_extension_version() -> None:
    assert monarch.__version__ == _rust_bindings.__version__
    assert monarch.__version__ == "0.1.0"


def test_build_info_describes_the_build() -> None:
    info = _rust_bindings.build_info()
    assert set(info) == {"version", "profile", "target", "rustc"}
    assert info["version"] == monarch.__version__
    assert info["profile"] in ("debug", "release")
    assert info["target"]
    assert info["rustc"].startswith("rustc ")


@pytest.mark.timeout(60)
def test_import_does_not_import_torch() -> None:
    code = "import sys, monarch; assert 'torch' not in sys.modules, 'monarch imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)
