"""Many hosts: worker agents, attaching a client to them, and this process's transport.

A **worker** (:func:`run_worker_loop_forever`, or the ``monarch worker`` command) is a
host agent started on its own on each machine. A client attaches to workers by their
addresses (:func:`attach_to_workers`) and gets a :class:`HostMesh` with extent
``{"hosts": N}``; ``spawn_procs`` then starts procs on every worker, which the client and
the procs reach directly over TCP. A client that goes away loses its procs once its
lease runs out (config ``host_client_lease``), and the worker waits for the next one.

TCP connections are authenticated before any message is read: with mutual TLS
(``ca=`` and ``private_key=``, PEM files of the cluster's CA and of this node's key and
certificate), with a cluster secret (``MONARCH_CLUSTER_SECRET``, the same on every
machine) or, explicitly and with a warning, not at all (``ca="trust_all_connections"``).
See docs/security.md and docs/hosts.md.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from monarch._rust_bindings import (
    Extent,
    HostMeshHandle,
    ProcAgent,
    set_tls_credentials,
    set_trust_all_connections,
)
from monarch._src import config
from monarch._src.actor import process
from monarch._src.actor.bootstrap_command import BootstrapCommand, default_bootstrap_cmd
from monarch._src.actor.future import Future
from monarch._src.actor.proc_mesh import HostMesh, exit_timeout

__all__ = [
    "TRUST_ALL",
    "BootstrapCommand",
    "ChannelTransport",
    "attach_to_workers",
    "default_bootstrap_cmd",
    "enable_transport",
    "run_worker_loop_forever",
    "worker_command",
]

#: The ``ca`` value that turns authentication off (explicitly; logs a warning).
TRUST_ALL = "trust_all_connections"
#: What a worker prints (with its address) once it serves: its agent answers.
READY_LINE = "monarch worker ready at"
#: The variable naming a file a worker creates (holding its address) once it serves, for
#: the process that started it (``ProcessJob``). Its socket exists a little earlier, before
#: the agent that answers on it: a message that arrives in between (an attaching client's
#: first heartbeat) is dropped.
READY_FILE_ENV = "MONARCH_WORKER_READY_FILE"


class ChannelTransport(enum.Enum):
    """The transports :func:`enable_transport` accepts (upstream Monarch's names)."""

    Unix = "unix"
    TcpWithLocalhost = "tcp-localhost"
    TcpWithHostname = "tcp"
    MetaTlsWithHostname = "metatls-hostname"
    MetaTlsWithIpV6 = "metatls-ipv6"
    Tls = "tls"
    Local = "local"


_SHORTCUTS = {"ipc": "unix", "unix": "unix", "tcp": "tcp", "tcp-localhost": "tcp-localhost"}
_UNSUPPORTED = ("metatls", "metatls-hostname", "metatls-ipv6", "tls", "local")


def _transport_spec(transport: object) -> str:
    if isinstance(transport, ChannelTransport):
        spec = transport.value
    elif isinstance(transport, str):
        spec = transport.strip()
    else:
        raise TypeError(
            f"enable_transport: expected a ChannelTransport, a name ('tcp', 'ipc') or an "
            f"address ('tcp://10.0.0.1:26600'), got {type(transport).__name__}"
        )
    lowered = spec.lower()
    if lowered in _SHORTCUTS:
        return _SHORTCUTS[lowered]
    if lowered in _UNSUPPORTED or lowered.startswith(("metatls://", "tls://")):
        raise NotImplementedError(
            f"enable_transport({transport!r}): TLS and in-process transports are not "
            "transports of their own here; use 'tcp' (or 'ipc', this machine only): TCP "
            "connections are mutual TLS when ca= and private_key= are given to "
            "attach_to_workers / run_worker_loop_forever, and otherwise authenticated with "
            "the cluster secret (see docs/security.md)"
        )
    if lowered.startswith(("tcp://", "tcp:", "ipc://", "unix:")):
        return spec
    raise ValueError(
        f"enable_transport({transport!r}): expected 'tcp', 'ipc', a ChannelTransport, or "
        "an address such as 'tcp://10.0.0.1:26600' (or 'ADVERTISE@BIND')"
    )


def _serving_transport(proc_id: str) -> str:
    addr = proc_id.split("@", 1)[1] if "@" in proc_id else proc_id
    return addr.split(":", 1)[0]


def enable_transport(transport: ChannelTransport | str) -> None:
    """Choose what this process serves on; call it before any other monarch call.

    ``"tcp"`` (or ``ChannelTransport.TcpWithHostname``) serves on every interface and
    tells peers this machine's primary IP (never a loopback address), for workers on
    other machines; ``"tcp://IP:PORT"`` (or ``"ADVERTISE@BIND"``) gives the address;
    ``"ipc"`` (``ChannelTransport.Unix``, the default) serves on this machine only.
    Enabling the transport already in use is a no-op; another one after monarch
    started raises ``RuntimeError``.
    """
    spec = _transport_spec(transport)
    state = process.peek()
    if state is not None:
        # Re-enabling the transport in use is a no-op; an explicit address never is.
        if spec in ("unix", "tcp", "tcp-localhost") and _serving_transport(
            state.proc_id
        ) == spec.removesuffix("-localhost"):
            return
        raise RuntimeError(
            f"enable_transport({transport!r}) must come before any other monarch call: "
            f"this process already serves at {state.proc_id}; call it first thing in "
            "your program"
        )
    config.configure(default_transport="tcp" if spec == "tcp-localhost" else spec)
    process.transport_override = spec


def _set_credentials(who: str, ca: object, private_key: object) -> None:
    """Apply the ``ca`` / ``private_key`` arguments of the worker API."""
    if ca == TRUST_ALL:
        set_trust_all_connections()
        return
    if ca is None:
        if private_key is not None:
            raise ValueError(
                f"{who}(ca=None, private_key={private_key!r}): a private key needs the "
                "cluster's CA too; pass ca='/path/to/ca.pem' with it"
            )
        return  # the runtime reads MONARCH_TLS_CA or MONARCH_CLUSTER_SECRET itself
    if isinstance(ca, (str, os.PathLike)):
        if private_key is None:
            raise ValueError(
                f"{who}(ca={ca!r}): mutual TLS needs private_key= too: the PEM file of "
                "this node's private key followed by its certificate (signed by that CA); "
                f"for example {who}(..., ca='ca.pem', private_key='node.pem')"
            )
        if not isinstance(private_key, (str, os.PathLike)):
            raise TypeError(f"{who}: private_key must be a path, got {private_key!r}")
        paths = {"ca": os.fspath(ca), "private_key": os.fspath(private_key)}
        for arg, path in paths.items():
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{who}({arg}={path!r}): no such file; give the path of a PEM file "
                    "(see docs/security.md for how to make one)"
                )
        try:
            set_tls_credentials(paths["ca"], paths["private_key"])
        except ValueError as e:
            raise ValueError(f"{who}: {e}") from None
        return
    raise TypeError(f"{who}: ca must be {TRUST_ALL!r}, None or a path, got {ca!r}")


def run_worker_loop_forever(
    *, address: str, ca: str | None, private_key: str | None = None
) -> NoReturn:
    """Serve as this machine's worker at ``address`` until terminated.

    ``address`` is ``tcp://HOST:PORT`` (``tcp://0.0.0.0:PORT`` binds every interface and
    advertises this machine's primary IP), ``ADVERTISE@BIND``, ``ipc://PATH``, or
    ``tcp://HOST:fdN`` (socket activation): serve on the listening TCP socket this
    process inherited as file descriptor ``N`` (its parent bound it, for example to port
    0, and passed it with ``subprocess.Popen(..., pass_fds=(N,))``), advertising ``HOST``
    with the socket's real port, which clients dial (``tcp://HOST:PORT``; ``fdN`` is
    only for serving). A descriptor that is not a listening TCP socket raises
    ``RuntimeError`` naming it.
    ``ca="/path/ca.pem", private_key="/path/node.pem"`` makes every TCP connection mutual
    TLS (the CA's certificate, and this node's key followed by its certificate, in PEM);
    ``ca="trust_all_connections"`` accepts every TCP connection (logs a warning);
    ``ca=None`` requires ``MONARCH_TLS_CA`` and ``MONARCH_TLS_KEY``, or the cluster secret
    in ``MONARCH_CLUSTER_SECRET``, for TCP.
    Prints ``monarch worker ready at <address>`` once it serves (its agent answers), and
    then creates the file named by ``MONARCH_WORKER_READY_FILE``, if set, holding the
    address. Spawns and reaps procs for whichever client attaches; SIGTERM or SIGINT stops
    its procs and ends it.
    """
    if not isinstance(address, str) or not address:
        raise ValueError(f"run_worker_loop_forever: address must be a string, got {address!r}")
    if process.peek() is not None:
        raise RuntimeError(
            "run_worker_loop_forever() must be the first monarch call of its process "
            "(this process already runs monarch)"
        )
    config.warn_ignored_from_env()
    _set_credentials("run_worker_loop_forever", ca, private_key)
    if (
        ca is None
        and address.startswith("tcp")
        and not os.environ.get("MONARCH_CLUSTER_SECRET")
        and not os.environ.get("MONARCH_TLS_CA")
    ):
        raise ValueError(
            "run_worker_loop_forever: a TCP worker needs credentials: pass ca= and "
            "private_key= (PEM files, mutual TLS), set MONARCH_CLUSTER_SECRET (the same on "
            f"the client and every worker), or pass ca={TRUST_ALL!r} on a trusted network"
        )
    from monarch._src.actor import runtime
    from monarch._src.actor.actor_host import run_spawner

    # Not inherited by the procs this worker spawns.
    ready_file = os.environ.pop(READY_FILE_ENV, None)
    seconds = runtime._seconds
    runtime.apply_channel_settings()
    agent = ProcAgent.serve_worker(
        address,
        ready_timeout=seconds("host_spawn_ready_timeout"),
        stop_timeout=seconds("stop_actor_timeout"),
        log_dir=str(config.get("proc_log_dir")) or None,
        **runtime.liveness(),
    )
    agent.exit_timeout = exit_timeout()
    state = process.ProcessState(agent, is_root=False)
    process.set_state(state)
    run_spawner(state)
    served = agent.proc_id.split("@", 1)[1]
    print(f"{READY_LINE} {served}", flush=True)
    if ready_file:
        # Written whole, then renamed: a reader sees the file complete or not at all.
        partial = f"{ready_file}.partial"
        with open(partial, "w") as f:
            f.write(f"{served}\n")
        os.replace(partial, ready_file)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    agent.close_spawns("its worker is ending")
    agent.shutdown_host(seconds("mesh_terminate_timeout"))
    ProcAgent.remove_socket_files()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _resolve(worker: str | Future[str]) -> str:
    if isinstance(worker, Future):
        worker = worker.get()
    if not isinstance(worker, str):
        raise TypeError(f"attach_to_workers: a worker address must be a string, got {worker!r}")
    return worker


def _is_remote_tcp(address: str) -> bool:
    lowered = address.split("@", 1)[0].lower()
    if not lowered.startswith("tcp"):
        return False
    return not any(local in lowered for local in ("127.", "localhost", "[::1]"))


def attach_to_workers(
    *,
    workers: Sequence[str | Future[str]],
    ca: str | None,
    private_key: str | None = None,
    name: str | None = None,
) -> HostMesh:
    """A host mesh of the running workers at ``workers`` (extent ``{"hosts": N}``).

    Returns at once; ``await mesh.initialized`` (or ``.get()``) waits until every worker
    answered, and fails naming the worker that could not be reached and why (each is
    retried while it refuses, up to the config's ``mesh_attach_config_timeout``).
    ``spawn_procs`` waits for the same first contact. Credentials as for
    :func:`run_worker_loop_forever`. If monarch has not started in this process yet and
    a worker is on another machine, this process serves over TCP
    (see :func:`enable_transport`).
    """
    if isinstance(workers, str) or not isinstance(workers, Sequence):
        raise TypeError(
            "attach_to_workers: workers must be a list of addresses such as "
            f"['tcp://10.0.0.2:26600'], got {workers!r}"
        )
    if not workers:
        raise ValueError("attach_to_workers: workers is empty; give at least one address")
    _set_credentials("attach_to_workers", ca, private_key)
    addresses = [_resolve(w) for w in workers]
    remote = [a for a in addresses if _is_remote_tcp(a)]
    state = process.peek()
    if remote and state is None and process.transport_override is None:
        enable_transport("tcp")
    elif remote and state is not None and _serving_transport(state.proc_id) == "unix":
        raise RuntimeError(
            f"attach_to_workers: worker {remote[0]} is on another machine, but this "
            f"process serves over Unix sockets ({state.proc_id}), which it cannot reach; "
            "call enable_transport('tcp') before any other monarch call"
        )
    process.get()  # start monarch (with the transport chosen) before the first contact
    timeout = float(config.get("mesh_attach_config_timeout"))
    extent = Extent(["hosts"], [len(addresses)])
    handle = HostMeshHandle.attached(addresses, extent, timeout)
    mesh = HostMesh(handle, extent.region, owned=True, attached=True)
    mesh._name = name
    return mesh


def worker_command(address: str, python: str | None = None) -> list[str]:
    """The command line that starts a worker serving at ``address``."""
    return [python or sys.executable, "-m", "monarch.tools.cli", "worker", "--address", address]
