"""MkDocs hooks of the documentation site (``make docs``; mkdocs.yml names this file).

Pages made at build time, never committed:

- ``api/monarch.md``: the ``monarch`` package's reference. Most of its names are imported
  on first access (``_LAZY`` in ``python/monarch/__init__.py``), which static analysis
  cannot follow, so the page lists every name of ``monarch.__all__``, noting those
  imported on first access;
- ``examples/<name>.md``: one page per example (``examples/*.py``, and one per folder
  such as ``examples/kubernetes/``): its docstring (or leading comment) as text, then
  the code;
- ``readme.md`` and ``changelog.md``: the repository's README and CHANGELOG;
- ``css/pygments.css``: the colours of the code, highlighted at build time;
- ``rust.md``: the Rust API, with the output of ``cargo doc`` copied under ``rust/`` when
  ``MONARCH_DOCS_RUST`` names it (the Makefile sets it; ``make docs DOCS_RUST=0`` leaves
  the Rust API out).

The guides (``docs/*.md``) link to repository files as they sit in the repository
(``../examples/ping_pong.py``, ``../README.md``), which reads right on a forge; here such
links are pointed at the pages above. A guide missing from the nav of mkdocs.yml is added
at the end of its "Guides" section, an example to "Examples".
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from pygments.formatters import HtmlFormatter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rest_text import rest_to_markdown

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PACKAGE_INIT = REPO / "python" / "monarch" / "__init__.py"
RUST_ENV = "MONARCH_DOCS_RUST"

GUIDES_SECTION = "Guides"
EXAMPLES_SECTION = "Examples"

_LANGUAGES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash", ".toml": "toml"}


# --- examples ---------------------------------------------------------------------------


def example_sources() -> dict[str, list[Path]]:
    """Page name -> the files it shows: each ``examples/*.py`` alone, each folder whole."""
    pages: dict[str, list[Path]] = {}
    if not EXAMPLES.is_dir():
        return pages
    for path in sorted(EXAMPLES.iterdir()):
        if path.name.startswith((".", "_")):
            continue
        if path.is_file() and path.suffix == ".py":
            pages[path.stem] = [path]
        elif path.is_dir():
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix in _LANGUAGES
                and "__pycache__" not in p.parts
                and not p.name.startswith(".")
            )
            if files:
                pages[path.name] = files
    return pages


def _leading_text(source: str) -> str:
    """A Python file's docstring, or else its leading comment block."""
    try:
        doc = ast.get_docstring(ast.parse(source))
    except SyntaxError:
        doc = None
    if doc:
        return doc
    lines = []
    for line in source.splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" "))
    return "\n".join(lines).strip()


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * max(3, longest + 1)


def example_page(name: str, files: list[Path]) -> str:
    """The Markdown of one example's page."""
    main = next((f for f in files if f.suffix == ".py"), files[0])
    intro = _leading_text(main.read_text()) if main.suffix == ".py" else ""
    title = intro.splitlines()[0].rstrip(".") if intro else name
    parts = [f"# {title}", ""]
    rest = "\n".join(intro.splitlines()[1:]).strip()
    if rest:
        parts += [rest_to_markdown(rest), ""]
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        code = path.read_text()
        fence = _fence(code)
        parts += [
            f"## `{rel}`",
            "",
            f"{fence}{_LANGUAGES.get(path.suffix, '')}",
            code.rstrip("\n"),
            fence,
            "",
        ]
    return "\n".join(parts)


# --- the monarch package ----------------------------------------------------------------


def monarch_exports() -> tuple[list[str], dict[str, tuple[str, str]]]:
    """``monarch.__all__`` and ``monarch._LAZY``, read from the source (no import)."""
    tree = ast.parse(PACKAGE_INIT.read_text())
    names: list[str] = []
    lazy: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        if target.id == "__all__":
            names = list(ast.literal_eval(node.value))
        elif target.id == "_LAZY":
            lazy = {k: tuple(v) for k, v in ast.literal_eval(node.value).items()}
    return names, lazy


def monarch_page() -> str:
    """The reference of ``monarch``: its docstring, then every name of ``__all__``."""
    names, lazy = monarch_exports()
    lines = [
        "# `monarch`",
        "",
        "::: monarch",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
        "",
        "The names below are the package's `__all__`. The distributed tensors API "
        "(`Tensor`, `reduce`, `Stream`, ...) is imported on first access, so that "
        "`import monarch` never imports torch.",
        "",
    ]
    for name in names:
        note = f"Imported on first access of `monarch.{name}`." if name in lazy else ""
        lines += [f"::: monarch.{name}", "    options:", "      show_root_full_path: true", ""]
        if note:
            lines += [note, ""]
    return "\n".join(lines)


# --- Rust -------------------------------------------------------------------------------


def rust_doc_dir() -> Path | None:
    value = os.environ.get(RUST_ENV)
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        path = REPO / path
    if not (path / "crates.js").is_file():
        raise SystemExit(f"{RUST_ENV}={value}: no cargo doc output there (run cargo doc)")
    return path


def rust_crates(doc: Path) -> list[str]:
    text = (doc / "crates.js").read_text()
    return sorted(
        c for c in re.findall(r'"([A-Za-z0-9_]+)"', text) if (doc / c / "index.html").is_file()
    )


def rust_page(doc: Path | None) -> str:
    lines = ["# Rust API", ""]
    if doc is None:
        lines += [
            "This copy of the site was built without the Rust API (`make docs DOCS_RUST=0`). "
            "`make docs` runs `cargo doc --workspace --no-deps` and puts the Rust API here.",
        ]
        return "\n".join(lines) + "\n"
    lines += [
        "The API of the workspace's crates, from `cargo doc --workspace --no-deps`:",
        "",
    ]
    lines += [f"- [`{c}`](rust/{c}/index.html)" for c in rust_crates(doc)]
    lines += [
        "",
        "The guide to the runtime is [hyperactor](hyperactor.md); "
        "how the layers fit is in [Architecture](architecture.md).",
    ]
    return "\n".join(lines) + "\n"


# --- links from repository files --------------------------------------------------------


def site_path(repo_path: str) -> str | None:
    """The page of the site that stands for a repository file, or None."""
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    if repo_path == "README.md":
        return "readme.md"
    if repo_path == "CHANGELOG.md":
        return "changelog.md"
    parts = repo_path.split("/")
    if parts[0] == "examples" and len(parts) >= 2:
        pages = example_sources()
        stem = parts[1].removesuffix(".py") if len(parts) == 2 else parts[1]
        if stem in pages:
            return f"examples/{stem}.md"
    return None


_LINK = re.compile(r"(\]\()([^)\s#]*)(#[^)\s]*)?((?:\s+\"[^\"]*\")?\))")


def rewrite_links(markdown: str, repo_path: str, src_uri: str) -> str:
    """Point the relative links of ``repo_path`` (a repository file shown at ``src_uri``)
    at the site's pages. Links the site does not know are left for the build to check."""
    repo_dir = posixpath.dirname(repo_path)
    page_dir = posixpath.dirname(src_uri)

    def replace(m: re.Match[str]) -> str:
        target = m.group(2)
        if not target or "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        resolved = posixpath.normpath(posixpath.join(repo_dir, target))
        mapped = site_path(resolved)
        if mapped is None:
            return m.group(0)
        new = posixpath.relpath(mapped, page_dir or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    out = []
    in_fence = False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        out.append(line if in_fence else _LINK.sub(replace, line))
    return "".join(out)


# --- hooks ------------------------------------------------------------------------------


def _nav_files(nav: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            found |= _nav_files(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _nav_files(value)
    return found


def _section(nav: list[Any], title: str) -> list[Any] | None:
    for item in nav:
        if isinstance(item, dict) and title in item and isinstance(item[title], list):
            section: list[Any] = item[title]
            return section
    return None


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    nav = config.nav
    if isinstance(nav, list):
        listed = _nav_files(nav)
        guides = _section(nav, GUIDES_SECTION)
        if guides is not None:
            for path in sorted(Path(config.docs_dir).glob("*.md")):
                if path.name not in listed:
                    guides.append(path.name)
        examples = _section(nav, EXAMPLES_SECTION)
        if examples is not None:
            for name in example_sources():
                if f"examples/{name}.md" not in listed:
                    examples.append({name: f"examples/{name}.md"})
    return config


def on_files(files: Files, /, *, config: MkDocsConfig) -> Files:
    def add(src_uri: str, content: str) -> None:
        files.append(File.generated(config, src_uri, content=content))

    add("css/pygments.css", HtmlFormatter(style="default").get_style_defs(".highlight"))
    add("api/monarch.md", monarch_page())
    for name, sources in example_sources().items():
        add(f"examples/{name}.md", example_page(name, sources))
    for repo_file, src_uri in (("README.md", "readme.md"), ("CHANGELOG.md", "changelog.md")):
        text = (REPO / repo_file).read_text()
        add(src_uri, rewrite_links(text, repo_file, src_uri))
    doc = rust_doc_dir()
    add("rust.md", rust_page(doc))
    if doc is not None:
        # The crates' front pages, so that the links to them are checked; on_post_build
        # copies the rest of the tree.
        for crate in rust_crates(doc):
            index = doc / crate / "index.html"
            files.append(
                File.generated(config, f"rust/{crate}/index.html", abs_src_path=str(index))
            )
    return files


def on_post_build(*, config: MkDocsConfig) -> None:
    doc = rust_doc_dir()
    if doc is not None:
        shutil.copytree(
            doc,
            Path(config.site_dir, "rust"),
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".lock"),
        )


#: A fence opener with words after its language (```` ```python notest ````, which the
#: docs tests read as "do not run"): superfences takes no such words, and would not see a
#: fence, so the headings after it would be lost.
_FENCE_WORDS = re.compile(r"^(\s*(?:```|~~~)[\w+-]+)[ \t]+[^`\n]*$", re.MULTILINE)


def plain_fences(markdown: str) -> str:
    """``markdown`` with every fence opener reduced to its language.

    >>> plain_fences("```python notest\\nx = 1\\n```\\n## After")
    '```python\\nx = 1\\n```\\n## After'
    """
    return _FENCE_WORDS.sub(r"\1", markdown)


def on_page_markdown(markdown: str, /, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    markdown = plain_fences(markdown)
    if page.file.generated_by is not None:  # written above, links already in site form
        return markdown
    return rewrite_links(markdown, f"docs/{page.file.src_uri}", page.file.src_uri)
