"""The implementation of ``monarch.job``: job specifications, their allocations and the
state cache (see :mod:`monarch._src.job.job`), and torchrun command lines on a job's hosts
(``serve`` and ``SPMDJob``, :mod:`monarch._src.job.spmd`)."""
