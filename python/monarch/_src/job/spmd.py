"""``monarch.job.spmd``: run a torchrun command line on a job's hosts.

The on-ramp for moving an existing torchrun script onto Monarch before rewriting it as
actors. :func:`serve` takes the command line you would give torchrun (``["torchrun",
"--nnodes=2", "--nproc-per-node=4", "train.py", "--lr", "0.1"]``, or the same as one
string, or a torchx ``AppDef`` holding it) and a scheduler, gets the hosts from that
scheduler (``--nnodes`` hosts) and returns an :class:`SPMDJob`; its
:meth:`~SPMDJob.run_spmd` starts ``--nproc-per-node`` procs on each host, gives every
proc torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
...; see :mod:`monarch.spmd`) and runs the script in it, as torchrun would run it in each
worker. A rank that raises or exits with a non-zero status fails the run: the other ranks
are stopped and :class:`SPMDRunError` names it.

=====================  ===========================================================
``scheduler``          the job that provides the hosts
=====================  ===========================================================
``"local"``,           :class:`~monarch.job.ProcessJob`: one worker process per host on
``"local_cwd"``        this machine (they end with this process, or ``kill()``)
``"slurm"``            :class:`~monarch.job.SlurmJob`: one Slurm allocation of
                       ``--nnodes`` nodes
``"kubernetes"``       :class:`~monarch.job.kubernetes.KubernetesJob`: ``--nnodes`` pods
=====================  ===========================================================

Torchrun's own rendezvous, restart and logging flags are accepted and have no effect
(Monarch picks the rendezvous address, and a failed run is run again by calling
``run_spmd()`` again); a flag torchrun does not have raises :class:`ValueError` naming it.

Invariants (tests cite them):

- SPMD-1: every rank runs the script once per ``run_spmd()``, in a proc of its own that
  the call starts and stops; the job's hosts outlive it (run again without a new
  allocation).
- SPMD-2: ``run_spmd()`` returns only when every rank's script returned; the first ranks
  that fail end it: the others are stopped, and the error names the failed ranks with
  their exception or exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import math
import os
import re
import shlex
import socket
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, cast

from monarch._src.actor import supervision
from monarch._src.actor.endpoint import endpoint
from monarch._src.job.job import DEFAULT_JOB_PATH, JobState, JobTrait, job_load, job_loads
from monarch._src.spmd.actor import SPMDActor

if TYPE_CHECKING:
    from monarch._src.actor.future import Future
    from monarch._src.actor.proc_mesh import HostMesh, ProcMesh

__all__ = ["SPMDJob", "SPMDRunError", "job_load", "job_loads", "serve"]

logger = logging.getLogger(__name__)

#: The name of the host mesh an :class:`SPMDJob`'s state has (upstream's name).
MESH = "workers"
#: The per-host dimension of the procs ``run_spmd`` starts (upstream's name).
PROC_DIM = "gpus"

#: Scheduler names of :func:`serve` and the job each maps to.
_LOCAL = ("local", "local_cwd")
_SCHEDULERS = (*_LOCAL, "slurm", "kubernetes")

#: Programs that are torchrun, and modules ``python -m`` runs as torchrun.
_TORCHRUN = ("torchrun", "torch.distributed.run")


class SPMDRunError(RuntimeError):
    """Ranks of :meth:`SPMDJob.run_spmd` failed: their script raised, exited with a
    non-zero status, or their proc died. ``failures`` maps each failed rank to what it
    raised (an ``ActorError`` whose ``exception`` is the script's, or a
    ``SupervisionError`` for a proc that died); the other ranks were stopped."""

    def __init__(self, message: str, failures: dict[int, BaseException]) -> None:
        super().__init__(message)
        #: The failed ranks (global ``RANK``), and what each raised.
        self.failures = failures

    @property
    def ranks(self) -> list[int]:
        """The failed ranks, in order."""
        return sorted(self.failures)


# --------------------------------------------------------------------------------------
# The torchrun command line


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises ``ValueError`` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


#: Torchrun's flags that take a value and have no effect here (Monarch does the
#: rendezvous, restarts and output), with their underscore spellings.
_IGNORED_WITH_VALUE = (
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-conf",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "event-log-handler",
    "role",
    "log-dir",
    "log-line-prefix-template",
    "local-ranks-filter",
    "duplicate-stdout-filters",
    "duplicate-stderr-filters",
    "node-rank",
    "master-addr",
    "master-port",
    "local-addr",
    "logs-specs",
    "numa-binding",
    "signals-to-handle",
    "shutdown-timeout",
)


def _both(flag: str) -> list[str]:
    """``--a-b`` and its underscore spelling ``--a_b`` (torchrun accepts both)."""
    spellings = [f"--{flag}"]
    if "-" in flag:
        spellings.append("--" + flag.replace("-", "_"))
    return spellings


def _torchrun_parser() -> _Parser:
    """Torchrun's flags (those of ``torch.distributed.run``, without importing torch)."""
    p = _Parser(prog="torchrun", add_help=False, allow_abbrev=False)
    p.add_argument("--nnodes", default="1:1")
    p.add_argument(*_both("nproc-per-node"), dest="nproc_per_node", default="1")
    p.add_argument(*_both("rdzv-id"), dest="rdzv_id", default="none")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument(*_both("no-python"), dest="no_python", action="store_true")
    p.add_argument(*_both("run-path"), dest="run_path", action="store_true")
    p.add_argument(*_both("virtual-local-rank"), dest="virtual_local_rank", action="store_true")
    p.add_argument("-r", "--redirects")
    p.add_argument("-t", "--tee")
    for flag in _IGNORED_WITH_VALUE:
        p.add_argument(*_both(flag), dest=flag.replace("-", "_"))
    p.add_argument("training_script", nargs="?")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


_FLAG = re.compile(r"^--?[A-Za-z]")


@dataclass(frozen=True)
class _Torchrun:
    """A parsed torchrun command line: where to run and what."""

    nnodes: int
    nproc_per_node: int
    #: ``["-m", "pkg.module", *args]`` or ``["path/to/script.py", *args]``, as
    #: ``SPMDActor.main`` takes them.
    script_args: tuple[str, ...]
    #: ``--rdzv-id`` (``TORCHELASTIC_RUN_ID``).
    run_id: str = "none"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def describe(self) -> str:
        return shlex.join(self.script_args)


def _is_python(program: str) -> bool:
    return re.fullmatch(r"python[\d.]*", os.path.basename(program)) is not None


def _nnodes(value: str, command: str) -> int:
    low, sep, high = value.strip().partition(":")
    try:
        nodes = int(low)
        maximum = int(high) if sep else nodes
    except ValueError:
        nodes = maximum = -1
    if nodes < 1 or maximum != nodes:
        if nodes >= 1 and maximum > nodes:
            why = (
                "an elastic range (MIN:MAX); run_spmd runs on a fixed number of hosts "
                "(torchrun's elastic membership is not supported)"
            )
        else:
            why = "not a positive number of nodes"
        raise ValueError(
            f"serve: --nnodes={value} in {command!r} is {why}; expected --nnodes=N (or "
            f"N:N), e.g. --nnodes=2"
        )
    return nodes


def _nproc(value: str, command: str) -> int:
    try:
        nproc = int(value)
    except ValueError:
        nproc = -1
    if nproc < 1:
        auto = value in ("auto", "cpu", "gpu", "xpu")
        why = "not a positive number of processes"
        if auto:
            why = "a device count torchrun detects on each node; run_spmd needs a number"
        raise ValueError(
            f"serve: --nproc-per-node={value} in {command!r} is {why}; expected "
            "--nproc-per-node=N, e.g. --nproc-per-node=8 for 8 GPUs per node"
        )
    return nproc


def parse_torchrun(command: Sequence[str] | str) -> _Torchrun:
    """Parse a torchrun command line (a list of arguments, or a string split as a shell
    would).

    Accepted forms: ``torchrun [flags] script.py [args]`` (or ``-m pkg.module``), the same
    with ``torch.distributed.run`` or a path to torchrun, ``python -m torchrun ...`` /
    ``python -m torch.distributed.run ...``, and ``python script.py [args]`` (one proc).

    >>> t = parse_torchrun("torchrun --nnodes=2 --nproc-per-node 4 -m train --lr 0.1")
    >>> (t.nnodes, t.nproc_per_node, t.script_args)
    (2, 4, ('-m', 'train', '--lr', '0.1'))
    >>> parse_torchrun(["python", "train.py", "--steps", "3"]).script_args
    ('train.py', '--steps', '3')

    Raises:
        ValueError: the command is not a torchrun command, has a flag torchrun does not
            have (or one that cannot work here), names no script, or has an elastic or
            automatic ``--nnodes``/``--nproc-per-node``.
    """
    if isinstance(command, str):
        args = shlex.split(command)
    elif isinstance(command, Sequence) and all(isinstance(a, str) for a in command):
        args = list(command)
    else:
        raise TypeError(
            f"serve: expected a torchrun command as a list of str or a str, got {command!r}"
        )
    text = shlex.join(args)
    if not args:
        raise ValueError(
            "serve: the command is empty; expected a torchrun command line, e.g. "
            "['torchrun', '--nproc-per-node=2', 'train.py']"
        )
    program = args[0]
    if os.path.basename(program) in _TORCHRUN:
        flags = args[1:]
    elif _is_python(program) and len(args) >= 3 and args[1] == "-m" and args[2] in _TORCHRUN:
        flags = args[3:]
    elif _is_python(program) and len(args) >= 2 and not _FLAG.match(args[1]):
        # `python script.py args`: one process, as python would run it.
        return _Torchrun(1, 1, tuple(args[1:]))
    elif _is_python(program) and len(args) >= 3 and args[1] == "-m":
        return _Torchrun(1, 1, tuple(args[1:]))
    else:
        raise ValueError(
            f"serve: {text!r} is not a torchrun command; expected it to start with "
            "'torchrun' (or 'python -m torch.distributed.run'), e.g. ['torchrun', "
            "'--nproc-per-node=2', 'train.py', '--lr', '0.1'], or 'python script.py'"
        )
    parsed, unknown = _torchrun_parser().parse_known_args(flags)
    if unknown:
        # Flags before the script that torchrun does not have (argparse takes the first
        # value after an unknown flag as the script; name the flag either way).
        bad = [a for a in unknown if _FLAG.match(a)] or unknown
        raise ValueError(
            f"serve: unknown torchrun flag(s) {', '.join(bad)} in {text!r}; expected "
            "torchrun's own flags (--nnodes, --nproc-per-node, --standalone, -m, --rdzv-*, "
            "...) before the script, and the script's flags after it"
        )
    script = parsed.training_script
    if script is not None and _FLAG.match(script):
        raise ValueError(
            f"serve: unknown torchrun flag {script} in {text!r}; expected torchrun's own "
            "flags before the script, and the script's flags after it"
        )
    if parsed.no_python:
        raise ValueError(
            f"serve: --no-python in {text!r} runs a program that is not Python; expected "
            "a Python script or -m module (run_spmd runs them inside its procs); drop "
            "--no-python and name a Python script"
        )
    if script is None:
        raise ValueError(
            f"serve: {text!r} names no script; expected the training script (or -m "
            "pkg.module) after torchrun's flags, e.g. ['torchrun', '--nproc-per-node=2', "
            "'train.py']"
        )
    nnodes = _nnodes(parsed.nnodes, text)
    if parsed.standalone and nnodes != 1:
        raise ValueError(
            f"serve: --standalone with --nnodes={parsed.nnodes} in {text!r}: standalone "
            "is one node; expected one of them: drop --standalone for several nodes "
            "(Monarch picks the rendezvous address either way)"
        )
    nproc = _nproc(parsed.nproc_per_node, text)
    if parsed.max_restarts not in (None, "0"):
        warnings.warn(
            f"serve: --max-restarts={parsed.max_restarts} has no effect: run_spmd does not "
            "restart failed ranks; it raises SPMDRunError, and you can call it again",
            stacklevel=3,
        )
    script_args = (["-m"] if parsed.module else []) + [script, *parsed.training_script_args]
    return _Torchrun(nnodes, nproc, tuple(script_args), str(parsed.rdzv_id))


def _command_of(appdef: Any) -> tuple[list[str], int | None, dict[str, str]]:
    """The torchrun command, replica count and environment of a torchx ``AppDef``'s
    single role (read by attribute: torchx is not needed)."""
    roles = list(getattr(appdef, "roles", None) or [])
    if len(roles) != 1:
        raise ValueError(
            f"serve: the AppDef has {len(roles)} roles; expected exactly one, whose "
            "entrypoint and args are a torchrun command"
        )
    role = roles[0]
    entrypoint = str(getattr(role, "entrypoint", "") or "")
    args = [str(a) for a in (getattr(role, "args", None) or [])]
    launcher = os.path.basename(entrypoint)
    if launcher in _TORCHRUN or _is_python(launcher):
        command = [entrypoint, *args]
    else:
        # A wrapper (e.g. workspace/entrypoint.sh) whose arguments are the command.
        command = args
    replicas = getattr(role, "num_replicas", None)
    env = {str(k): str(v) for k, v in (getattr(role, "env", None) or {}).items()}
    return command, replicas if isinstance(replicas, int) else None, env


def _with_nnodes(command: list[str], torchrun: _Torchrun, nnodes: int) -> list[str]:
    """``command`` run on ``nnodes`` hosts (an ``AppDef`` role's ``num_replicas``):
    ``--nnodes`` added where the command has none (a ``python script.py`` command
    becomes the torchrun command that runs it on every host).

    >>> t = parse_torchrun(["python", "train.py", "-v"])
    >>> _with_nnodes(["python", "train.py", "-v"], t, 2)
    ['torchrun', '--nnodes=2', 'train.py', '-v']

    Raises:
        ValueError: the command gives another ``--nnodes``.
    """
    script_at = len(command) - len(torchrun.script_args)
    if os.path.basename(command[0]) in _TORCHRUN:
        flags_at = 1
    elif len(command) >= 3 and command[1] == "-m" and command[2] in _TORCHRUN:
        flags_at = 3
    else:  # python script.py / python -m module
        return ["torchrun", f"--nnodes={nnodes}", *torchrun.script_args]
    flags = command[flags_at:script_at]
    if any(a == "--nnodes" or a.startswith("--nnodes=") for a in flags):
        raise ValueError(
            f"serve: the AppDef's role has num_replicas={nnodes} but its command says "
            f"--nnodes={torchrun.nnodes}; expected them to agree"
        )
    return [*command[:flags_at], f"--nnodes={nnodes}", *command[flags_at:]]


# --------------------------------------------------------------------------------------
# Schedulers


def _check_cfg(scheduler: str, cfg: Mapping[str, Any], known: Sequence[str]) -> None:
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        accepted = ", ".join(sorted(known)) or "none"
        raise ValueError(
            f"serve: scheduler_cfg key(s) {', '.join(map(repr, unknown))} are not known for "
            f"scheduler {scheduler!r}; expected some of: {accepted}"
        )


#: scheduler_cfg keys of "slurm": SlurmJob's own arguments, and torchx's slurm options
#: (mapped to them, or to sbatch flags).
_SLURM_ARGS = (
    "python_exe",
    "slurm_args",
    "monarch_port",
    "job_name",
    "time_limit",
    "partition",
    "log_dir",
    "exclusive",
    "gpus_per_node",
    "cpus_per_task",
    "mem",
    "job_start_timeout",
    "account",
    "qos",
)
_SLURM_RENAMED = {"time": "time_limit", "job_dir": "log_dir"}
_SLURM_FLAGS = ("constraint", "comment", "mail-user", "mail-type")
_SLURM_IGNORED = ("nomem",)

#: scheduler_cfg keys of "kubernetes".
_K8S_JOB = ("namespace", "timeout", "kubeconfig")
_K8S_MESH = (
    "mesh_name",
    "label_selector",
    "pod_rank_label",
    "image",
    "resources",
    "port",
    "labels",
    "annotations",
)


def _slurm_job(cfg: Mapping[str, Any], nnodes: int) -> JobTrait:
    from monarch._src.job.slurm import SlurmJob

    _check_cfg("slurm", cfg, (*_SLURM_ARGS, *_SLURM_RENAMED, *_SLURM_FLAGS, *_SLURM_IGNORED))
    kwargs: dict[str, Any] = {}
    extra: list[str] = []
    for key, value in cfg.items():
        if key in _SLURM_FLAGS:
            extra.append(f"--{key}={value}")
        elif key in _SLURM_IGNORED:
            continue
        else:
            name = _SLURM_RENAMED.get(key, key)
            if name in kwargs:
                both = sorted(k for k in cfg if _SLURM_RENAMED.get(k, k) == name)
                raise ValueError(
                    f"serve: scheduler_cfg gives both {both[0]!r} and {both[1]!r} (the "
                    "same setting); expected one of them"
                )
            kwargs[name] = value
    if extra:
        kwargs["slurm_args"] = [*extra, *kwargs.get("slurm_args", ())]
    return SlurmJob({MESH: nnodes}, **kwargs)


def _kubernetes_job(cfg: Mapping[str, Any], nnodes: int) -> JobTrait:
    from monarch._src.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

    _check_cfg("kubernetes", cfg, (*_K8S_JOB, *_K8S_MESH))
    kubeconfig = cfg.get("kubeconfig")
    if isinstance(kubeconfig, (str, os.PathLike)):
        kubeconfig = KubeConfig.from_path(os.path.expanduser(os.fspath(kubeconfig)))
    job = KubernetesJob(
        namespace=cfg.get("namespace", "default"),
        timeout=cfg.get("timeout"),
        kubeconfig=kubeconfig,
    )
    mesh: dict[str, Any] = {k: cfg[k] for k in _K8S_MESH if k in cfg}
    name = mesh.pop("mesh_name", MESH)
    image = mesh.pop("image", None)
    resources = mesh.pop("resources", None)
    if image is not None:
        mesh["image_spec"] = ImageSpec(str(image), resources=resources)
    elif resources is not None:
        raise ValueError(
            "serve: scheduler_cfg 'resources' go with 'image' (pods the job provisions); "
            "expected 'image' too, or set the resources in your own pods' manifest"
        )
    job.add_mesh(name, nnodes, **mesh)
    return job


def _make_job(scheduler: str, cfg: Mapping[str, Any], nnodes: int) -> JobTrait:
    """The job of ``scheduler`` that gives ``nnodes`` hosts."""
    if scheduler in _LOCAL:
        from monarch._src.job.job import ProcessJob

        _check_cfg(scheduler, cfg, ())
        return ProcessJob({MESH: nnodes})
    if scheduler == "slurm":
        return _slurm_job(cfg, nnodes)
    if scheduler == "kubernetes":
        return _kubernetes_job(cfg, nnodes)
    raise ValueError(
        f"serve: unknown scheduler {scheduler!r}; expected one of "
        f"{', '.join(map(repr, _SCHEDULERS))} (upstream's torchx schedulers such as "
        "'mast_conda' are not available in this implementation)"
    )


# --------------------------------------------------------------------------------------
# The actor


def _free_port() -> int:
    """A TCP port nobody listens on now, on every interface (as a TCPStore binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _proc_address(proc_id: str) -> str | None:
    """The IP a proc serves on, from its id (``name@tcp:10.0.0.5:1234``,
    ``name@tcp:[::1]:1234``); ``None`` for a proc that does not serve over TCP.

    >>> _proc_address("anon-0@tcp:10.124.0.11:36275"), _proc_address("a@tcp:[::1]:80")
    ('10.124.0.11', '::1')
    >>> _proc_address("anon-0@unix:/tmp/p.sock") is None
    True
    """
    address = proc_id.rsplit("@", 1)[-1]
    transport, _, rest = address.partition(":")
    if transport != "tcp" or not rest:
        return None
    if rest.startswith("["):
        return rest[1 : rest.find("]")] or None
    return rest.rsplit(":", 1)[0] or None


class _TorchrunActor(SPMDActor):
    """``SPMDActor`` with the rendezvous address and ``sys.path`` torchrun gives."""

    @endpoint
    def rendezvous(self) -> tuple[str, int]:
        """This proc's address and a free port, for ``MASTER_ADDR``/``MASTER_PORT``: the
        IP the proc serves on (the address of its host's worker, which the other hosts
        reach), or, for a proc on this machine only, ``127.0.0.1``; its hostname when
        neither is known."""
        from monarch._src.actor import process

        state = process.peek()
        address = None if state is None else _proc_address(state.proc_id)
        if address is None:
            local = state is not None and "@tcp:" not in state.proc_id
            address = "127.0.0.1" if local else socket.gethostname()
        return address, _free_port()

    @endpoint
    def run(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """``SPMDActor.main``, with ``sys.path[0]`` as ``python`` sets it: the script's
        directory (the working directory for ``-m``)."""
        if script_args[:1] == ["-m"]:
            first = os.getcwd()
        else:
            first = os.path.dirname(os.path.abspath(script_args[0])) if script_args else ""
        added = bool(first) and first not in sys.path
        if added:
            sys.path.insert(0, first)
        try:
            main = cast(Any, super()).main
            return bool(main(master_addr, master_port, script_args))
        finally:
            if added and first in sys.path:
                sys.path.remove(first)


# --------------------------------------------------------------------------------------
# The job


def _describe_failure(error: BaseException) -> str:
    inner = getattr(error, "exception", None)
    if isinstance(inner, BaseException):
        text = str(inner)
        prefix = "SPMDActor.main: "
        if isinstance(inner, RuntimeError) and text.startswith(prefix) and " exited " in text:
            return text[len(prefix) :]
        return f"{type(inner).__name__}: {text}"
    return f"{type(error).__name__}: {error}"


def _traceback_of(error: BaseException) -> str:
    formatted = getattr(error, "exception_formatted", None)
    return str(formatted).rstrip() if formatted else ""


class SPMDJob(JobTrait):
    """A torchrun command and the job whose hosts run it (see the module docs).

    :func:`serve` makes one from a scheduler; ``SPMDJob(job, command)`` runs ``command``
    on any job of one host mesh of ``--nnodes`` hosts (a :class:`ProcessJob`,
    :class:`SlurmJob`, :class:`KubernetesJob`, or your own). Applying, saving
    (``dump``/``job_load``), reconnecting through the state cache and ``kill()`` are the
    job's: ``state().workers`` is its host mesh, and a saved ``SPMDJob`` reconnects to the
    same allocation for a later ``run_spmd()``. A cached job is reused by an ``SPMDJob``
    of the same scheduler whose job it ``can_run``, whatever its script: edit the
    script, serve it again, and it runs on the hosts you already have.

    Args:
        job: The job that provides the hosts (one host mesh).
        command: The torchrun command line (see :func:`serve`).
        env: Environment variables for every rank, set before its script starts (and
            before any of its proc's code runs).
        scheduler: The scheduler name :func:`serve` made ``job`` for (for ``repr`` and
            cache reuse).

    Raises:
        ValueError: the command is not a valid torchrun command line.
        TypeError: ``job`` is not a job, or ``env`` not a dict of str to str.
    """

    #: Seconds ``run_spmd`` waits for the procs to start and rank 0 to give its address.
    start_timeout: float = 300.0
    #: Seconds ``run_spmd`` waits for the procs to stop once the script ended or failed.
    stop_timeout: float = 120.0

    def __init__(
        self,
        job: JobTrait,
        command: Sequence[str] | str,
        env: Mapping[str, str] | None = None,
        scheduler: str | None = None,
    ) -> None:
        if not isinstance(job, JobTrait):
            raise TypeError(
                f"SPMDJob(job={job!r}): expected a job (a JobTrait) such as "
                "ProcessJob({'workers': 2}); or call serve(command, scheduler=...)"
            )
        env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError(f"SPMDJob(env={env!r}): expected a dict of str to str")
        super().__init__()
        self._command: tuple[str, ...] = (
            tuple(shlex.split(command)) if isinstance(command, str) else tuple(command)
        )
        self._torchrun = parse_torchrun(self._command)
        self._job = job
        self._env = env
        self._scheduler = scheduler
        #: The host mesh of the last ``state()`` (not saved with the job).
        self._hosts: HostMesh | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_hosts"] = None  # a connection: a loaded job attaches again
        return state

    @property
    def job(self) -> JobTrait:
        """The job that provides the hosts."""
        return self._job

    @property
    def nnodes(self) -> int:
        """Hosts the command runs on (``--nnodes``)."""
        return self._torchrun.nnodes

    @property
    def nproc_per_node(self) -> int:
        """Ranks on each host (``--nproc-per-node``)."""
        return self._torchrun.nproc_per_node

    @property
    def script_args(self) -> list[str]:
        """What every rank runs: ``["-m", "module", *args]`` or ``["script.py", *args]``."""
        return list(self._torchrun.script_args)

    def __repr__(self) -> str:
        scheduler = f", scheduler={self._scheduler!r}" if self._scheduler else ""
        return f"SPMDJob({self._job!r}, {shlex.join(self._command)!r}{scheduler})"

    # ----------------------------------------------------------------------------------
    # The job trait: the inner job's allocation

    def _create(self, client_script: str | None) -> None:
        self._job.apply(client_script)

    def _state(self) -> JobState:
        state = self._job.state(cached_path=None)
        meshes = list(state)
        if len(meshes) != 1:
            raise ValueError(
                f"SPMDJob: the job {self._job!r} has {len(meshes)} host meshes "
                f"({', '.join(meshes) or 'none'}); expected exactly one, whose hosts run "
                "the command"
            )
        hosts = state[meshes[0]]
        return JobState({MESH: hosts})

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's hosts can serve ``spec``: an ``SPMDJob`` of the same
        scheduler whose job this one's job ``can_run`` (its command may differ).

        Args:
            spec: The job specification a new program asks for.

        Returns:
            ``True`` when the allocation can be reused for ``spec``.
        """
        return (
            isinstance(spec, SPMDJob)
            and spec._scheduler == self._scheduler
            and self._job.can_run(spec._job)
        )

    def kill(self) -> None:
        """End the allocation (the job's hosts); a no-op when inactive."""
        self._hosts = None
        super().kill()

    def _kill(self) -> None:
        self._hosts = None
        self._job.kill()

    def _saved(self) -> None:
        self._job._mark_saved()

    # ----------------------------------------------------------------------------------
    # Running

    def _host_mesh(self) -> HostMesh:
        hosts = self._hosts
        if hosts is None:
            local = self._scheduler in _LOCAL
            hosts = self.state(cached_path=None if local else DEFAULT_JOB_PATH).workers
            self._hosts = hosts
        sizes = dict(hosts.sizes)
        count = math.prod(sizes.values()) if sizes else 1
        if count != self.nnodes:
            raise ValueError(
                f"SPMDJob: the job's host mesh has {count} host(s) ({sizes}), but the "
                f"command asks for --nnodes={self.nnodes}; expected a job of "
                f"{self.nnodes} host(s) (or change --nnodes)"
            )
        return hosts

    def run_spmd(self, timeout: float | None = None) -> None:
        """Run the command's script on every rank and wait until every rank is done.

        Starts ``--nproc-per-node`` procs on each of the job's hosts (a proc mesh
        ``{"hosts": nnodes, "gpus": nproc_per_node}``, ``CUDA_VISIBLE_DEVICES`` left
        as it is, as under torchrun), spawns an ``SPMDActor`` on each (``"_SPMDActor"``),
        picks ``MASTER_ADDR``/``MASTER_PORT`` on rank 0 (the address its host serves
        on, and a free port), and runs the script on every rank with torchrun's
        environment and ``sys.argv``; then stops the procs. The job's hosts stay: call
        it again for another run. A job not applied yet is applied first, through the
        state cache as ``state()`` does (reusing a saved job that ``can_run`` this one,
        and saving this one at ``.monarch/job_state.pkl``), except for the ``"local"``
        scheduler, which is never saved.

        Args:
            timeout: Seconds the script may run on every rank; ``None`` waits as long as
                it runs. On timeout the ranks are stopped.

        Raises:
            SPMDRunError: a rank's script raised, exited with a non-zero status, or its
                proc died; the message names the rank(s) and what happened, and the other
                ranks were stopped (SPMD-2).
            TimeoutError: ``timeout`` passed; the ranks were stopped.
        """
        if timeout is not None and not timeout > 0:
            raise ValueError(f"run_spmd(timeout={timeout!r}): expected seconds > 0, or None")
        hosts = self._host_mesh()
        run = self._torchrun
        env = {
            "TORCHELASTIC_RUN_ID": run.run_id,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            **self._env,
        }
        # Without GPU pinning (torchrun leaves CUDA_VISIBLE_DEVICES alone: its scripts
        # select their GPU with LOCAL_RANK).
        procs = hosts._spawn_procs(
            {PROC_DIM: run.nproc_per_node}, None, "spmd", None, None, env, pin_gpus=False
        )
        mesh_id: int | None = None
        try:
            actors = procs.spawn("_SPMDActor", _TorchrunActor)
            # A rank whose proc dies is this call's failure (SPMDRunError), not one for
            # the client's unhandled-failure hook, which would end the program.
            mesh_id = cast(Any, actors)._shared.handle.mesh_id
            supervision.route_failures(mesh_id, _handled)
            labels = list(procs.extent.labels)
            origin = actors.slice(**dict.fromkeys(labels, 0))
            addr, port = origin.rendezvous.call_one().get(timeout=self.start_timeout)
            logger.info(
                "run_spmd: %s on %d rank(s), rendezvous at %s:%d",
                run.describe(),
                run.world_size,
                addr,
                port,
            )
            calls: dict[int, Future[bool]] = {}
            coords: dict[int, dict[str, int]] = {}
            sizes = list(procs.extent.sizes)
            # Row-major, as RANK is (torch_elastic_env).
            for rank, point in enumerate(itertools.product(*(range(n) for n in sizes))):
                at = dict(zip(labels, point, strict=True))
                coords[rank] = at
                calls[rank] = actors.slice(**at).run.call_one(addr, port, list(run.script_args))
            failures, pending = _wait_ranks(calls, timeout)
        finally:
            self._stop(procs)
            if mesh_id is not None:
                supervision.route_failures(mesh_id, None)
        if failures:
            raise self._run_error(failures, coords)
        if pending:
            raise TimeoutError(
                f"run_spmd: {run.describe()} did not finish within {timeout:g} s on "
                f"rank(s) {', '.join(map(str, sorted(pending)))} of {run.world_size}; "
                "expected every rank to finish; they were stopped (give a longer timeout, "
                "or None)"
            )

    def _stop(self, procs: ProcMesh) -> None:
        try:
            procs.stop("run_spmd ended").get(timeout=self.stop_timeout)
        except Exception:
            logger.warning("run_spmd: could not stop its procs cleanly", exc_info=True)

    def _run_error(
        self, failures: dict[int, BaseException], coords: dict[int, dict[str, int]]
    ) -> SPMDRunError:
        run = self._torchrun
        lines = []
        for rank in sorted(failures):
            at = ", ".join(f"{k}={v}" for k, v in coords.get(rank, {}).items())
            lines.append(f"rank {rank} ({at}): {_describe_failure(failures[rank])}")
        first = failures[min(failures)]
        traceback = _traceback_of(first)
        which = ", ".join(map(str, sorted(failures)))
        message = (
            f"run_spmd: {run.describe()} failed on rank(s) {which} of {run.world_size}:\n  "
            + "\n  ".join(lines)
            + "\nexpected every rank's script to return; the other ranks were stopped. "
            "Fix the script and call run_spmd() again (the job's hosts are still there)."
        )
        if traceback:
            message += f"\nRank {min(failures)}'s traceback:\n{traceback}"
        return SPMDRunError(message, failures)


def _handled(failure: object) -> None:
    """The failure handler of ``run_spmd``'s actors: handled (the pending call of the
    failed rank raises, and ``run_spmd`` reports it)."""
    logger.info("run_spmd: %s", failure)


def _wait_ranks(
    calls: dict[int, Future[bool]], timeout: float | None
) -> tuple[dict[int, BaseException], set[int]]:
    """Wait until every call returned, one failed, or ``timeout`` passed; the failed
    ranks (those known failed at that moment) and the ranks still running."""

    async def one(rank: int, fut: Future[bool]) -> int:
        await fut
        return rank

    async def wait() -> tuple[dict[int, BaseException], set[int]]:
        tasks = {asyncio.ensure_future(one(r, f)): r for r, f in calls.items()}
        done, pending = await asyncio.wait(
            tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        failures: dict[int, BaseException] = {}
        for task in done:
            error = task.exception()
            if error is not None:
                failures[tasks[task]] = error
        return failures, {tasks[t] for t in pending}

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # Called from async code (a notebook): wait on a loop of our own, in a thread.
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(asyncio.run(wait()))
        except BaseException as e:  # re-raised in the caller
            box.append(e)

    thread = threading.Thread(target=target, name="run_spmd", daemon=True)
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return cast(tuple[dict[int, BaseException], set[int]], box[0])


# --------------------------------------------------------------------------------------
# serve


def serve(
    appdef: Any,
    scheduler: str = "local",
    scheduler_cfg: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> SPMDJob:
    """Get the hosts for a torchrun command from ``scheduler`` and return the
    :class:`SPMDJob` that runs it (``job.run_spmd()``).

    ``appdef`` is the torchrun command line: a list of arguments (``["torchrun",
    "--nnodes=2", "--nproc-per-node=4", "train.py", "--lr", "0.1"]``), a string, or a
    torchx ``AppDef`` of one role whose entrypoint and args are the command (an
    entrypoint that is neither torchrun nor python, such as a wrapper script, is left
    out; the role's ``num_replicas`` is ``--nnodes`` when the command has none, and its
    ``env`` joins ``env``). ``--nnodes`` hosts are asked for, each to run
    ``--nproc-per-node`` ranks.

    ``scheduler`` and ``scheduler_cfg``:

    - ``"local"`` (or ``"local_cwd"``): a :class:`ProcessJob`, worker processes on this
      machine; no keys. Its workers end with this process (or ``kill()``), and the job
      is not saved.
    - ``"slurm"``: a :class:`SlurmJob` of ``--nnodes`` nodes; keys: its arguments
      (``python_exe``, ``partition``, ``time_limit``, ``account``, ``qos``,
      ``gpus_per_node``, ``cpus_per_task``, ``mem``, ``slurm_args``, ``log_dir``,
      ``job_start_timeout``, ...) and torchx's names ``time``, ``job_dir``,
      ``constraint``, ``comment``, ``mail-user``, ``mail-type`` (``nomem`` is ignored).
    - ``"kubernetes"``: a :class:`~monarch.job.kubernetes.KubernetesJob`; keys
      ``namespace`` (default ``"default"``), ``timeout``, ``kubeconfig`` (a path), and
      for the mesh: ``mesh_name`` (default ``"workers"``: the pods labelled
      ``monarch.pytorch.org/mesh-name=workers``), ``label_selector``, ``image`` (and
      ``resources``) to provision the pods through a MonarchMesh, ``port``, ...

    The Slurm and Kubernetes jobs are applied and saved at ``.monarch/job_state.pkl``
    (``state()``'s cache): a later ``serve`` of the same scheduler and settings reuses
    the running allocation, whatever its script; a saved job that cannot serve this one
    is killed first. ``job_load()`` reloads it; ``job.kill()`` (or ``monarch kill``) ends
    it.

    Args:
        appdef: The torchrun command (list, string) or a torchx ``AppDef``.
        scheduler: ``"local"``, ``"local_cwd"``, ``"slurm"`` or ``"kubernetes"``.
        scheduler_cfg: The scheduler's settings (above).
        env: Environment variables for every rank.

    Returns:
        The applied :class:`SPMDJob`.

    Raises:
        ValueError: the command is not a valid torchrun command, the scheduler is
            unknown, or ``scheduler_cfg`` has a key it does not know.
    """
    cfg = dict(scheduler_cfg or {})
    extra_env: dict[str, str] = {}
    replicas: int | None = None
    if isinstance(appdef, str):
        command = shlex.split(appdef)
    elif isinstance(appdef, (list, tuple)):
        command = list(appdef)
    elif hasattr(appdef, "roles"):
        command, replicas, extra_env = _command_of(appdef)
    else:
        raise TypeError(
            f"serve: expected a torchrun command (a list of str or a str) or a torchx "
            f"AppDef, got {appdef!r}"
        )
    torchrun = parse_torchrun(command)
    if replicas is not None and replicas != torchrun.nnodes:
        command = _with_nnodes(command, torchrun, replicas)
        torchrun = parse_torchrun(command)
    job = SPMDJob(
        _make_job(scheduler, cfg, torchrun.nnodes),
        command,
        env={**extra_env, **dict(env or {})},
        scheduler=scheduler,
    )
    start = time.monotonic()
    if scheduler in _LOCAL:
        state = job.state(cached_path=None)
    else:
        state = job.state(cached_path=DEFAULT_JOB_PATH)
    job._hosts = state.workers
    logger.info(
        "serve: %s ready (%d host(s)) in %.1f s", job, torchrun.nnodes, time.monotonic() - start
    )
    return job
