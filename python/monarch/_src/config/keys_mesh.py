"""The config keys of the section "Meshes, procs and actors" of docs/config.md: casts, the
transport, host heartbeats and leases, spawning procs, stopping and cleaning up, and
upstream's allocators.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import POSITIVE, USIZE, Key, in_group
from monarch._src.config.kinds import (
    BOOL,
    DURATION,
    MINUTE,
    MS,
    PORT_RANGE,
    STRING,
    TRANSPORT,
    S,
    optional,
)

#: The docs section these keys are listed in.
GROUP = "Meshes, procs and actors"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
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
            "(never to itself). A process that uses more than 32 hosts sends one heartbeat "
            "per group of 32, which a host of the group relays to the others (see the "
            "hosts guide, 'When a host fails').",
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
]
