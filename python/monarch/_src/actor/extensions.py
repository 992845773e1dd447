"""What the actor layer asks of the layers built on it, and where they register it.

The actor layer is the floor of the package: it imports nothing above it. Yet some of its
public API belongs to higher layers — ``ProcMesh.activate()`` and an endpoint called with
distributed tensors are the tensor engine's, a client's start may start the monitoring
dashboard, an unhandled failure writes the post-mortem report. Those go through the
registration points here: a higher layer (or :mod:`monarch._src.wiring`, which connects
the layers when ``monarch`` is imported) fills them, and the actor layer calls what was
registered.

A provider is registered as a function that returns it, called on first use, so that a
layer that imports ``torch`` (the tensor engine) is imported only when a program uses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TensorEngine",
    "client_started",
    "enable_tensor_arguments",
    "on_client_started",
    "on_unhandled_failure",
    "provide_tensor_engine",
    "tensor_engine",
    "tensor_engine_if_tensors",
    "unhandled_failure",
]


@dataclass(frozen=True)
class TensorEngine:
    """The tensor engine's part of the actor API (see ``monarch._src.tensor_engine``)."""

    #: ``ProcMesh.activate()``: make the mesh the active one; returns the context manager.
    activate: Callable[[Any], Any]
    #: ``ProcMesh.deactivate()``.
    deactivate: Callable[[Any], None]
    #: ``ProcMesh.rank_tensor(dims)``.
    rank_tensor: Callable[[Any, str | Sequence[str]], Any]
    #: ``ProcMesh.process_group(dims)``.
    process_group: Callable[[Any, str | Sequence[str]], Any]
    #: ``ProcMesh.to_table()``.
    to_table: Callable[[Any], str]
    #: Whether an endpoint call's arguments hold distributed tensors.
    has_tensors: Callable[[tuple[Any, ...], dict[str, Any]], bool]
    #: Run an endpoint call whose arguments hold distributed tensors:
    #: ``call(endpoint, adverb, args, kwargs)``.
    call: Callable[[Any, str, tuple[Any, ...], dict[str, Any]], Any]
    #: ``Endpoint.rref(*args, **kwargs)``: ``rref(endpoint, args, kwargs)``.
    rref: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
    #: The arguments of ``proc_mesh.spawn(name, cls, *args, **kwargs)`` with each
    #: distributed tensor replaced by what gives each actor its local shard:
    #: ``spawn_args(proc_mesh, name, class_name, args, kwargs) -> (args, kwargs)``.
    spawn_args: Callable[
        [Any, str, str, tuple[Any, ...], dict[str, Any]],
        tuple[tuple[Any, ...], dict[str, Any]],
    ]


_lock = threading.Lock()
_engine: TensorEngine | None = None
_engine_provider: Callable[[], TensorEngine] | None = None
_tensor_arguments = False
_client_started: list[Callable[[Any], None]] = []
_unhandled_failure: list[Callable[[], None]] = []


def provide_tensor_engine(provider: Callable[[], TensorEngine]) -> None:
    """Register the function that gives the tensor engine's part (called on first use,
    so that torch is imported only by programs that use distributed tensors);
    :mod:`monarch._src.wiring` does this when ``monarch`` is imported."""
    global _engine_provider
    with _lock:
        _engine_provider = provider


def tensor_engine() -> TensorEngine:
    """The tensor engine, imported on first use."""
    global _engine
    if _engine is not None:
        return _engine
    provider = _engine_provider
    if provider is None:
        raise RuntimeError(
            "distributed tensors are not available in this process: the tensor engine "
            "was never registered (import monarch first; it registers the engine)"
        )
    engine = provider()
    with _lock:
        _engine = engine
    return engine


def enable_tensor_arguments() -> None:
    """From now on, the arguments of an endpoint call may hold distributed tensors: the
    module that defines them calls this when it is imported."""
    global _tensor_arguments
    _tensor_arguments = True


def tensor_engine_if_tensors() -> TensorEngine | None:
    """The tensor engine if distributed tensors exist in this process, else ``None``,
    without importing anything (no value can hold one before their module is imported)."""
    if not _tensor_arguments:
        return None
    return tensor_engine()


def on_client_started(hook: Callable[[Any], None]) -> None:
    """Call ``hook(agent)`` each time this process starts its root client (after the
    runtime is up), with the client's :class:`~monarch._rust_bindings.ProcAgent`."""
    with _lock:
        _client_started.append(hook)


def client_started(agent: Any) -> None:
    """Run the hooks of :func:`on_client_started` (the runtime calls this)."""
    with _lock:
        hooks = list(_client_started)
    for hook in hooks:
        hook(agent)


def on_unhandled_failure(hook: Callable[[], None]) -> None:
    """Call ``hook()`` when an unhandled failure is about to end the program (the fault
    hook raised); it must not raise."""
    with _lock:
        _unhandled_failure.append(hook)


def unhandled_failure() -> None:
    """Run the hooks of :func:`on_unhandled_failure` (supervision calls this)."""
    with _lock:
        hooks = list(_unhandled_failure)
    for hook in hooks:
        hook()
