"""``ProcessJob``: worker processes on this machine, one per "host", for testing
multi-host programs on one machine; and the exit hook that stops the workers of jobs
never saved (JOB-3).
"""

from __future__ import annotations

import atexit
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from monarch._src.job.process_workers import (
    _READY_FILE_ENV,
    _children,
    _inherit_output,
    _is_running,
    _make_socket_dir,
    _proc_stat,
    _ready_file,
    _stop_workers,
    _unsaved,
    _valid_mesh,
    _Worker,
    _Workers,
)
from monarch._src.job.trait import JobState, JobTrait, _refuse_batch

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import HostMesh

__all__ = ["ProcessJob"]


def _stop_unsaved_at_exit() -> None:
    # The client's own exit first, whatever the order the hooks were registered in (the
    # runtime may have started before this module was imported): it checks what became
    # of its procs, and workers ended under it would read as lost hosts.
    runtime = sys.modules.get("monarch._src.actor.runtime")
    if _unsaved and runtime is not None:
        runtime._shutdown_at_exit()
    for workers in list(_unsaved):
        try:
            workers.stop(ProcessJob.stop_grace)
        except Exception as e:  # at exit there is nobody left to raise to
            print(f"monarch.job: stopping ProcessJob workers failed: {e!r}", file=sys.stderr)
    _unsaved.clear()


# Registered when this module is imported, after ``import monarch`` registered its own
# hooks and usually before the actor runtime starts (and registers its shutdown): atexit
# runs hooks last-in first-out, so the client stops its procs before the workers go (and
# the hook runs the runtime's first when it was registered earlier).
atexit.register(_stop_unsaved_at_exit)


class ProcessJob(JobTrait):
    """Worker processes on this machine, one per "host": ``ProcessJob({"trainers": 2})``
    gives a mesh ``trainers`` with extent ``{"hosts": 2}``, as a two-machine job would.
    For testing multi-host programs on one machine.

    ``apply()`` starts each worker (``python -m monarch.tools.cli worker``) in its own
    session, listening on a Unix socket (``ipc://``) in a private temporary directory,
    and returns once each serves (its agent answers, as its ready file beside the socket
    says); ``env`` is added to the workers' environment. Workers write to this process's
    stdout and stderr, or, when either is a pipe, to ``worker-<n>.log`` beside their
    sockets (the error of a worker that exits names its log). ``state()`` attaches to them with
    ``monarch.actor.attach_to_workers``; it raises :class:`RuntimeError` once a worker
    has exited. ``kill()`` sends the workers' process groups SIGTERM, then SIGKILL after
    :attr:`stop_grace` seconds, and removes the directory.

    Workers end with ``kill()``, or when the process that started them exits, unless
    the job was saved (``dump``/``dumps``, as ``state()`` does with its cache): a saved
    job's workers keep running for a later process to reuse, until someone calls
    ``kill()`` on the job (or ``monarch kill``). A saved job ``can_run`` a specification
    with the same meshes and ``env`` while all its workers are alive. No batch mode.
    """

    #: Seconds ``kill()`` waits after SIGTERM, and again after SIGKILL.
    stop_grace: float = 5.0
    #: Seconds ``apply()`` waits for every worker to serve on its socket.
    start_timeout: float = 60.0

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        if (
            not isinstance(meshes, Mapping)
            or not meshes
            or not all(_valid_mesh(name, count) for name, count in meshes.items())
        ):
            raise ValueError(
                f"ProcessJob(meshes={meshes!r}): expected mesh names mapped to positive "
                "host counts, e.g. ProcessJob({'trainers': 2})"
            )
        env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError(f"ProcessJob(env={env!r}): expected a dict of str to str")
        super().__init__()
        self._meshes: dict[str, int] = dict(meshes)
        self._env: dict[str, str] = env
        self._workers: _Workers | None = None

    def _worker_command(self, address: str) -> list[str]:
        """The command line of a worker listening on ``address``."""
        return [sys.executable, "-m", "monarch.tools.cli", "worker", "--address", address]

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add the mesh ``name`` of ``num_nodes`` hosts (worker processes).

        Before the job is applied, this extends the specification, as if the mesh had
        been given to the constructor. On a running job (applied, or reconnected to a
        saved one through the cache) it also starts the new workers at once, the way
        ``apply()`` started the first ones (the same ``env`` and socket directory), and
        returns once they serve: ``job.state()[name]`` is then their host mesh, of
        extent ``{"hosts": num_nodes}``. The workers already running are not touched.
        ``kill()`` ends the new workers with the others, and so does the exit of this
        process when the job was never saved; a job saved with ``dump()`` (or by
        ``state()`` in its cache) is saved again at that path with the new mesh (one
        saved with ``dumps()`` only, you save again yourself).

        A saved job grown this way is reused by a specification with all its meshes
        (``can_run`` compares the meshes, the added ones included).

        Args:
            name: The new mesh's name.
            num_nodes: How many hosts (worker processes) it has.

        Raises:
            ValueError: The job already has a mesh ``name``, or the name or count is not
                valid.
            RuntimeError: A new worker exited before it served, or did not serve within
                :attr:`start_timeout`; the new workers are stopped and the job is left
                as it was.
        """
        if not _valid_mesh(name, num_nodes):
            raise ValueError(
                f"ProcessJob.add_mesh({name!r}, {num_nodes!r}): expected a non-empty mesh "
                "name and a positive host count, e.g. job.add_mesh('loaders', 2)"
            )
        running = self._running
        meshes = dict(self._meshes)
        if isinstance(running, ProcessJob):
            meshes.update(running._meshes)
        if name in meshes:
            raise ValueError(
                f"ProcessJob.add_mesh({name!r}, {num_nodes!r}): this job already has a "
                f"mesh named {name!r} (its meshes: {meshes}); expected a new name; pick "
                "another one, or kill() the job and give it the meshes you need"
            )
        if isinstance(running, ProcessJob):
            running._start_mesh(name, num_nodes)
        self._meshes[name] = num_nodes
        if running is not None:
            running._save_again()

    def _start_mesh(self, name: str, count: int) -> None:
        """Start ``count`` more workers, the mesh ``name`` of this running job, and wait
        until they serve; on failure stop them and leave the job as it was."""
        workers = self._workers
        if workers is None:
            raise RuntimeError(
                f"ProcessJob.add_mesh({name!r}, {count!r}): the job has no workers; "
                "apply() it first"
            )
        env = {**os.environ, **self._env}
        inherit = _inherit_output()
        first = workers.next_index()
        started: list[_Worker] = []
        try:
            for index in range(first, first + count):
                base = os.path.join(workers.socket_dir, f"worker-{index}")
                started.append(self._start_worker(name, base, env, inherit))
            self._wait_serving(started)
        except BaseException:
            _stop_workers(started, self.stop_grace)
            raise
        workers.meshes[name] = started
        self._meshes[name] = count

    def _create(self, client_script: str | None) -> None:
        _refuse_batch(self, client_script)
        workers = _Workers(_make_socket_dir())
        env = {**os.environ, **self._env}
        inherit = _inherit_output()
        try:
            index = 0
            for mesh, count in self._meshes.items():
                started = workers.meshes.setdefault(mesh, [])
                for _ in range(count):
                    base = os.path.join(workers.socket_dir, f"worker-{index}")
                    index += 1
                    started.append(self._start_worker(mesh, base, env, inherit))
            self._wait_serving(workers.all())
        except BaseException:
            workers.stop(self.stop_grace)
            raise
        self._workers = workers
        _unsaved.add(workers)

    def _start_worker(
        self, mesh: str, base: str, env: dict[str, str], inherit_output: bool
    ) -> _Worker:
        """Start one worker listening at ``base.sock`` (output to ``base.log`` unless
        ``inherit_output``)."""
        address = f"ipc://{base}.sock"
        log = None if inherit_output else f"{base}.log"
        output = None if log is None else open(log, "ab")
        try:
            popen = subprocess.Popen(
                self._worker_command(address),
                env={**env, _READY_FILE_ENV: _ready_file(address)},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        finally:
            if output is not None:
                output.close()  # the worker has its own descriptor
        _children[popen.pid] = popen
        proc = _proc_stat(popen.pid)
        return _Worker(mesh, popen.pid, None if proc is None else proc[1], address, log)

    def _wait_serving(self, workers: list[_Worker]) -> None:
        """Wait until each of ``workers`` serves (its ready file exists); raise if one
        exits first. Its socket alone is not enough: it exists before the worker's agent,
        and a client's first heartbeat arriving in between would be dropped (and its
        attach time out, ``mesh_attach_config_timeout`` later)."""
        deadline = time.monotonic() + self.start_timeout
        pending = list(workers)
        delay = 0.005
        while True:
            for w in list(pending):
                if os.path.exists(_ready_file(w.address)):
                    pending.remove(w)
                elif not _is_running(w):
                    command = shlex.join(self._worker_command(w.address))
                    tail = w.log_tail()
                    why = (
                        f"its output ends with:\n{tail}"
                        if tail
                        else "its output (on this process's stderr) says why"
                    )
                    raise RuntimeError(
                        f"ProcessJob: the worker ({w.describe()}) exited before it "
                        f"listened and served (command: {command}); {why}"
                    )
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"ProcessJob: workers did not listen and serve within "
                    f"{self.start_timeout:g} s: " + "; ".join(w.describe() for w in pending)
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _state(self) -> JobState:
        workers = self._workers
        if workers is None:
            raise RuntimeError("ProcessJob has no workers: apply() it first")
        exited = workers.exited()
        if exited:
            raise RuntimeError(
                "lost connection to worker processes of this ProcessJob (exited: "
                + "; ".join(w.describe() for w in exited)
                + "); call job.kill(), then job.state() to start new workers"
            )
        # Imported here: monarch.job stays cheap to import.
        from monarch._src.actor.workers import attach_to_workers

        # Unix sockets need no credentials (their directory is private to this user):
        # the process's TCP authentication is left as it is, never switched off.
        meshes: dict[str, HostMesh] = {}
        for name, ws in workers.meshes.items():
            meshes[name] = attach_to_workers(name=name, ca=None, workers=[w.address for w in ws])
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's workers can serve ``spec``, so that ``spec.state()``
        reuses them instead of starting new ones.

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``True`` when ``spec`` is a ``ProcessJob`` of the same class with the same
            meshes and environment, and the workers this job started are all still
            running.
        """
        return (
            isinstance(spec, ProcessJob)
            and type(spec) is type(self)
            and spec._meshes == self._meshes
            and spec._env == self._env
            and self._workers is not None
            and not self._workers.exited()
        )

    def _kill(self) -> None:
        workers = self._workers
        if workers is None:
            return
        _unsaved.discard(workers)
        self._workers = None
        workers.stop(self.stop_grace)

    def _saved(self) -> None:
        if self._workers is not None:
            _unsaved.discard(self._workers)

    def __repr__(self) -> str:
        env = f", env={self._env!r}" if self._env else ""
        return f"{type(self).__name__}({self._meshes!r}{env})"
