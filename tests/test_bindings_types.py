"""The typed boundary of ``monarch._rust_bindings``: the enums (cast mode, reply status,
delivery kind), the records (reply items, RDMA regions, endpoint kinds) and the one
transport parser."""

from __future__ import annotations

import ctypes
import os
import pickle

import pytest

import monarch._rust_bindings as bindings
from monarch._rust_bindings import (
    CastMode,
    DeliveryKind,
    Proc,
    RdmaRegion,
    ReplyItem,
    ReplyStatus,
)


def test_the_enums_have_their_members_with_their_codes() -> None:
    assert [int(m) for m in (CastMode.BROADCAST, CastMode.CALL, CastMode.ONE)] == [0, 1, 2]
    assert [int(m) for m in (CastMode.CHOOSE, CastMode.STREAM, CastMode.PORT)] == [3, 4, 5]
    statuses = [ReplyStatus.OK, ReplyStatus.ERROR, ReplyStatus.FAILED, ReplyStatus.STOPPED]
    assert [int(s) for s in statuses] == [0, 1, 2, 3]
    kinds = [
        DeliveryKind.CALL,
        DeliveryKind.SUPERVISE,
        DeliveryKind.STOP,
        DeliveryKind.ENDED,
        DeliveryKind.SKIP,
    ]
    assert [int(k) for k in kinds] == [0, 1, 2, 3, 4]
    assert ReplyStatus.ERROR == 1 and ReplyStatus.ERROR != ReplyStatus.FAILED
    assert repr(CastMode.STREAM) == "CastMode.STREAM"
    assert len({CastMode.CALL, CastMode.CALL, CastMode.ONE}) == 2  # hashable


def test_the_old_constant_names_are_the_enum_members() -> None:
    for name in ("OK", "ERROR", "FAILED", "STOPPED"):
        assert getattr(bindings, f"REPLY_{name}") is getattr(ReplyStatus, name)
    for name in ("CALL", "SUPERVISE", "STOP", "ENDED", "SKIP"):
        assert getattr(bindings, f"DELIVERY_{name}") is getattr(DeliveryKind, name)


def test_a_reply_item_is_a_record_whose_status_is_the_member_itself() -> None:
    import monarch.actor  # noqa: F401  (the process's agent)
    from monarch._src.actor import process

    state = process.get()
    queue = state.agent.reply_queue()
    queue.port(7).send(state.client, ReplyStatus.ERROR, [b"a", b"b"])
    queue.port(8).send(state.client, 0, [b"c"])  # a code is accepted too
    first, second = queue.get(timeout=20), queue.get(timeout=20)
    assert isinstance(first, ReplyItem)
    assert (first.index, first.parts) == (7, [b"a", b"b"])
    assert first.status is ReplyStatus.ERROR
    assert second.status is ReplyStatus.OK
    assert repr(first) == "ReplyItem(index=7, status=ReplyStatus.ERROR, parts=2)"
    with pytest.raises(AttributeError):
        first.index = 3  # type: ignore[misc]


def test_a_reply_status_that_is_neither_a_member_nor_a_code_is_refused() -> None:
    import monarch.actor  # noqa: F401
    from monarch._src.actor import process

    state = process.get()
    port = state.agent.reply_queue().port()
    with pytest.raises(ValueError, match=r"a ReplyStatus .* or its code 0, 1, 2 or 3, got 9"):
        port.send(state.client, 9, [b"x"])
    with pytest.raises(TypeError):
        port.send(state.client, "OK", [b"x"])  # type: ignore[arg-type]


def test_cast_takes_a_cast_mode_not_a_string() -> None:
    from monarch.actor import Actor, endpoint, this_proc

    class Echo(Actor):
        @endpoint
        def ping(self) -> int:
            return 1

    mesh = this_proc().spawn("typed_cast", Echo)
    assert mesh.ping.call_one().get(timeout=30) == 1
    with pytest.raises(TypeError, match="CastMode"):
        mesh._handle.cast(None, "ping", [b""], "call")  # type: ignore[arg-type]


def test_an_rdma_region_is_a_named_picklable_record() -> None:
    region = RdmaRegion(pid=11, id=2, addr=0x1000, len=64, key=5, slot=0x2000)
    assert (region.pid, region.id, region.addr, region.len, region.key, region.slot) == (
        11,
        2,
        0x1000,
        64,
        5,
        0x2000,
    )
    assert pickle.loads(pickle.dumps(region)) == region
    assert hash(region) == hash(RdmaRegion(11, 2, 0x1000, 64, 5, 0x2000))
    assert region.with_len(16).len == 16 and region.with_len(16).id == 2
    with pytest.raises(ValueError, match="has only 64 bytes"):
        region.with_len(65)
    memory = bytearray(16)
    addr = ctypes.addressof((ctypes.c_char * 16).from_buffer(memory))
    registered = bindings.rdma_register(addr, 16, memory)
    try:
        assert isinstance(registered, RdmaRegion)
        assert (registered.addr, registered.len, registered.pid) == (addr, 16, os.getpid())
    finally:
        bindings.rdma_deregister(registered.id)


def test_endpoint_kinds_are_named_records_carried_by_mesh_references() -> None:
    from monarch._src.actor.endpoint import EndpointKind
    from monarch.actor import Actor, endpoint, this_proc

    class Kinds(Actor):
        @endpoint
        async def ping(self) -> int:
            return 1

    mesh = this_proc().spawn("kinds", Kinds)
    kind = mesh._endpoints["ping"]  # type: ignore[attr-defined]
    assert kind == EndpointKind(is_async=True, explicit_response_port=False)
    copy = pickle.loads(pickle.dumps(mesh))
    assert copy._endpoints == {"ping": kind}


@pytest.mark.parametrize("name", ["udp", "Unix", ""])
def test_an_unknown_transport_name_lists_the_accepted_ones(name: str) -> None:
    accepted = r'expected "local", "unix" \(or "ipc"\) or "tcp"'
    with pytest.raises(ValueError, match=f'unknown channel transport "{name}": {accepted}'):
        Proc.serve(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=accepted):
        bindings.ProcAgent.bootstrap(name)  # type: ignore[arg-type]


def test_ipc_is_the_unix_transport_everywhere() -> None:
    assert "@unix:" in Proc.serve("ipc").proc_id
