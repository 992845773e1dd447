"""The implementation of ``monarch.job``: job specifications, their allocations and the
state cache (see :mod:`monarch._src.job.job`)."""
