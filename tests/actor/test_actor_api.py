"""The Python actor API on one host (issue 3): the seed example, adverbs, futures,
meshes, context, errors and lifecycle. Each test has a timeout; the harness fails a test
that leaves a process or a non-daemon thread behind."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.actor import (
    Actor,
    ActorError,
    Extent,
    Future,
    Point,
    Port,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    as_endpoint,
    concurrent_actor,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)
from proc_state import running

pytestmark = pytest.mark.timeout(60)


class Trainer(Actor):
    @endpoint
    def train(self, step: int): ...


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.init_rank = current_rank()

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def where(self) -> tuple[int, dict[str, int], dict[str, int], str, int]:
        ctx = context()
        return (
            current_rank().rank,
            dict(current_rank()),
            current_size(),
            current_actor_name(),
            ctx.actor_instance.rank.rank,
        )

    @endpoint
    def init_rank_of(self) -> int:
        return self.init_rank.rank

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def creator(self) -> tuple[str, str]:
        creator = context().actor_instance.creator
        assert creator is not None
        return creator.name, str(creator)

    @endpoint
    def call_other(self, other: Counter) -> int:
        # A sync endpoint may block on a future.
        return other.incr.call_one(10).get(timeout=30)

    @endpoint
    def controller_value(self) -> int:
        ctrl = get_or_spawn_controller("shared_controller", Counter, 100).get(timeout=30)
        return ctrl.incr.call_one(1).get(timeout=30)

    def helper(self) -> int:
        return 1


class AsyncCounter(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    async def slow_append(self, i: int, delay: float) -> list[int]:
        await asyncio.sleep(delay)
        self.log.append(i)
        return list(self.log)

    @endpoint
    async def rank(self) -> int:
        return current_rank().rank


class Replier(Actor):
    @endpoint(explicit_response_port=True)
    def later(self, port: Port[int], x: int) -> None:
        threading.Thread(target=lambda: port.send(x * 2), daemon=True).start()

    @endpoint(explicit_response_port=True)
    def refuse(self, port: Port[int], x: int) -> None:
        port.exception(KeyError(x))


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    # The procs start in the background: wait, so that they exist before the first
    # test's leak-check snapshot.
    assert mesh.initialized.get(timeout=30) is True
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.fixture(scope="module")
def counters(procs: ProcMesh) -> Counter:
    return procs.spawn("counters", Counter, 5)


def test_seed_example_runs_unchanged() -> None:
    training_procs = this_host().spawn_procs({"gpus": 8})
    trainers = training_procs.spawn("trainers", Trainer)
    fut = trainers.train.call(step=0)
    result = fut.get()
    assert isinstance(result, ValueMesh)
    assert result.values() == [None] * 8
    assert result.sizes == {"gpus": 8}
    training_procs.stop().get(timeout=30)


def test_call_gathers_a_value_mesh_shaped_like_the_mesh(counters: Counter) -> None:
    vm = counters.where.call().get(timeout=30)
    assert vm.extent == Extent(["hosts", "gpus"], [2, 2])
    for point, (rank, coords, size, name, inst_rank) in vm.items():
        assert isinstance(point, Point)
        assert rank == point.rank == inst_rank
        assert coords == dict(point)
        assert size == {"hosts": 2, "gpus": 2}
        assert "counters" in name
    assert vm.item(hosts=1, gpus=0)[0] == 2


def test_each_actor_ran_init_with_its_rank_in_the_proc_mesh(counters: Counter) -> None:
    assert counters.init_rank_of.call().get(timeout=30).values() == [0, 1, 2, 3]


def test_actors_live_in_distinct_processes(counters: Counter) -> None:
    pids = counters.pid.call().get(timeout=30).values()
    assert len(set(pids)) == 4
    assert os.getpid() not in pids


def test_call_one_on_a_slice_and_message_rank(counters: Counter) -> None:
    one = counters.slice(hosts=1, gpus=1)
    rank, coords, size, _, inst_rank = one.where.call_one().get(timeout=30)
    assert (rank, coords, size, inst_rank) == (0, {}, {}, 3)
    row = counters.slice(hosts=1)
    vm = row.where.call().get(timeout=30)
    assert [v[0] for v in vm.values()] == [0, 1]
    assert [v[4] for v in vm.values()] == [2, 3]


def test_messages_from_one_sender_arrive_in_order(procs: ProcMesh) -> None:
    c = procs.slice(hosts=0, gpus=0).spawn("ordered", Counter)
    futs = [c.incr.call_one() for _ in range(200)]
    assert [f.get(timeout=30) for f in futs] == list(range(1, 201))


def test_split_rename_flatten_and_sizes(counters: Counter) -> None:
    flat = counters.flatten("ranks")
    assert flat.sizes == {"ranks": 4}
    assert sorted(r[4] for r in flat.where.call().get(timeout=30).values()) == [0, 1, 2, 3]
    renamed = counters.rename(hosts="nodes")
    assert renamed.sizes == {"nodes": 2, "gpus": 2}
    split = flat.split(ranks=("a", "b"), b=2)
    assert split.sizes == {"a": 2, "b": 2}
    assert counters.size() == 4 and counters.size("gpus") == 2 and len(counters) == 4
    assert counters.extent == Extent(["hosts", "gpus"], [2, 2])


def test_choose_and_stream_and_broadcast(procs: ProcMesh) -> None:
    c = procs.spawn("cbs", Counter)
    assert c.get.choose().get(timeout=30) == 0
    c.incr.broadcast(5)
    got = sorted(f.get(timeout=30) for f in c.get.stream())
    assert got == [5, 5, 5, 5]

    async def gather() -> list[int]:
        return [await f for f in c.incr.stream(1)]

    assert sorted(asyncio.run(gather())) == [6, 6, 6, 6]


def test_actor_error_carries_the_remote_traceback_and_the_actor_lives_on(
    counters: Counter,
) -> None:
    one = counters.slice(hosts=0, gpus=1)
    with pytest.raises(ActorError) as info:
        one.fail.call_one("boom").get(timeout=30)
    err = info.value
    assert isinstance(err.exception, ValueError)
    assert str(err.exception) == "boom"
    assert "Traceback of where the remote call failed" in str(err)
    assert err.message == "Actor call counters.fail failed."
    assert str(err).startswith("Actor call counters.fail failed.\n")
    assert "raise ValueError(message)" in err.exception_formatted
    assert one.echo.call_one("alive").get(timeout=30) == "alive"
    with pytest.raises(ActorError):
        counters.fail.call("all").get(timeout=30)


def test_future_get_timeout_does_not_cancel_and_results_are_cached(procs: ProcMesh) -> None:
    a = procs.slice(hosts=0, gpus=0).spawn("slow", AsyncCounter)
    fut = a.slow_append.call_one(1, 0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)
    gathered = Future.gather(fut)
    with pytest.raises(TimeoutError, match=r"future #0 of 1 did not finish within 0.01 s"):
        gathered.get(timeout=0.01)
    assert gathered.get(timeout=30) == [[1]]  # the timeout cancelled nothing
    first = fut.get(timeout=30)
    assert first == [1]
    assert fut.get() is first and fut.result(timeout=1) is first
    assert fut.exception() is None
    bad = procs.slice(hosts=0, gpus=0).spawn("bad", Counter).fail.call_one("x")
    exc = bad.exception(timeout=30)
    assert isinstance(exc, ActorError)
    with pytest.raises(ActorError) as again:
        bad.get()
    assert again.value is exc
    with pytest.raises(ValueError, match="finite"):
        fut.get(timeout=-1)
    with pytest.raises(TypeError):
        Future()  # type: ignore[call-arg]


def test_await_works_on_any_loop_and_is_repeatable(counters: Counter) -> None:
    fut = counters.get.call()

    async def twice() -> tuple[object, object]:
        return await fut, await fut

    a, b = asyncio.run(twice())
    assert a is b and len(a.values()) == 4  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="running asyncio loop"):
        fut.__await__()


def test_future_gather_keeps_the_order_and_the_first_error(counters: Counter) -> None:
    one = counters.slice(hosts=0, gpus=0)
    assert Future.gather(one.echo.call_one("a"), one.echo.call_one("b")).get(timeout=30) == [
        "a",
        "b",
    ]
    assert Future.gather().get(timeout=30) == []
    failing = one.fail.call_one("gathered")
    with pytest.raises(ActorError, match=r"Actor call counters\.fail failed"):
        Future.gather(one.echo.call_one(1), failing).get(timeout=30)
    first, second = Future.gather(one.echo.call_one(1), failing, return_exceptions=True).get(
        timeout=30
    )
    assert first == 1 and isinstance(second, ActorError)
    assert failing.exception(timeout=30) is second  # the futures stay usable on their own

    async def gathered() -> list[object]:
        return await Future.gather(one.echo.call_one(3), one.echo.call_one(4))

    assert asyncio.run(gathered()) == [3, 4]
    with pytest.raises(TypeError, match=r"argument #1 is int"):
        Future.gather(one.echo.call_one(1), 2)  # type: ignore[arg-type]


def test_the_client_is_the_root_that_creates_top_level_meshes(counters: Counter) -> None:
    assert str(context().actor_instance) == "<root>"
    assert counters.slice(hosts=0, gpus=1).creator.call_one().get(timeout=30) == (
        "root",
        "<root>",
    )


def test_async_actor_handles_one_message_at_a_time(procs: ProcMesh) -> None:
    a = procs.slice(hosts=1, gpus=1).spawn("one_at_a_time", AsyncCounter)
    slow = a.slow_append.call_one(1, 0.3)
    fast = a.slow_append.call_one(2, 0.0)
    assert fast.get(timeout=30) == [1, 2]
    assert slow.get(timeout=30) == [1]
    assert a.rank.call_one().get(timeout=30) == 0


def test_meshes_pickle_as_references_and_can_be_called_from_an_actor(
    procs: ProcMesh,
) -> None:
    a = procs.slice(hosts=0, gpus=0).spawn("caller", Counter)
    b = procs.slice(hosts=1, gpus=0).spawn("callee", Counter, 1)
    assert b.get.call_one().get(timeout=30) == 1  # b is up before it is passed on
    assert a.call_other.call_one(b).get(timeout=30) == 11
    assert b.get.call_one().get(timeout=30) == 11
    copy = pickle.loads(pickle.dumps(b))
    assert copy.get.call_one().get(timeout=30) == 11


def test_explicit_response_port(procs: ProcMesh) -> None:
    r = procs.slice(hosts=0, gpus=1).spawn("replier", Replier)
    assert r.later.call_one(21).get(timeout=30) == 42
    with pytest.raises(ActorError) as info:
        r.refuse.call_one(7).get(timeout=30)
    assert isinstance(info.value.exception, KeyError)


def test_this_proc_runs_actors_in_this_process() -> None:
    c = this_proc().spawn("local_counter", Counter, 3)
    assert c.pid.call_one().get(timeout=30) == os.getpid()
    assert c.incr.call_one().get(timeout=30) == 4
    assert this_proc().sizes == {}


def test_get_or_spawn_controller_from_client_and_actors(counters: Counter) -> None:
    ctrl = get_or_spawn_controller("shared_controller", Counter, 100).get(timeout=30)
    again = get_or_spawn_controller("shared_controller", Counter, 100).get(timeout=30)
    assert ctrl is again
    assert ctrl.pid.call_one().get(timeout=30) == os.getpid()
    from_actors = counters.controller_value.call().get(timeout=30).values()
    assert sorted(from_actors) == [101, 102, 103, 104]
    assert ctrl.get.call_one().get(timeout=30) == 104


def test_actor_mesh_stop_then_calls_fail(procs: ProcMesh) -> None:
    c = procs.spawn("stoppable", Counter)
    assert c.incr.call().get(timeout=30).values() == [1, 1, 1, 1]
    c.stop().get(timeout=30)
    with pytest.raises(SupervisionError, match="stopped"):
        c.incr.call().get(timeout=30)


def test_proc_mesh_stop_and_async_with() -> None:
    async def main() -> list[int]:
        async with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
            c = pm.spawn("in_with", Counter)
            return (await c.pid.call()).values()

    pids = asyncio.run(main())
    assert len(pids) == 2
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    assert pm.initialized.get(timeout=30) is True
    before = pm.spawn("before_stop", Counter)
    assert before.get.call_one().get(timeout=30) == 0
    pm.stop().get(timeout=30)
    with pytest.raises(SupervisionError, match="actor mesh is stopped due to proc mesh shutdown"):
        before.get.call_one().get(timeout=30)
    late = pm.spawn("late", Counter)
    with pytest.raises(RuntimeError, match="already been stopped"):
        late.get.call().get(timeout=30)


# --- bad input: clear errors at the call site ---------------------------------------------


class NotAnActor:
    pass


class RefusesToPickle:
    def __getstate__(self) -> object:
        raise RuntimeError("refuses to pickle")


class Mixed(Actor):
    @endpoint
    def a(self) -> None: ...

    @endpoint
    async def b(self) -> None: ...


def test_call_one_on_several_actors_is_a_value_error(counters: Counter) -> None:
    with pytest.raises(ValueError, match=r"exactly 1 actor.*has 4"):
        counters.get.call_one()


def test_slice_errors(counters: Counter) -> None:
    with pytest.raises(TypeError, match="no dimension"):
        counters.slice(nope=0)
    with pytest.raises(IndexError):
        counters.slice(gpus=2)
    with pytest.raises(IndexError):
        counters.slice(gpus=-1)


def test_spawn_errors(procs: ProcMesh) -> None:
    with pytest.raises(ValueError, match=r"not a subclass of monarch\.actor\.Actor"):
        procs.spawn("x", NotAnActor)  # type: ignore[type-var]
    with pytest.raises(ValueError, match="mixes sync endpoints"):
        procs.spawn("x", Mixed)
    with pytest.raises(TypeError, match="__init__"):
        procs.spawn("x", Counter, 1, 2, 3)


def test_endpoint_argument_errors(counters: Counter) -> None:
    with pytest.raises(TypeError, match=r"wrong arguments for endpoint .*incr"):
        counters.incr.call(1, 2, 3)
    with pytest.raises(TypeError, match="wrong arguments"):
        counters.incr.call(nope=1)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"echo: argument #0 \(lock\) cannot be pickled"):
        counters.echo.call(lock)
    # An argument whose own pickling code raises: its exception, told where.
    with pytest.raises(RuntimeError, match="refuses to pickle") as info:
        counters.echo.call(RefusesToPickle())
    assert any("echo: argument #0" in note for note in getattr(info.value, "__notes__", []))
    with pytest.raises(AttributeError, match=r"no endpoint 'nope'.*'incr'"):
        counters.nope  # noqa: B018
    with pytest.raises(RuntimeError, match="not an endpoint"):
        counters.helper()


def test_import_monarch_actor_does_not_import_torch() -> None:
    code = "import sys, monarch.actor; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


def test_clean_shutdown_at_interpreter_exit(tmp_path: object) -> None:
    script = textwrap.dedent(
        """
        import os
        from monarch.actor import Actor, endpoint, this_host

        class Pid(Actor):
            @endpoint
            def pid(self) -> int:
                return os.getpid()

        pm = this_host().spawn_procs(per_host={"gpus": 3})
        print(*pm.spawn("p", Pid).pid.call().get(timeout=30).values())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3
    for pid in pids:
        assert not running(pid)


class FailsInInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("no init for you")

    @endpoint
    def hello(self) -> str:
        return "hi"


class EnvReader(Actor):
    @endpoint
    def env(self, key: str) -> str | None:
        return os.environ.get(key)


class Gate(Actor):
    """A plain async actor: one message at a time."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    @endpoint
    async def wait_for_release(self) -> str:
        await self.release.wait()
        return "released"

    @endpoint
    async def release_now(self) -> None:
        self.release.set()


class Concurrent(Gate):
    @concurrent_endpoint
    async def wait_for_release(self) -> str:
        await self.release.wait()
        return "released"


def test_failing_init_makes_later_calls_raise_supervision_error(procs: ProcMesh) -> None:
    m = procs.slice(hosts=0).spawn("bad_init", FailsInInit)
    with pytest.raises(SupervisionError, match="no init for you") as info:
        m.hello.call().get(timeout=30)
    assert info.value.endpoint is not None and "hello" in info.value.endpoint


def test_spawn_procs_bootstrap_runs_before_actors() -> None:
    def set_env() -> None:
        # The bootstrap may use actors on its own proc (they are hosted already).
        helper = this_proc().spawn("bootstrap_helper", Counter, 41)
        assert helper.incr.call_one().get(timeout=30) == 42
        os.environ["MONARCH_TEST_BOOTSTRAP"] = "done"

    pm = this_host().spawn_procs({"gpus": 2}, bootstrap=set_env, name="booted")
    try:
        vm = pm.spawn("env", EnvReader).env.call("MONARCH_TEST_BOOTSTRAP").get(timeout=30)
        assert vm.values() == ["done", "done"]
    finally:
        pm.stop().get(timeout=30)


def test_concurrent_endpoint_misuse_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="can only wrap async endpoints; plain is sync"):

        class Sync(Actor):
            @concurrent_endpoint
            def plain(self) -> None: ...

    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Stacked(Actor):
            @concurrent_endpoint  # type: ignore[arg-type]
            @endpoint
            async def both(self) -> None: ...


def test_concurrent_endpoint_lets_the_next_message_in(procs: ProcMesh) -> None:
    c = procs.slice(hosts=0, gpus=0).spawn("concurrent", Concurrent)
    waiting = c.wait_for_release.call_one()
    c.release_now.call_one().get(timeout=30)
    assert waiting.get(timeout=30) == "released"


@concurrent_actor
class ConcurrentGate(Gate):
    """Every endpoint concurrent; a stop lets the running ones finish."""

    def __init__(self, path: str = "") -> None:
        super().__init__()
        self.path = path
        self.finished = False

    @endpoint(explicit_response_port=True)
    async def work(self, port: Port[str]) -> None:
        port.send("started")
        await asyncio.sleep(0.3)  # the work the stop must let finish
        self.finished = True
        Path(self.path).write_text("done")

    async def __cleanup__(self, exc: Exception | None) -> None:
        Path(self.path + ".cleanup").write_text(str(self.finished))


def test_concurrent_actor_makes_every_endpoint_concurrent(procs: ProcMesh, tmp_path: Path) -> None:
    g = procs.slice(hosts=0, gpus=0).spawn("concurrent_gate", ConcurrentGate, str(tmp_path / "x"))
    try:
        # An endpoint inherited from an undecorated base is concurrent here too...
        waiting = g.wait_for_release.call_one()
        g.release_now.call_one().get(timeout=30)
        assert waiting.get(timeout=30) == "released"
    finally:
        g.stop().get(timeout=30)
    # ... and stays sequential on the base class.
    assert not Gate.wait_for_release._concurrent
    assert ConcurrentGate.wait_for_release._concurrent


def test_stopping_a_concurrent_actor_lets_its_running_endpoints_finish(
    procs: ProcMesh, tmp_path: Path
) -> None:
    done = tmp_path / "done"
    g = procs.slice(hosts=0, gpus=0).spawn("draining_gate", ConcurrentGate, str(done))
    assert g.work.call_one().get(timeout=30) == "started"
    g.stop().get(timeout=30)
    assert done.read_text() == "done"
    # __cleanup__ ran after the endpoint finished, and saw what it did.
    assert Path(str(done) + ".cleanup").read_text() == "True"


def test_concurrent_actor_misuse_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"can only wrap async endpoints.*\['ping'\]"):

        @concurrent_actor
        class SyncEndpoint(Actor):
            @endpoint
            def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match="requires async __cleanup__"):

        @concurrent_actor
        class SyncCleanup(Actor):
            @endpoint
            async def ping(self) -> str:
                return "pong"

            def __cleanup__(self, exc: Exception | None) -> None:
                pass

    with pytest.raises(TypeError, match="decorates an actor class"):
        concurrent_actor(len)  # type: ignore[type-var]


def test_as_endpoint_calls_a_plain_method(counters: Counter) -> None:
    assert as_endpoint(counters.helper).call().get(timeout=30).values() == [1, 1, 1, 1]
    # As upstream: the same plain method may be made an endpoint again.
    assert as_endpoint(counters.helper).call().get(timeout=30).values() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="as_endpoint"):
        as_endpoint(counters.incr)


def test_get_inside_a_running_loop_warns(counters: Counter) -> None:
    async def main() -> object:
        with pytest.warns(UserWarning, match="asyncio loop"):
            return counters.get.call().get(timeout=30)

    assert len(asyncio.run(main())) == 4  # type: ignore[arg-type]


def test_spawn_procs_bad_input() -> None:
    with pytest.raises(ValueError, match="positive ints"):
        this_host().spawn_procs({"gpus": 0})
    with pytest.raises(ValueError, match="not a valid proc name"):
        this_host().spawn_procs({"gpus": 1}, name="a/b")
    with pytest.raises(ValueError, match="proc_bind"):
        this_host().spawn_procs({"gpus": 2}, proc_bind=[{}])


class Spawner(Actor):
    @endpoint
    def spawn_on(self, procs: ProcMesh) -> list[int]:
        # A proc mesh received as an argument is a reference: spawning on it works from
        # any actor.
        child = procs.spawn("grandchild", Counter, 40)
        return child.incr.call(2).get(timeout=30).values()


class Forwarder(Actor):
    @endpoint(explicit_response_port=True)
    def forward(self, port: Port[str], to: Replier2, text: str) -> None:
        # The reply port travels to another actor, which answers the original caller.
        to.answer.broadcast(port, text)


class Replier2(Actor):
    @endpoint
    def answer(self, port: Port[str], text: str) -> None:
        port.send(text.upper())


def test_proc_meshes_and_ports_travel_as_references(procs: ProcMesh) -> None:
    s = procs.slice(hosts=0, gpus=0).spawn("spawner", Spawner)
    assert s.spawn_on.call_one(procs.slice(hosts=1)).get(timeout=30) == [42, 42]
    f = procs.slice(hosts=0, gpus=1).spawn("forwarder", Forwarder)
    r = procs.slice(hosts=1, gpus=1).spawn("replier2", Replier2)
    assert f.forward.call_one(r, "relayed").get(timeout=30) == "RELAYED"
    copy = pickle.loads(pickle.dumps(procs))
    assert copy.sizes == procs.sizes


def test_a_stopped_actor_frees_its_thread_and_calls_still_fail() -> None:
    c = this_proc().spawn("thread_freed", Counter)
    assert c.incr.call_one().get(timeout=30) == 1
    [thread] = [t for t in threading.enumerate() if t.name == "monarch-actor-thread_freed-0"]
    copy = pickle.loads(pickle.dumps(c))  # a reference that does not know of the stop
    c.stop().get(timeout=30)
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(SupervisionError, match="was stopped"):
        copy.incr.call_one().get(timeout=30)
    copy.stop().get(timeout=30)  # stopping again is fine


def test_host_mesh_stop_shutdown_and_async_with() -> None:
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        sys.path.insert(0, TESTS)
        from monarch.actor import Actor, endpoint, this_host
        from proc_state import running

        class Pid(Actor):
            @endpoint
            def pid(self) -> int:
                return os.getpid()

        host = this_host()
        pm = host.spawn_procs({"gpus": 2})
        pids = pm.spawn("p", Pid).pid.call().get(timeout=30).values()
        host.stop().get(timeout=30)
        print("stopped", not any(running(p) for p in pids))
        try:
            host.slice().shutdown()
        except RuntimeError as e:
            print("view:", e)

        async def main() -> None:
            async with this_host() as h:
                got = await h.spawn_procs({"gpus": 1}).spawn("q", Pid).pid.call()
                print("in with", len(got))

        asyncio.run(main())
        try:
            this_host().spawn_procs({"gpus": 1})
        except RuntimeError as e:
            print("after:", e)
        """
    ).replace("TESTS", repr(str(Path(__file__).parent.parent)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "stopped True",
        "view: shutdown() is only for the HostMesh that owns its hosts (this_host(), or "
        "the mesh attach_to_workers returned); this one is a slice or a received reference",
        "in with 1",
        "after: HostMesh has already been shut down",
    ]
