"""One-sided transfers of registered memory between actors: ``RDMABuffer`` and
``RDMAAction``.

Register CPU or CUDA memory in place with ``RDMABuffer(tensor)``, hand the buffer to
other actors (it pickles to a small reference), and let them ``read_into`` or
``write_from`` it. Transfers between processes of one host are cross-memory copies
(CUDA IPC for GPU memory); between hosts they use ibverbs where both have an RDMA
device, else a TCP path over parallel connections. Guide: [RDMA](../rdma.md).
"""

from monarch._src.rdma.buffer import (
    RDMAAction,
    RDMABuffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from monarch._src.rdma.notices import (
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
)

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
