"""The layers of ``monarch._src`` (docs/architecture.md, "Layers of the Python package").

Each package of ``monarch._src`` sits on a layer; a module imports only modules of its
own package or of a lower layer's packages, whether at module level or inside a function
(a function-level import ties two modules as much as a module-level one). What a lower
layer needs from a higher one goes through a registration point the higher layer fills
(``monarch._src.actor.extensions``, filled by ``monarch._src.wiring``). ``_src`` never
imports the public modules (they re-export ``_src``), and its modules import each other
without a cycle. The modules are read from their source, so nothing is imported here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import monarch

PACKAGE = Path(monarch.__file__).parent
SRC = "monarch._src"

#: Bottom to top: a package may import the packages of the layers below its own (and the
#: modules of its own package), never those of its layer's other packages or above.
LAYERS: list[tuple[str, ...]] = [
    ("config",),
    ("actor",),
    ("rdma", "spmd"),
    ("tensor_engine",),
    ("recovery",),
    ("monitoring",),
    ("job",),
    ("cli",),
    # The package itself and the module that wires the layers together.
    ("", "wiring"),
]

#: What ``_src`` may import outside itself: the extension, the floor of every layer.
EXTENSION = "monarch._rust_bindings"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    line: int
    target: str  # the imported module


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((PACKAGE / "_src").rglob("*.py"))}


def _imports(name: str, is_package: bool, source: str, known: set[str]) -> Iterator[Import]:
    """What module ``name`` (with ``source``) imports when it runs, not counting imports
    under ``if TYPE_CHECKING:``; ``known`` are the names that are modules."""
    package = name if is_package else name.rpartition(".")[0]

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def walk(node: ast.AST) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    yield from walk_one(other)
                continue
            yield from walk_one(child)

    def walk_one(node: ast.AST) -> Iterator[Import]:
        if isinstance(node, ast.ImportFrom):
            module = absolute(node)
            if module == "monarch" or module.startswith("monarch."):
                for alias in node.names:
                    # ``from package import module`` imports the module.
                    sub = f"{module}.{alias.name}"
                    yield Import(name, node.lineno, sub if sub in known else module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "monarch" or alias.name.startswith("monarch."):
                    yield Import(name, node.lineno, alias.name)
        yield from walk(node)

    yield from walk(ast.parse(source, name))


def _all_imports() -> list[Import]:
    """Every import of every module of ``_src`` (one per importing line and module)."""
    modules = _modules()
    known = set(modules) | {EXTENSION}
    found = {
        i: None
        for name, path in modules.items()
        for i in _imports(name, path.name == "__init__.py", path.read_text(), known)
    }
    return list(found)


def _package(module: str) -> str:
    """The package of ``_src`` that ``module`` belongs to ("" for ``monarch._src``)."""
    rest = module[len(SRC) :].lstrip(".")
    return rest.split(".")[0]


def _layer(package: str) -> int:
    for level, packages in enumerate(LAYERS):
        if package in packages:
            return level
    raise AssertionError(
        f"monarch._src.{package} is on no layer: add it to LAYERS in {__file__} and to "
        "the layer table of docs/architecture.md"
    )


def _where(i: Import) -> str:
    return f"{i.source} (line {i.line}) imports {i.target}"


def test_every_package_of_src_is_on_a_layer() -> None:
    packages = {_package(m) for m in _modules()}
    assert {"actor", "config", "tensor_engine", "cli"} <= packages
    for package in packages:
        _layer(package)


def test_src_never_imports_the_public_modules() -> None:
    bad = [
        _where(i)
        for i in _all_imports()
        if not (i.target.startswith(SRC + ".") or i.target in (SRC, EXTENSION))
    ]
    assert not bad, (
        "monarch._src imports public modules (they re-export monarch._src and are never "
        "imported by it; import the monarch._src module that defines the name, or read a "
        "user's setting through a hook the public module fills):\n" + "\n".join(bad)
    )


def test_no_layer_imports_a_layer_above_or_beside_it() -> None:
    bad = []
    for i in _all_imports():
        if not i.target.startswith(SRC + "."):
            continue
        source, target = _package(i.source), _package(i.target)
        if source == target:
            continue
        if _layer(target) >= _layer(source):
            bad.append(
                f"{_where(i)}: layer {source or SRC} may import only "
                f"{', '.join(p for layer in LAYERS[: _layer(source)] for p in layer)}"
            )
    assert not bad, (
        "imports up or across the layers of monarch._src (what a lower layer needs from a "
        "higher one goes through monarch._src.actor.extensions, which monarch._src.wiring "
        "fills):\n" + "\n".join(bad)
    )


def test_the_modules_of_src_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for i in _all_imports():
        if i.target in graph and i.target != i.source:
            graph[i.source].add(i.target)
    bad = [" -> ".join(_a_cycle(graph, component)) for component in _cycles(graph)]
    assert not bad, "import cycles in monarch._src:\n" + "\n".join(bad)


#: What a tensor worker's proc runs: the worker side of the tensor engine, and what both
#: sides share (the wire, the errors). The client side is ``tensor_engine.client``.
WORKER = "monarch._src.tensor_engine.worker"
SHARED = {"monarch._src.tensor_engine.wire", "monarch._src.tensor_engine.errors"}


def _worker_side(module: str) -> bool:
    return module == WORKER or module.startswith(WORKER + ".") or module in SHARED


def test_the_tensor_worker_never_imports_the_client() -> None:
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for i in _all_imports():
        if i.target in graph:
            graph[i.source].add(i.target)
    assert f"{WORKER}.actor" in graph and f"{WORKER}.collectives" in graph
    reached, todo = set(), [f"{WORKER}.actor"]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo.extend(graph[m])
    engine = {m for m in reached if m.startswith("monarch._src.tensor_engine.")}
    bad = [
        _where(i)
        for i in _all_imports()
        if _worker_side(i.source)
        and i.target.startswith("monarch._src.tensor_engine.")
        and not _worker_side(i.target)
    ]
    outside = sorted(m for m in engine if not _worker_side(m))
    assert not bad and not outside, (
        f"the tensor worker imports the client side of the tensor engine (the worker side is "
        f"{WORKER} with {sorted(SHARED)}):\n" + "\n".join(bad or outside)
    )


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module (each
    a set of modules that reach each other through imports): Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _a_cycle(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """One cycle through the modules of ``component`` (a strongly connected component)."""
    path = [min(component)]
    while path.count(path[-1]) < 2:
        path.append(min(d for d in graph[path[-1]] if d in component))
    return path[path.index(path[-1]) :]


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    assert _a_cycle(graph, frozenset({"a", "b", "c"})) == ["a", "b", "c", "a"]


def test_the_layer_checks_see_function_level_and_relative_imports() -> None:
    """The reader itself: a function-level import and a relative one are both seen, an
    import for type checkers only is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import future\n"
        "if TYPE_CHECKING:\n"
        "    from monarch._src.job import job\n"
        "def f():\n"
        "    from monarch._src.tensor_engine.client.api import rank_tensor\n"
    )
    known = {"monarch._src.actor.future", "monarch._src.tensor_engine.client.api"}
    got = [i.target for i in _imports("monarch._src.actor.example", False, source, known)]
    assert got == ["monarch._src.actor.future", "monarch._src.tensor_engine.client.api"]
