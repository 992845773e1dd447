"""The config keys of the section "RDMA" of docs/config.md: the TCP fallback, ibverbs
devices and upstream's queue and registration settings.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import POSITIVE, USIZE, Key, in_group
from monarch._src.config.kinds import BOOL, DURATION, STRING, S, optional

#: The docs section these keys are listed in.
GROUP = "RDMA"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
        Key(
            "rdma_allow_tcp_fallback",
            "MONARCH_RDMA_ALLOW_TCP_FALLBACK",
            BOOL,
            True,
            "Between hosts without a common RDMA device, transfers stream over TCP "
            "connections to the owner's transfer server (when false they fail, naming "
            "both sides). Transfers within one host never need it.",
            effect="Read at each transfer: between hosts without a common RDMA device, false "
            "makes it raise RuntimeError naming both sides (same-host copies are never a "
            "fallback).",
        ),
        Key(
            "rdma_disable_ibverbs",
            "MONARCH_RDMA_DISABLE_IBVERBS",
            BOOL,
            False,
            "Do not use ibverbs even where the hardware is present.",
            effect="Read at each registration and transfer: true makes get_rdma_backend() and "
            "buffers ignore RDMA devices.",
        ),
        Key(
            "rdma_max_chunk_size_mb",
            "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
            USIZE,
            64,
            "The largest piece one request of a TCP-path RDMA transfer moves, in MiB.",
            effect="The largest piece one request of a TCP-path transfer moves.",
        ),
        Key(
            "rdma_tcp_fallback_parallelism",
            "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM",
            USIZE,
            4,
            "How many parallel connections a TCP-path transfer uses at most (upstream "
            "Monarch's default is 1).",
            effect="How many pooled connections a TCP-path transfer is split over (default 4 "
            "here; upstream's is 1).",
        ),
        Key(
            "rdma_ibverbs_target",
            "MONARCH_RDMA_IBVERBS_TARGET",
            STRING,
            "",
            "The ibverbs device to use: cpu:<numa>, gpu:<ordinal> or nic:<name> "
            "(empty: automatic).",
            ignored="The ibverbs backend here uses one device per process: the first one, or the "
            "one MONARCH_RDMA_IBVERBS_DEVICE names.",
        ),
        Key(
            "rdma_peer_device_affinity",
            "MONARCH_RDMA_PEER_DEVICE_AFFINITY",
            STRING,
            "",
            "Which peer NICs a local NIC pairs with: any, match_name or groups:... (empty: any).",
            ignored="The ibverbs backend here uses one device per process "
            "(MONARCH_RDMA_IBVERBS_DEVICE), so there is no pairing of NICs to choose.",
        ),
        Key(
            "rdma_max_nics_per_buffer",
            "MONARCH_RDMA_MAX_NICS_PER_BUFFER",
            optional(POSITIVE),
            1,
            "On how many NICs a buffer is registered at most (None: no limit).",
            ignored="The ibverbs backend here registers each buffer on its process's one device.",
        ),
        Key(
            "rdma_qps_per_cq",
            "MONARCH_RDMA_QPS_PER_CQ",
            POSITIVE,
            1,
            "How many queue pairs share a completion queue.",
            ignored="The ibverbs backend here gives each connection its own completion queue, so "
            "a transfer only sees its own completions.",
        ),
        Key(
            "rdma_runtime_worker_threads",
            "MONARCH_RDMA_RUNTIME_WORKER_THREADS",
            USIZE,
            16,
            "Worker threads of the RDMA data-plane runtime (fixed at first RDMA use).",
            ignored="RDMA transfers here run on the process's own runtime (tokio_worker_threads); "
            "there is no separate data-plane runtime.",
        ),
        Key(
            "rdma_qp_init_timeout",
            "MONARCH_RDMA_QP_INIT_TIMEOUT",
            DURATION,
            30 * S,
            "Each side's budget for setting up a queue pair.",
            ignored="Setting up a queue pair here is bounded by the transfer's own deadline.",
        ),
        Key(
            "rdma_cq_busy_poll_window",
            "MONARCH_RDMA_CQ_BUSY_POLL_WINDOW",
            optional(DURATION),
            None,
            "How long a completion queue poll loop yields before it backs off to "
            "sleeping (None: it never sleeps).",
            ignored="The ibverbs backend here polls a completion queue until its transfer "
            "completes, yielding the CPU after a fixed number of empty polls.",
        ),
        Key(
            "rdma_mr_lru_cache_size",
            "MONARCH_RDMA_MR_LRU_CACHE_SIZE",
            USIZE,
            1024,
            "How many registered memory regions each process caches.",
            ignored="Memory registrations here are cached by range and reference-counted, "
            "released when the buffer is, so no LRU bound applies.",
        ),
    ),
]
