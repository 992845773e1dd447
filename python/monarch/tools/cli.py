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
on the current job; see [the monarch command](../job.md#the-monarch-command). Parsing a
command line imports neither the actor runtime nor ``torch``: each verb imports what it
needs.
"""

from __future__ import annotations

import argparse
import os
import sys

from monarch._src.cli.parser import VERBS as _JOB_VERBS
from monarch._src.cli.parser import add_verbs as _add_job_verbs
from monarch._src.cli.parser import run as _run_job_verb


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="monarch", description="Monarch command-line tools.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    worker = verbs.add_parser(
        "worker",
        help="run this machine's worker agent",
        description="Serve as this machine's worker: spawn and reap procs for the client "
        "that attaches (attach_to_workers). Runs until SIGTERM or SIGINT.",
    )
    worker.add_argument(
        "--address",
        required=True,
        help="where to serve: tcp://HOST:PORT (tcp://0.0.0.0:PORT for every interface), "
        "ADVERTISE@BIND, ipc://PATH, or tcp://HOST:fdN to serve on the listening socket "
        "inherited as file descriptor N (socket activation)",
    )
    worker.add_argument(
        "--ca",
        help="mutual TLS: the PEM file of the cluster's CA certificate (with --private-key)",
    )
    worker.add_argument(
        "--private-key",
        help="mutual TLS: the PEM file of this machine's private key followed by its "
        "certificate, signed by the CA of --ca",
    )
    worker.add_argument(
        "--trust-all-connections",
        action="store_true",
        help="accept TCP connections without authentication (trusted networks only)",
    )
    debug = verbs.add_parser(
        "debug",
        help="drive the pdb sessions of actors paused at breakpoint()",
        description="Connect to the debug server of a running monarch client (started by "
        "the first breakpoint() of one of its actors) and drive its actors' pdb sessions "
        "at the monarch_dbg> prompt: list, attach <actor> <rank>, cast <actor> <ranks> "
        "<pdb command>, continue, quit, help.",
    )
    debug.add_argument(
        "--host",
        help="the client's host (default: $MONARCH_DEBUG_SERVER_HOST, else localhost)",
    )
    debug.add_argument(
        "--port",
        type=int,
        help="the debug server's port (default: $MONARCH_DEBUG_SERVER_PORT, else 27000)",
    )
    _add_job_verbs(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``monarch`` command with ``argv`` (default: the process's arguments)."""
    args = _parser().parse_args(argv)
    if args.verb in _JOB_VERBS:
        # The job's module and ``module.attr`` specs are found from here.
        sys.path.insert(0, os.getcwd())
        return _run_job_verb(args)
    if args.verb == "debug":
        from monarch._src.actor.debugger.cli import run

        return run(args.host, args.port)
    if args.verb == "worker":
        sys.path.insert(0, os.getcwd())
        from monarch._src.actor.workers import TRUST_ALL, run_worker_loop_forever

        if args.trust_all_connections and args.ca is not None:
            print("monarch worker: give --ca or --trust-all-connections, not both", file=sys.stderr)
            return 2
        try:
            run_worker_loop_forever(
                address=args.address,
                ca=TRUST_ALL if args.trust_all_connections else args.ca,
                private_key=args.private_key,
            )
        except (ValueError, NotImplementedError, RuntimeError, OSError) as e:
            print(f"monarch worker: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
