"""The job verbs of the ``monarch`` command: their arguments and help, and the
dispatch to their implementations (imported when a verb runs)."""

from __future__ import annotations

import argparse
import sys

from monarch._src.cli.errors import CliError

__all__ = ["VERBS", "add_verbs", "run"]

#: The verbs this module adds.
VERBS = frozenset({"apply", "exec", "shell", "kill", "context", "status", "top"})

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


def _add_apply(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apply = verbs.add_parser(
        "apply",
        help="start (or reuse) the job a Python module defines",
        description="Import MODULE.ATTR (a JobTrait object, or a function returning one; "
        "the working directory is on the import path), apply it unless the context's "
        "running job can serve it, wait until the hosts of every mesh answer, and save "
        "it as the context's current job: `monarch exec`, `monarch shell`, `monarch "
        "status` and a script's job.state() then use it. " + _CONTEXTS,
    )
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


def _add_exec(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = verbs.add_parser(
        "exec",
        help="run a command on the job's hosts",
        usage="monarch exec [--one | --all | --mesh NAME | --point DIM=N,...] "
        "[--per-host DIM=N] [-e NAME=VALUE]... [--workdir DIR] [--script FILE|-] "
        "[-m MODULE] [--output-dir DIR] [--kill] [--] [cmd ...]",
        description="Run a command on hosts of the current job: by default on the first "
        "host of its first mesh, its output streamed here line by line ([rank N] "
        "prefixed); with --all or --mesh on every host, each run's output written to "
        "<output dir>/<mesh>/rank_<N>.log (the directory is printed). Each run sees "
        "MONARCH_RANK_<DIM> and MONARCH_SIZE_<DIM>. The command is an argument list, run "
        "without a shell (use `sh -c '...'` or --script for shell syntax); one starting "
        "with a .py file runs with the hosts' Python. Exits with the largest exit status "
        "of the runs (128 + N for a run killed by signal N). " + _CONTEXTS,
    )
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


def _add_shell(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    shell = verbs.add_parser(
        "shell",
        help="open an interactive shell on one of the job's hosts",
        description="Run the remote $SHELL (/bin/sh when unset) on one host of the "
        "current job: the first host of its first mesh unless --mesh or --point say "
        "otherwise. On a terminal the shell gets a remote pseudo-terminal of the same "
        "size; otherwise it reads its commands from stdin. Exits with the shell's exit "
        "status. " + _CONTEXTS,
    )
    _add_target(shell, "open the shell on")
    _add_env(shell)


def _add_kill(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kill = verbs.add_parser(
        "kill",
        help="kill a context's job",
        description="Kill the job of the current context (or of CONTEXT), wait until it "
        "has ended, and forget it; its spec stays, so `monarch apply` starts it again.",
    )
    kill.add_argument("context", nargs="?", help="the context (default: the current one)")


def _add_context(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    context = verbs.add_parser(
        "context",
        help="create, switch, remove or list contexts",
        description="A context holds one current job: each is a directory "
        ".monarch/<name>/ (its spec and its saved state), and .monarch/job_state.pkl "
        "links to the current one's state. The first is `default`.",
    )
    actions = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a context (the current one stays)")
    create.add_argument("name")
    use = actions.add_parser("use", help="make a context the current one")
    use.add_argument("name")
    rm = actions.add_parser("rm", help="kill a context's job and remove the context")
    rm.add_argument("name")
    actions.add_parser("ls", help="list the contexts; * marks the current one")


def _add_status(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = verbs.add_parser(
        "status",
        help="show the current job's meshes and whether their hosts answer",
        description="Show the current context's job: its meshes, their hosts, and for "
        "each host whether it answers within --timeout. Exits with 1 when one does not. "
        + _CONTEXTS,
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long each host may take to answer (default: 10)",
    )


def _add_top(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The monitoring modules import only the standard library.
    from monarch._src.monitoring import tui

    top = verbs.add_parser(
        "top",
        help="watch a running program: its actors, their counters and its failures",
        description=tui.DESCRIPTION,
    )
    tui.add_arguments(top)


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the job verbs to the ``monarch`` command's sub-parsers."""
    _add_apply(verbs)
    _add_exec(verbs)
    _add_shell(verbs)
    _add_kill(verbs)
    _add_context(verbs)
    _add_status(verbs)
    _add_top(verbs)


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


def run(args: argparse.Namespace) -> int:
    """Run the job verb ``args.verb``; the command's exit status."""
    if args.verb == "top":
        from monarch._src.monitoring.tui import run as top

        return top(args)
    from monarch._src.job.context import ContextError

    try:
        if args.verb in ("exec", "shell"):
            from monarch._src.cli import commands

            return commands.run(args)
        from monarch._src.cli import jobs

        status = jobs.run(args)
        if args.verb == "status":
            _admin_status()
        return status
    except (CliError, ContextError) as e:
        print(f"monarch {args.verb}: {e}", file=sys.stderr)
        return e.status if isinstance(e, CliError) else 1
    except KeyboardInterrupt:
        print(f"monarch {args.verb}: interrupted", file=sys.stderr)
        return 130
