"""Monarch's actor API: actors, endpoints, meshes of hosts, procs and actors, futures.

Guides: [Getting started](../getting_started.md) and [Supervision](../supervision.md).
"""

from collections.abc import Callable as _Callable
from typing import Any as _Any

from monarch._src.actor import logs as _logs
from monarch._src.actor import supervision as _supervision
from monarch._src.actor.actor import Actor
from monarch._src.actor.actor_mesh import ActorMesh, get_or_spawn_controller
from monarch._src.actor.channel import Accumulator, Channel, Port, PortReceiver, send
from monarch._src.actor.context import (
    Context,
    Instance,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from monarch._src.actor.debugger import debug_controller
from monarch._src.actor.endpoint import (
    Endpoint,
    as_endpoint,
    concurrent_actor,
    concurrent_endpoint,
    endpoint,
)
from monarch._src.actor.errors import ActorError, SupervisionError
from monarch._src.actor.extent import Extent
from monarch._src.actor.future import Future
from monarch._src.actor.gateway import attach
from monarch._src.actor.ids import ProcId, Uid
from monarch._src.actor.point import Point
from monarch._src.actor.proc_mesh import HostMesh, ProcMesh, this_host, this_proc
from monarch._src.actor.runtime import shutdown as _shutdown
from monarch._src.actor.supervision import MeshFailure
from monarch._src.actor.supervision import unhandled_fault_hook as _default_fault_hook
from monarch._src.actor.telemetry import get_meter, span, traced
from monarch._src.actor.value_mesh import ValueMesh
from monarch._src.actor.workers import (
    BootstrapCommand,
    ChannelTransport,
    attach_to_workers,
    default_bootstrap_cmd,
    enable_transport,
    run_worker_loop_forever,
)
from monarch.actor import config

#: Called with each failure that reaches the client unhandled; assign your own function
#: to decide (returning normally handles the failure). The default exits non-zero.
unhandled_fault_hook: _Callable[[MeshFailure], object] = _default_fault_hook

# The runtime reads the two settings users assign here when it needs them.
_supervision.set_fault_hook_source(lambda: unhandled_fault_hook)
_logs.set_prefix_switch(lambda: config.prefix_python_logs_with_actor)


def __getattr__(name: str) -> _Any:
    # The deprecated spellings of earlier releases, given on request but not exported
    # (see monarch._src.actor.legacy).
    if name == "proc_mesh":
        from monarch._src.actor.legacy import proc_mesh

        return proc_mesh
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hosts_from_config(name: str = "hosts") -> HostMesh:
    """Two worker processes on this machine, attached as a 2-host mesh (extent
    ``{"hosts": 2}``): a stand-in for a real cluster, for trying multi-host code on
    one machine (a :class:`monarch.job.ProcessJob`). The workers end with this
    process."""
    # Imported on first use: the job layer is built on this one.
    from monarch._src.job.job import hosts_from_config as start

    return start(name)


def shutdown_context() -> Future[None]:
    """Tear down the client context: stop every proc it spawned. Idempotent; runs at
    interpreter exit too."""
    from monarch._src.actor.future import coroutine_future

    async def stop() -> None:
        _shutdown(timeout=1.0)

    return coroutine_future(stop)


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "SupervisionError",
    "Uid",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_actor",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "span",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]
