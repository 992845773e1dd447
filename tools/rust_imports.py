"""The import graph of a Rust crate's modules, by file, read from the source text.

An arrow A -> B means a file of module A names module B through a `crate::` or `super::`
path (in a `use` or inline), following `pub use` re-exports to the file that defines the
name; a `pub use` itself draws no arrow (it only hands a name on). Test modules
(`#[cfg(test)] mod ... { ... }`) and comments are left out: they are not part of the
library's structure. It reads text, so a macro that builds a path is not seen; it is a
guard for the layering (tests/test_rust_layers.py), not a compiler.

    python tools/rust_imports.py hyperactor/src     # the loops of more than one file
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

Module = tuple[str, ...]

_TEST_MODULE = re.compile(
    r"#\[cfg\((?:test|all\(test[^\]]*)\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+\w+\s*\{"
)
_REEXPORT = re.compile(r"pub(?:\([^)]*\))?\s+use\s+([\w:]+?)(?:::\{([^}]*)\}|::(\w+))\s*;")
_PATH = re.compile(r"\b(crate|super)((?:::\w+)*)(::\{([^;]*?)\})?")


def _strip_tests(text: str) -> str:
    out, i = [], 0
    while m := _TEST_MODULE.search(text, i):
        out.append(text[i : m.start()])
        j, depth = m.end(), 1
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def modules(src: Path) -> dict[Module, Path]:
    """Every module file under `src`, by module path (`lib.rs` is the root, `()`)."""
    found = {}
    for path in sorted(src.rglob("*.rs")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("lib", "main", "mod"):
            parts.pop()
        found[tuple(parts)] = path
    return found


def graph(src: Path) -> dict[Module, dict[Module, set[str]]]:
    """The arrows between the module files of `src`, with the names each one takes."""
    files = modules(src)
    texts = {m: _strip_comments(_strip_tests(p.read_text())) for m, p in files.items()}

    def relative(mod: Module, head: str, rest: list[str]) -> list[str] | None:
        if head == "crate":
            return rest
        if head == "super":
            return list(mod[:-1]) + rest
        if head == "self":
            return list(mod) + rest
        if (*mod, head) not in files:  # another crate's path
            return None
        return [*mod, head, *rest]

    reexports: dict[tuple[Module, str], list[str]] = {}
    for mod, text in texts.items():
        for m in _REEXPORT.finditer(text):
            segs = m.group(1).split("::")
            base = relative(mod, segs[0], segs[1:])
            if base is None:
                continue
            names = [m.group(3)] if m.group(3) else m.group(2).split(",")
            for name in (n.strip().split(" as ")[0] for n in names):
                if name and name != "self":
                    reexports[(mod, name)] = base + name.split("::")

    def resolve(path: list[str], depth: int = 0) -> tuple[Module, str] | None:
        """The module file that defines what `path` names, and the name taken from it."""
        for k in range(len(path), -1, -1):
            mod = tuple(path[:k])
            if mod in files:
                if k < len(path) and (mod, path[k]) in reexports and depth < 8:
                    found = resolve(reexports[(mod, path[k])] + path[k + 1 :], depth + 1)
                    if found is not None:
                        return found
                if not k:  # the crate root itself is no arrow
                    return None
                return mod, path[k] if k < len(path) else "*"
        return None

    arrows: dict[Module, dict[Module, set[str]]] = {}
    for mod, text in texts.items():
        out: dict[Module, set[str]] = {}
        # A `pub use` hands a name on (a facade); whoever uses the name draws the arrow.
        for m in _PATH.finditer(_REEXPORT.sub("", text)):
            segs = [s for s in m.group(2).split("::") if s]
            base = segs if m.group(1) == "crate" else list(mod[:-1]) + segs
            # `crate::a::{B, c::D}` names a's B and a::c's D; `crate::a::B` names B.
            paths = [] if m.group(4) else [base]
            for item in (m.group(4) or "").split(","):
                item = item.strip().split(" as ")[0].strip("{} ")
                if item and item != "self":
                    paths.append(base + item.split("::"))
            for path in paths:
                found = resolve(path)
                if found is not None and found[0] != mod:
                    out.setdefault(found[0], set()).add(found[1])
        arrows[mod] = out
    return arrows


def loops(arrows: dict[Module, dict[Module, set[str]]]) -> list[list[Module]]:
    """The strongly connected components of more than one file, largest first."""
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    found: list[list[Module]] = []
    counter = 0

    def visit(v: Module) -> None:  # Tarjan's algorithm
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in arrows.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in arrows:
        if v not in index:
            visit(v)
    return sorted(found, key=len, reverse=True)


def name(mod: Module) -> str:
    return "/".join(mod) or "lib"


def main() -> None:
    for src in sys.argv[1:]:
        arrows = graph(Path(src))
        for component in loops(arrows):
            print(f"{src}: loop of {len(component)}: {', '.join(name(m) for m in component)}")
            members = set(component)
            for a in component:
                for b, names in sorted(arrows[a].items()):
                    if b in members:
                        print(f"    {name(a)} -> {name(b)}: {', '.join(sorted(names))}")


if __name__ == "__main__":
    main()
