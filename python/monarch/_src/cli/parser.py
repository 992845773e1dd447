"""The verbs of the ``monarch`` command, each declared once in :data:`VERBS`: its name,
help, arguments and handler. :func:`main` builds the parser from the table and runs the
verb's handler, which imports what the verb needs: parsing a command line imports
neither the actor runtime nor ``torch`` (only this module, ``options``, ``errors`` and
the terminal UI's argument declarations, which need only the standard library).

``monarch worker`` and ``monarch debug`` serve this machine and attach to a client's
pdb sessions; the job verbs (``apply``, ``exec``, ``shell``, ``kill``, ``context``,
``status``) work on the current job; ``monarch top`` (also installed as ``monarch-tui``)
watches a running program.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from monarch._src.cli.errors import CliError
from monarch._src.monitoring import tui

__all__ = ["VERBS", "Verb", "build_parser", "main", "main_tui"]


@dataclass(frozen=True)
class Verb:
    """One verb of the ``monarch`` command."""

    name: str
    #: The line of ``monarch --help``.
    help: str
    #: The text of ``monarch VERB --help``.
    description: str
    #: Declares the verb's arguments on its parser.
    arguments: Callable[[argparse.ArgumentParser], None]
    #: Runs the verb with the parsed arguments; the command's exit status.
    run: Callable[[argparse.Namespace], int]
    #: The usage line, when argparse's own would mislead.
    usage: str | None = None
    #: Whether the working directory goes first on the import path (a job's module, the
    #: user code a worker's procs import).
    imports_from_cwd: bool = True


_CONTEXTS = (
    "The job lives in the current context: a directory .monarch/<context>/ of the "
    "working directory (`monarch context`)."
)


def _add_target(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--mesh",
        metavar="NAME",
        help=f"the mesh to {what} (default: the job's first mesh)",
    )
    parser.add_argument(
        "--point",
        metavar="DIM=N[,DIM=N]",
        help="the host at these coordinates of the mesh, e.g. --point hosts=1",
    )


def _add_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the remote side (repeat for more)",
    )
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="the remote working directory, which must exist on the hosts (relative: to "
        "this working directory; default: this working directory where the host has it)",
    )
    parser.add_argument(
        "--kill",
        action="store_true",
        help="kill the job once the command ended (as `monarch kill`)",
    )


def _worker_arguments(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--address",
        "--addr",
        dest="address",
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


def _run_worker(args: argparse.Namespace) -> int:
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


def _debug_arguments(debug: argparse.ArgumentParser) -> None:
    debug.add_argument(
        "--host",
        help="the client's host (default: $MONARCH_DEBUG_SERVER_HOST, else localhost)",
    )
    debug.add_argument(
        "--port",
        type=int,
        help="the debug server's port (default: $MONARCH_DEBUG_SERVER_PORT, else 27000)",
    )


def _run_debug(args: argparse.Namespace) -> int:
    from monarch._src.actor.debugger.cli import run

    return run(args.host, args.port)


def _apply_arguments(apply: argparse.ArgumentParser) -> None:
    apply.add_argument(
        "spec",
        nargs="?",
        metavar="MODULE.ATTR",
        help="e.g. jobs.job for the object `job` in jobs.py (default: the one the "
        "context last applied)",
    )
    apply.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long the hosts may take to answer (default: 120)",
    )


def _exec_arguments(run: argparse.ArgumentParser) -> None:
    target = run.add_mutually_exclusive_group()
    target.add_argument(
        "--one",
        action="store_true",
        help="run on the first host of the mesh, streaming its output (the default)",
    )
    target.add_argument(
        "--all",
        action="store_true",
        help="run on every host of every mesh, writing per-rank output files",
    )
    target.add_argument(
        "--point",
        metavar="DIM=N[,DIM=N]",
        help="run on the host at these coordinates, streaming its output, e.g. --point hosts=1",
    )
    run.add_argument(
        "--mesh",
        metavar="NAME",
        help="run on this mesh: on every host of it (per-rank files), or with --one or "
        "--point on one",
    )
    run.add_argument(
        "--per-host",
        metavar="DIM=N[,DIM=N]",
        help="run N copies on each host along a new dimension, e.g. --per-host gpus=4 "
        "(each sees MONARCH_RANK_GPUS)",
    )
    _add_env(run)
    source = run.add_mutually_exclusive_group()
    source.add_argument(
        "--script",
        metavar="FILE",
        help="run this bash script (- reads it from stdin); the arguments after -- are "
        "its $1, $2, ...",
    )
    source.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        help="run this Python module, as python -m MODULE, with the arguments after --",
    )
    run.add_argument(
        "--output-dir",
        metavar="DIR",
        help="where --all and --mesh write the output (default: .monarch/<context>/exec/<time>/)",
    )
    run.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="the command and its arguments (after --)",
    )


def _shell_arguments(shell: argparse.ArgumentParser) -> None:
    _add_target(shell, "open the shell on")
    _add_env(shell)


def _kill_arguments(kill: argparse.ArgumentParser) -> None:
    kill.add_argument("context", nargs="?", help="the context (default: the current one)")


def _context_arguments(context: argparse.ArgumentParser) -> None:
    actions = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a context (the current one stays)")
    create.add_argument("name")
    use = actions.add_parser("use", help="make a context the current one")
    use.add_argument("name")
    rm = actions.add_parser("rm", help="kill a context's job and remove the context")
    rm.add_argument("name")
    actions.add_parser("ls", help="list the contexts; * marks the current one")


def _status_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long each host may take to answer (default: 10)",
    )


def _admin_status() -> None:
    """The line ``monarch status`` adds when the program's admin URL is known: its
    health and counts, asked with a 1 s timeout (the token is not printed)."""
    from monarch._src.monitoring.client import (
        AdminClient,
        AdminError,
        default_admin_url,
        summary_line,
    )

    url = default_admin_url()
    if url is None:
        return
    try:
        client = AdminClient(url, timeout=1.0)
    except ValueError as e:
        print(f"admin: not asked: {e}", flush=True)
        return
    try:
        line = summary_line(client.summary())
    except AdminError as e:
        line = f"not answering: {e}"
    print(f"admin {client.base_url}: {line}", flush=True)


def _job_verb(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a job verb: its errors end it with their message on stderr."""
    from monarch._src.job.context import ContextError

    try:
        return run(args)
    except (CliError, ContextError) as e:
        print(f"monarch {args.verb}: {e}", file=sys.stderr)
        return e.status if isinstance(e, CliError) else 1
    except KeyboardInterrupt:
        print(f"monarch {args.verb}: interrupted", file=sys.stderr)
        return 130


def _run_job_verb(args: argparse.Namespace) -> int:
    from monarch._src.cli import jobs

    return _job_verb(jobs.run, args)


def _run_status(args: argparse.Namespace) -> int:
    from monarch._src.cli import jobs

    def status(args: argparse.Namespace) -> int:
        code = jobs.run(args)
        _admin_status()
        return code

    return _job_verb(status, args)


def _run_command(args: argparse.Namespace) -> int:
    from monarch._src.cli import commands

    return _job_verb(commands.run, args)


#: The verbs, in the order ``monarch --help`` lists them.
VERBS: tuple[Verb, ...] = (
    Verb(
        "worker",
        help="run this machine's worker agent",
        description="Serve as this machine's worker: spawn and reap procs for the client "
        "that attaches (attach_to_workers). Runs until SIGTERM or SIGINT.",
        arguments=_worker_arguments,
        run=_run_worker,
    ),
    Verb(
        "debug",
        help="drive the pdb sessions of actors paused at breakpoint()",
        description="Connect to the debug server of a running monarch client (started by "
        "the first breakpoint() of one of its actors) and drive its actors' pdb sessions "
        "at the monarch_dbg> prompt: list, attach <actor> <rank>, cast <actor> <ranks> "
        "<pdb command>, continue, quit, help.",
        arguments=_debug_arguments,
        run=_run_debug,
        imports_from_cwd=False,
    ),
    Verb(
        "apply",
        help="start (or reuse) the job a Python module defines",
        description="Import MODULE.ATTR (a JobTrait object, or a function returning one; "
        "the working directory is on the import path), apply it unless the context's "
        "running job can serve it, wait until the hosts of every mesh answer, and save "
        "it as the context's current job: `monarch exec`, `monarch shell`, `monarch "
        "status` and a script's job.state() then use it. " + _CONTEXTS,
        arguments=_apply_arguments,
        run=_run_job_verb,
    ),
    Verb(
        "exec",
        help="run a command on the job's hosts",
        description="Run a command on hosts of the current job: by default on the first "
        "host of its first mesh, its output streamed here line by line ([rank N] "
        "prefixed); with --all or --mesh on every host, each run's output written to "
        "<output dir>/<mesh>/rank_<N>.log (the directory is printed). Each run sees "
        "MONARCH_RANK_<DIM> and MONARCH_SIZE_<DIM>. The command is an argument list, run "
        "without a shell (use `sh -c '...'` or --script for shell syntax); one starting "
        "with a .py file runs with the hosts' Python. Exits with the largest exit status "
        "of the runs (128 + N for a run killed by signal N). " + _CONTEXTS,
        usage="monarch exec [--one | --all | --mesh NAME | --point DIM=N,...] "
        "[--per-host DIM=N] [-e NAME=VALUE]... [--workdir DIR] [--script FILE|-] "
        "[-m MODULE] [--output-dir DIR] [--kill] [--] [cmd ...]",
        arguments=_exec_arguments,
        run=_run_command,
    ),
    Verb(
        "shell",
        help="open an interactive shell on one of the job's hosts",
        description="Run the remote $SHELL (/bin/sh when unset) on one host of the "
        "current job: the first host of its first mesh unless --mesh or --point say "
        "otherwise. On a terminal the shell gets a remote pseudo-terminal of the same "
        "size; otherwise it reads its commands from stdin. Exits with the shell's exit "
        "status. " + _CONTEXTS,
        arguments=_shell_arguments,
        run=_run_command,
    ),
    Verb(
        "kill",
        help="kill a context's job",
        description="Kill the job of the current context (or of CONTEXT), wait until it "
        "has ended, and forget it; its spec stays, so `monarch apply` starts it again.",
        arguments=_kill_arguments,
        run=_run_job_verb,
    ),
    Verb(
        "context",
        help="create, switch, remove or list contexts",
        description="A context holds one current job: each is a directory "
        ".monarch/<name>/ (its spec and its saved state), and .monarch/job_state.pkl "
        "links to the current one's state. The first is `default`.",
        arguments=_context_arguments,
        run=_run_job_verb,
    ),
    Verb(
        "status",
        help="show the current job's meshes and whether their hosts answer",
        description="Show the current context's job: its meshes, their hosts, and for "
        "each host whether it answers within --timeout. Exits with 1 when one does not. "
        + _CONTEXTS,
        arguments=_status_arguments,
        run=_run_status,
    ),
    Verb(
        "top",
        help="watch a running program: its actors, their counters and its failures",
        description=tui.DESCRIPTION,
        arguments=tui.add_arguments,
        run=tui.run,
    ),
)


def build_parser(prog: str = "monarch") -> argparse.ArgumentParser:
    """The parser of the ``monarch`` command, from :data:`VERBS`."""
    parser = argparse.ArgumentParser(prog=prog, description="Monarch command-line tools.")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        verb.arguments(
            subparsers.add_parser(
                verb.name, help=verb.help, description=verb.description, usage=verb.usage
            )
        )
    return parser


_BY_NAME = {verb.name: verb for verb in VERBS}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``monarch`` command with ``argv`` (default: the process's arguments)."""
    args = build_parser().parse_args(argv)
    verb = _BY_NAME[args.verb]
    if verb.imports_from_cwd:
        sys.path.insert(0, os.getcwd())
    return verb.run(args)


def main_tui(argv: Sequence[str] | None = None) -> int:
    """The ``monarch-tui`` command: ``monarch top`` under its upstream name."""
    return main(["top", *(sys.argv[1:] if argv is None else argv)])
