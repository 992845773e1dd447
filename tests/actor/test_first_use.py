"""The runtime starts on first use of the actor API, whatever the program imported.

A function pickled by value (cloudpickle, the way test helpers, notebooks and job
launchers ship code) and run in a fresh interpreter imports only the modules it names:
here ``monarch._src.actor.proc_mesh`` (for ``this_host``) and the actor base class, never
``monarch.actor``. Spawning procs and calling an actor from it must work.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import cloudpickle
import pytest

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.proc_mesh import this_host

#: Reads a pickled function from stdin, runs it, prints its result.
RUNNER = (
    "import pickle, sys\n"
    "fn = pickle.loads(sys.stdin.buffer.read())\n"
    "print('RESULT', fn(), flush=True)\n"
)


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value * 2


def job() -> tuple[bool, list[int]]:
    """What runs in the fresh interpreter: whether monarch.actor was imported before
    the actor API was used, and what the actors answered."""
    before = "monarch.actor" in sys.modules
    procs = this_host().spawn_procs(per_host={"procs": 2})
    echoes = procs.spawn("echo", Echo)
    values = sorted(echoes.echo.call(21).get(timeout=60).values())
    procs.stop().get(timeout=30)
    return before, values


@pytest.fixture
def by_value() -> Iterator[None]:
    """This module's functions and classes pickled by value, as cloudpickle does for
    ``__main__`` or a module registered so."""
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("by_value")
def test_a_function_pickled_by_value_starts_the_runtime_in_a_fresh_interpreter() -> None:
    blob = cloudpickle.dumps(job)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER], input=blob, capture_output=True, timeout=100
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    assert "RESULT (False, [42, 42])" in out, (out, err[-3000:])
