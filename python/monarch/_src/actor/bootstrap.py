"""The entry point of a proc spawned by a host agent:
``python -m monarch._src.actor.bootstrap`` (see
:func:`monarch._src.actor.runtime.serve_child`)."""

from __future__ import annotations

# Importing the public module registers everything the runtime needs (config, hooks).
import monarch.actor  # noqa: F401
from monarch._src.actor.runtime import serve_child

if __name__ == "__main__":
    serve_child()
