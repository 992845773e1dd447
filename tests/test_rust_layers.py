"""The module layers of the Rust crates (docs/architecture.md).

The import graph of each crate's modules is read from the source by
``tools/rust_imports.py``. No import loop spans more than four files, except the ones
listed in ``ALLOWED_LOOPS`` (each with its reason; they may shrink, never grow), and
hyperactor's modules import only their own layer or the layers below it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["hyperactor", "hyperactor_mesh", "monarch_admin", "monarch_rdma", "monarch_extension"]
LARGEST_LOOP = 4


def _load_tool() -> ModuleType:
    path = ROOT / "tools" / "rust_imports.py"
    spec = importlib.util.spec_from_file_location("rust_imports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rust_imports"] = module
    spec.loader.exec_module(module)
    return module


rust_imports = _load_tool()

#: Loops of more than four files that stay for now, by crate: the files of each, and why.
ALLOWED_LOOPS: dict[str, list[tuple[frozenset[str], str]]] = {}

#: hyperactor's layers, bottom to top; `channel/...` modules are all on the first.
HYPERACTOR_LAYERS: list[set[str]] = [
    {"sync", "sync/spin", "id", "error", "message", "supervision", "channel"},
    {"actor/work_queue", "actor/stats", "mailbox"},
    {"router"},
    {"port", "context"},
    {"actor", "actor/runtime", "actor/driven"},
    {"proc", "client", "testing"},
]


def _layer_of(module: str) -> int:
    top = "channel" if module.startswith("channel") else module
    for level, members in enumerate(HYPERACTOR_LAYERS):
        if top in members:
            return level
    raise AssertionError(
        f"hyperactor module {module!r} is on no layer: add it to HYPERACTOR_LAYERS here "
        "and to the table in docs/architecture.md"
    )


def test_no_import_loop_spans_more_than_four_files() -> None:
    problems = []
    for crate in CRATES:
        arrows = rust_imports.graph(ROOT / crate / "src")
        allowed = ALLOWED_LOOPS.get(crate, [])
        for component in rust_imports.loops(arrows):
            files = frozenset(rust_imports.name(m) for m in component)
            if len(files) <= LARGEST_LOOP:
                continue
            if any(files <= known for known, _ in allowed):
                continue
            ties = [
                f"{rust_imports.name(a)} -> {rust_imports.name(b)} ({', '.join(sorted(n))})"
                for a in component
                for b, n in arrows[a].items()
                if b in component
            ]
            problems.append(
                f"{crate}: an import loop of {len(files)} files: {', '.join(sorted(files))}\n"
                + "\n".join(f"    {t}" for t in ties)
            )
    assert not problems, (
        "Import loops over 4 files (break the upward import with a hook or trait the "
        "higher module fills, or move the shared item down):\n" + "\n".join(problems)
    )


def test_hyperactor_modules_import_only_their_layer_and_below() -> None:
    arrows = rust_imports.graph(ROOT / "hyperactor" / "src")
    upward = []
    for source, targets in arrows.items():
        if not source:  # lib.rs declares every module
            continue
        for target, names in targets.items():
            if not target:
                continue
            a, b = rust_imports.name(source), rust_imports.name(target)
            if _layer_of(b) > _layer_of(a):
                upward.append(
                    f"{a} (layer {_layer_of(a) + 1}) -> {b} (layer {_layer_of(b) + 1}): "
                    + ", ".join(sorted(names))
                )
    assert not upward, "hyperactor imports a higher layer:\n" + "\n".join(upward)


def _crate(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src


def test_the_reader_finds_loops_through_reexports_and_skips_test_modules(tmp_path: Path) -> None:
    src = _crate(
        tmp_path,
        {
            "lib.rs": "mod a;\nmod b;\nmod c;\npub use c::Gamma;\n",
            "a.rs": "use crate::b::{Beta, other::Thing};\npub struct Alpha;\n",
            # Through the crate root's re-export: c, not lib.
            "b.rs": "use crate::Gamma;\npub struct Beta;\n",
            "c.rs": (
                "pub struct Gamma;\n"
                "fn f() -> super::a::Alpha { todo!() }\n"
                "#[cfg(test)]\nmod tests {\n    use crate::b::Beta;\n}\n"
                "// use crate::b::Beta; in a comment\n"
            ),
        },
    )
    arrows = rust_imports.graph(src)
    assert arrows[("a",)] == {("b",): {"Beta", "other"}}
    assert arrows[("b",)] == {("c",): {"Gamma"}}
    assert arrows[("c",)] == {("a",): {"Alpha"}}, "the test module's import is not an arrow"
    assert rust_imports.loops(arrows) == [[("a",), ("b",), ("c",)]]


def test_the_reader_sees_no_loop_in_a_layered_crate(tmp_path: Path) -> None:
    src = _crate(
        tmp_path,
        {
            "lib.rs": "mod low;\nmod high;\n",
            "low.rs": "pub struct Low;\n",
            "high.rs": "use crate::low::Low;\n",
        },
    )
    assert rust_imports.loops(rust_imports.graph(src)) == []
