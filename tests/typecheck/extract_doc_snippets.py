"""Type-check the Python code of Markdown guides, as users' code.

Usage::

    python tests/typecheck/extract_doc_snippets.py OUTDIR GUIDE.md...   # write the code
    python tests/typecheck/extract_doc_snippets.py --mypy GUIDE.md...    # and run mypy on it

Each guide's ```` ```python ```` blocks become one Python file, ``OUTDIR/<guide>.py``,
in order: a guide's blocks form one program (a later block uses what an earlier one
defined). Every line of the file is on the line number it has in the guide (the rest
is blank), so with ``--mypy`` an error reads ``docs/guide.md:LINE: error: ...``.

A block that is deliberately partial (a fragment that does not stand on its own) is
left out by putting this HTML comment right before its opening fence (blank lines in
between are allowed)::

    <!-- typecheck: skip -->
    ```python
    ...
    ```

``--mypy`` runs mypy with the repository's ``pyproject.toml`` configuration and exits
with its status.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The marker that leaves the next ```python block out.
SKIP_MARKER = "<!-- typecheck: skip -->"

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\S*)")


def extract(markdown: str) -> str:
    """The Python code of ``markdown``'s ```` ```python ```` blocks, each line on its line
    number in ``markdown`` (every other line blank), blocks marked with
    :data:`SKIP_MARKER` left out.

    >>> print(extract("Text\\n```python\\nx = 1\\n```\\n\\n```sh\\nls\\n```\\n").splitlines())
    ['', '', 'x = 1', '', '', '', '', '']
    >>> extract("<!-- typecheck: skip -->\\n\\n```python\\nbroken(\\n```\\n").strip()
    ''
    """
    out: list[str] = []
    fence: str | None = None  # the open fence, if inside a block
    keep = False  # whether the open block is Python code that is kept
    skip_next = False
    for line in markdown.splitlines():
        if fence is not None:
            if line.strip() == fence:
                fence = None
                out.append("")
            else:
                out.append(line if keep else "")
            continue
        out.append("")
        match = _FENCE.match(line)
        if match is not None:
            fence = match.group(1)
            keep = match.group(2) == "python" and not skip_next
            skip_next = False
        elif line.strip() == SKIP_MARKER:
            skip_next = True
        elif line.strip():
            skip_next = False
    return "\n".join(out) + "\n"


def write_snippets(guides: list[Path], outdir: Path) -> dict[Path, Path]:
    """Write each guide's code to ``outdir/doc_<stem>.py`` (the prefix keeps a guide
    named like a module it imports, ``logging.md``, from shadowing it); a map from
    written file to guide. Guides without Python code are left out."""
    outdir.mkdir(parents=True, exist_ok=True)
    written: dict[Path, Path] = {}
    for guide in guides:
        code = extract(guide.read_text())
        if not code.strip():
            continue
        target = outdir / f"doc_{guide.stem}.py"
        if target in written:
            raise SystemExit(f"two guides named {guide.stem!r}: {written[target]} and {guide}")
        target.write_text(code)
        written[target] = guide
    return written


def seeded_cache(cache_dir: Path) -> Path:
    """A mypy cache for a run over temporary files, ``cache_dir``: a copy of the
    repository's own cache (the one ``make typecheck``'s first run leaves) where there is
    one, so the run checks only its own files and takes the monarch package, the standard
    library and torch from the copy (2 s instead of 32 s on 2 cores). The temporary files
    are not in that cache, so their errors are reported with their own paths. A copy, not
    the cache itself: mypy writes what it checks back into the cache it reads."""
    repo_cache = ROOT / ".mypy_cache"
    if repo_cache.is_dir():
        shutil.copytree(repo_cache, cache_dir, dirs_exist_ok=True)
    return cache_dir


def run_mypy(guides: list[Path]) -> int:
    """Type-check the guides' code with the repository's mypy configuration; print the
    report with the guides' paths; mypy's exit status."""
    from mypy import api

    with tempfile.TemporaryDirectory(prefix="doc-snippets-") as tmp:
        written = write_snippets(guides, Path(tmp).resolve() / "snippets")
        if not written:
            print("no Python code blocks to check")
            return 0
        stdout, stderr, status = api.run(
            [
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "--show-absolute-path",
                "--cache-dir",
                str(seeded_cache(Path(tmp) / ".mypy_cache")),
                *map(str, written),
            ]
        )
        for snippet, guide in written.items():
            shown = guide.resolve()
            if shown.is_relative_to(Path.cwd()):
                shown = shown.relative_to(Path.cwd())
            stdout = stdout.replace(str(snippet), str(shown))
        sys.stdout.write(stdout)
        sys.stderr.write(stderr)
        return status


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--mypy":
        return run_mypy([Path(a) for a in argv[1:]])
    if len(argv) >= 2 and not argv[0].startswith("-"):
        write_snippets([Path(a) for a in argv[1:]], Path(argv[0]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
