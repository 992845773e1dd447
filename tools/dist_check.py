"""Checks and describes what `make wheel` and `make sdist` built.

``dist_check.py wheel WHEEL`` checks that the wheel holds the whole Python package
(every file under ``python/monarch`` but caches and develop builds), one extension
module (the one cargo just built, byte for byte, when ``target/release`` has it), the
stubs, ``py.typed`` and both console scripts, and no junk; then prints its size, tag and
top-level contents. ``dist_check.py sdist SDIST`` checks that the source distribution
holds what a build from source needs (every workspace crate, ``Cargo.lock``, the
Python sources) and no build output; then prints its size.

Exits 1, naming what is wrong, when a check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tarfile
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "monarch"
EXTENSION = "monarch/_rust_bindings.abi3.so"
#: Parts of a path that are never shipped.
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.venv|target)(/|$)|\.pyc$")
SCRIPTS = ("monarch", "monarch-tui")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _package_files() -> set[str]:
    """The package as the wheel must hold it: every file under python/monarch but
    caches and extension modules (the wheel's own comes from cargo)."""
    files = set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if path.is_file() and not JUNK.search(rel) and not rel.endswith(".so"):
            files.add(rel)
    return files


def _members(path: Path) -> list[str]:
    """The workspace members of the Cargo.toml at `path`."""
    text = path.read_text()
    match = re.search(r"^members\s*=\s*\[(.*?)\]", text, re.MULTILINE | re.DOTALL)
    assert match, f"{path} has no workspace members"
    return re.findall(r'"([^"]+)"', match.group(1))


def check_wheel(wheel: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        dist_info = next((n.split("/")[0] for n in names if ".dist-info/" in n), "")
        wheel_meta = zf.read(f"{dist_info}/WHEEL").decode() if dist_info else ""
        entry_points = (
            zf.read(f"{dist_info}/entry_points.txt").decode()
            if f"{dist_info}/entry_points.txt" in names
            else ""
        )
        so = zf.read(EXTENSION) if EXTENSION in names else b""

    if len(names) != len(set(names)):
        problems.append("some paths are in the wheel twice")
    problems += [f"junk in the wheel: {n}" for n in names if JUNK.search(n)]
    shared = [n for n in names if n.endswith(".so")]
    if shared != [EXTENSION]:
        problems.append(f"expected exactly one extension module, {EXTENSION}; found {shared}")
    missing = sorted(_package_files() - set(names))
    problems += [f"missing from the wheel: {n}" for n in missing]
    for script in SCRIPTS:
        if not re.search(rf"^{re.escape(script)}\s*=", entry_points, re.MULTILINE):
            problems.append(f"the console script {script!r} is not in entry_points.txt")
    if "-abi3-" not in wheel.name:
        problems.append(f"{wheel.name} is not an abi3 wheel")
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    built = target / "release" / "lib_rust_bindings.so"
    if so and built.exists():
        if hashlib.sha256(so).digest() != hashlib.sha256(built.read_bytes()).digest():
            problems.append(f"the wheel's {EXTENSION} is not the one cargo built ({built})")

    tag = re.search(r"^Tag:\s*(\S+)", wheel_meta, re.MULTILINE)
    print(f"{wheel}: {_mib(wheel.stat().st_size)}, tag {tag.group(1) if tag else '?'}")
    print(f"  {len(names)} files, {_mib(sum(i.file_size for i in infos))} unpacked:")
    top: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for info in infos:
        parts = info.filename.split("/")
        key = "/".join(parts[:2]) + ("/" if len(parts) > 2 else "")
        top[key][0] += 1
        top[key][1] += info.file_size
    for key, (count, size) in sorted(top.items()):
        print(f"    {key:<45} {count:>4} file{'s' if count > 1 else ' '} {_mib(size):>10}")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    problems = []
    with tarfile.open(sdist) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
    prefix = names[0].split("/")[0] + "/" if names else ""
    rel = {n[len(prefix) :] for n in names if n.startswith(prefix)}
    needed = ["Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md"]
    needed += [f"{m}/Cargo.toml" for m in _members(ROOT / "Cargo.toml")]
    needed += sorted(f"python/{f}" for f in _package_files())
    if (ROOT / "LICENSE").exists():
        needed.append("LICENSE")
    problems += [f"missing from the sdist: {n}" for n in needed if n not in rel]
    problems += [f"build output or junk in the sdist: {n}" for n in sorted(rel) if JUNK.search(n)]
    problems += [f"a binary in the sdist: {n}" for n in sorted(rel) if n.endswith(".so")]
    print(f"{sdist}: {_mib(sdist.stat().st_size)}, {len(rel)} files")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["wheel", "sdist"])
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    problems = (check_wheel if args.kind == "wheel" else check_sdist)(args.path)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
