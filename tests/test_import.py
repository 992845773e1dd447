"""The package imports, reports its version and build, and stays cheap to import."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


#: A proc that only runs a plain (synchronous) actor imports none of these: they serve
#: features it does not use (workspace sync, async actors, TLS), and each costs start-up
#: time and memory in every proc.
NOT_IN_A_PLAIN_PROC = ["asyncio", "ssl", "hashlib", "monarch._src.actor.code_sync"]

PROC_MODULES = """
import sys
from monarch.actor import Actor, endpoint, this_host

class Modules(Actor):
    @endpoint
    def loaded(self, names: list) -> list:
        return [n for n in names if n in sys.modules]

procs = this_host().spawn_procs(per_host={"gpus": 1})
loaded = procs.spawn("modules", Modules).loaded.call_one(NAMES).get(timeout=60)
procs.stop().get(timeout=60)
assert not loaded, f"a plain proc imported {loaded}"
"""


@pytest.mark.timeout(120)
def test_a_plain_proc_does_not_import_what_it_does_not_use() -> None:
    code = f"NAMES = {NOT_IN_A_PLAIN_PROC!r}\n" + PROC_MODULES
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]


def _module_imports(package_dir: Path, package: str) -> dict[str, set[str]]:
    """For every module of ``package`` (a directory), the modules of the same package
    it imports when it runs: at module level or inside functions (a cycle through a
    function-local import still ties the modules together), but not under
    ``if TYPE_CHECKING:`` (names for annotations only, never imported at run time)."""
    import ast

    def imports(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (m for c in child.orelse for m in imports(c))
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                if child.module.startswith(package + "."):
                    yield child.module
                elif child.module == package:
                    yield from (f"{package}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                yield from (a.name for a in child.names if a.name.startswith(package + "."))
            yield from imports(child)

    graph: dict[str, set[str]] = {}
    for path in sorted(package_dir.glob("*.py")):
        name = f"{package}.{path.stem}" if path.stem != "__init__" else package
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {d for d in imports(tree) if d != name}
    return graph


def test_the_actor_modules_import_each_other_without_cycles() -> None:
    """monarch._src.actor is layered: each module imports only modules below it, so the
    graph of its run-time imports has no cycle (a topological order exists)."""

    import monarch._src.actor as pkg

    package_dir = Path(pkg.__file__).parent
    graph = _module_imports(package_dir, "monarch._src.actor")
    assert len(graph) > 10, graph
    # Kahn's algorithm: what is left once every module without remaining imports is
    # peeled off lies on a cycle.
    remaining = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    while True:
        leaves = [m for m, deps in remaining.items() if not deps]
        if not leaves:
            break
        for m in leaves:
            del remaining[m]
        for deps in remaining.values():
            deps.difference_update(leaves)
    assert not remaining, f"import cycle among: {sorted(remaining)}"
