"""Starting and stopping this process's part in the mesh.

- The root client (a script, a notebook) bootstraps on first use of the actor API: it
  serves a proc with this machine's host agent (:func:`bootstrap_root`), or, outside
  the cluster, starts its proc attached to a gateway and has no host
  (:mod:`monarch._src.actor.gateway`); then it starts the thread that hosts the actors
  spawned on its own proc, and the thread that judges failures reaching the client
  (:mod:`monarch._src.actor.supervision`).
- A proc spawned by a host runs :func:`serve_child` (``python -m
  monarch._src.actor.bootstrap``): it applies the client's config, serves its proc,
  runs the spawn's bootstrap function, reports ready, and serves until its host asks
  it to stop; then it stops its actors and returns, and the process ends with the
  interpreter's normal (bounded) finalization.

:func:`shutdown` stops every proc this process's host spawned; it runs at interpreter
exit, after the exit learned what became of the procs the program uses and judged the
failures that arrived (:func:`_shutdown_at_exit`).
"""

from __future__ import annotations

import atexit
import base64
import os
import sys
import time

from monarch._rust_bindings import (
    ProcAgent,
    monitor_stack_fd,
    set_call_spin,
    set_channel_settings,
    set_max_frame_len,
)
from monarch._src import config
from monarch._src.actor import (
    code_sync_base,
    cpu_threads,
    cuda_devices,
    extensions,
    logs,
    proc_bind,
    process,
    supervision,
)
from monarch._src.actor.actor_host import run_spawner, stop_all
from monarch._src.actor.pickling import loads
from monarch._src.actor.proc_mesh import (
    BOOTSTRAP_FN_ENV,
    ROOT_PROC_ENV,
    exit_timeout,
    run_bootstrap,
)

__all__ = ["bootstrap_root", "liveness", "serve_child", "shutdown"]


def _seconds(key: str) -> float:
    value = config.get(key)
    return float(value)


def _set_frame_limit() -> None:
    """Give the runtime the config's largest frame, before its first message (spawned
    procs get the client's config, and do the same)."""
    set_max_frame_len(int(config.get("codec_max_frame_length")))


def apply_channel_settings() -> None:
    """Give the runtime the config's channel settings, before its first link (spawned
    procs get the client's config, and do the same): ``message_delivery_timeout``,
    ``channel_tcp_keepalive_idle`` and ``channel_tcp_congestion``; and how long a caller
    spins for its replies, ``call_spin``."""
    set_channel_settings(
        delivery_timeout=_seconds("message_delivery_timeout"),
        tcp_keepalive_idle=_seconds("channel_tcp_keepalive_idle"),
        tcp_congestion=str(config.get("channel_tcp_congestion")).strip() or None,
    )
    set_call_spin(_seconds("call_spin"))


#: A lease that never runs out in practice (``mesh_orphan_timeout=None``): ten years.
NEVER = 10 * 365 * 86400.0


def _first_set(*keys: str) -> str:
    """The first of ``keys`` that is set (see ``config.is_set``), else the first: the
    keys after the first are upstream Monarch's names for the same mechanism."""
    return next((k for k in keys if config.is_set(k)), keys[0])


def heartbeat_timeout() -> float:
    """How long a host may leave heartbeats unanswered, in seconds:
    ``host_heartbeat_timeout``, or upstream's ``supervision_watchdog_timeout`` /
    ``supervision_liveness_timeout`` when only they are set."""
    return _seconds(
        _first_set(
            "host_heartbeat_timeout",
            "supervision_watchdog_timeout",
            "supervision_liveness_timeout",
        )
    )


def client_lease() -> float:
    """How long a worker keeps the procs of a silent client, in seconds:
    ``host_client_lease``, or upstream's ``mesh_orphan_timeout`` when only it is set
    (``None``: never)."""
    value = config.get(_first_set("host_client_lease", "mesh_orphan_timeout"))
    return NEVER if value is None else float(value)


def liveness() -> dict[str, float]:
    """The heartbeat and lease settings of the config, for the agent."""
    return {
        "heartbeat_interval": _seconds("host_heartbeat_interval"),
        "heartbeat_timeout": heartbeat_timeout(),
        "client_lease": client_lease(),
    }


def _register_stack_dumps() -> None:
    """Let the agent dump this process's Python stacks on request, even when a thread
    holds the GIL forever: ``faulthandler`` writes them from its signal handler to a pipe
    the agent reads (see ``hyperactor_mesh::monitor::stack``)."""
    import faulthandler

    try:
        fd, signum = monitor_stack_fd()
        faulthandler.register(signum, file=fd, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as e:  # no pipe, or no such signal here
        sys.stderr.write(f"[monarch] stack dumps are unavailable in this process: {e}\n")


def bootstrap_root() -> process.ProcessState:
    """Create the root client's state (registered with :mod:`process`)."""
    config.warn_ignored_from_env()
    _set_frame_limit()
    apply_channel_settings()
    if process.gateway_address is not None:
        # A client outside the cluster (monarch.actor.attach): its proc is reached
        # through the gateway, and it has no host of its own.
        agent = ProcAgent.attach_root(
            process.gateway_address,
            stop_timeout=_seconds("stop_actor_timeout"),
            **liveness(),
        )
    else:
        agent = ProcAgent.serve_root(
            process.transport_override or str(config.get("default_transport")),
            ready_timeout=_seconds("host_spawn_ready_timeout"),
            stop_timeout=_seconds("stop_actor_timeout"),
            log_dir=str(config.get("proc_log_dir")) or None,
            **liveness(),
        )
    agent.fanout = config.cached("cast_fanout")
    agent.exit_timeout = exit_timeout()
    state = process.ProcessState(agent, is_root=True)
    _register_stack_dumps()
    logs.install_actor_log_prefix()
    # Before the exit hook below, so that its own (flushing the procs' last lines)
    # runs after it.
    logs.start_client_output()
    run_spawner(state)
    supervision.start_root_supervision(state)
    atexit.register(_shutdown_at_exit)
    extensions.client_started(agent)  # the dashboard, when MONARCH_DASHBOARD asks
    return state


def serve_child() -> None:
    """The life of a proc spawned by a host: see the module docs."""
    logs.configure_proc_streams()
    # Before anything could initialize CUDA: this proc's GPU, if its spawn asked.
    cuda_devices.pin_this_proc()
    # Before the runtime starts its threads (they inherit it): CPUs and memory nodes.
    proc_bind.bind_this_proc()
    # Its share of the host's cores, when its spawn started several procs there.
    cpu_threads.share_this_proc()
    config.apply_snapshot_from_env()
    _set_frame_limit()
    apply_channel_settings()
    agent = ProcAgent.bootstrap("auto", stop_timeout=_seconds("stop_actor_timeout"), **liveness())
    agent.fanout = config.cached("cast_fanout")
    agent.exit_timeout = exit_timeout()
    state = process.ProcessState(agent, is_root=False)
    _register_stack_dumps()
    state.root_proc = os.environ.get(ROOT_PROC_ENV)
    process.set_state(state)
    logs.install_actor_log_prefix()
    # breakpoint() and post-mortem in this proc's endpoints: remote pdb sessions the
    # client's `monarch debug` drives.
    from monarch._src.actor.debugger import remote_pdb

    remote_pdb.install()
    code_sync_base.apply_to_this_proc()  # a synced workspace on sys.path
    # Actors spawned here are hosted from now on, so the bootstrap function may spawn
    # and call actors on this proc; the client's spawns still come after it, as they
    # wait for report_ready.
    run_spawner(state)
    blob = os.environ.get(BOOTSTRAP_FN_ENV)
    if blob is not None:
        run_bootstrap(loads(base64.b64decode(blob)))
    agent.report_ready()
    agent.wait_for_stop()
    asked = time.monotonic()
    agent.close_spawns("its host asked it to stop")
    # Graceful: every actor here cancels its concurrent tasks, runs __cleanup__ and is
    # released (finalizers run), bounded by the stop timeout.
    limit = _seconds("stop_actor_timeout")
    stuck = stop_all("its proc is stopping", limit)
    sys.stdout.flush()
    sys.stderr.flush()
    if stuck:
        # An actor's thread still runs its code, which the interpreter's finalization
        # could wait for, or pull the rug from under: the host decided we stop, leave.
        os._exit(0)
    # Returning ends the process with the interpreter's normal finalization, as any
    # Python program ends: atexit handlers and the finalizers (``__del__``,
    # ``weakref.finalize``) of what modules still hold run. Never for longer than what
    # is left of the stop timeout (at least FINALIZE_MIN seconds): past that, a watchdog
    # that needs no Python (faulthandler's) dumps the threads' stacks to stderr and ends
    # the process.
    _bound_finalization(max(FINALIZE_MIN, limit - (time.monotonic() - asked)))


#: The least time a stopping proc's interpreter is given to finalize, in seconds.
FINALIZE_MIN = 2.0


def _bound_finalization(seconds: float) -> None:
    """End this process ``seconds`` from now if it has not ended by then (the stacks of
    its threads go to stderr first: whatever held up the exit)."""
    import faulthandler

    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    except (OSError, RuntimeError, ValueError):  # no usable stderr: leave at once
        os._exit(0)


def _shutdown_at_exit() -> None:
    """The runtime's exit hook: learn what became of the procs the program uses, judge
    the failures that arrived (a raising hook sets exit status 1), then stop the procs
    this process spawned. One thread runs it; another that gets here waits for the
    program to end (see :func:`monarch._src.actor.supervision._exit`)."""
    process.claim_exit(None)  # a failure judged from now on leaves the exit to this thread
    with supervision.exit_sequence:
        state = process.peek()
        if state is not None and state.is_root and not process.is_shut_down():
            _settle(state)
            supervision.drain_at_exit(state)
        try:
            shutdown(timeout=1.0)
        except Exception as e:  # at exit there is nobody left to raise to
            print(f"monarch: shutdown at exit failed: {e!r}", file=sys.stderr)


def _settle(state: process.ProcessState) -> None:
    """Wait until this process knows, for every proc running actors it owns, whether it
    still runs: a proc killed (or whose host was lost) before the program ended has its
    failure judged at exit, every time, not only when its report happened to arrive
    first. Bounded by the time a silent host takes to be found lost."""
    limit = heartbeat_timeout() + 2 * _seconds("host_heartbeat_interval") + 0.5
    try:
        state.agent.settle_owned(limit)
    except Exception as e:  # at exit there is nobody left to raise to
        print(f"monarch: checking the procs at exit failed: {e!r}", file=sys.stderr)


def shutdown(timeout: float = 1.0) -> None:
    """Stop every proc this process spawned (each gets ``timeout`` seconds, then is
    killed). Idempotent."""
    if not process.mark_shut_down():
        return
    state = process.peek()
    if state is None:
        return
    state.agent.close_spawns("the program is ending")
    # The actors of this process (``this_proc().spawn``) stop gracefully too.
    stop_all("the program is ending", timeout)
    state.agent.shutdown_host(timeout)
    ProcAgent.remove_socket_files()


process.set_bootstrapper(bootstrap_root)
