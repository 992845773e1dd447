"""``SlurmJob``: host meshes on the nodes of one Slurm allocation.

A :class:`SlurmJob` names host meshes by node count (``SlurmJob({"trainers": 2,
"dataloaders": 1})``) and gets them from Slurm with one ``sbatch`` for all meshes. The
batch script starts one ``monarch worker`` per Slurm task with ``srun``; task *t* on a
node serves at ``tcp://$(hostname):<monarch_port + t>``, so several tasks per node do
not collide. ``state()`` waits until the job runs, reads its nodes, waits until every
worker is ready, and attaches to them (``attach_to_workers``): the nodes are split
between the meshes in the order the meshes were named, each node giving
``ntasks_per_node`` consecutive hosts of its mesh.

What it reads from Slurm, in formats stable from Slurm 21.08 to current:
``sbatch --parsable`` (the job id), ``squeue -h -j ID -t all -o '%T|%r|%N'`` (state,
reason, node list), ``scontrol show hostnames LIST`` and ``scontrol show node -o NAMES`` (each
node's ``NodeAddr``, the address the client dials). A job ``squeue`` no longer knows
has ended.

Out of cluster (upstream's ``out_of_cluster=True``, ``attach_to=``): a client whose
network does not reach the nodes attaches through one worker, its gateway
(``monarch.actor.attach``), before any host mesh: the first allocated worker, or the
address ``attach_to`` gives (an SSH tunnel's local end). Every message then goes
through that worker. A running job is adopted with ``slurm_job_id=``.

Security: the job makes a random cluster secret; the client and every worker
authenticate each TCP connection with it (``MONARCH_CLUSTER_SECRET``). It reaches the
workers through ``sbatch``'s environment (never a command line), and is saved with the
job in the state cache, a file only its owner can read. Workers never trust all
connections.

Invariants (tests cite them):

- SLURM-1: one allocation (one ``sbatch``) serves every mesh a job had when it was
  applied; each mesh added to a running job (``add_mesh``) gets one allocation of its
  own, with the job's settings and secret.
- SLURM-2: every error about a submitted job says what Slurm reported and ends with the
  tail of the job's log.
- SLURM-3: ``kill()`` returns once Slurm reports the job ended (or no longer knows it),
  the allocations of added meshes included.
- SLURM-4: ``state()`` attaches only once the job is RUNNING and every worker announced
  that it is ready; a job that ended, or never can start, raises instead.

Typical use::

    from monarch.job import SlurmJob

    job = SlurmJob({"trainers": 2}, python_exe=".venv/bin/python", time_limit="01:00:00")
    trainers = job.state().trainers  # a HostMesh, extent {"hosts": 2}
    ...
    job.kill()
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monarch._src.job.job import DEFAULT_JOB_PATH, JobState, JobTrait
from monarch._src.job.slurm_status import _NEVER_STARTS, _Status
from monarch._src.job.trait import BATCH_ENV

if TYPE_CHECKING:
    from monarch.actor import HostMesh

__all__ = ["SlurmJob"]

logger = logging.getLogger(__name__)

#: What each worker prints once it serves (see ``monarch.actor.run_worker_loop_forever``).
_READY = re.compile(r"^\s*(\d+): monarch worker ready at ", re.MULTILINE)
#: How many lines of the job's log errors quote.
_LOG_TAIL_LINES = 20
#: Time limit of each Slurm command.
_COMMAND_TIMEOUT = 30.0
#: How long an error about a COMPLETING job waits for the job to end, so that it gives
#: the job's final state and a log tail that holds the reason (Slurm writes who
#: cancelled it, or which task failed, while the job completes).
_COMPLETING_SETTLE = 5.0
#: The environment variable a batch-mode client runs with.
_BATCH_ENV = BATCH_ENV
#: Variables of other authentication modes, removed from the workers' environment.
_OTHER_AUTH = ("MONARCH_CLUSTER_AUTH", "MONARCH_TLS_CA", "MONARCH_TLS_KEY", "MONARCH_TLS_CERT")


class SlurmError(RuntimeError):
    """A Slurm command failed, or the job cannot (or no longer does) run the workers."""


@dataclass(frozen=True)
class _Added:
    """The allocation of a mesh added to a running job (``add_mesh``): a Slurm job of
    its own, whose task *t* of a node serves at ``port + t``."""

    mesh: str
    nodes: int
    job_id: str
    port: int


def _use_tcp() -> None:
    """Serve this process over TCP (with its hostname's address) unless monarch already
    started or a transport was chosen: remote workers must be able to dial it back."""
    from monarch._src.actor import process
    from monarch._src.actor.workers import enable_transport

    if process.peek() is None and process.transport_override is None:
        enable_transport("tcp")


class SlurmJob(JobTrait):
    """Host meshes on the nodes of one Slurm allocation (see the module docs).

    Args:
        meshes: Mesh names mapped to node counts, e.g. ``{"trainers": 2}``; more can be
            added with :meth:`add_mesh`, before the job is applied or while it runs.
        python_exe: The Python on the nodes that runs the workers (it must have monarch).
        slurm_args: Extra ``sbatch`` arguments, e.g. ``["--constraint=a100"]``; they
            come after the job's own and win over them.
        monarch_port: The TCP port of each node's first worker; task *t* of a node
            serves at ``monarch_port + t``.
        job_name: The Slurm job name.
        ntasks_per_node: Workers per node: each is a host of its mesh, so a mesh of
            ``n`` nodes has extent ``{"hosts": n * ntasks_per_node}``.
        time_limit: ``--time`` (e.g. ``"01:00:00"``); ``None``: the partition default.
        partition: ``--partition``; ``None``: the cluster default.
        log_dir: Where the job's log ``slurm_<id>_<job_name>.out`` goes (workers' output
            and Slurm's messages); default the working directory. Errors quote its tail.
        exclusive: ``--exclusive``: no other job on the nodes.
        gpus_per_node: ``--gpus-per-node``.
        cpus_per_task: ``--cpus-per-task``.
        mem: ``--mem`` (per node, e.g. ``"64G"``).
        job_start_timeout: Seconds ``state()`` waits for the job to start running (and
            its workers to be ready); ``None`` waits as long as the job may start. On
            timeout the job is cancelled.
        account: ``--account``.
        qos: ``--qos``.
        out_of_cluster: The client runs outside the cluster's network and reaches the
            nodes through one gateway (upstream Monarch's meaning): ``state()`` attaches
            this process to the first allocated worker (``monarch.actor.attach``) before
            any host mesh, unless ``attach_to`` names the gateway. It must then be this
            program's first monarch call. ``False``: the client dials each node at its
            ``NodeAddr``.
        attach_to: The gateway's address as this machine reaches it, e.g.
            ``"tcp://127.0.0.1:22222"`` for an SSH tunnel to the first node's worker
            (upstream Monarch's meaning): ``state()`` attaches through it, as with
            ``out_of_cluster=True``. A Slurm job id here (what this parameter meant in
            earlier versions of this implementation) raises ``ValueError`` pointing to
            ``slurm_job_id``.
        slurm_job_id: The id of a running Slurm job to use instead of submitting one: a
            job whose tasks run ``monarch worker`` the way this class starts them
            (another client's ``SlurmJob``, for instance). Its workers' secret must then
            be in ``MONARCH_CLUSTER_SECRET``. ``kill()`` cancels it.

    Raises:
        ValueError: an argument is invalid (the message shows a valid call).
    """

    #: Seconds ``kill()`` waits for Slurm to report the job ended (Slurm waits
    #: ``KillWait``, 30 s by default, before SIGKILL).
    kill_timeout: float = 90.0
    #: Seconds ``state()`` waits for the workers to announce they serve, once the job
    #: runs (when ``job_start_timeout`` is ``None``).
    worker_ready_timeout: float = 120.0
    #: Longest pause between two polls of Slurm while waiting.
    max_poll_interval: float = 1.0

    # Class-level defaults, so that a job pickled before meshes could be added to a
    # running job still loads: the allocations of added meshes, and those known ready.
    _added: tuple[_Added, ...] = ()
    _added_ready: frozenset[str] = frozenset()
    # Likewise for jobs pickled before the gateway options.
    _out_of_cluster: bool = False
    _slurm_job_id: str | None = None

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        slurm_job_id: str | int | None = None,
    ) -> None:
        if not isinstance(meshes, Mapping):
            raise ValueError(
                f"SlurmJob(meshes={meshes!r}): expected mesh names mapped to node counts, "
                "e.g. SlurmJob({'trainers': 2})"
            )
        for name, count in meshes.items():
            _check_mesh(name, count)
        if isinstance(slurm_args, str):
            raise ValueError(
                f"SlurmJob(slurm_args={slurm_args!r}): expected a list of sbatch arguments, "
                f"e.g. slurm_args={shlex.split(slurm_args)!r}"
            )
        if not isinstance(monarch_port, int) or not 1 <= monarch_port <= 65535:
            raise ValueError(f"SlurmJob(monarch_port={monarch_port!r}): expected a TCP port")
        if not isinstance(ntasks_per_node, int) or ntasks_per_node < 1:
            raise ValueError(
                f"SlurmJob(ntasks_per_node={ntasks_per_node!r}): expected a positive int"
            )
        if monarch_port + ntasks_per_node - 1 > 65535:
            raise ValueError(
                f"SlurmJob: ports {monarch_port}..{monarch_port + ntasks_per_node - 1} do "
                "not fit below 65536; pick a lower monarch_port"
            )
        if job_start_timeout is not None and job_start_timeout <= 0:
            raise ValueError(
                f"SlurmJob(job_start_timeout={job_start_timeout!r}): expected seconds > 0, "
                "or None to wait as long as the job may start"
            )
        _check_gateway(attach_to)
        if slurm_job_id is not None and not str(slurm_job_id).strip().isdigit():
            raise ValueError(
                f"SlurmJob(slurm_job_id={slurm_job_id!r}): expected the id of a running "
                "Slurm job, e.g. slurm_job_id='12345'"
            )
        super().__init__()
        self._meshes: dict[str, int] = dict(meshes)
        self._python_exe = python_exe
        self._slurm_args: tuple[str, ...] = tuple(slurm_args)
        self._port = monarch_port
        self._job_name = job_name
        self._ntasks_per_node = ntasks_per_node
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = os.path.abspath(log_dir if log_dir is not None else os.getcwd())
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._out_of_cluster = bool(out_of_cluster)
        self._attach_to = attach_to
        self._slurm_job_id = None if slurm_job_id is None else str(slurm_job_id).strip()
        # The allocation (set by apply()).
        self._job_id: str | None = None
        self._secret: str | None = None
        self._batch = False
        self._ready = False
        if not self._through_gateway:
            _use_tcp()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A job loaded from the cache (or in batch mode, inside the allocation) must
        # serve over TCP too, as __init__ arranged for the process that made it.
        self.__dict__.update(state)
        attach_to = self.__dict__.get("_attach_to")
        if isinstance(attach_to, str) and attach_to.isdigit():
            # Saved when attach_to named a Slurm job (now slurm_job_id).
            self._slurm_job_id, self._attach_to = attach_to, None
        if not self._through_gateway:
            _use_tcp()

    @property
    def _through_gateway(self) -> bool:
        """Whether the client reaches the nodes through a gateway (out of cluster)."""
        return self._out_of_cluster or self._attach_to is not None

    # ----------------------------------------------------------------------------------
    # Specification

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add the mesh ``name`` of ``num_nodes`` nodes.

        Before the job is applied, this extends the specification: the one allocation
        ``apply()`` submits serves it too (SLURM-1). On a running job (applied, or
        reconnected to a saved one through the cache) it submits an allocation of its
        own for the new mesh at once (one ``sbatch``, with the job's settings, secret
        and log directory), whose workers come up like the first ones; ``job.state()``
        then waits for it as for the first, and ``state()[name]`` is its host mesh.
        :attr:`slurm_job_id` stays the first allocation's; :attr:`slurm_job_ids` lists
        them all, and ``kill()`` cancels them all. The workers of the ``k``-th added
        allocation serve at ``monarch_port + k * ntasks_per_node + t``, so that they
        never collide with another allocation's on a shared node. A job saved with
        ``dump()`` (or by ``state()`` in its cache) is saved again there with the new
        allocation.

        Args:
            name: The new mesh's name.
            num_nodes: How many nodes it has (each gives ``ntasks_per_node`` hosts).

        Raises:
            ValueError: The job already has a mesh ``name``, the name or count is not
                valid, or the new allocation's ports would not fit below 65536.
            SlurmError: ``sbatch`` refused the new allocation (the job is left as it
                was).
        """
        _check_mesh(name, num_nodes)
        running = self._running
        meshes = dict(self._meshes)
        if isinstance(running, SlurmJob):
            meshes.update(running._meshes)
        if name in meshes:
            raise ValueError(
                f"SlurmJob.add_mesh({name!r}, {num_nodes!r}): this job already has a mesh "
                f"named {name!r} (its meshes: {meshes}); expected a new name; pick another "
                "one, or kill() the job and give it the meshes you need"
            )
        if isinstance(running, SlurmJob):
            running._submit_added(name, num_nodes)
        self._meshes[name] = num_nodes
        if running is not None:
            running._save_again()

    def _spec(self) -> tuple[object, ...]:
        return (
            self._meshes,
            self._python_exe,
            self._slurm_args,
            self._port,
            self._job_name,
            self._ntasks_per_node,
            self._time_limit,
            self._partition,
            self._exclusive,
            self._gpus_per_node,
            self._cpus_per_task,
            self._mem,
            self._account,
            self._qos,
            self._slurm_job_id,
            self._out_of_cluster,
            self._attach_to,
        )

    @property
    def slurm_job_id(self) -> str | None:
        """The Slurm job id of the allocation this job uses (its own, or the saved one it
        reconnected to); ``None`` before ``apply()``."""
        running = self._running
        if isinstance(running, SlurmJob) and running is not self:
            return running.slurm_job_id
        return self._resolved_job_id()

    @property
    def slurm_job_ids(self) -> list[str]:
        """The Slurm job ids of every allocation this job uses: the first (its
        :attr:`slurm_job_id`), then one per mesh added while it ran (:meth:`add_mesh`);
        empty before ``apply()``."""
        running = self._running
        if isinstance(running, SlurmJob) and running is not self:
            return running.slurm_job_ids
        first = self._resolved_job_id()
        return ([] if first is None else [first]) + [a.job_id for a in self._added]

    @property
    def log_path(self) -> str | None:
        """The job's Slurm log (workers' output and Slurm's messages), once submitted."""
        running = self._running
        if isinstance(running, SlurmJob) and running is not self:
            return running.log_path
        job_id = self._resolved_job_id()
        if job_id is None:
            return None
        return self._log_of(job_id)

    def _log_of(self, job_id: str) -> str:
        """The Slurm log of the allocation ``job_id`` (the first, or an added mesh's)."""
        return os.path.join(self._log_dir, f"slurm_{job_id}_{self._job_name}.out")

    def _first_meshes(self) -> dict[str, int]:
        """The meshes the first allocation serves: all but those added while it ran."""
        added = {a.mesh for a in self._added}
        return {name: n for name, n in self._meshes.items() if name not in added}

    def __repr__(self) -> str:
        job = f", slurm_job_id={self._job_id!r}" if self._job_id else ""
        return f"SlurmJob({self._meshes!r}, job_name={self._job_name!r}{job})"

    # ----------------------------------------------------------------------------------
    # JobTrait

    def _create(self, client_script: str | None) -> None:
        if not self._meshes:
            raise ValueError(
                "SlurmJob has no meshes: name them, SlurmJob({'trainers': 2}), or add them "
                "with job.add_mesh('trainers', 2) before apply()"
            )
        self._ready = False
        if self._slurm_job_id is not None:
            if client_script is not None:
                raise RuntimeError(
                    "SlurmJob(slurm_job_id=...) cannot run a client script: batch mode "
                    "submits a job of its own; leave slurm_job_id out"
                )
            self._adopt(self._slurm_job_id)
            return
        if self._through_gateway and client_script is not None:
            raise RuntimeError(
                "SlurmJob(out_of_cluster=True or attach_to=...) cannot run a client script: "
                "batch mode runs the client inside the allocation, in the cluster; leave "
                "out_of_cluster and attach_to out"
            )
        self._secret = secrets.token_hex(32)
        if client_script is not None:
            self._save_for_batch(client_script)
        self._submit(client_script)

    def _state(self) -> JobState:
        job_id = self._resolved_job_id()
        if job_id is None:
            raise SlurmError("SlurmJob has no Slurm job: apply() it first")
        deadline = (
            None if self._job_start_timeout is None else time.monotonic() + self._job_start_timeout
        )
        first = self._first_meshes()
        nodes = self._wait_running(job_id, deadline, sum(first.values()))
        addresses = self._node_addresses(nodes)
        if not self._ready:
            self._wait_workers_ready(job_id, nodes, deadline)
            self._ready = True
        if self._through_gateway:
            # Before any host mesh: the first allocated worker, unless attach_to names
            # the gateway (an SSH tunnel's local end, say).
            self._attach_gateway(self._attach_to or f"tcp://{addresses[0]}:{self._port}")
        meshes = self._attach(first, addresses, self._port)
        for added in self._added:
            nodes = self._wait_running(added.job_id, deadline, added.nodes)
            addresses = self._node_addresses(nodes)
            if added.job_id not in self._added_ready:
                self._wait_workers_ready(added.job_id, nodes, deadline)
                self._added_ready = self._added_ready | {added.job_id}
            meshes.update(self._attach({added.mesh: added.nodes}, addresses, added.port))
        # In the order the meshes were named (added ones last, as they were added).
        return JobState({name: meshes[name] for name in self._meshes if name in meshes})

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's Slurm allocation can serve ``spec``, so that
        ``spec.state()`` attaches to it instead of submitting a new one.

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``True`` when ``spec`` is a ``SlurmJob`` with the same meshes (those added
            to this one while it ran included) and Slurm options, and every allocation
            of this job is still active (asked of ``squeue``).
        """
        if not isinstance(spec, SlurmJob) or spec._spec() != self._spec():
            return False
        job_id = self._resolved_job_id()
        return job_id is not None and all(
            self._squeue(j).active for j in [job_id, *(a.job_id for a in self._added)]
        )

    def _kill(self) -> None:
        job_id = self._resolved_job_id()
        if job_id is None:
            return
        # Every allocation is cancelled before any is waited for. The added meshes'
        # allocations never hold the client, so they are cancelled in batch mode too;
        # whether one ended, its wait tells.
        added = [a.job_id for a in self._added]
        for other in added:
            self._run(["scancel", other], what=f"cancel Slurm job {other}", check=False)
        batch = self._inside_own_batch_job(job_id)
        if not batch:
            self._run(["scancel", job_id], what=f"cancel Slurm job {job_id}")
        for other in added:
            self._wait_ended(other)
        self._added = ()
        self._added_ready = frozenset()
        if batch:
            logger.info(
                "SlurmJob: not cancelling Slurm job %s from inside it (batch mode): it "
                "ends when the client script exits",
                job_id,
            )
            return
        self._wait_ended(job_id)
        self._job_id = None
        self._ready = False

    def _wait_ended(self, job_id: str) -> None:
        """Wait until Slurm reports the cancelled job ``job_id`` ended (SLURM-3)."""
        deadline = time.monotonic() + self.kill_timeout
        delay = 0.02
        while True:
            status = self._squeue(job_id)
            if not status.active and status.state != "COMPLETING":
                logger.info("SlurmJob: Slurm job %s ended: %s", job_id, status.describe())
                break
            if time.monotonic() >= deadline:
                raise SlurmError(
                    f"Slurm job {job_id} was cancelled but is still {status.describe()} "
                    f"after {self.kill_timeout:g} s; expected it to end within Slurm's "
                    "KillWait; check the nodes with `scontrol show job "
                    f"{job_id}`{self._log_tail_suffix(job_id)}"
                )
            time.sleep(delay)  # polling squeue: Slurm has no wait-for-end command
            delay = min(delay * 2, self.max_poll_interval)

    # ----------------------------------------------------------------------------------
    # Submitting

    def _batch_script(
        self, client_script: str | None, nodes: int | None = None, port: int | None = None
    ) -> str:
        """The sbatch script: directives, then ``srun`` of one worker per task (and in
        batch mode the client, after which the workers stop). ``nodes`` and ``port``
        are those of an added mesh's allocation; by default, the first one's."""
        nodes = sum(self._meshes.values()) if nodes is None else nodes
        port = self._port if port is None else port
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={self._job_name}",
            f"#SBATCH --nodes={nodes}",
            f"#SBATCH --ntasks-per-node={self._ntasks_per_node}",
            f"#SBATCH --output={os.path.join(self._log_dir, f'slurm_%j_{self._job_name}.out')}",
        ]
        optional = {
            "--time": self._time_limit,
            "--partition": self._partition,
            "--gpus-per-node": self._gpus_per_node,
            "--cpus-per-task": self._cpus_per_task,
            "--mem": self._mem,
            "--account": self._account,
            "--qos": self._qos,
        }
        lines += [f"#SBATCH {flag}={value}" for flag, value in optional.items() if value]
        if self._exclusive:
            lines.append("#SBATCH --exclusive")
        # A requeued job restarts on other nodes, which the client's meshes do not know:
        # a node failure must end the job, for state() to report it.
        lines.append("#SBATCH --no-requeue")
        worker = (
            'exec "$0" -m monarch.tools.cli worker '
            f'--address "tcp://$(hostname):$(({port} + SLURM_LOCALID))"'
        )
        srun = f"srun --label --kill-on-bad-exit=0 bash -c {shlex.quote(worker)} " + shlex.quote(
            self._python_exe
        )
        lines += [
            "# Workers authenticate with the job's secret (in the environment, from sbatch).",
            "unset " + " ".join(_OTHER_AUTH),
            "export MONARCH_CLUSTER_SECRET",
        ]
        if client_script is None:
            lines += ["# One monarch worker per task, at monarch_port + its local task id.", srun]
        else:
            lines += [
                "# Batch mode: the workers, then the client; the job ends with the client.",
                f"{srun} &",
                "workers=$!",
                f"{_BATCH_ENV}=1 {shlex.quote(self._python_exe)} {shlex.quote(client_script)}",
                "status=$?",
                'kill -TERM "$workers" 2>/dev/null',
                'wait "$workers"',
                'exit "$status"',
            ]
        return "\n".join(lines) + "\n"

    def _submit(self, client_script: str | None) -> None:
        job_id = self._sbatch(self._meshes, self._batch_script(client_script))
        self._job_id = job_id
        logger.info("SlurmJob: submitted Slurm job %s; its log: %s", job_id, self.log_path)

    def _sbatch(self, meshes: dict[str, int], script: str) -> str:
        """Submit ``script``, an allocation for ``meshes``; its Slurm job id."""
        os.makedirs(self._log_dir, exist_ok=True)
        env = {**os.environ, "MONARCH_CLUSTER_SECRET": self._secret or ""}
        argv = ["sbatch", "--parsable", *self._slurm_args]
        nodes = sum(meshes.values())
        done = self._run(
            argv,
            what=f"submit the job ({nodes} nodes, {self._ntasks_per_node} tasks per node)",
            stdin=script,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise SlurmError(
                f"sbatch refused the job ({nodes} nodes for meshes {meshes}, "
                f"{self._ntasks_per_node} task(s) per node, partition "
                f"{self._partition or 'default'}): {done.stderr.strip()}; expected Slurm to "
                "queue it; fix the request (`sinfo` lists the partitions and their nodes) "
                f"or slurm_args={list(self._slurm_args)!r}"
            )
        job_id = done.stdout.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(
                f"sbatch --parsable printed {done.stdout.strip()!r}, expected a job id"
            )
        return job_id

    def _submit_added(self, name: str, num_nodes: int) -> None:
        """Submit the allocation of the mesh ``name`` added to this running job."""
        k = len(self._added) + 1
        port = self._port + k * self._ntasks_per_node
        if port + self._ntasks_per_node - 1 > 65535:
            raise ValueError(
                f"SlurmJob.add_mesh({name!r}, {num_nodes!r}): the workers of added mesh "
                f"number {k} would serve at ports {port}..{port + self._ntasks_per_node - 1}"
                ", which do not fit below 65536; expected a lower monarch_port "
                f"(now {self._port})"
            )
        if not self._secret:
            raise SlurmError(
                f"SlurmJob.add_mesh({name!r}, {num_nodes!r}): the job has no cluster "
                "secret for the new workers; apply() it first"
            )
        script = self._batch_script(None, nodes=num_nodes, port=port)
        job_id = self._sbatch({name: num_nodes}, script)
        self._added = (*self._added, _Added(name, num_nodes, job_id, port))
        self._meshes[name] = num_nodes
        logger.info(
            "SlurmJob: submitted Slurm job %s for the added mesh %r; its log: %s",
            job_id,
            name,
            self._log_of(job_id),
        )

    def _save_for_batch(self, client_script: str) -> None:
        """Save the job for the client script, which runs inside the allocation and
        reconnects through the cache (its Slurm job id comes from ``SLURM_JOB_ID``)."""
        if not os.path.isfile(client_script):
            raise FileNotFoundError(
                f"SlurmJob.apply(client_script={client_script!r}): no such file; give the "
                "path of the Python script to run inside the allocation"
            )
        saved = object.__new__(SlurmJob)
        saved.__dict__.update(self.__dict__)
        saved._batch = True
        saved._status = "running"
        saved._apply_id = str(uuid.uuid4())
        saved.dump(DEFAULT_JOB_PATH)

    def _adopt(self, job_id: str) -> None:
        secret = os.environ.get("MONARCH_CLUSTER_SECRET")
        if not secret:
            raise SlurmError(
                f"SlurmJob(slurm_job_id={job_id!r}) needs the workers' cluster secret in "
                "MONARCH_CLUSTER_SECRET (the one the job's workers were started with)"
            )
        status = self._squeue(job_id)
        if not status.active:
            raise SlurmError(
                f"SlurmJob(slurm_job_id={job_id!r}): Slurm job {job_id} is "
                f"{status.describe()}; expected a pending or running job; leave "
                "slurm_job_id out to submit a new one"
            )
        self._secret = secret
        self._job_id = job_id

    # ----------------------------------------------------------------------------------
    # Waiting and attaching

    def _resolved_job_id(self) -> str | None:
        if self._job_id is not None:
            return self._job_id
        if self._batch and os.environ.get(_BATCH_ENV) == "1":
            return os.environ.get("SLURM_JOB_ID")
        return None

    def _inside_own_batch_job(self, job_id: str) -> bool:
        return os.environ.get(_BATCH_ENV) == "1" and os.environ.get("SLURM_JOB_ID") == job_id

    def _settled(self, job_id: str, status: _Status) -> _Status:
        """``status``; if the job is COMPLETING, its status once it has ended, waiting at
        most ``_COMPLETING_SETTLE`` seconds (for an error that names its final state
        and quotes a log that says why it ended)."""
        deadline = time.monotonic() + _COMPLETING_SETTLE
        delay = 0.02
        while status.state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(delay)  # polling squeue: Slurm has no wait-for-end command
            delay = min(delay * 2, self.max_poll_interval)
            status = self._squeue(job_id)
        return status

    def _wait_running(self, job_id: str, deadline: float | None, expected: int) -> list[str]:
        """Wait until the job runs; return its ``expected`` nodes (SLURM-4)."""
        delay = 0.02
        last = None
        while True:
            status = self._squeue(job_id)
            if status.state == "RUNNING":
                return self._hostnames(job_id, status.nodelist, expected)
            if not status.active:
                status = self._settled(job_id, status)
                check = (
                    f"check python_exe={self._python_exe!r}, which must run monarch on the nodes"
                )
                if status.state in ("FAILED", "COMPLETED"):
                    why = f" (its workers exited: {check})"
                elif status.state == "COMPLETING":
                    # Cancelled, or every task exited: the log tail below tells which.
                    why = f" (if it was not cancelled, its workers exited: {check})"
                else:
                    why = ""
                raise SlurmError(
                    f"Slurm job {job_id} is {status.describe()}{why}, so it no longer runs "
                    "the workers of this SlurmJob; expected RUNNING; call job.kill() and "
                    f"then job.state() to submit a new one{self._log_tail_suffix(job_id)}"
                )
            if status.reason in _NEVER_STARTS:
                self._cancel_quietly(job_id)
                raise SlurmError(
                    f"Slurm job {job_id} can never start: {status.describe()}, "
                    f"{_NEVER_STARTS[status.reason]}; it was cancelled; fix the request "
                    "(`sinfo` lists partitions and nodes; `scontrol show job` the details) "
                    f"and apply again{self._log_tail_suffix(job_id)}"
                )
            if (status.state, status.reason) != last:
                logger.info("SlurmJob: Slurm job %s is %s", job_id, status.describe())
                last = (status.state, status.reason)
            if deadline is not None and time.monotonic() >= deadline:
                self._cancel_quietly(job_id)
                raise SlurmError(
                    f"Slurm job {job_id} did not start within job_start_timeout="
                    f"{self._job_start_timeout:g} s: it is {status.describe()}; it was "
                    "cancelled; raise job_start_timeout, or ask for fewer or other nodes "
                    f"(`squeue -j {job_id}` explains the reason){self._log_tail_suffix(job_id)}"
                )
            time.sleep(delay)  # polling squeue: Slurm has no wait-for-start command
            delay = min(delay * 2, self.max_poll_interval)

    def _wait_workers_ready(self, job_id: str, nodes: list[str], deadline: float | None) -> None:
        """Wait until every worker printed its ready line in the job's log (SLURM-4);
        skipped when the log is not readable here (no shared file system)."""
        expected = len(nodes) * self._ntasks_per_node
        path = self._log_of(job_id)
        if not os.path.exists(path):
            return
        limit = time.monotonic() + self.worker_ready_timeout
        if deadline is not None:
            limit = min(limit, deadline)
        delay = 0.02
        while True:
            ready = {int(task) for task in _READY.findall(_read(path))}
            if len(ready) >= expected:
                return
            status = self._squeue(job_id)
            if status.state != "RUNNING":
                status = self._settled(job_id, status)
                raise SlurmError(
                    f"Slurm job {job_id} is {status.describe()} before all its workers "
                    f"were ready ({len(ready)} of {expected}); expected every task to run "
                    f"`monarch worker`; check python_exe={self._python_exe!r} (it must "
                    f"have monarch on the nodes){self._log_tail_suffix(job_id)}"
                )
            if time.monotonic() >= limit:
                missing = sorted(set(range(expected)) - ready)
                self._cancel_quietly(job_id)
                raise SlurmError(
                    f"workers of Slurm job {job_id} were not ready in time (tasks "
                    f"{missing} did not print 'monarch worker ready'); it was cancelled; "
                    f"check python_exe={self._python_exe!r} and the log"
                    f"{self._log_tail_suffix(job_id)}"
                )
            time.sleep(delay)  # polling the log: the workers announce themselves there
            delay = min(delay * 2, 0.25)

    def _node_addresses(self, nodes: list[str]) -> list[str]:
        """Each node's ``NodeAddr`` (in ``nodes``' order)."""
        out = self._run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)], what="read the nodes"
        ).stdout
        addrs: dict[str, str] = {}
        for line in out.splitlines():
            name = re.search(r"\bNodeName=(\S+)", line)
            addr = re.search(r"\bNodeAddr=(\S+)", line)
            if name:
                addrs[name[1]] = addr[1] if addr else name[1]
        return [addrs.get(node, node) for node in nodes]

    def _attach_gateway(self, gateway: str) -> None:
        """Attach this client to the worker at ``gateway`` (out of cluster), with the
        job's secret."""
        from monarch._rust_bindings import set_cluster_secret
        from monarch._src.actor.gateway import attach

        if not self._secret:
            raise SlurmError("SlurmJob has no cluster secret: apply() it first")
        set_cluster_secret(self._secret)
        logger.info("SlurmJob: attaching this client through the gateway %s", gateway)
        attach(gateway)

    def _attach(
        self, meshes: dict[str, int], addresses: list[str], port: int
    ) -> dict[str, HostMesh]:
        """Attach to the workers of one allocation: its nodes' ``addresses``, split
        between ``meshes`` in order; task *t* of a node serves at ``port + t``."""
        from monarch._rust_bindings import set_cluster_secret
        from monarch._src.actor.workers import attach_to_workers

        if not self._secret:
            raise SlurmError("SlurmJob has no cluster secret: apply() it first")
        set_cluster_secret(self._secret)
        k = self._ntasks_per_node
        workers = [f"tcp://{addr}:{port + t}" for addr in addresses for t in range(k)]
        attached: dict[str, HostMesh] = {}
        start = 0
        for name, count in meshes.items():
            mine = workers[start : start + count * k]
            start += count * k
            attached[name] = attach_to_workers(name=name, ca=None, workers=mine)
        return attached

    # ----------------------------------------------------------------------------------
    # Slurm commands

    def _squeue(self, job_id: str) -> _Status:
        done = self._run(
            ["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T|%r|%N"],
            what=f"query Slurm job {job_id}",
            check=False,
        )
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return _Status(None)
            raise SlurmError(
                f"squeue failed for Slurm job {job_id} (exit {done.returncode}): "
                f"{done.stderr.strip()}; expected the controller to answer; check "
                "`scontrol ping` and SLURM_CONF"
            )
        line = done.stdout.strip().splitlines()
        if not line:
            return _Status(None)
        state, reason, nodelist = [*line[0].split("|"), "", ""][:3]
        return _Status(state.strip(), reason.strip(), nodelist.strip())

    def _hostnames(self, job_id: str, nodelist: str, expected: int) -> list[str]:
        if not nodelist:
            return []
        out = self._run(
            ["scontrol", "show", "hostnames", nodelist], what="expand the node list"
        ).stdout
        nodes = out.split()
        if len(nodes) != expected:
            raise SlurmError(
                f"Slurm job {job_id} runs on {len(nodes)} nodes ({nodelist}), "
                f"expected {expected} (meshes {self._meshes}); partial allocations are "
                "not supported: kill() the job and apply again"
            )
        return nodes

    def _cancel_quietly(self, job_id: str) -> None:
        if not self._inside_own_batch_job(job_id):
            self._run(["scancel", job_id], what=f"cancel Slurm job {job_id}", check=False)

    def _run(
        self,
        argv: list[str],
        *,
        what: str,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        if shutil.which(argv[0]) is None:
            raise SlurmError(
                f"SlurmJob: cannot {what}: `{argv[0]}` is not on PATH; run the client on a "
                "machine with the Slurm client commands (a login node) and SLURM_CONF set "
                "if the cluster needs it"
            )
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"SlurmJob: cannot {what}: `{shlex.join(argv)}` did not answer within "
                f"{_COMMAND_TIMEOUT:g} s; is slurmctld up (`scontrol ping`)?"
            ) from None
        if check and done.returncode != 0:
            raise SlurmError(
                f"SlurmJob: cannot {what}: `{shlex.join(argv)}` failed (exit "
                f"{done.returncode}): {done.stderr.strip()}{self._log_tail_suffix()}"
            )
        return done

    def _log_tail_suffix(self, job_id: str | None = None) -> str:
        """The tail of the log of the allocation ``job_id`` (by default the first), for
        an error message (SLURM-2)."""
        path = self.log_path if job_id is None else self._log_of(job_id)
        if path is None:
            return ""
        if not os.path.exists(path):
            return (
                f"\n(the job's log {path} does not exist: the job has not run yet, or "
                "log_dir is not on a file system this machine shares with the nodes)"
            )
        lines = _read(path).splitlines()[-_LOG_TAIL_LINES:]
        if not lines:
            return f"\n(the job's log {path} is empty)"
        return f"\nthe job's log {path} ends with:\n" + "\n".join(lines)


def _check_gateway(attach_to: object) -> None:
    """``attach_to`` must be a gateway address (upstream's meaning), not a Slurm job id
    (what it meant in earlier versions of this implementation)."""
    if attach_to is None:
        return
    if isinstance(attach_to, int) or (
        isinstance(attach_to, str) and attach_to.strip().replace("_", "").isdigit()
    ):
        raise ValueError(
            f"SlurmJob(attach_to={attach_to!r}): attach_to is the gateway address of a "
            "client outside the cluster (upstream Monarch's meaning, e.g. "
            "attach_to='tcp://127.0.0.1:22222'), not a Slurm job id; to use the running "
            f"Slurm job {attach_to}, pass slurm_job_id={str(attach_to).strip()!r} instead"
        )
    if not isinstance(attach_to, str) or (
        "://" not in attach_to and not attach_to.startswith(("tcp:", "unix:"))
    ):
        raise ValueError(
            f"SlurmJob(attach_to={attach_to!r}): expected the gateway's address as this "
            "machine reaches it, e.g. 'tcp://127.0.0.1:22222' (a worker's port, through an "
            "SSH tunnel); leave it out to attach through the first allocated worker with "
            "out_of_cluster=True"
        )


def _check_mesh(name: object, count: object) -> None:
    if (
        not isinstance(name, str)
        or not name
        or not isinstance(count, int)
        or isinstance(count, bool)
        or count < 1
    ):
        raise ValueError(
            f"SlurmJob: mesh {name!r} with {count!r} nodes: expected a non-empty name and a "
            "positive node count, e.g. SlurmJob({'trainers': 2}) or add_mesh('trainers', 2)"
        )


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
