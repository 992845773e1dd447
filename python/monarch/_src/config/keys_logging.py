"""The config keys of the section "Logging and telemetry" of docs/config.md: forwarding and
capturing procs' output, log files, and upstream's tracing and metrics layers.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import USIZE, Key, in_group
from monarch._src.config.kinds import BOOL, DURATION, STRING, S

#: The docs section these keys are listed in.
GROUP = "Logging and telemetry"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
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
]
