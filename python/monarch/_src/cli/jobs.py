"""``monarch apply``, ``kill``, ``status`` and ``context``: the current job of each
context (the ``.monarch/`` layout of :mod:`monarch._src.job.context`)."""

from __future__ import annotations

import argparse
import os
import time

from monarch._src.cli.errors import USAGE, CliError
from monarch._src.job import context
from monarch._src.job.job import (
    JobState,
    JobTrait,
    import_job,
    load_saved_job,
    remove_context,
)

__all__ = ["connect", "run", "saved_job"]


def _say(message: str) -> None:
    print(message, flush=True)


def saved_job(name: str) -> JobTrait:
    """The job applied in context ``name``; :class:`CliError` saying how to apply one
    when there is none."""
    job = load_saved_job(name)
    if job is None or not job.active:
        spec = context.read_spec(name)
        again = f"`monarch apply` (to apply {spec} again) or " if spec else ""
        raise CliError(
            f"no job is applied in context {name!r}: run {again}`monarch apply module.attr` first"
        )
    return job


def connect(job: JobTrait, name: str) -> JobState:
    """The host meshes of the applied ``job`` of context ``name``."""
    try:
        return job.state()
    except Exception as e:
        raise CliError(
            f"cannot reach the job of context {name!r} ({e}); run `monarch kill` and then "
            "`monarch apply` to start it anew"
        ) from e


def _describe(state: JobState) -> str:
    return ", ".join(f"{m} ({len(state[m])} host{'s' * (len(state[m]) != 1)})" for m in state)


def _apply(args: argparse.Namespace) -> int:
    name = context.ensure_layout()
    spec = args.spec or context.read_spec(name)
    if spec is None:
        raise CliError(
            f"context {name!r} has no job yet: name one, e.g. `monarch apply jobs.job` "
            "for the object `job` in jobs.py",
            USAGE,
        )
    try:
        job = import_job(spec)
    except (ValueError, TypeError) as e:
        raise CliError(str(e), USAGE) from e
    context.write_spec(name, spec)
    # The runtime is imported once the command line and the job are known to be good.
    from monarch._src.cli.probe import wait_ready

    previous = load_saved_job(name)
    started = time.monotonic()
    try:
        state = job.state(cached_path=str(context.state_path(name)))
    except Exception as e:
        raise CliError(f"applying {spec} ({job!r}) failed: {e}") from e
    reused = previous is not None and previous.apply_id == job.apply_id
    try:
        wait_ready(state, args.timeout)
    except RuntimeError as e:
        raise CliError(
            f"{spec} is applied but not ready: {e}; see `monarch status`, or `monarch kill` it"
        ) from e
    how = "reused the running job" if reused else "applied"
    _say(
        f"{how} {spec} ({job!r}) in context {name!r}: {_describe(state)} ready in "
        f"{time.monotonic() - started:.1f} s"
    )
    return 0


def _kill(args: argparse.Namespace) -> int:
    name = args.context or context.ensure_layout()
    context.check_name(name)
    if name not in context.contexts():
        raise CliError(
            f"no context named {name!r} (contexts: {', '.join(context.contexts()) or 'none'})",
            USAGE,
        )
    job = saved_job(name)
    kill_saved(job, name)
    _say(f"killed the job of context {name!r} ({job!r})")
    return 0


def kill_saved(job: JobTrait, name: str) -> None:
    """Kill ``job``, the saved job of context ``name``, and forget it."""
    try:
        job.kill()
    except Exception as e:
        raise CliError(f"killing the job of context {name!r} ({job!r}) failed: {e}") from e
    path = context.state_path(name)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _status(args: argparse.Namespace) -> int:
    name = context.current()
    job = saved_job(name)
    from monarch._src.cli.probe import probe_hosts

    spec = context.read_spec(name) or "(no spec)"
    _say(f"context {name}: {spec}, {job!r}, apply id {job.apply_id}")
    state = connect(job, name)
    meshes = {m: len(state[m]) for m in state}
    answers = probe_hosts(lambda: connect(job, name), meshes, args.timeout)
    failed = 0
    for mesh in state:
        _say(f"mesh {mesh}: {state[mesh].sizes}")
        for a in (a for a in answers if a.mesh == mesh):
            if a.error is None:
                _say(f"  host {a.rank}: {a.name}: answering")
            else:
                failed += 1
                _say(f"  host {a.rank}: {a.name}: not answering: {a.error}")
    if failed:
        _say(
            f"{failed} host{'s' * (failed != 1)} did not answer; `monarch kill` and "
            "`monarch apply` start the job anew"
        )
    return 1 if failed else 0


def _context(args: argparse.Namespace) -> int:
    action = args.action
    if action == "ls":
        names = context.contexts()
        if not names:
            _say(f"no contexts yet: `monarch apply` creates {context.DEFAULT_CONTEXT!r}")
            return 0
        current = context.current()
        width = max(len(n) for n in names)
        for n in names:
            spec = context.read_spec(n) or "-"
            applied = "applied" if context.state_path(n).exists() else "no job"
            _say(f"{'*' if n == current else ' '} {n:<{width}}  {spec}  ({applied})")
        return 0
    name: str = args.name
    if action == "create":
        context.create(name)
        _say(f"created context {name!r}; switch to it with `monarch context use {name}`")
    elif action == "use":
        context.use(name)
        recorded = context.read_spec(name)
        _say(f"now in context {name!r}" + (f" ({recorded})" if recorded else ""))
    else:
        job = remove_context(name)
        killed = f"; killed its job ({job!r})" if job is not None else ""
        _say(f"removed context {name!r}{killed}")
    return 0


def run(args: argparse.Namespace) -> int:
    verb = args.verb
    if verb == "apply":
        return _apply(args)
    if verb == "kill":
        return _kill(args)
    if verb == "status":
        return _status(args)
    return _context(args)
