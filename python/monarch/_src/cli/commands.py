"""``monarch exec`` and ``monarch shell``: a command, or an interactive shell, on hosts
of the current job (:func:`monarch.job.exec_command`, :func:`monarch.job.shell`)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
import uuid
from pathlib import Path

from monarch._src.cli.errors import USAGE, CliError
from monarch._src.cli.jobs import connect, kill_saved, saved_job
from monarch._src.cli.options import check_point, parse_coordinates, parse_env
from monarch._src.job import context
from monarch._src.job.job import JobState

__all__ = ["run"]


def _mesh(state: JobState, name: str | None) -> str:
    """The mesh called ``name`` (default: the first) of ``state``."""
    names = list(state)
    if not names:
        raise CliError("the job has no meshes")
    if name is None:
        return names[0]
    if name not in state:
        raise CliError(
            f"--mesh {name}: the job has no mesh {name!r}; its meshes are: {', '.join(names)}",
            USAGE,
        )
    return name


def _point(text: str | None) -> dict[str, int] | None:
    return None if text is None else parse_coordinates("--point", text)


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.script is not None:
        try:
            text = sys.stdin.read() if args.script == "-" else Path(args.script).read_text()
        except OSError as e:
            raise CliError(f"--script {args.script}: cannot read it: {e}", USAGE) from e
        return ["bash", "-c", text, "monarch-exec", *cmd]
    if args.module is not None:
        return ["-m", args.module, *cmd]
    if not cmd:
        raise CliError(
            "no command: give one after --, e.g. `monarch exec -- hostname`, or use "
            "--script FILE or -m MODULE",
            USAGE,
        )
    return cmd


def _output_dir(args: argparse.Namespace, name: str) -> Path:
    if args.output_dir is not None:
        return Path(args.output_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return context.state_path(name).parent / "exec" / f"{stamp}-{uuid.uuid4().hex[:6]}"


def _exec(args: argparse.Namespace) -> int:
    cmd = _command(args)
    env = parse_env(args.env)
    per_host = (
        None
        if args.per_host is None
        else parse_coordinates("--per-host", args.per_host, positive=True)
    )
    if args.all and args.mesh is not None:
        raise CliError("give --all (every mesh) or --mesh NAME, not both", USAGE)
    point = _point(args.point)
    name = context.current()
    job = saved_job(name)
    # The runtime is imported once the command line and the job are known to be good.
    from monarch._src.job.exec import exec_command

    state = connect(job, name)
    if per_host is not None:
        clash = sorted(set(per_host) & {d for m in state for d in state[m].sizes})
        if clash:
            raise CliError(
                f"--per-host {args.per_host}: {', '.join(clash)} is a host dimension "
                "already; name the new dimension otherwise, e.g. gpus",
                USAGE,
            )
    streamed = args.one or args.point is not None or (not args.all and args.mesh is None)
    if streamed:
        mesh = _mesh(state, args.mesh)
        if point is not None:
            check_point(point, mesh, state[mesh].sizes)
        rank = None if point is not None else 0
        status = exec_command(
            state[mesh],
            cmd,
            env=env,
            workdir=args.workdir,
            rank=rank,
            point=point,
            per_host=per_host,
        ).get()
    else:
        meshes = list(state) if args.all else [_mesh(state, args.mesh)]
        out = _output_dir(args, name)
        runs = [
            exec_command(
                state[m],
                cmd,
                env=env,
                workdir=args.workdir,
                output_dir=out / m,
                per_host=per_host,
            )
            for m in meshes
        ]
        where = ", ".join(str(out / m / "rank_<N>.log") for m in meshes)
        print(f"monarch exec: the output of each run goes to {where}", file=sys.stderr)
        statuses = [r.get() for r in runs]
        status = max(statuses, default=0)
    if args.kill:
        kill_saved(job, name)
    return status


def _shell(args: argparse.Namespace) -> int:
    env = parse_env(args.env)
    point = _point(args.point)
    name = context.current()
    job = saved_job(name)
    from monarch._src.cli.probe import host_at
    from monarch._src.job.shell import shell

    state = connect(job, name)
    mesh = _mesh(state, args.mesh)
    if point is not None:
        check_point(point, mesh, state[mesh].sizes)
    hosts = state[mesh]
    selected = hosts.slice(**point) if point else host_at(hosts, 0)
    if len(selected) != 1:
        dims = ", ".join(d for d in hosts.sizes if d not in (point or {}))
        raise CliError(
            f"--point {args.point} picks {len(selected)} hosts of mesh {mesh!r}; give a "
            f"coordinate for {dims} as well",
            USAGE,
        )
    status = shell(selected, env=env, workdir=args.workdir)
    if args.kill:
        kill_saved(job, name)
    return status


def _exit_on_signal(signum: int, frame: object) -> None:
    # Unwinds as Ctrl-C does: exec_command and shell end their remote runs first.
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    try:
        return _exec(args) if args.verb == "exec" else _shell(args)
    except (FileNotFoundError, ValueError, TypeError) as e:
        # What exec_command and shell raise for what they are given (a workdir missing
        # on a host, a command that is not one).
        raise CliError(str(e)) from e
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
