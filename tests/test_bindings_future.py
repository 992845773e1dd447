"""``monarch._rust_bindings.Future``: blocking ``get``, ``await`` and caching.

Pending futures come from ``PortReceiver.recv()`` on a port nobody has sent to yet; a
test completes them by sending.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from monarch._rust_bindings import (
    Client,
    Future,
    PortReceiver,
    PortRef,
    Proc,
    ReplyItem,
    WouldBlockRuntime,
)
from proc_state import voluntary_switches


@dataclass
class Port:
    client: Client
    ref: PortRef
    rx: PortReceiver

    def send(self, *parts: bytes) -> None:
        self.ref.send(self.client, list(parts))


@pytest.fixture
def port() -> Iterator[Port]:
    proc = Proc.serve("local")
    client = proc.client("test")
    ref, rx = client.open_port()
    yield Port(client, ref, rx)
    rx.close()


@pytest.mark.timeout(30)
def test_future_is_not_user_constructible() -> None:
    with pytest.raises(TypeError):
        Future()  # type: ignore[call-arg]


@pytest.mark.timeout(30)
def test_future_is_generic_at_runtime() -> None:
    alias = Future[int]
    assert alias is not None


@pytest.mark.timeout(30)
def test_would_block_runtime_is_a_runtime_error() -> None:
    assert issubclass(WouldBlockRuntime, RuntimeError)


@pytest.mark.timeout(30)
def test_get_returns_the_message(port: Port) -> None:
    port.send(b"hello", b"world")
    assert port.rx.recv().get(timeout=10) == [b"hello", b"world"]


@pytest.mark.timeout(30)
def test_timeout_does_not_cancel(port: Port) -> None:
    fut = port.rx.recv()
    with pytest.raises(TimeoutError, match="keeps running"):
        fut.get(timeout=0.05)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0)
    port.send(b"late")
    assert fut.get(timeout=10) == [b"late"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", [-1.0, -0.001, math.nan, math.inf, -math.inf])
def test_bad_timeout_is_a_value_error(port: Port, timeout: float) -> None:
    port.send(b"x")
    fut = port.rx.recv()
    with pytest.raises(ValueError, match="timeout"):
        fut.get(timeout=timeout)
    with pytest.raises(ValueError, match="timeout"):
        fut.result(timeout=timeout)
    assert fut.get(timeout=10) == [b"x"]


@pytest.mark.timeout(30)
def test_result_is_cached(port: Port) -> None:
    port.send(b"once")
    fut = port.rx.recv()
    first = fut.get()
    assert first == [b"once"]
    assert fut.get() is first
    assert fut.result(timeout=1) is first
    assert fut.exception() is None


@pytest.mark.timeout(30)
def test_exception_is_cached(port: Port) -> None:
    fut = port.rx.recv()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)  # started, pending
    port.rx.close()
    with pytest.raises(RuntimeError, match="is closed") as first:
        fut.get(timeout=10)
    assert str(port.ref) in str(first.value)
    with pytest.raises(RuntimeError) as second:
        fut.get()
    assert second.value is first.value
    assert fut.exception() is first.value
    # A receiver that is already closed fails new receives too.
    with pytest.raises(RuntimeError, match="is closed"):
        port.rx.recv().get(timeout=10)


@pytest.mark.timeout(30)
def test_await_on_asyncio(port: Port) -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        fut = port.rx.recv()
        # The send runs on this loop after the await started: the loop is not blocked.
        asyncio.get_running_loop().call_soon(port.send, b"async")
        first = await fut
        second = await fut
        assert second is first
        return first, await port.rx.recv().as_asyncio()

    port.send(b"second")
    # Order on the port: b"second" was sent first.
    first, second = asyncio.run(main())
    assert first == [b"second"]
    assert second == [b"async"]


@pytest.mark.timeout(30)
def test_await_a_done_future(port: Port) -> None:
    port.send(b"done")
    fut = port.rx.recv()
    value = fut.get(timeout=10)

    async def main() -> list[bytes]:
        return await fut

    assert asyncio.run(main()) is value


@pytest.mark.timeout(30)
def test_await_outside_a_loop_is_a_value_error(port: Port) -> None:
    with pytest.raises(ValueError, match="running asyncio loop"):
        port.rx.recv().__await__()


@pytest.mark.timeout(30)
def test_await_from_two_loops_in_two_threads(port: Port) -> None:
    fut = port.rx.recv()
    results: dict[int, object] = {}
    awaiting = [threading.Event(), threading.Event()]

    def run(i: int) -> None:
        async def main() -> object:
            aw = fut.as_asyncio()  # registered with the future from here on
            awaiting[i].set()
            return await asyncio.wait_for(aw, 10)

        results[i] = asyncio.run(main())

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for e in awaiting:
        assert e.wait(10)
    port.send(b"both")
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert results[0] == [b"both"]
    assert results[1] is results[0]


def _read_concurrently(port: Port, payload: bytes) -> None:
    """Four threads read one future the moment it finishes: two block in ``get`` and
    two await it on their own loops."""
    fut = port.rx.recv()
    results: list[object] = []
    failures: list[BaseException] = []
    ready = threading.Barrier(5)

    def blocking() -> None:
        ready.wait(10)
        try:
            results.append(fut.get(timeout=10))
        except BaseException as e:  # recorded; asserted below
            failures.append(e)

    def awaiting() -> None:
        async def main() -> object:
            aw = fut.as_asyncio()
            ready.wait(10)
            return await asyncio.wait_for(aw, 10)

        try:
            results.append(asyncio.run(main()))
        except BaseException as e:  # recorded; asserted below
            failures.append(e)

    threads = [threading.Thread(target=blocking, daemon=True) for _ in range(2)]
    threads += [threading.Thread(target=awaiting, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    ready.wait(10)
    port.send(payload)
    for t in threads:
        t.join(15)
        assert not t.is_alive()
    assert failures == []
    assert len(results) == 4
    assert all(r is results[0] for r in results)
    assert results[0] == [payload]


@pytest.mark.timeout(60)
def test_concurrent_first_reads_all_see_one_result(port: Port) -> None:
    """Many readers of a just-finished future at once: exactly one conversion runs and
    every reader gets the same object. Repeated, since the race is between GIL
    switches."""
    for round_ in range(30):
        _read_concurrently(port, f"round {round_}".encode())


@pytest.mark.timeout(30)
def test_get_inside_a_running_loop_warns(port: Port) -> None:
    port.send(b"warned")

    async def main() -> list[bytes]:
        with pytest.warns(UserWarning, match="asyncio loop"):
            return port.rx.recv().get(timeout=10)

    assert asyncio.run(main()) == [b"warned"]


@pytest.mark.timeout(60)
def test_get_releases_the_gil(port: Port) -> None:
    """A counter thread runs Python code while the main thread blocks in ``get()``; the
    message is sent by a third thread only once the counter has advanced a lot after
    ``get()`` was entered. If ``get()`` held the GIL, nothing would progress and ``get``
    would time out."""
    entering = threading.Event()
    progressed = threading.Event()
    stop = threading.Event()
    count = 0

    def counter() -> None:
        nonlocal count
        entering.wait(10)
        start = count
        while not stop.is_set():
            count += 1
            if count - start == 200_000:
                progressed.set()

    def sender() -> None:
        if progressed.wait(20):
            port.send(b"progress")

    threads = [
        threading.Thread(target=counter, daemon=True),
        threading.Thread(target=sender, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        fut = port.rx.recv()
        entering.set()
        assert fut.get(timeout=30) == [b"progress"]
    finally:
        stop.set()
        progressed.set()
        for t in threads:
            t.join(10)
    assert count >= 200_000


@pytest.mark.timeout(30)
def test_get_on_a_runtime_thread_raises_would_block_runtime(port: Port) -> None:
    """The runtime calls ``loop.call_soon_threadsafe`` from one of its own threads to
    wake an awaiting loop; a loop that blocks in ``get()`` right there gets
    ``WouldBlockRuntime`` instead of stalling the runtime."""
    port.send(b"done")
    done = port.rx.recv()
    done.get(timeout=10)
    seen: list[BaseException] = []

    class Loop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[no-untyped-def,override]
            if threading.current_thread() is not threading.main_thread():
                try:
                    done.get()
                except WouldBlockRuntime as e:
                    seen.append(e)
            return super().call_soon_threadsafe(callback, *args, context=context)

    async def main() -> list[bytes]:
        fut = port.rx.recv()
        asyncio.get_running_loop().call_soon(port.send, b"wake")
        return await fut

    loop = Loop()
    try:
        assert loop.run_until_complete(main()) == [b"wake"]
    finally:
        loop.close()
    assert len(seen) == 1
    assert "tokio runtime" in str(seen[0])


@pytest.mark.timeout(120)
def test_exit_right_after_an_await_does_not_abort() -> None:
    """A runtime thread settling an awaited future while the interpreter finalizes was
    ended by CPython mid-call and aborted the process (about 1 run in 5). The exit hook
    now keeps runtime threads out of Python during finalization. (Without the hook
    this script aborted in 4 of 60 runs on a loaded 2-core machine, 23 of 100 on
    another run.)"""
    code = (
        "import asyncio\n"
        "import monarch.actor\n"
        "from monarch._src.actor import process\n"
        "agent = process.get().agent\n"
        "async def main():\n"
        "    await agent.this_proc().initialized()\n"
        "asyncio.run(main())\n"
    )
    for _ in range(25):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, (out.returncode, out.stderr)


class _Alarm(Exception):
    pass


def _raise_alarm(signum: int, frame: object) -> None:
    raise _Alarm()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("waiter", ["future", "queue"])
def test_a_signal_handler_interrupts_a_blocking_get_on_the_main_thread(
    port: Port, waiter: str
) -> None:
    import signal

    import monarch.actor  # noqa: F401  (the process's agent)
    from monarch._src.actor import process

    queue = process.get().agent.reply_queue()
    wait = port.rx.recv().get if waiter == "future" else queue.get
    previous = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Alarm):
            wait()  # no timeout: only the handler ends it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_blocking_get_off_the_main_thread_sleeps_until_woken(port: Port) -> None:
    """Only the main thread runs signal handlers, so only it waits in slices: a waiting
    actor thread must not wake ten times a second (many idle procs share few cores)."""
    import monarch.actor  # noqa: F401  (the process's agent)
    from monarch._src.actor import process

    state = process.get()
    queue = state.agent.reply_queue()
    started = threading.Event()
    tid: list[int] = []
    got: list[ReplyItem] = []

    def waiter() -> None:
        tid.append(threading.get_native_id())
        started.set()
        got.append(queue.get())

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert started.wait(10)
    before = voluntary_switches(tid[0])
    thread.join(0.6)  # an observation window: the waiter must stay asleep in it
    after = voluntary_switches(tid[0])
    assert after - before <= 2, f"the waiting thread woke {after - before} times in 0.6 s"
    queue.port(9).send(state.client, 0, [b"wake"])
    thread.join(10)
    assert [(i.index, i.status, i.parts) for i in got] == [(9, 0, [b"wake"])], got
