"""The ``monarch`` command.

``monarch worker --address tcp://0.0.0.0:26600`` runs this machine's worker (see
:func:`monarch.actor.run_worker_loop_forever`) until terminated. Credentials: mutual TLS
with ``--ca ca.pem --private-key node.pem`` (or ``MONARCH_TLS_CA`` and
``MONARCH_TLS_KEY``), the cluster secret in ``MONARCH_CLUSTER_SECRET`` (the same on the
client and every worker), or ``--trust-all-connections`` on a trusted network (logged as
a warning).

``monarch debug [--host H] [--port P]`` attaches a terminal to the pdb sessions of a
running monarch client's actors (``breakpoint()`` in an endpoint); see
[Debugging](../debugging.md).

The job verbs (``apply``, ``exec``, ``shell``, ``kill``, ``context``, ``status``) work
on the current job; see [the monarch command](../job.md#the-monarch-command).
``monarch top`` (also installed as ``monarch-tui``) watches a running program; see
[Monitoring](../monitoring.md). Parsing a command line imports neither the actor runtime
nor ``torch``: each verb imports what it needs.
"""

import sys

from monarch._src.cli.parser import build_parser as _parser  # noqa: F401  (tests)
from monarch._src.cli.parser import main, main_tui

__all__ = ["main", "main_tui"]

if __name__ == "__main__":
    sys.exit(main())
