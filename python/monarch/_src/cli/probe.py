"""Whether a job's hosts answer: the readiness check of ``monarch apply`` (every host
of every mesh starts a proc that answers a call) and the per-host check of ``monarch
status`` (each host answers the first contact)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.future import Future
from monarch._src.actor.proc_mesh import HostMesh, ProcMesh
from monarch._src.job.job import JobState

__all__ = ["HostAnswer", "host_at", "host_names", "probe_hosts", "wait_ready"]


class _Ping(Actor):
    """Answers where it runs."""

    @endpoint
    def where(self) -> str:
        return f"{socket.gethostname()} pid {os.getpid()}"


def wait_ready(state: JobState, timeout: float) -> None:
    """Start a proc on every host of every mesh of ``state`` and call it; raise
    :class:`RuntimeError` naming the mesh that did not answer within ``timeout``
    seconds. The procs are stopped after."""
    deadline = time.monotonic() + timeout
    started: dict[str, ProcMesh] = {}
    try:
        calls: dict[str, Future[Any]] = {}
        for name in state:
            procs = state[name].spawn_procs(name="ready")
            started[name] = procs
            calls[name] = procs.spawn("ready", _Ping).where.call()
        for name, call in calls.items():
            left = max(deadline - time.monotonic(), 0.0)
            try:
                call.get(timeout=left)
            except TimeoutError:
                raise RuntimeError(
                    f"the hosts of mesh {name!r} did not all answer within {timeout:g} s"
                ) from None
            except Exception as e:
                raise RuntimeError(f"the hosts of mesh {name!r} did not answer: {e}") from e
    finally:
        for procs in started.values():
            try:
                procs.stop("readiness checked").get(timeout=30)
            except Exception:
                pass  # a host that did not answer may not stop either


def host_names(mesh: HostMesh) -> list[str]:
    """The hosts of ``mesh`` in row-major order, as their workers' addresses."""
    return [h.removeprefix("worker@") for h in mesh._handle.hosts()]


def host_at(mesh: HostMesh, rank: int) -> HostMesh:
    """The host of row-major ``rank`` in ``mesh``."""
    coordinates: dict[str, int] = {}
    rest = rank
    for label, size in reversed(list(mesh.sizes.items())):
        coordinates[label] = rest % size
        rest //= size
    return mesh.slice(**coordinates) if coordinates else mesh


@dataclass(frozen=True)
class HostAnswer:
    """How one host answered: ``error`` is ``None`` when it did, in ``seconds``."""

    mesh: str
    rank: int
    name: str
    error: str | None
    seconds: float


def probe_hosts(
    connect: Callable[[], JobState], meshes: Mapping[str, int], timeout: float
) -> list[HostAnswer]:
    """Whether each host of ``meshes`` (name: host count) answers within ``timeout``.

    The first contact with attached hosts happens once per mesh object, for the hosts
    it is first asked about: each probe therefore gets meshes of its own, one
    ``connect()`` (the job's ``state()``) per host rank, so that a host that does not
    answer does not hide the others."""
    started = time.monotonic()
    pending: list[tuple[str, int, str, Future[bool]]] = []
    for rank in range(max(meshes.values(), default=0)):
        state = connect()
        for name, count in meshes.items():
            if rank < count:
                mesh = state[name]
                host = host_at(mesh, rank)
                pending.append((name, rank, host_names(mesh)[rank], host.initialized))
    answers: list[HostAnswer] = []
    deadline = started + timeout
    for name, rank, label, probe in pending:
        error: str | None = None
        try:
            probe.get(timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            error = f"no answer within {timeout:g} s"
        except Exception as e:
            error = str(e) or type(e).__name__
        answers.append(HostAnswer(name, rank, label, error, time.monotonic() - started))
    answers.sort(key=lambda a: (list(meshes).index(a.mesh), a.rank))
    return answers
