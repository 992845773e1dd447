"""Ports and channels: Channel.open/open_ranked, Port.send/exception,
PortReceiver.recv, send(), Accumulator, from sync and async code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    Channel,
    Port,
    ProcMesh,
    context,
    current_rank,
    endpoint,
    send,
    this_host,
)

if TYPE_CHECKING:
    from conftest import Faults

pytestmark = pytest.mark.timeout(60)


class Producer(Actor):
    @endpoint
    def produce(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i * 10 + context().actor_instance.rank.rank)

    @endpoint
    def refuse(self, port: Port[int]) -> None:
        port.exception(ValueError("refused"))

    @endpoint
    def rank(self) -> int:
        """This actor's rank in the mesh spawned (not in the message's view)."""
        return context().actor_instance.rank.rank

    @endpoint
    def message_rank(self) -> int:
        return current_rank().rank

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("send without a port")


class AsyncProducer(Actor):
    @endpoint
    async def produce(self, port: Port[str]) -> None:
        await asyncio.sleep(0)
        port.send("from async")


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    assert pm.initialized.get(timeout=30)
    yield pm
    pm.stop().get(timeout=30)


@pytest.fixture(scope="module")
def producers(procs: ProcMesh) -> Producer:
    return procs.spawn("producers", Producer)


def test_a_port_handed_to_an_actor_delivers_in_order(producers: Producer) -> None:
    port, receiver = Channel[int].open()
    one = producers.slice(gpus=2)
    one.produce.call_one(port, 5).get(timeout=30)
    assert [receiver.recv().get(timeout=30) for _ in range(5)] == [2, 12, 22, 32, 42]


def test_recv_from_async_code(procs: ProcMesh) -> None:
    a = procs.slice(gpus=0).spawn("async_producer", AsyncProducer)

    async def main() -> str:
        port, receiver = Channel[str].open()
        a.produce.broadcast(port)
        return await receiver.recv()

    assert asyncio.run(main()) == "from async"


def test_port_exception_raises_at_the_receiver(producers: Producer) -> None:
    port, receiver = Channel[int].open()
    producers.slice(gpus=1).refuse.broadcast(port)
    with pytest.raises(ActorError) as info:
        receiver.recv().get(timeout=30)
    assert isinstance(info.value.exception, ValueError)


def test_recv_is_lazy_and_a_timeout_loses_nothing(producers: Producer) -> None:
    port, receiver = Channel[int].open()
    fut = receiver.recv()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    port.send(7)  # the client sends to its own port
    assert fut.get(timeout=30) == 7


def test_send_routes_every_reply_to_a_ranked_port(producers: Producer) -> None:
    port, receiver = Channel.open_ranked()
    send(producers.rank, (), {}, port=port)
    got = sorted(receiver.recv().get(timeout=30) for _ in range(4))
    assert got == [(0, 0), (1, 1), (2, 2), (3, 3)]
    # Ranks are positions in the view sent to, as current_rank() says inside.
    port, receiver = Channel.open_ranked()
    send(producers.slice(gpus=slice(2, 4)).message_rank, (), {}, port=port)
    assert sorted(receiver.recv().get(timeout=30) for _ in range(2)) == [(0, 0), (1, 1)]
    port, receiver = Channel[int].open()
    send(producers.slice(gpus=slice(1, 3)).rank, (), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=30) in (1, 2)
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.2)  # exactly one reply for "choose"


def test_send_without_a_port_fails_the_actor_on_error(procs: ProcMesh, faults: Faults) -> None:
    p = procs.slice(gpus=3).spawn("no_port", Producer)
    send(p.boom, (), {})
    assert "send without a port" in faults.wait_for(1, "no_port")[0].report()


def test_send_checks_its_arguments(producers: Producer) -> None:
    with pytest.raises(ValueError, match="selection"):
        send(producers.rank, (), {}, selection="some")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrong arguments"):
        send(producers.produce, (1, 2, 3), {})
    with pytest.raises(TypeError, match="mesh endpoint"):
        send(print, (), {})  # type: ignore[arg-type]


def test_accumulator_folds_replies_sync_and_async(producers: Producer) -> None:
    total = Accumulator(producers.rank, 0, lambda acc, r: acc + r)
    assert total.accumulate().get(timeout=30) == 6

    async def main() -> list[int]:
        return await Accumulator(producers.rank, [], lambda acc, r: [*acc, r]).accumulate()

    assert sorted(asyncio.run(main())) == [0, 1, 2, 3]
    empty = producers.slice(gpus=slice(0, 0))
    assert Accumulator(empty.rank, "identity", lambda a, r: a).accumulate().get(1) == "identity"


def test_once_port_takes_one_message() -> None:
    port, receiver = Channel[int].open(once=True)
    port.send(1)
    port.send(2)
    assert receiver.recv().get(timeout=30) == 1
    with pytest.raises(RuntimeError, match="closed"):
        receiver.recv().get(timeout=1)
