"""The entry point of a proc spawned by a host agent:
``python -m monarch._src.actor.bootstrap`` (see
:func:`monarch._src.actor.runtime.serve_child`)."""

from __future__ import annotations

# The modules of the actor API (the ones ``monarch.actor`` re-exports): a proc needs them
# once it unpickles its first actor, and the fork server's template preloads them.
from monarch._src.actor import (  # noqa: F401
    actor,
    actor_mesh,
    channel,
    context,
    debugger,
    endpoint,
    errors,
    future,
    proc_mesh,
    supervision,
    telemetry,
    value_mesh,
    workers,
)
from monarch._src.actor.runtime import serve_child

if __name__ == "__main__":
    serve_child()
