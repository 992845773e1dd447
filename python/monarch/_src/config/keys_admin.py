"""The config keys of the section "Mesh admin server" of docs/config.md: the dashboard, its
post-mortem report, and upstream's admin server budgets and py-spy.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import USIZE, Key, in_group
from monarch._src.config.kinds import DURATION, MS, SOCKET_ADDR, STRING, S

#: The docs section these keys are listed in.
GROUP = "Mesh admin server"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
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
