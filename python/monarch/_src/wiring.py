"""Connects the layers of ``monarch._src``: fills the registration points of the actor
layer (:mod:`monarch._src.actor.extensions`) with the layers above it.

Imported by ``monarch`` itself (whose ``__init__`` runs before any module of the package),
so the connections hold whatever a program imports first. Nothing heavy is imported here:
each connection imports its layer when it is first used (the tensor engine imports
torch).
"""

from __future__ import annotations

from typing import Any

from monarch._src.actor import extensions

__all__: list[str] = []


def _tensor_engine() -> extensions.TensorEngine:
    """The tensor engine's part of the actor API. Its package, imported first, says
    what to install when torch is missing."""
    from monarch._src.tensor_engine.client import api, interop, tensor

    return extensions.TensorEngine(
        activate=tensor.activate,
        deactivate=tensor.deactivate,
        rank_tensor=api.rank_tensor,
        process_group=lambda mesh, dims: api.RemoteProcessGroup(dims, mesh),
        to_table=api.to_table,
        has_tensors=interop.has_tensors,
        call=interop.call,
        rref=interop.rref,
        spawn_args=interop.spawn_args,
    )


def _start_dashboard(agent: Any) -> None:
    from monarch._src.monitoring.dashboard import start_from_config

    start_from_config(agent)  # when MONARCH_DASHBOARD asks


def _write_postmortem() -> None:
    from monarch._src.monitoring.postmortem import write_postmortem

    write_postmortem()  # when MONARCH_DASHBOARD_REPORT names a file; never raises


extensions.provide_tensor_engine(_tensor_engine)
extensions.on_client_started(_start_dashboard)
extensions.on_unhandled_failure(_write_postmortem)
