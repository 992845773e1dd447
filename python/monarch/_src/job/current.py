"""The current job and the jobs the ``monarch`` command names: :func:`set_current_job`,
:func:`load_current_job`, :func:`import_job` (a ``module.attr`` spec), and the job
saved in each context of the command line (:func:`load_saved_job`,
:func:`remove_context`).
"""

from __future__ import annotations

import importlib
import os
import sys
import types

from monarch._src.job import context
from monarch._src.job.trait import (
    DEFAULT_JOB_PATH,
    JobTrait,
    _can_run,
    _load_cached,
    job_load,
)

__all__ = [
    "import_job",
    "load_current_job",
    "load_saved_job",
    "remove_context",
    "set_current_job",
]


_current_job: JobTrait | None = None


def set_current_job(job: JobTrait | str | None) -> None:
    """Make ``job`` the job :func:`load_current_job` returns.

    A job object is held for this process only (``None`` forgets it). A string
    ``"module.attr"`` (a job, or a function returning one) is recorded on disk as the
    spec of the current context of the ``monarch`` command (``.monarch/<context>/spec``,
    as ``monarch apply module.attr`` records it), for this and later processes; it
    replaces a job object set earlier. The string is checked by importing it.
    """
    global _current_job
    if isinstance(job, str):
        import_job(job)  # fails here, naming the problem, not at the next load
        context.write_spec(context.ensure_layout(), job)
        _current_job = None
        return
    if job is not None and not isinstance(job, JobTrait):
        raise TypeError(f"set_current_job expects a job (a JobTrait) or 'module.attr', got {job!r}")
    _current_job = job


def load_current_job() -> JobTrait:
    """The current job: the job object given to :func:`set_current_job`; else, in the
    current context of the ``monarch`` command (see ``monarch context``), the applied
    job saved at :data:`DEFAULT_JOB_PATH` when it is active and serves the context's
    recorded spec (or no spec is recorded); else a new job from that spec (not applied:
    its ``state()`` applies it and saves it there).

    Raises :class:`FileNotFoundError` when there is none of these.
    """
    if _current_job is not None:
        return _current_job
    name = context.current()
    spec = context.read_spec(name)
    saved = _load_cached(DEFAULT_JOB_PATH)
    if spec is None:
        if saved is not None:
            return saved
        raise FileNotFoundError(
            f"no current job: none was set with set_current_job(), and context {name!r} "
            f"has none ({os.path.join(os.getcwd(), DEFAULT_JOB_PATH)} does not exist); "
            "run `monarch apply module.attr` first (or `job.state()`, which saves the job "
            "there)"
        )
    job = import_job(spec)
    if saved is not None and _can_run(saved, job):
        return saved
    return job


def import_job(spec: str) -> JobTrait:
    """The job ``spec`` names: ``module.attr``, where ``attr`` is a job or a function
    that returns one (called without arguments). The working directory is on the
    import path."""
    module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"{spec!r} does not name a job: give module.attr, e.g. `monarch apply jobs.job` "
            "for the object `job` in jobs.py"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise ValueError(
                f"cannot import {module_name!r} for {spec!r}: no module {e.name!r} in "
                f"{cwd} or on the Python path; run the command from the directory that "
                "holds it"
            ) from e
        raise
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise ValueError(
            f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
            f"attribute {attr!r} for {spec!r}"
        ) from None
    what = value
    if not isinstance(value, JobTrait) and callable(value) and not isinstance(value, type):
        value = value()
    if not isinstance(value, JobTrait):
        got = type(value).__name__
        hint = ""
        if isinstance(what, types.ModuleType):
            hint = f"; {spec} is a module: name the job in it, e.g. {spec}.job"
        elif isinstance(what, type):
            got = f"the class {what.__name__}"
            hint = f"; make an instance in {module_name}, e.g. job = {what.__name__}(...)"
        raise TypeError(
            f"{spec} is not a job: expected a JobTrait (e.g. ProcessJob({{'hosts': 2}})) or "
            f"a function returning one, got {got}{hint}"
        )
    return value


def load_saved_job(name: str) -> JobTrait | None:
    """The job applied in context ``name``, or ``None`` when it has none."""
    path = context.state_path(name)
    try:
        return job_load(str(path))
    except FileNotFoundError:
        return None


def remove_context(name: str) -> JobTrait | None:
    """Kill the job of context ``name`` and delete the context; the job it killed. When
    ``name`` was current, ``default`` becomes current."""
    context.check_exists(name)
    job = load_saved_job(name)
    if job is not None:
        job.kill()
    context.delete(name)
    return job
