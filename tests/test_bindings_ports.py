"""Ports of ``monarch._rust_bindings``: byte parts between procs, and picklable refs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Literal

import cloudpickle  # type: ignore[import-untyped]
import pytest

from monarch._rust_bindings import PortRef, Proc


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
