"""Ports of ``monarch._rust_bindings``: byte parts between procs, and picklable refs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, Literal

import cloudpickle  # type: ignore[import-untyped]
import pytest

from monarch._rust_bindings import (
    REPLY_ERROR,
    REPLY_FAILED,
    REPLY_OK,
    REPLY_STOPPED,
    PortRef,
    Proc,
    ReplyStatus,
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "unix", "tcp"])
def test_send_and_recv_across_two_procs(transport: Literal["local", "unix", "tcp"]) -> None:
    sender_proc = Proc.serve(transport)
    receiver_proc = Proc.serve(transport)
    assert sender_proc.proc_id != receiver_proc.proc_id
    assert transport in receiver_proc.proc_id
    sender = sender_proc.client("sender")
    ref, rx = receiver_proc.client("receiver").open_port()
    assert str(ref) == rx.port_id
    ref.send(sender, [b"a", b"", b"ccc"])
    ref.send(sender, b"single")
    assert rx.recv().get(timeout=20) == [b"a", b"", b"ccc"]
    assert rx.recv().get(timeout=20) == [b"single"]
    rx.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_64_mib_part_round_trip(transport: Literal["local", "unix", "tcp"]) -> None:
    big = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    a, b = Proc.serve(transport), Proc.serve(transport)
    sender = a.client("sender")
    ref, rx = b.client("receiver").open_port()
    ref.send(sender, [b"header", big])
    header, received = rx.recv().get(timeout=100)
    assert header == b"header"
    assert len(received) == len(big)
    assert received == big
    rx.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_port_ref_pickles_and_works_after_unpickling(dumps: Callable[[object], bytes]) -> None:
    a, b = Proc.serve("unix"), Proc.serve("unix")
    ref, rx = b.client("receiver").open_port()
    copy = pickle.loads(dumps(ref))
    assert isinstance(copy, PortRef)
    assert copy == ref
    assert hash(copy) == hash(ref)
    assert str(copy) == str(ref)
    copy.send(a.client("sender"), [b"via", b"copy"])
    assert rx.recv().get(timeout=20) == [b"via", b"copy"]
    rx.close()


@pytest.mark.timeout(30)
def test_port_ref_from_string_round_trips() -> None:
    ref, rx = Proc.serve("local").client().open_port()
    assert PortRef.from_string(str(ref)) == ref
    with pytest.raises(ValueError, match="port id"):
        PortRef.from_string("not a port")
    rx.close()


@pytest.mark.timeout(30)
def test_send_rejects_non_bytes() -> None:
    client = Proc.serve("local").client()
    ref, rx = client.open_port()
    with pytest.raises(TypeError, match="bytes or a list of bytes"):
        ref.send(client, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes or a list of bytes"):
        ref.send(client, [b"ok", 1])  # type: ignore[list-item]
    rx.close()


@pytest.mark.timeout(30)
def test_serve_rejects_unknown_transport_and_bad_names() -> None:
    with pytest.raises(ValueError, match="unknown channel transport"):
        Proc.serve("carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Proc.serve("local", "bad name/")
    with pytest.raises(ValueError):
        Proc.serve("local").client("bad name/")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [REPLY_OK, REPLY_ERROR, REPLY_FAILED, REPLY_STOPPED])
def test_port_handle_sends_every_reply_status(status: ReplyStatus) -> None:
    """Each status the module exports reaches the receiver as sent; ``STOPPED`` decodes
    as a rank that cannot answer, with the reason sent."""
    import monarch.actor  # noqa: F401  (the process's agent)
    from monarch._src.actor import process

    state = process.get()
    queue = state.agent.reply_queue()
    queue.port(4).send(state.client, status, [b"the actor was stopped"])
    item = queue.get(timeout=20)
    assert (item.index, item.status, item.parts) == (4, status, [b"the actor was stopped"])
    if status == REPLY_STOPPED:
        from monarch._src.actor.errors import SupervisionError
        from monarch._src.actor.replies import MeshInfo, decode

        with pytest.raises(
            SupervisionError, match="rank 4 cannot handle ep: the actor was stopped"
        ):
            decode([item], MeshInfo("m", "C", None, client_owned=False), "ep")


@pytest.mark.timeout(30)
def test_port_handle_refuses_an_unknown_status_naming_the_accepted_ones() -> None:
    import monarch.actor  # noqa: F401  (the process's agent)
    from monarch._src.actor import process

    state = process.get()
    port = state.agent.reply_queue().port()
    accepted = sorted(int(s) for s in (REPLY_OK, REPLY_ERROR, REPLY_FAILED, REPLY_STOPPED))
    assert accepted == [0, 1, 2, 3]
    bad = max(accepted) + 1
    with pytest.raises(
        ValueError,
        match=r"a ReplyStatus \(OK, ERROR, FAILED or STOPPED\) or its code 0, 1, 2 or 3, got 4$",
    ):
        port.send(state.client, bad, [b"x"])


@pytest.mark.timeout(60)
def test_delivery_reply_accepts_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Delivery.reply(REPLY_STOPPED, ...)`` reaches the caller: its call raises
    ``SupervisionError`` with the reason (an actor on this process answers STOPPED in
    place of its value)."""
    from monarch._src.actor.actor_host import HostedActor
    from monarch.actor import Actor, SupervisionError, endpoint, this_proc

    def answer_stopped(self: HostedActor, d: Any, result: Any) -> None:
        d.reply(REPLY_STOPPED, [b"stopped by the test"])

    monkeypatch.setattr(HostedActor, "_answer", answer_stopped)

    class Answers(Actor):
        @endpoint
        def ask(self) -> int:
            return 1

    mesh = this_proc().spawn("answers_stopped", Answers)
    with pytest.raises(SupervisionError, match="stopped by the test"):
        mesh.ask.call_one().get(timeout=30)
