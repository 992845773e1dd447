"""Endpoint calls are typed: mypy checks them against the endpoint method's signature.

Each snippet below is a small program, written to a file of its own; one mypy run (the
repository's configuration, a copy of its cache) checks them all. A snippet line ending in
``# reveal: T`` must make ``reveal_type`` show ``T`` (module prefixes removed), one
ending in ``# error: CODE`` must get a mypy error with that code, and no other line may
get an error: so a correct call is shown to type-check, and each wrong one to fail.
"""

from __future__ import annotations

import doctest
import importlib
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import extract_doc_snippets  # noqa: E402

#: What every snippet starts with: an actor with one endpoint of each kind, and a mesh
#: of it, typed the way spawn() types it.
PRELUDE = """\
from monarch.actor import (
    Actor, Channel, Future, Port, ValueMesh, as_endpoint, concurrent_endpoint, endpoint,
    this_host,
)


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    async def get_async(self) -> int:
        return self.value

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[str], n: int) -> None:
        port.send(str(n))

    @endpoint(propagate=None, instrument=False)
    def tags(self, name: str, *, upper: bool = False) -> list[str]:
        return [name.upper() if upper else name]

    @concurrent_endpoint
    async def half(self, x: float) -> float:
        return x / 2

    @concurrent_endpoint(explicit_response_port=True)
    async def blob(self, port: Port[bytes], size: int) -> None:
        port.send(bytes(size))

    def plain(self, x: int) -> str:
        return str(x)


counter = this_host().spawn_procs(per_host={"gpus": 2}).spawn("counter", Counter, 0)
"""

SNIPPETS: dict[str, str] = {
    "sync_adverbs": """
        reveal_type(counter)  # reveal: Counter
        reveal_type(counter.incr)  # reveal: Endpoint[[by: int =], int]
        reveal_type(counter.incr.call(1))  # reveal: Future[ValueMesh[int]]
        reveal_type(counter.incr.call_one(by=2))  # reveal: Future[int]
        reveal_type(counter.incr.choose())  # reveal: Future[int]
        reveal_type(counter.incr.stream(3))  # reveal: Iterator[Future[int]]
        reveal_type(counter.incr.broadcast(4))  # reveal: None
        reveal_type(counter.tags.call_one("a", upper=True))  # reveal: Future[list[str]]
        reveal_type(counter.slice(gpus=0).incr.call_one())  # reveal: Future[int]
        reveal_type(Counter.incr)  # reveal: EndpointProperty[[by: int =], int]
    """,
    "wrong_type": """
        counter.incr.call("1")  # error: arg-type
        counter.incr.call_one(by=1.5)  # error: arg-type
        counter.tags.broadcast(3)  # error: arg-type
    """,
    "missing_argument": """
        counter.tags.call()  # error: call-arg
        counter.later.call_one()  # error: call-arg
        counter.incr.call(1, 2)  # error: call-arg
    """,
    "unknown_keyword": """
        counter.incr.call(step=1)  # error: call-arg
        counter.tags.choose("a", lower=True)  # error: call-arg
    """,
    "async_endpoints": """
        reveal_type(counter.get_async.call_one())  # reveal: Future[int]
        reveal_type(counter.get_async.call())  # reveal: Future[ValueMesh[int]]
        reveal_type(counter.half.call_one(1.0))  # reveal: Future[float]


        async def main() -> None:
            reveal_type(await counter.get_async.call_one())  # reveal: int
            reveal_type(await counter.incr.call())  # reveal: ValueMesh[int]
    """,
    "explicit_response_port": """
        reveal_type(counter.later)  # reveal: Endpoint[[n: int], str]
        reveal_type(counter.later.call(3))  # reveal: Future[ValueMesh[str]]
        reveal_type(counter.blob.call_one(8))  # reveal: Future[bytes]
        port: Port[str] = Channel[str].open()[0]
        counter.later.call(port, 3)  # error: call-arg
    """,
    "future_and_value_mesh": """
        fut = counter.incr.call_one()
        reveal_type(fut.get())  # reveal: int
        reveal_type(fut.get(timeout=1.0))  # reveal: int
        reveal_type(fut.result())  # reveal: int
        values = counter.incr.call().get()
        reveal_type(values.values())  # reveal: list[int]
        reveal_type(values.item(gpus=0))  # reveal: int
        reveal_type(values.items())  # reveal: Iterator[tuple[Point, int]]
        reveal_type(values.slice(gpus=1))  # reveal: ValueMesh[int]
        wrong: Future[str] = counter.incr.call_one()  # error: assignment
    """,
    "misuse": """
        counter.incr(1)  # error: operator
        reveal_type(as_endpoint(counter.plain).call_one(3))  # reveal: Future[str]
        as_endpoint(counter.plain).call_one("3")  # error: arg-type
        reveal_type(counter.size())  # reveal: int
        reveal_type(counter.stop())  # reveal: Future[None]


        class Sync(Actor):
            @concurrent_endpoint  # error: arg-type
            def sync(self) -> int:
                return 1
    """,
}

#: ``file:line: severity: message  [code]`` or ``file:line: note: message``.
_LINE = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): (?P<kind>error|note): (?P<msg>.*)$")
_REVEALED = re.compile(r'^Revealed type is "(?P<type>.*)"$')
_CODE = re.compile(r"\[(?P<code>[a-z-]+)\]$")
#: A module path before a name: ``monarch._src.actor.future.Future`` -> ``Future``.
_MODULE_PREFIX = re.compile(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+(?=[A-Za-z_])")


@dataclass
class Report:
    """What mypy said about one snippet, by line."""

    revealed: dict[int, str] = field(default_factory=dict)
    errors: dict[int, list[tuple[str, str]]] = field(default_factory=dict)


@dataclass
class Snippet:
    path: Path
    #: line -> expected revealed type / expected error code
    reveals: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def _write(tmp: Path, name: str, body: str) -> Snippet:
    code = PRELUDE + textwrap.dedent(body)
    snippet = Snippet(tmp / f"{name}.py")
    snippet.path.write_text(code)
    for number, line in enumerate(code.splitlines(), start=1):
        if "# reveal: " in line:
            snippet.reveals[number] = line.split("# reveal: ", 1)[1].strip()
        elif "# error: " in line:
            snippet.errors[number] = line.split("# error: ", 1)[1].strip()
    return snippet


def _parse(stdout: str) -> dict[str, Report]:
    reports: dict[str, Report] = {}
    for raw in stdout.splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        report = reports.setdefault(Path(m["file"]).stem, Report())
        line, msg = int(m["line"]), m["msg"]
        if m["kind"] == "note":
            revealed = _REVEALED.match(msg)
            if revealed is not None:
                report.revealed[line] = _MODULE_PREFIX.sub("", revealed["type"])
            continue
        code = _CODE.search(msg)
        report.errors.setdefault(line, []).append((code["code"] if code else "?", msg))
    return reports


@pytest.fixture(scope="module")
def mypy_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, Snippet], dict[str, Report], str]]:
    """All snippets, checked by one mypy run: the snippets, the reports, mypy's output."""
    from mypy import api

    tmp = tmp_path_factory.mktemp("typecheck")
    snippets = {name: _write(tmp, name, body) for name, body in SNIPPETS.items()}
    stdout, stderr, _status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(extract_doc_snippets.seeded_cache(tmp / ".mypy_cache")),
            *(str(s.path) for s in snippets.values()),
        ]
    )
    assert "error: " in stdout or "Success" in stdout, f"mypy did not run:\n{stdout}{stderr}"
    yield snippets, _parse(stdout), stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet_types(
    name: str, mypy_run: tuple[dict[str, Snippet], dict[str, Report], str]
) -> None:
    snippets, reports, stdout = mypy_run
    snippet = snippets[name]
    report = reports.get(name, Report())
    code = snippet.path.read_text().splitlines()
    problems = []
    for line, expected in snippet.reveals.items():
        got = report.revealed.get(line)
        if got != expected:
            problems.append(f"line {line} `{code[line - 1].strip()}`: revealed {got!r}")
    for line, expected_code in snippet.errors.items():
        codes = [c for c, _ in report.errors.get(line, [])]
        if expected_code not in codes:
            problems.append(f"line {line} `{code[line - 1].strip()}`: error codes {codes}")
    for line, errors in report.errors.items():
        if line not in snippet.errors:
            problems.append(f"line {line} `{code[line - 1].strip()}`: unexpected {errors}")
    assert not problems, "\n".join(problems) + f"\n--- mypy output\n{stdout}"


@pytest.mark.timeout(30)
def test_every_snippet_expects_something() -> None:
    """A snippet with no expectation would pass whatever mypy says."""
    for name, body in SNIPPETS.items():
        assert "# reveal: " in body or "# error: " in body, name


# --- the guides' code ---------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("module", [extract_doc_snippets, "monarch._src.actor.endpoint"])
def test_doctests_pass(module: object) -> None:
    if isinstance(module, str):
        module = importlib.import_module(module)
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.timeout(30)
def test_extract_keeps_line_numbers_and_skips_marked_blocks() -> None:
    guide = textwrap.dedent(
        """\
        # Title

        ```python
        x = 1
        ```

        <!-- typecheck: skip -->

        ```python
        partial(
        ```

        ```text
        y = 2
        ```

        <!-- typecheck: skip -->
        Prose in between: the marker no longer applies.

        ```python
        z = x
        ```
        """
    )
    lines = extract_doc_snippets.extract(guide).splitlines()
    assert lines[3] == "x = 1"
    assert lines[20] == "z = x"
    assert [line for line in lines if line] == ["x = 1", "z = x"]


@pytest.mark.timeout(120)
def test_doc_errors_name_the_guide_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text("Intro\n\n```python\nx: int = 1\ny: str = x\n```\n")
    status = extract_doc_snippets.run_mypy([guide])
    out = capsys.readouterr().out
    assert status == 1, out
    assert f"{guide}:5: error: Incompatible types in assignment" in out, out
