"""Remote pdb for actor endpoints.

- :mod:`.remote_pdb`: the proc side. Procs started by monarch install
  ``sys.breakpointhook = remote_breakpointhook``; ``breakpoint()`` in an endpoint opens
  a pdb session whose input and output travel as actor messages; post-mortem on
  endpoint exceptions.
- :mod:`.controller`: the client side. The ``debug_controller`` singleton actor keeps
  the sessions (keyed by actor name and rank) and serves ``monarch debug`` clients.
- :mod:`.commands`: the ``monarch_dbg>`` commands; :mod:`.protocol`: settings and the
  wire format; :mod:`.cli`: the ``monarch debug`` command.

User guide: ``docs/debugging.md``. Nothing is imported here, so that ``monarch debug``
does not load the runtime.
"""
