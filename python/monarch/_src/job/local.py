"""``LocalJob``: a job whose every mesh is this machine (``this_host()``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from monarch._src.job.trait import BATCH_ENV, DEFAULT_JOB_PATH, JobState, JobTrait

__all__ = ["LocalJob"]


class LocalJob(JobTrait):
    """Every named mesh is this machine: ``this_host()``, a 0-dimensional host mesh
    (no ``"hosts"`` dimension). Lets a program written against a job run locally by
    swapping the job. Nothing is started or killed; a cached ``LocalJob`` is never
    reused (a fresh one is as good).

    Batch mode, ``apply(client_script="train.py")``: the job is saved at
    ``.monarch/job_state.pkl`` and the script starts in a new Python process with
    ``MONARCH_BATCH_JOB=1`` (``job.process``, a ``subprocess.Popen``; its output goes to
    ``stdout.log`` and ``stderr.log`` in ``job.log_dir``). In the script, ``state()`` of
    any job returns this job's meshes. ``kill()`` ends the script if it still runs.
    """

    _kill_ends_hosts = False  # the hosts are this machine: kill() leaves them be

    #: The batch-mode client script's process, once ``apply(client_script=...)`` ran.
    process: subprocess.Popen[bytes] | None = None
    #: Where that process's ``stdout.log`` and ``stderr.log`` are.
    _log_dir: str | None = None

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(
                f"LocalJob(hosts={hosts!r}): expected a sequence of mesh names, e.g. "
                "LocalJob(hosts=('trainers', 'dataloaders'))"
            )
        super().__init__()
        self._host_names: tuple[str, ...] = tuple(hosts)

    @property
    def log_dir(self) -> str | None:
        """The directory of the batch-mode script's ``stdout.log`` and ``stderr.log``
        (``None`` before ``apply(client_script=...)``)."""
        return self._log_dir

    def _create(self, client_script: str | None) -> None:
        if client_script is None:
            return
        if not os.path.isfile(client_script):
            raise FileNotFoundError(
                f"LocalJob.apply(client_script={client_script!r}): no such file; give the "
                "path of the Python script to run as the job's client"
            )
        # The copy the script finds: running (it serves state() there), marked batch.
        saved = LocalJob(self._host_names)
        saved._status = "running"
        saved._batch = True
        saved.dump(DEFAULT_JOB_PATH)
        self._log_dir = tempfile.mkdtemp(prefix="monarch-localjob-")
        with (
            open(os.path.join(self._log_dir, "stdout.log"), "wb") as out,
            open(os.path.join(self._log_dir, "stderr.log"), "wb") as err,
        ):
            self.process = subprocess.Popen(
                [sys.executable, client_script],
                env={**os.environ, BATCH_ENV: "1"},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    def _state(self) -> JobState:
        from monarch._src.actor.proc_mesh import this_host

        host = this_host()
        return JobState({name: host for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        """Never: a ``LocalJob`` has no allocation to reuse (``state()`` is always this
        machine, so there is nothing to save between programs).

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``False``.
        """
        return False

    def _kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("process", None)  # a process handle is this process's only
        return state

    def __repr__(self) -> str:
        return f"LocalJob(hosts={self._host_names!r})"
