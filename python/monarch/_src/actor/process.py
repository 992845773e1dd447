"""This process's part in the mesh: its agent, its root client, what it owns.

Every process that takes part — the client (the root, which is also this machine's
host agent) and each proc a host spawned — has one :class:`ProcessState`: the Rust
:class:`~monarch._rust_bindings.ProcAgent` of its proc, and a client mailbox named
``client`` that owns what is spawned outside any actor (in the root, the script's main
thread; its failures go to ``unhandled_fault_hook``).

The state is created on first use: :func:`get` bootstraps the root client unless the
process is a spawned proc (which sets its state at start). How a state is created lives
in :mod:`monarch._src.actor.runtime`, which registers itself here
(:func:`set_bootstrapper`) so that this module imports nothing above it. Until the
runtime is imported, the package ``monarch._src.actor`` (whose ``__init__`` runs before
any of its modules) registers a bootstrapper that imports it: the actor API starts on
first use whatever the program imported (only, say, ``monarch._src.actor.proc_mesh``,
as a function pickled by value does).

Which thread runs the exit sequence is decided here too (:func:`claim_exit`, see
:mod:`monarch._src.actor.supervision`): one thread runs the ``atexit`` hooks, and the
status an unhandled failure sets is the one the program ends with.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from monarch._rust_bindings import Client, ProcAgent

__all__ = [
    "ProcessState",
    "claim_exit",
    "get",
    "is_shut_down",
    "peek",
    "set_bootstrapper",
    "set_state",
]


class ProcessState:
    """This process's agent and root client: see the module docs."""

    def __init__(self, agent: ProcAgent, *, is_root: bool) -> None:
        self.agent = agent
        self.is_root = is_root
        self.proc_id: str = agent.proc_id
        self.client: Client = agent.client("client")
        if is_root:
            agent.set_singleton_owner(self.client)
        #: Actor meshes spawned from this process, by mesh id: what a failure report
        #: hands its owner as ``failure.mesh``.
        self.owned: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        #: Meshes stopped from this process (their failures are expected).
        self.stopped: set[int] = set()
        #: Singleton controllers spawned or fetched from this process, by name.
        self.controllers: dict[str, Any] = {}
        self.controllers_lock = threading.Lock()
        #: The root process's proc id (for controllers); set for spawned procs.
        self.root_proc: str | None = None


#: What the root proc serves on, when ``enable_transport`` chose it (else the config's
#: ``default_transport``).
transport_override: str | None = None

#: The gateway the root proc attaches to instead of serving (``monarch.actor.attach``),
#: as the user wrote it; ``None``: it serves an address of its own.
gateway_address: str | None = None

#: The exit status the program must end with, once set (an unhandled failure); read by
#: ``monarch``'s last exit hook.
exit_status: int | None = None

#: Guards the exit decision: :data:`exit_status` and :data:`_exit_thread`.
_exit_lock = threading.Lock()
#: The thread running the exit sequence (this process's ``atexit`` hooks), once one does.
_exit_thread: threading.Thread | None = None

_lock = threading.RLock()
_state: ProcessState | None = None
_shut_down = False
_bootstrapper: Callable[[], ProcessState] | None = None


def set_bootstrapper(fn: Callable[[], ProcessState]) -> None:
    """Register how the root client's state is created on first use."""
    global _bootstrapper
    _bootstrapper = fn


def set_state(state: ProcessState) -> None:
    """Install this process's state (a spawned proc, at start)."""
    global _state
    with _lock:
        _state = state


def peek() -> ProcessState | None:
    """This process's state if it exists (never bootstraps)."""
    return _state


def get() -> ProcessState:
    """This process's state, bootstrapping the root client on first use."""
    state = _state
    if state is not None:
        return state
    with _lock:
        if _state is None:
            if _shut_down:
                raise RuntimeError(
                    "the monarch client context was shut down (shutdown_context() or "
                    "interpreter exit); it cannot be used again in this process"
                )
            if _bootstrapper is None:
                raise RuntimeError(
                    "monarch is not initialized in this process: no bootstrapper is "
                    "registered (monarch._src.actor registers one when it is imported)"
                )
            set_state(_bootstrapper())
        assert _state is not None
        return _state


def mark_shut_down() -> bool:
    """Record that this process's context is shut down; false if it already was."""
    global _shut_down
    with _lock:
        was = _shut_down
        _shut_down = True
        return not was


def is_shut_down() -> bool:
    return _shut_down


def claim_exit(code: int | None) -> bool:
    """Record that the program must end with ``code`` (the first status set wins; None
    sets none) and whether the caller is to run the exit sequence: true for the first
    thread that asks, false once one does (it ends the program with the status set, and
    may be the caller)."""
    global exit_status, _exit_thread
    with _exit_lock:
        if code is not None and exit_status is None:
            exit_status = code
        if _exit_thread is not None:
            return False
        _exit_thread = threading.current_thread()
        return True
