"""The config keys: upstream Monarch's documented keys, with their environment variables,
types and defaults, plus this implementation's own (``cast_fanout``, ``host_*``,
``spawn_*``, ...).

Every :class:`Key` either takes effect here or is refused with a reason:

- ``effect`` says what it changes in this implementation (code reads it with
  :func:`monarch._src.config.get` or, on hot paths, ``cached``);
- ``ignored`` says, in one sentence, why it has no meaning in this design: the key is
  still accepted (scripts written for upstream Monarch run), and setting it warns once
  per process (:class:`monarch._src.config.IgnoredSettingWarning`).

Exactly one of the two is set (checked below). docs/config.md is generated from this
table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from monarch._src.config.kinds import (
    BOOL,
    DURATION,
    ENCODING,
    FRACTION,
    MINUTE,
    MS,
    PEM,
    PORT_RANGE,
    SOCKET_ADDR,
    STRING,
    TRANSPORT,
    Encoding,
    Kind,
    S,
    integer,
    optional,
)


@dataclass(frozen=True)
class Key:
    """One config key."""

    #: The keyword of ``configure()``.
    name: str
    #: The environment variable that overrides it.
    env: str
    kind: Kind
    #: The default, in stored form (durations in nanoseconds).
    default: Any
    #: What the key controls (in upstream Monarch, for keys without an ``effect``).
    doc: str
    #: What it changes in this implementation (empty for an ignored key).
    effect: str = ""
    #: Why it has no meaning in this implementation (empty for a key with an effect):
    #: setting it warns once per process, with this reason.
    ignored: str = ""
    #: Whether a spawned proc inherits the client's value (see ``snapshot_for_children``).
    propagate: bool = True
    #: The docs section it is listed in.
    group: str = ""


USIZE = integer()
POSITIVE = integer(1)

_MESH = "Meshes, procs and actors"
_MESSAGES = "Messages and channels"
_LOGS = "Logging and telemetry"
_ADMIN = "Mesh admin server"
_PYTHON = "Python actors and the runtime"
_RDMA = "RDMA"
_TLS = "TLS"
_TENSORS = "Distributed tensors"


def _keys(group: str, *keys: Key) -> list[Key]:
    return [replace(k, group=group) for k in keys]


_ALL = [
    *_keys(
        _MESH,
        Key(
            "cast_fanout",
            "HYPERACTOR_MESH_CAST_FANOUT",
            POSITIVE,
            16,
            "How many procs each node of a cast's tree sends to.",
            effect="How many procs a cast is sent to from each node of its tree (the "
            "sender included): a cast to n actors takes about log_fanout(n) hops.",
        ),
        Key(
            "default_transport",
            "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
            TRANSPORT,
            "unix",
            "The channel transport procs and actors communicate over: a transport name "
            "or an explicit address.",
            effect="What the client's proc serves on (set it with enable_transport() before "
            "any other monarch call): 'unix' (this machine only), 'tcp' (every interface, "
            "advertising this machine's primary IP, for workers on other machines), or an "
            "address 'tcp://IP:PORT' / 'ADVERTISE@BIND'. Spawned procs serve like their "
            "host.",
        ),
        Key(
            "host_heartbeat_interval",
            "MONARCH_HOST_HEARTBEAT_INTERVAL",
            DURATION,
            250 * MS,
            "How often a process sends a heartbeat to each host whose procs it uses.",
            effect="How often a process sends a heartbeat to each host whose procs it uses "
            "(never to itself).",
        ),
        Key(
            "host_heartbeat_timeout",
            "MONARCH_HOST_HEARTBEAT_TIMEOUT",
            DURATION,
            2 * S,
            "How long a host may leave heartbeats unanswered before it counts as lost.",
            effect="How long a host may leave heartbeats unanswered before it counts as "
            "lost and its procs as failed (a cut network, a frozen worker). A killed "
            "worker is found at once: its connections are refused. Also the longest "
            "that stopping procs, HostMesh.shutdown() and the end of the program wait on "
            "a host that stopped answering (one already lost is not waited on).",
        ),
        Key(
            "host_client_lease",
            "MONARCH_HOST_CLIENT_LEASE",
            DURATION,
            10 * S,
            "How long a worker keeps the procs of a client that stopped sending heartbeats.",
            effect="How long a worker keeps the procs of a client on another machine that "
            "sent no heartbeat (it died or was cut off) before it kills them.",
        ),
        Key(
            "spawn_fork_server",
            "MONARCH_SPAWN_FORK_SERVER",
            BOOL,
            True,
            "Whether hosts fork procs from a template process instead of starting a "
            "fresh interpreter for each.",
            effect="When true, each host starts one template interpreter that has already "
            "imported monarch and forks every proc of the default bootstrap command from "
            "it (a spawn of many procs then takes a fraction of the time); false starts a "
            "fresh interpreter per proc. A bootstrap_command other than the default entry "
            "point (or one that differs per proc) starts fresh interpreters.",
        ),
        Key(
            "spawn_fork_server_preload",
            "MONARCH_SPAWN_FORK_SERVER_PRELOAD",
            STRING,
            "auto",
            "Modules the fork server's template imports before forking procs.",
            effect="Modules the template interpreter imports before it forks procs, so "
            "that each proc shares them instead of importing them itself: a comma-"
            "separated list of module names, 'none', or 'auto' (the default: torch, when "
            "the spawning program has imported torch; its import costs each proc seconds "
            "of CPU). A template that preloads takes that time once, when it starts.",
        ),
        Key(
            "spawn_cuda_visible_devices",
            "MONARCH_SPAWN_CUDA_VISIBLE_DEVICES",
            BOOL,
            True,
            "Whether spawn_procs gives each proc of a 'gpus' dimension its own GPU.",
            effect="When true, spawn_procs(per_host={..., 'gpus': N}) sets "
            "CUDA_VISIBLE_DEVICES=i in the proc at gpus coordinate i of each host that "
            "has exactly N GPUs, unless CUDA_VISIBLE_DEVICES is already set (in the "
            "spawning process's environment, the spawn's env= or the host's "
            "environment). Read by the process that spawns.",
        ),
        Key(
            "spawn_cpu_threads",
            "MONARCH_SPAWN_CPU_THREADS",
            BOOL,
            True,
            "Whether procs spawned several to a host share its cores among their torch threads.",
            effect="When true, spawn_procs(per_host=...) with k procs per host gives each "
            "proc max(1, cores // k) torch/OpenMP threads (OMP_NUM_THREADS, and "
            "torch.set_num_threads where the fork server preloaded torch), unless the "
            "spawn binds its procs to CPUs or OMP_NUM_THREADS is already set (in the "
            "spawning process's environment, the spawn's env= or the host's "
            "environment). Read by the process that spawns.",
        ),
        Key(
            "max_cast_dimension_size",
            "HYPERACTOR_MESH_MAX_CAST_DIMENSION_SIZE",
            USIZE,
            2**64 - 1,
            "The largest dimension a cast's shape is folded to, to bound fan-out (the "
            "default means no folding).",
            ignored="A cast here goes down a tree over the mesh's ranks (cast_fanout procs per "
            "node), whatever the shape, so no dimension is folded.",
        ),
        Key(
            "host_spawn_ready_timeout",
            "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT",
            DURATION,
            30 * S,
            "How long a host waits for a spawned proc to report ready (0: forever).",
            effect="How long the host waits for a proc it spawned to report ready before it "
            "counts the spawn as failed; read when the client starts its runtime.",
        ),
        Key(
            "mesh_proc_spawn_max_idle",
            "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE",
            DURATION,
            30 * S,
            "The longest gap between updates while a proc mesh spawns.",
            ignored="Spawning procs here waits for each proc to report ready, bounded by "
            "host_spawn_ready_timeout; there is no stream of updates to time.",
        ),
        Key(
            "proc_stop_max_idle",
            "HYPERACTOR_MESH_PROC_STOP_MAX_IDLE",
            DURATION,
            30 * S,
            "The longest gap between updates while a proc mesh stops.",
            ignored="Stopping procs here waits for each host's answer, bounded by "
            "process_exit_timeout (and by heartbeats for a silent host); there is no stream of "
            "updates to time.",
        ),
        Key(
            "get_proc_state_max_idle",
            "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE",
            DURATION,
            MINUTE,
            "The longest gap between updates while querying hosts for proc states.",
            ignored="Hosts here push proc exits to the owner as events, and heartbeats find a "
            "silent host; no query of proc states waits.",
        ),
        Key(
            "actor_spawn_max_idle",
            "HYPERACTOR_MESH_ACTOR_SPAWN_MAX_IDLE",
            DURATION,
            30 * S,
            "The longest gap between updates while an actor mesh spawns.",
            ignored="ProcMesh.spawn here returns at once and a constructor that fails reaches the "
            "owner as a supervision event; nothing waits for spawn updates.",
        ),
        Key(
            "get_actor_state_max_idle",
            "HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE",
            DURATION,
            30 * S,
            "The longest wait for a proc agent's reply to an actor state query.",
            ignored="Actor failures here reach the owner as supervision events pushed by the proc "
            "agents; no query of actor states waits.",
        ),
        Key(
            "supervision_watchdog_timeout",
            "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT",
            DURATION,
            2 * MINUTE,
            "Silence on an actor mesh's supervision stream for this long means its "
            "controller is unreachable and the mesh unhealthy.",
            effect="An alias of host_heartbeat_timeout, the mechanism that finds silent peers "
            "here (a host that leaves heartbeats unanswered this long counts as lost, and "
            "its procs as failed): when this key is set and host_heartbeat_timeout is not, "
            "it is the heartbeat timeout. Read when a process starts its runtime.",
        ),
        Key(
            "supervision_liveness_timeout",
            "HYPERACTOR_MESH_SUPERVISION_LIVENESS_TIMEOUT",
            DURATION,
            30 * S,
            "An earlier name of supervision_watchdog_timeout, with its earlier default.",
            effect="An alias of host_heartbeat_timeout, like supervision_watchdog_timeout: when "
            "this key is set and neither host_heartbeat_timeout nor "
            "supervision_watchdog_timeout is, it is the heartbeat timeout. Read when a "
            "process starts its runtime.",
        ),
        Key(
            "process_exit_timeout",
            "HYPERACTOR_PROCESS_EXIT_TIMEOUT",
            DURATION,
            10 * S,
            "How long stopping a proc waits for its process to exit.",
            effect="How long stopping procs (ProcMesh.stop(), HostMesh.stop(), an owner that "
            "stops) waits for each proc's process to exit after asking it to stop, before "
            "its host kills it; unset: stop_actor_timeout, the time the proc's actors are "
            "given. Read by the stopping process when it starts its runtime and at each "
            "ProcMesh.stop().",
        ),
        Key(
            "stop_actor_timeout",
            "HYPERACTOR_STOP_ACTOR_TIMEOUT",
            DURATION,
            10 * S,
            "How long a proc mesh waits for an actor to stop.",
            effect="How long stopping a mesh waits for each actor (its owned meshes, __cleanup__"
            " and queued messages) before it is stopped anyway; read when a process "
            "starts its runtime.",
        ),
        Key(
            "cleanup_timeout",
            "HYPERACTOR_CLEANUP_TIMEOUT",
            DURATION,
            3 * S,
            "How long an actor's cleanup callback may run (less than stop_actor_timeout).",
            effect="How long an actor's __cleanup__ may run when it stops (longer: the actor "
            "stops without waiting for it); read at each stop.",
        ),
        Key(
            "mesh_bootstrap_enable_pdeathsig",
            "HYPERACTOR_MESH_BOOTSTRAP_ENABLE_PDEATHSIG",
            BOOL,
            True,
            "Spawned procs get a parent-death signal (SIGKILL), so they die with their host.",
            ignored="Procs here always get a parent-death SIGKILL: the host's guarantee that no "
            "proc outlives it relies on it.",
        ),
        Key(
            "mesh_terminate_concurrency",
            "HYPERACTOR_MESH_TERMINATE_CONCURRENCY",
            USIZE,
            16,
            "How many child processes a host terminates at once during shutdown.",
            ignored="A host here stops all its procs at once, each bounded by its own timeout, so "
            "there is no concurrency to limit.",
        ),
        Key(
            "mesh_terminate_timeout",
            "HYPERACTOR_MESH_TERMINATE_TIMEOUT",
            DURATION,
            10 * S,
            "How long a host waits after SIGTERM before it sends SIGKILL to a child.",
            effect="How long a worker that is ending (SIGTERM or SIGINT, or its client's "
            "HostMesh.shutdown()) gives each of its procs to stop before it kills them. "
            "Read by the worker when it ends and by the client at shutdown().",
        ),
        Key(
            "mesh_orphan_timeout",
            "HYPERACTOR_MESH_ORPHAN_TIMEOUT",
            optional(DURATION),
            60 * S,
            "Actors, procs and hosts whose owner has been unreachable this long stop "
            "themselves (None: never).",
            effect="An alias of host_client_lease, the same mechanism here (a worker kills the "
            "procs of a client that sent no heartbeat for this long; None: never): when "
            "this key is set and host_client_lease is not, it is the lease. Read when a "
            "process starts its runtime.",
        ),
        Key(
            "proc_launcher_kind",
            "HYPERACTOR_MESH_PROC_LAUNCHER_KIND",
            STRING,
            "",
            "Which launcher starts proc processes: 'native' (empty: the default) or 'systemd'.",
            ignored="Procs here are started by their host agent, as child processes or forked "
            "from a template (spawn_fork_server); there is no systemd launcher.",
        ),
        Key(
            "remote_allocator_heartbeat_interval",
            "HYPERACTOR_REMOTE_ALLOCATOR_HEARTBEAT_INTERVAL",
            DURATION,
            5 * MINUTE,
            "The heartbeat interval of the remote process allocator.",
            ignored="There is no remote process allocator here: workers are attached with "
            "attach_to_workers and watched with host_heartbeat_interval.",
        ),
        Key(
            "remote_alloc_bind_to_inaddr_any",
            "HYPERACTOR_REMOTE_ALLOC_BIND_TO_INADDR_ANY",
            BOOL,
            False,
            "Remote process allocators bind every interface (INADDR_ANY) instead of their "
            "host name's address.",
            ignored="There is no remote process allocator here: a worker binds the address given "
            "to run_worker_loop_forever (tcp://0.0.0.0:PORT binds every interface).",
        ),
        Key(
            "remote_alloc_bootstrap_addr",
            "HYPERACTOR_REMOTE_ALLOC_BOOTSTRAP_ADDR",
            STRING,
            "",
            "The address the client serves for remote process allocators to dial back (empty: "
            "chosen from the transport).",
            ignored="There is no remote process allocator here: the client serves where "
            "default_transport (or enable_transport) says and workers dial that address.",
        ),
        Key(
            "remote_alloc_allowed_port_range",
            "HYPERACTOR_REMOTE_ALLOC_ALLOWED_PORT_RANGE",
            optional(PORT_RANGE),
            None,
            "The ports the client may serve on for remote process allocators: "
            "slice(start, stop) or 'START..STOP' (None: any port).",
            ignored="There is no remote process allocator here: the client's port is chosen with "
            "enable_transport('tcp://IP:PORT') and a worker's with its address.",
        ),
    ),
    *_keys(
        _MESSAGES,
        Key(
            "codec_max_frame_length",
            "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
            USIZE,
            10 * 1024**3,
            "The largest serialized message, in bytes.",
            effect="The largest frame (message) a process sends or accepts; read when a process "
            "starts its runtime, and passed to the procs it spawns. Processes that talk "
            "to each other need the same value.",
        ),
        Key(
            "message_delivery_timeout",
            "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
            DURATION,
            30 * S,
            "A message not delivered within this time is returned as undeliverable.",
            effect="A message its destination's proc has not acknowledged within this time, "
            "while nothing moved on the link (the peer is frozen or cut off, or the "
            "connection never completed), fails its link: it and every other message not "
            "yet acknowledged there are returned undeliverable, with an error naming the "
            "address and this key (a proc its host cannot reach so is killed and reported "
            "lost). A slow transfer that keeps moving is not cut. Read when a process "
            "starts its runtime.",
        ),
        Key(
            "message_ack_time_interval",
            "HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL",
            DURATION,
            500 * MS,
            "How often a channel's receiver acknowledges messages.",
            ignored="A channel's receiver here acknowledges frames as soon as they are delivered "
            "(cumulative acknowledgements), so there is no interval to tune.",
        ),
        Key(
            "message_ack_every_n_messages",
            "HYPERACTOR_MESSAGE_ACK_EVERY_N_MESSAGES",
            USIZE,
            1000,
            "A channel's receiver acknowledges at least every this many messages.",
            ignored="A channel's receiver here acknowledges frames as soon as they are delivered "
            "(cumulative acknowledgements), so there is no count to tune.",
        ),
        Key(
            "message_ttl_default",
            "HYPERACTOR_MESSAGE_TTL_DEFAULT",
            integer(0, 255),
            64,
            "The default number of hops a message envelope may take.",
            ignored="Messages here go straight to the destination proc (casts down a tree of "
            "bounded depth), so envelopes carry no hop count.",
        ),
        Key(
            "message_latency_sampling_rate",
            "HYPERACTOR_MESSAGE_LATENCY_SAMPLING_RATE",
            FRACTION,
            0.01,
            "The fraction of messages whose latency is logged.",
            ignored="Every handled message is counted here, its latency in a per-endpoint "
            "histogram the dashboard shows; nothing is sampled.",
        ),
        Key(
            "default_encoding",
            "HYPERACTOR_DEFAULT_ENCODING",
            ENCODING,
            Encoding.Multipart,
            "How message payloads are serialized: Encoding.Bincode, Encoding.Json or "
            "Encoding.Multipart.",
            ignored="Python payloads here are always pickles (protocol 5, large buffers out of "
            "band) and the runtime's own messages have one fixed encoding.",
        ),
        Key(
            "split_max_buffer_size",
            "HYPERACTOR_SPLIT_MAX_BUFFER_SIZE",
            USIZE,
            5,
            "How many updates a split port buffers before reducing them.",
            ignored="Replies to a cast here are reduced by the nodes of its tree as they arrive; "
            "there are no split ports that buffer updates.",
        ),
        Key(
            "split_max_buffer_age",
            "HYPERACTOR_SPLIT_MAX_BUFFER_AGE",
            DURATION,
            50 * MS,
            "The longest an update stays buffered in a split port before it is reduced.",
            ignored="Replies to a cast here are reduced by the nodes of its tree as they arrive; "
            "there are no split ports that buffer updates.",
        ),
        Key(
            "channel_net_rx_buffer_full_check_interval",
            "HYPERACTOR_CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
            DURATION,
            5 * S,
            "How often a network receiver checks whether its buffer is full.",
            ignored="A receiver here that stops taking frames stops reading its socket, which "
            "holds the sender to its byte budget; nothing polls for a full buffer.",
        ),
        Key(
            "channel_tcp_keepalive_idle",
            "HYPERACTOR_CHANNEL_TCP_KEEPALIVE_IDLE",
            DURATION,
            60 * S,
            "Idle time before the kernel's first TCP keepalive probe on a channel.",
            effect="How long a TCP connection of a channel may be idle before the kernel sends "
            "its first keepalive probe (then one every 5 s, 3 in all: a dead peer is "
            "found within this time + 15 s even when nothing is sent). Read when a "
            "process starts its runtime; applies to connections made after.",
        ),
        Key(
            "channel_tcp_congestion",
            "HYPERACTOR_CHANNEL_TCP_CONGESTION",
            STRING,
            "",
            "The TCP congestion control algorithm of channel connections, such as 'bbr' "
            "(empty: the system's default).",
            effect="The congestion control of every TCP connection of a channel this process "
            "makes or accepts ('bbr', 'cubic', 'reno'...; empty: the kernel's default). A "
            "name the kernel refuses leaves its default and logs one warning. Read when a "
            "process starts its runtime; applies to connections made after.",
        ),
        Key(
            "channel_reconnect_timeout",
            "HYPERACTOR_CHANNEL_RECONNECT_TIMEOUT",
            DURATION,
            60 * S,
            "How long a channel link retries a failed connection before it closes.",
            ignored="Links here never reconnect: a link whose connection fails is dead at once "
            "and its unacknowledged messages are returned undeliverable.",
        ),
        Key(
            "enable_dest_actor_reordering_buffer",
            "HYPERACTOR_ENABLE_DEST_ACTOR_REORDERING_BUFFER",
            BOOL,
            False,
            "Reorder messages per destination actor on receipt.",
            ignored="Messages from one sender to one actor are always delivered in order here "
            "(one ordered link per pair of procs, sequenced casts), so no reordering buffer "
            "exists.",
        ),
        Key(
            "sequencer_max_locked_keys",
            "HYPERACTOR_SEQUENCER_MAX_LOCKED_KEYS",
            POSITIVE,
            128,
            "How many destinations the message sequencer assigns under one lock.",
            ignored="The cast sequencer here numbers messages per sender and target actor, with "
            "no lock over destinations to bound.",
        ),
        Key(
            "terminated_snapshot_retention",
            "HYPERACTOR_TERMINATED_SNAPSHOT_RETENTION",
            USIZE,
            100,
            "How many snapshots of terminated actors a proc keeps for introspection.",
            ignored="The admin server here (the dashboard) records the end of each actor in its "
            "event log instead of keeping snapshots of terminated actors.",
        ),
        Key(
            "server_heartbeat_interval",
            "HYPERACTOR_SERVER_HEARTBEAT_INTERVAL",
            DURATION,
            S,
            "How often a channel server emits its liveness metric.",
            ignored="Channel servers here emit no liveness metric; hosts' liveness is checked "
            "with host heartbeats (host_heartbeat_interval).",
        ),
        Key(
            "forwarder_flush_timeout",
            "HYPERACTOR_FORWARDER_FLUSH_TIMEOUT",
            DURATION,
            5 * S,
            "How long a proc's forwarder waits for acknowledgements when it shuts down.",
            ignored="Procs here have no forwarder: each sends straight to the destination proc, "
            "and unacknowledged messages are bounded by message_delivery_timeout.",
        ),
        Key(
            "small_write_threshold",
            "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
            USIZE,
            64 << 10,
            "Pickled buffers smaller than this many bytes are copied; larger ones are "
            "sent without a copy.",
            effect="Buffers of at least this many bytes in a message (NumPy arrays, CPU "
            "tensors, top-level bytes arguments and return values) travel out of band, as "
            "message parts of their own, instead of being copied into the pickle (64 KiB "
            "by default here; 256 in upstream Monarch). Read at each message.",
        ),
    ),
]

_ALL += [
    *_keys(
        _LOGS,
        Key(
            "enable_log_forwarding",
            "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING",
            BOOL,
            True,
            "Forward spawned procs' stdout and stderr to the client over the mesh.",
            effect="When true (the default here; false in upstream Monarch), the stdout "
            "and stderr of the procs a process spawns are sent to it as messages and "
            "written, prefixed [mesh rank], through its sys.stdout and sys.stderr; "
            "ProcMesh.logging_option then controls streaming and aggregation. When false, "
            "each host prints them on its own stdout and stderr. Read when procs are "
            "spawned (see docs/logging.md).",
        ),
        Key(
            "enable_file_capture",
            "HYPERACTOR_MESH_ENABLE_FILE_CAPTURE",
            BOOL,
            True,
            "Also write spawned procs' stdout and stderr to per-host files.",
            effect="When true (the default here; false in upstream Monarch), the host "
            "of each proc writes everything the proc prints to a file of its own, "
            "<proc_log_dir>/<mesh>-<rank>-<pid>.log. Read when procs are spawned.",
        ),
        Key(
            "proc_log_dir",
            "MONARCH_PROC_LOG_DIR",
            STRING,
            "",
            "Where hosts write the per-proc log files.",
            effect="The directory of the per-proc log files on a host; empty: "
            "$TMPDIR/monarch-<user>/logs (/tmp when TMPDIR is unset). Read by the client "
            "(for this machine's host) and by each worker when it starts.",
        ),
        Key(
            "tail_log_lines",
            "HYPERACTOR_MESH_TAIL_LOG_LINES",
            USIZE,
            20,
            "How many recent lines of each proc's output are kept in memory (upstream "
            "Monarch's default: 0).",
            effect="How many of the last lines of each proc's stderr its host keeps, shown in "
            "the error of a spawn whose proc exited before it was ready (20 by default "
            "here; 0, none, in upstream Monarch). Read when procs are spawned.",
        ),
        Key(
            "read_log_buffer",
            "HYPERACTOR_READ_LOG_BUFFER",
            USIZE,
            100,
            "How many log lines are read before they are flushed to the client.",
            ignored="A host here sends its procs' lines in batches of at most 10 ms or 1000 "
            "lines, which is not configurable.",
        ),
        Key(
            "force_file_log",
            "HYPERACTOR_FORCE_FILE_LOG",
            BOOL,
            False,
            "Write and aggregate log files even for local runs.",
            ignored="Hosts here write a log file per proc whenever enable_file_capture is true, "
            "for local runs too.",
        ),
        Key(
            "prefix_with_rank",
            "HYPERACTOR_PREFIX_WITH_RANK",
            BOOL,
            True,
            "Prefix forwarded log lines with the rank of the proc that wrote them.",
            effect="When true, each forwarded line is shown as '[<proc mesh> <rank>] "
            "<line>'. Read when the client starts.",
        ),
        Key(
            "file_log_level",
            "MONARCH_FILE_LOG",
            STRING,
            "",
            "The level of Monarch's file log: debug, info, warn or error (empty: info).",
            ignored="The runtime here writes no log file of its own: its warnings and errors go "
            "to stderr (and so to each proc's log file); MONARCH_LOG or RUST_LOG sets their "
            "level.",
        ),
        Key(
            "monarch_log_suffix",
            "MONARCH_LOG_SUFFIX",
            STRING,
            "",
            "A suffix for log file names.",
            ignored="The runtime here writes no log file of its own; the per-proc log files are "
            "named <mesh>-<rank>-<pid>.log under proc_log_dir.",
        ),
        Key(
            "enable_otel_tracing",
            "ENABLE_OTEL_TRACING",
            BOOL,
            True,
            "Enable the OpenTelemetry tracing layer.",
            ignored="This implementation has no OpenTelemetry layer; the dashboard "
            "(MONARCH_DASHBOARD) and monarch.monitoring show its state.",
        ),
        Key(
            "enable_otel_metrics",
            "ENABLE_OTEL_METRICS",
            BOOL,
            True,
            "Enable the OpenTelemetry metrics layer.",
            ignored="This implementation has no OpenTelemetry layer; the dashboard serves its "
            "metrics (see docs/monitoring.md).",
        ),
        Key(
            "otel_metric_export_interval",
            "OTEL_METRIC_EXPORT_INTERVAL",
            DURATION,
            10 * S,
            "How often OpenTelemetry metrics are exported.",
            ignored="This implementation has no OpenTelemetry layer, so no metrics are exported.",
        ),
        Key(
            "enable_recorder_tracing",
            "ENABLE_RECORDER_TRACING",
            BOOL,
            True,
            "Enable the in-memory trace recorder.",
            ignored="This implementation has no in-memory trace recorder; the dashboard's event "
            "log records what happened.",
        ),
        Key(
            "enable_sqlite_tracing",
            "ENABLE_SQLITE_TRACING",
            BOOL,
            False,
            "Enable the SQLite tracing layer.",
            ignored="This implementation has no SQLite tracing layer.",
        ),
        Key(
            "scuba_log_enter_exit",
            "SCUBA_LOG_ENTER_EXIT",
            BOOL,
            False,
            "Log span enter and exit events to Scuba.",
            ignored="This implementation logs nothing to Scuba.",
        ),
        Key(
            "use_unified_layer",
            "USE_UNIFIED_LAYER",
            BOOL,
            False,
            "Use the unified tracing layer.",
            ignored="This implementation has no unified tracing layer.",
        ),
    ),
    *_keys(
        _ADMIN,
        Key(
            "dashboard",
            "MONARCH_DASHBOARD",
            STRING,
            "",
            "Start the admin server and dashboard when the program first uses the actor API.",
            effect="Empty or '0': off. '1' (or 'true'): serve on the loopback interface, a "
            "free port. 'HOST:PORT': serve there. The URL, with its token, is printed to "
            "stderr. Read by the client when it starts (see docs/monitoring.md).",
            propagate=False,
        ),
        Key(
            "dashboard_report",
            "MONARCH_DASHBOARD_REPORT",
            STRING,
            "",
            "Where to write a post-mortem HTML report when the program ends on a failure.",
            effect="A file path; empty: no report. When the client ends the program "
            "because of an unhandled failure, it writes one self-contained HTML page of "
            "the last state there (health, failures with their causes, the tree, events, "
            "the failed procs' last lines).",
            propagate=False,
        ),
        Key(
            "mesh_admin_addr",
            "HYPERACTOR_MESH_ADMIN_ADDR",
            SOCKET_ADDR,
            "[::]:1729",
            "The address the mesh admin HTTP server binds to.",
            effect="Where the dashboard serves when dashboard (MONARCH_DASHBOARD) is '1' or "
            "'true', if this key is set (unset: the loopback interface, a free port; "
            "binding every interface, as the default '[::]:1729' would, needs asking for). "
            "Read when the client starts.",
        ),
        Key(
            "mesh_attach_config_timeout",
            "HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT",
            DURATION,
            10 * S,
            "How long attaching to running hosts waits for them to take the client's "
            "config (best effort).",
            effect="How long attach_to_workers(...).initialized waits for each worker to "
            "answer before it fails naming the worker.",
        ),
        Key(
            "mesh_admin_resolve_actor_timeout",
            "HYPERACTOR_MESH_ADMIN_RESOLVE_ACTOR_TIMEOUT",
            DURATION,
            200 * MS,
            "The admin server's budget for a fallback query to a recently stopped actor.",
            ignored="The admin server here (the dashboard) does not query stopped actors: an "
            "actor that ended appears in its event log.",
        ),
        Key(
            "mesh_admin_max_concurrent_resolves",
            "HYPERACTOR_MESH_ADMIN_MAX_CONCURRENT_RESOLVES",
            USIZE,
            2,
            "How many resolve requests the admin server forwards at once.",
            ignored="The admin server here (the dashboard) shares one snapshot collection among "
            "concurrent requests (reused for 250 ms) instead of forwarding resolves.",
        ),
        Key(
            "mesh_admin_single_host_timeout",
            "HYPERACTOR_MESH_ADMIN_SINGLE_HOST_TIMEOUT",
            DURATION,
            3 * S,
            "The admin server's budget for a query to one host.",
            ignored="The admin server here (the dashboard) gives each host a fixed 1 s to answer "
            "a snapshot; one that does not appears with what the client knows of it.",
        ),
        Key(
            "mesh_admin_query_child_timeout",
            "HYPERACTOR_MESH_ADMIN_QUERY_CHILD_TIMEOUT",
            DURATION,
            100 * MS,
            "The admin server's budget for one child snapshot lookup.",
            ignored="The admin server here (the dashboard) gives each proc a fixed 300 ms to "
            "answer a snapshot; one that does not appears with what its host knows.",
        ),
        Key(
            "mesh_admin_config_dump_bridge_timeout",
            "HYPERACTOR_MESH_ADMIN_CONFIG_DUMP_BRIDGE_TIMEOUT",
            DURATION,
            5 * S,
            "The admin server's budget for a proc's config dump.",
            ignored="The admin server here (the dashboard) serves no per-proc config dumps.",
        ),
        Key(
            "mesh_admin_tree_timeout",
            "HYPERACTOR_MESH_ADMIN_TREE_TIMEOUT",
            DURATION,
            10 * S,
            "The admin server's budget for a dump of the whole mesh tree.",
            ignored="The admin server here (the dashboard) gathers a snapshot of the whole tree "
            "within a fixed 5 s.",
        ),
        Key(
            "mesh_admin_pyspy_timeout",
            "HYPERACTOR_MESH_ADMIN_PYSPY_TIMEOUT",
            DURATION,
            10 * S,
            "How long a py-spy stack dump may run.",
            ignored="Stack dumps here come from each process's own faulthandler, not py-spy, and "
            "are bounded by a fixed 10 s.",
        ),
        Key(
            "mesh_admin_pyspy_bridge_timeout",
            "HYPERACTOR_MESH_ADMIN_PYSPY_BRIDGE_TIMEOUT",
            DURATION,
            13 * S,
            "The admin server's budget for a py-spy request (more than mesh_admin_pyspy_timeout).",
            ignored="Stack dumps here come from each process's own faulthandler, not py-spy, and "
            "are bounded by a fixed 10 s.",
        ),
        Key(
            "mesh_admin_pyspy_client_timeout",
            "HYPERACTOR_MESH_ADMIN_PYSPY_CLIENT_TIMEOUT",
            DURATION,
            20 * S,
            "An admin client's budget for a py-spy request (more than "
            "mesh_admin_pyspy_bridge_timeout).",
            ignored="Stack dumps here come from each process's own faulthandler, not py-spy, and "
            "are bounded by a fixed 10 s.",
        ),
        Key(
            "pyspy_bin",
            "PYSPY_BIN",
            STRING,
            "",
            "The py-spy binary to run (empty: py-spy from PATH).",
            ignored="Stack dumps here come from each process's own faulthandler; no py-spy binary "
            "is run.",
        ),
    ),
]

_ALL += [
    *_keys(
        _PYTHON,
        Key(
            "tokio_worker_threads",
            "MONARCH_TOKIO_WORKER_THREADS",
            optional(POSITIVE),
            None,
            "The number of worker threads of a process's tokio runtime (None: the "
            "implementation's choice).",
            effect="Read from the environment variable only, when a process starts its "
            "runtime: its number of tokio worker threads (unset: 2 in the client, 1 in "
            "spawned procs). configure() cannot change a runtime that has started.",
        ),
        Key(
            "shared_asyncio_runtime",
            "HYPERACTOR_SHARED_ASYNCIO_RUNTIME",
            BOOL,
            False,
            "Run all Python actors of a process on one asyncio event loop.",
            ignored="Each Python actor here has its own thread, and an async actor its own "
            "asyncio loop on it, which keeps one actor's blocking code from stalling the others.",
        ),
        Key(
            "actor_queue_dispatch",
            "MONARCH_ACTOR_QUEUE_DISPATCH",
            BOOL,
            False,
            "Dispatch messages to Python actors through a queue.",
            ignored="Messages always reach Python actors here through the actor's own ordered "
            "queue, read by its thread.",
        ),
    ),
    *_keys(
        _RDMA,
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
    *_keys(
        _TENSORS,
        Key(
            "tensor_collective_timeout",
            "MONARCH_TENSOR_COLLECTIVE_TIMEOUT",
            DURATION,
            60 * S,
            "How long a collective, a to_mesh transfer or a process group's rendezvous "
            "of the tensor engine waits for its peers.",
            effect="How long a tensor worker waits for the other ranks of a collective "
            "(reduce, a process group's rendezvous) or for the sender of a to_mesh "
            "transfer before the command fails (RemoteException naming the ranks); "
            "read when a worker creates a process group or waits for a transfer.",
        ),
        Key(
            "tensor_engine_start_timeout",
            "MONARCH_TENSOR_ENGINE_START_TIMEOUT",
            DURATION,
            120 * S,
            "How long the first activation of a mesh waits for its tensor workers.",
            effect="How long the first use of a mesh for tensors waits for its tensor "
            "workers to start (an error names the mesh after it).",
        ),
    ),
    *_keys(
        _TLS,
        Key(
            "hyperactor_tls_ca",
            "HYPERACTOR_TLS_CA",
            PEM,
            "/etc/hyperactor/tls/ca.crt",
            "The CA certificate of the tls transport: a path or PEM text. Not passed "
            "to spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_CA and MONARCH_TLS_KEY "
            "(see docs/security.md).",
        ),
        Key(
            "hyperactor_tls_cert",
            "HYPERACTOR_TLS_CERT",
            PEM,
            "/etc/hyperactor/tls/tls.crt",
            "The certificate of the tls transport: a path or PEM text. Not passed to "
            "spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_KEY and MONARCH_TLS_CERT "
            "(see docs/security.md).",
        ),
        Key(
            "hyperactor_tls_key",
            "HYPERACTOR_TLS_KEY",
            PEM,
            "/etc/hyperactor/tls/tls.key",
            "The private key of the tls transport: a path or PEM text. Not passed to "
            "spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_KEY (see "
            "docs/security.md).",
        ),
    ),
]

#: Every key, by name, in docs order.
KEYS: dict[str, Key] = {k.name: k for k in _ALL}
#: The docs sections, in order.
GROUPS = [_MESH, _MESSAGES, _LOGS, _ADMIN, _PYTHON, _RDMA, _TENSORS, _TLS]

assert len(KEYS) == len(_ALL), "duplicate config key"
assert all(bool(k.effect) != bool(k.ignored) for k in _ALL), (
    "every config key has an effect or a reason it is ignored, not both: "
    + ", ".join(k.name for k in _ALL if bool(k.effect) == bool(k.ignored))
)
assert len({k.env for k in _ALL}) == len(_ALL), "duplicate config environment variable"
