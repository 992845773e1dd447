"""Remote pdb for actor endpoints.

- :mod:`.remote_pdb`: the proc side. Procs started by monarch install
  ``sys.breakpointhook = remote_breakpointhook``; ``breakpoint()`` in an endpoint opens
  a pdb session whose input and output travel as actor messages; post-mortem on
  endpoint exceptions.
- :mod:`.controller`: the client side. The ``debug_controller`` singleton actor keeps
  the sessions (keyed by actor name and rank) and serves ``monarch debug`` clients.
- :mod:`.commands`: the ``monarch_dbg>`` commands; :mod:`.protocol`: settings and the
  wire format; :mod:`.cli`: the ``monarch debug`` command.

User guide: ``docs/debugging.md``. Nothing of the runtime is imported here, so that
``monarch debug`` does not load it and ``import monarch.actor`` stays light
(:func:`debug_controller` imports the controller when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monarch._src.actor.debugger.controller import DebugController


def debug_controller() -> DebugController:
    """The client's debug controller, spawned on first use, serving ``monarch debug``
    (``MONARCH_DEBUG_SERVER_HOST``/``_PORT``). Blocks until it serves.

    Importing the controller (and asyncio with it) waits for this call, so that
    ``import monarch.actor`` stays light."""
    from monarch._src.actor.debugger import controller

    return controller.debug_controller()
