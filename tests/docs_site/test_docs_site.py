"""The documentation site (``make docs``: mkdocs.yml and tools/docs/).

The site is built once, into a temporary folder, with the same config and ``--strict``;
a stand-in for ``cargo doc``'s output takes the place of the Rust API (``make docs``
runs cargo doc; that takes too long for a test). The checks: the API reference has an
entry for every name of each public module's ``__all__`` (``monarch``'s lazily imported
names included) and the docstrings of a few known ones; every guide of docs/ and every
example became a page listed in the navigation; the guides' links to repository files
point at the site's pages; and a broken link or anchor fails the build.

Needs the docs' packages (``make docs`` installs them into .venv); without them the tests
skip, unless ``MONARCH_REQUIRE_DOCS=1`` (set by CI), where that is a failure.
"""

from __future__ import annotations

import ast
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "mkdocs.yml"
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"
PACKAGE = REPO / "python" / "monarch"
BUILD_TIMEOUT = 100.0

#: Public module -> the API page that documents it.
API_PAGES = {
    "monarch": "api/monarch.html",
    "monarch.actor": "api/actor.html",
    "monarch.actor.config": "api/actor.html",
    "monarch.config": "api/config.html",
    "monarch.job": "api/job.html",
    "monarch.job.kubernetes": "api/job.html",
    "monarch.rdma": "api/rdma.html",
    "monarch.spmd": "api/spmd.html",
    "monarch.recovery": "api/recovery.html",
    "monarch.monitoring": "api/monitoring.html",
    "monarch.builtins.log": "api/builtins.html",
    "monarch.builtins.random": "api/builtins.html",
    "monarch.tools.network": "api/tools.html",
    "monarch.tools.config": "api/tools.html",
}


def _require_docs() -> bool:
    return os.environ.get("MONARCH_REQUIRE_DOCS", "") == "1"


def _skip_or_fail(reason: str) -> None:
    if _require_docs():
        pytest.fail(f"MONARCH_REQUIRE_DOCS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _check_requirements() -> None:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "yaml"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            _skip_or_fail(f"{module} is not installed (`make docs` installs the docs' packages)")


def _build(config: Path, site: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_DOCS_RUST"}
    env.update(extra)
    return env


@dataclass
class Site:
    root: Path

    def page(self, rel: str) -> str:
        path = self.root / rel
        assert path.is_file(), f"{rel} is not in the site"
        return path.read_text()

    def text(self, rel: str) -> str:
        """The page's text: tags dropped, entities decoded, whitespace collapsed."""
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", self.page(rel))).split())

    def code(self, rel: str) -> str:
        """The page's text without any whitespace (highlighted code is split into tags)."""
        return "".join(html.unescape(re.sub(r"<[^>]+>", "", self.page(rel))).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    _check_requirements()
    tmp = tmp_path_factory.mktemp("docs_site")
    # A stand-in for cargo doc's output: the index of crates, one crate, and a Markdown
    # file among the static files (rustdoc ships one) which must be copied, not rendered.
    rust = tmp / "cargo-doc"
    (rust / "hyperactor").mkdir(parents=True)
    (rust / "hyperactor" / "index.html").write_text("<html><body>hyperactor</body></html>")
    (rust / "crates.js").write_text('window.ALL_CRATES = ["hyperactor"];')
    (rust / "static.files").mkdir()
    (rust / "static.files" / "LICENSE.md").write_text("# a license\n")
    out = _build(CONFIG, tmp / "site", _env(MONARCH_DOCS_RUST=str(rust)))
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout}\n{out.stderr}"
    return Site(tmp / "site")


def _module_file(module: str) -> Path:
    rel = Path(*module.split("."))
    path = REPO / "python" / rel.with_suffix(".py")
    return path if path.is_file() else REPO / "python" / rel / "__init__.py"


def _module_all(module: str) -> list[str]:
    for node in ast.parse(_module_file(module).read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list)
            return [str(n) for n in names]
    raise AssertionError(f"{module} has no __all__")


def _docstring_start(source: Path, name: str) -> str:
    """The first words of the docstring of ``name`` (the last definition that has one)
    in ``source``, as the site shows them."""
    doc = None
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name and ast.get_docstring(node):
                doc = ast.get_docstring(node)
    assert doc, f"{name} has no docstring in {source}"
    words = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc).replace("`", "").replace("*", "").split()
    return " ".join(words[:6])


def test_every_public_name_has_an_entry(site: Site) -> None:
    """Each name of each public module's ``__all__`` has its anchor on the module's page;
    for ``monarch`` this covers the names imported on first access (``_LAZY``)."""
    missing = []
    for module, page in API_PAGES.items():
        content = site.page(page)
        names = _module_all(module)
        assert names, module
        missing += [f"{module}.{n} ({page})" for n in names if f'id="{module}.{n}"' not in content]
    assert not missing, f"no API entry for: {missing}"


@pytest.mark.parametrize(
    ("page", "qualname", "source", "name"),
    [
        ("api/actor.html", "monarch.actor.Actor", "_src/actor/actor.py", "Actor"),
        ("api/actor.html", "monarch.actor.endpoint", "_src/actor/endpoint.py", "endpoint"),
        ("api/rdma.html", "monarch.rdma.RDMABuffer", "_src/rdma/buffer.py", "RDMABuffer"),
        ("api/monarch.html", "monarch.Stream", "_src/tensor_engine/client/stream.py", "Stream"),
        ("api/monarch.html", "monarch.Tensor", "_src/tensor_engine/client/tensor.py", "Tensor"),
        ("api/job.html", "monarch.job.ProcessJob", "_src/job/process.py", "ProcessJob"),
    ],
)
def test_api_entry_shows_the_docstring(
    site: Site, page: str, qualname: str, source: str, name: str
) -> None:
    content = site.page(page)
    start = content.find(f'id="{qualname}"')
    assert start >= 0, f"{qualname} has no entry on {page}"
    entry = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", content[start:])).split())
    expected = _docstring_start(PACKAGE / source, name)
    assert expected in entry[:4000], f"{qualname}: {expected!r} not in its entry"


def test_api_pages_link_the_guides(site: Site) -> None:
    """The API reference links the guides as pages (module docstrings say
    ``[Slurm](../slurm.md)``), rather than naming their files, and never sends readers to
    the private ``monarch._src`` modules."""
    problems = []
    for page in sorted(set(API_PAGES.values())):
        text = site.text(page)
        problems += [f"{page}: {m}" for m in re.findall(r"\bdocs/\w+\.md", text)]
        problems += [f"{page}: {m}" for m in re.findall(r"\bmonarch\._src\b[\w.]*", text)]
    assert not problems, "API pages name guide files or private modules:\n" + "\n".join(problems)
    actor = site.page("api/actor.html")
    assert 'href="../getting_started.html"' in actor and 'href="../supervision.html"' in actor


def test_every_guide_is_a_page_in_the_nav(site: Site) -> None:
    nav = site.page("index.html")
    guides = sorted(DOCS.glob("*.md"))
    assert len(guides) > 10
    for guide in guides:
        html_name = guide.with_suffix(".html").name
        assert (site.root / html_name).is_file(), f"{guide.name} did not become a page"
        assert f'href="{html_name}"' in nav, f"{guide.name} is not in the navigation"
    for image in (DOCS / "images").glob("*.png"):
        assert (site.root / "images" / image.name).is_file(), image.name


def _examples() -> dict[str, Path]:
    found = {p.stem: p for p in EXAMPLES.glob("*.py")}
    found.update({p.name: p for p in EXAMPLES.iterdir() if p.is_dir() and p.name[0] not in "._"})
    return found


def test_every_example_is_a_page(site: Site) -> None:
    nav = site.page("index.html")
    examples = _examples()
    assert "ping_pong" in examples and "kubernetes" in examples
    for name, path in examples.items():
        rel = f"examples/{name}.html"
        assert f'href="{rel}"' in nav, f"example {name} is not in the navigation"
        code = site.code(rel)
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        for f in files:
            if f.suffix not in (".py", ".yaml", ".yml"):
                continue
            # The file is shown whole: its last non-blank line is on the page.
            last = [line for line in f.read_text().splitlines() if line.strip()][-1]
            assert "".join(last.split()) in code, f"{rel} does not show {f.name}"
    # The text is the docstring: ping_pong.py's first line is the page's title.
    doc = ast.get_docstring(ast.parse((EXAMPLES / "ping_pong.py").read_text()))
    assert doc
    assert doc.splitlines()[0].rstrip(".") in site.text("examples/ping_pong.html")


def test_repository_links_point_at_site_pages(site: Site) -> None:
    """Guides link to ``../examples/x.py`` and ``../README.md``, as on a forge; the site
    turns them into its own pages."""
    assert 'href="examples/getting_started.html"' in site.page("getting_started.html")
    index = site.page("index.html")
    assert 'href="readme.html"' in index and 'href="changelog.html"' in index
    assert "make test" in site.text("readme.html")


def test_rust_api_is_copied_and_linked(site: Site) -> None:
    assert 'href="rust/hyperactor/index.html"' in site.page("rust.html")
    assert (site.root / "rust" / "hyperactor" / "index.html").is_file()
    assert (site.root / "rust" / "static.files" / "LICENSE.md").is_file()


def test_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """A copy of the config with an extra page that links to a missing page and to a
    missing anchor: the strict build fails on these two warnings and no other."""
    _check_requirements()
    import yaml

    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "broken.md").write_text(
        "# Broken\n\nSee [nothing](no_such_page.md) and [no anchor](index.md#no-such-anchor).\n"
    )
    config = yaml.safe_load(CONFIG.read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(REPO / h) for h in config["hooks"]]
    # Without the API reference (most of the build's time), which the check of links
    # does not need: the API pages then show their `:::` lines as text.
    config["plugins"] = [
        p for p in config["plugins"] if not (isinstance(p, dict) and "mkdocstrings" in p)
    ]
    config["nav"].append({"Broken": "broken.md"})
    copy = tmp_path / "mkdocs.yml"
    copy.write_text(yaml.safe_dump(config, sort_keys=False))
    out = _build(copy, tmp_path / "site", _env())
    log = out.stdout + out.stderr
    assert out.returncode != 0, f"the build passed despite broken links:\n{log}"
    assert "no_such_page.md" in log, log
    assert "no-such-anchor" in log, log
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2, log
