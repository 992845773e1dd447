"""How ``monarch.rdma`` chooses a path, and the TCP path within one machine: a handle
whose owner claims another host is moved over the owner's TCP transfer server (the
same code as between real hosts, which tests/multihost covers), and the settings that
forbid fallback or disable ibverbs give errors that say why and what to do."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from monarch._src.rdma import buffer as impl  # noqa: E402
from monarch._src.rdma import notices  # noqa: E402
from monarch.config import configured  # noqa: E402
from monarch.rdma import (  # noqa: E402
    RDMABuffer,
    RDMATcpFallbackWarning,
    get_rdma_backend,
    is_ibverbs_available,
)

pytestmark = pytest.mark.timeout(60)


def elsewhere(buf: RDMABuffer, **changes: Any) -> RDMABuffer:
    """``buf``'s handle as if its owner ran on another host (or with other fields)."""
    fields = dict(
        owner=buf.owner,
        host="another-host",
        server=buf._server,
        region=buf._region,
        device=buf.device,
        writable=True,
        cuda_handle=None,
        rkey=None,
    )
    fields.update(changes)
    return impl._rebuild(**fields)


def test_a_handle_of_another_host_goes_over_tcp_and_warns_once() -> None:
    src = torch.arange(3 << 20, dtype=torch.int64).view(torch.uint8)
    buf = RDMABuffer(src)
    assert buf.backend == "cma"
    remote = elsewhere(buf)
    assert remote.backend == "tcp"
    notices._warned.discard(RDMATcpFallbackWarning)
    dst = torch.zeros_like(src)
    with pytest.warns(RDMATcpFallbackWarning, match="TCP"):
        remote.read_into(dst).get()
    assert torch.equal(dst, src)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning
        remote.write_from(torch.full((1000,), 3, dtype=torch.uint8)).get()
    assert src[:1000].eq(3).all() and src[1000] == dst[1000]
    remote.drop().get()
    with pytest.raises(RuntimeError, match="dropped"):
        buf.read_into(dst).get()


def test_forbidding_the_fallback_names_both_sides_and_why() -> None:
    buf = RDMABuffer(bytearray(64))
    remote = elsewhere(buf)
    with configured(rdma_allow_tcp_fallback=False):
        assert get_rdma_backend() == ("ibverbs" if is_ibverbs_available() else "none")
        if not is_ibverbs_available():
            assert remote.backend == "none"
            with pytest.raises(RuntimeError) as info:
                remote.read_into(bytearray(64))
            text = str(info.value)
            assert "another-host" in text and buf.owner in text, text
            assert "rdma_allow_tcp_fallback" in text, text
            # Why there is no RDMA device here is part of the message.
            assert "RDMA device" in text, text
        # On one host, cross-memory copies are not a fallback.
        dst = bytearray(64)
        buf.write_from(b"x" * 64).get()
        buf.read_into(dst).get()
        assert dst == b"x" * 64
    buf.drop().get()


def test_disabling_ibverbs_is_reported() -> None:
    with configured(rdma_disable_ibverbs=True):
        assert is_ibverbs_available() is False
        assert get_rdma_backend() == "tcp"
        with configured(rdma_allow_tcp_fallback=False):
            assert get_rdma_backend() == "none"


def test_gpu_memory_of_another_host_is_refused_with_a_fix() -> None:
    buf = RDMABuffer(bytearray(16))
    remote = elsewhere(buf, device="cuda:0")
    assert remote.backend == "none"
    with pytest.raises(RuntimeError, match=r"CUDA memory of another host.*t\.cpu\(\)"):
        remote.read_into(bytearray(16))
    buf.drop().get()
