"""The implementation of :mod:`monarch.rdma` (see :mod:`monarch._src.rdma.buffer`)."""
