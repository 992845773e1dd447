"""A client outside the cluster: :func:`attach` makes this process drive a job through
one address, its *gateway*.

A client normally reaches every proc of a job directly (see
:mod:`monarch._src.actor.workers`), so its network must route to every host. A laptop,
a notebook or a web server outside the cluster reaches at most one address: a worker's
port forwarded with ``kubectl port-forward`` or an SSH tunnel, or a load balancer.
Every worker is a gateway: ``attach(address)``, called before the client's first use of
monarch, connects to the worker at ``address`` (authenticated like every connection)
and starts the client's proc *attached* to it. Every message the client sends goes to
the gateway, which relays it to its destination; every message to the client is sent
to the gateway (the client's proc id carries the gateway's address) and relayed on the
connection the client opened. Nothing dials the client, and the client dials nothing
else.

After ``attach``, the client uses the cluster's hosts as any client does
(``attach_to_workers`` with the workers' in-cluster addresses, or a job's ``state()``):
spawning, calls, casts, supervision, logs and shutdown work unchanged. It has no host
of its own (``this_host()`` raises); actors on its own proc (``this_proc().spawn``) are
reached through the gateway too. If the gateway's worker ends, the client reaches
nothing: every host is found lost at once, and the failures of the procs it owns reach
the fault hook.

Upstream Monarch's API: ``monarch.actor.attach(address)``; the ``ca=`` and
``private_key=`` keywords (the credentials, as for ``attach_to_workers``) are this
implementation's.
"""

from __future__ import annotations

import threading

from monarch._src.actor import process
from monarch._src.actor.workers import _set_credentials

__all__ = ["attach", "attached_gateway"]


def attached_gateway() -> str | None:
    """The gateway address this process's client attached through (:func:`attach`), or
    ``None``."""
    state = process.peek()
    if state is None:
        return process.gateway_address
    gateway: str | None = getattr(state.agent, "gateway", None)
    return gateway


def attach(address: str, *, ca: str | None = None, private_key: str | None = None) -> None:
    """Drive the cluster through the gateway at ``address``: call it before any other
    monarch call of the program (the client's first use of monarch).

    ``address`` is a worker's address as this machine reaches it: ``tcp://HOST:PORT``
    (for example ``tcp://127.0.0.1:26600`` for ``kubectl port-forward pod/w-0
    26600:26600``). Every worker serves as a gateway on its own port. ``ca=`` and
    ``private_key=`` are the credentials, as for
    :func:`~monarch.actor.attach_to_workers` (``ca=None``: ``MONARCH_CLUSTER_SECRET``
    or the ``MONARCH_TLS_*`` files; ``ca="trust_all_connections"``: none).

    Connects at once: returns once the gateway accepted this client. Calling it again
    with the same address is a no-op.

    Raises:
        RuntimeError: monarch already started in this process (any earlier monarch call:
            ``this_host()``, ``attach_to_workers``, spawning, ...), or the gateway cannot
            be reached, refused this client's credentials, or is not a monarch worker
            (the message names the gateway and says why).
        ValueError: ``address`` is not an address.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError(
            f"attach({address!r}): expected a gateway address such as "
            "'tcp://127.0.0.1:26600' (a monarch worker's port, as this machine reaches it)"
        )
    address = address.strip()
    with _lock:
        state = process.peek()
        if state is not None:
            current = attached_gateway()
            if current is not None and address in (process.gateway_address, current):
                return
            if current is not None and _normalized(address) == current:
                return
            how = f"attached through {current}" if current else f"serving at {state.proc_id}"
            raise RuntimeError(
                f"attach({address!r}) must come before the client's first use of monarch: "
                f"this process already runs monarch ({how}); call monarch.actor.attach(...) "
                "first thing in your program, before any other monarch call (this_host(), "
                "attach_to_workers, enable_transport, spawning, a job's state())"
            )
        if process.is_shut_down():
            raise RuntimeError(
                f"attach({address!r}): the monarch client context of this process was shut "
                "down; it cannot attach again"
            )
        _set_credentials("attach", ca, private_key)
        process.gateway_address = address
        try:
            process.get()
        except BaseException:
            process.gateway_address = None
            raise


def _normalized(address: str) -> str:
    """``address`` as the runtime prints a dialed address (``tcp:HOST:PORT``)."""
    for prefix, printed in (("tcp://", "tcp:"), ("ipc://", "unix:")):
        if address.startswith(prefix):
            return printed + address[len(prefix) :]
    return address


_lock = threading.Lock()
