"""Supervision: failures of actors and procs become ``MeshFailure``s for their owners
(API.md §1.9; DESIGN.md "Supervision").

Every actor mesh has an owner: the actor that spawned it, or the client. The owner's
*address* is ``(inbox port, key)``: an actor key for an actor, or
:data:`SUPERVISION_KEY` of the root client's inbox for the client (procs forward
failures of meshes spawned outside any actor to the root client too).

Failure sources and where they are turned into ``MeshFailure``s:

- an actor that fails (an exception from ``broadcast`` or an explicit-port endpoint, a
  ``BaseException``, a failing ``__init__``, ``kill()``): its host thread reports it to
  the owner and answers every later call with ``SupervisionError``;
- a proc that exits without being asked to: the host agent (the client) reaps it at
  once and sends a *death notice* to every process it spawned and to itself. Each
  process then fails the calls still waiting on that proc (``SupervisionError``), makes
  later sends to it fail at once, and reports one ``MeshFailure`` per rank of each mesh
  it owns on that proc.

An owner actor gets the failure as a message, handled in order with its others: its
``__supervise__(failure)`` returning truthy handles it; otherwise the owner fails in
turn, with the failure as the cause, and its own owner hears of it. At the client,
``monarch.actor.unhandled_fault_hook(failure)`` runs (looked up at call time): returning
normally handles the failure; raising (the default exits) prints the report and
interrupts the main thread, so the program stops with a non-zero status.
"""

from __future__ import annotations

import _thread
import pickle
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from monarch._src.actor import runtime
from monarch._src.actor.runtime import ProcessContext, dumps, key_part

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh

#: The root client's queue of failures of meshes it owns.
SUPERVISION_KEY = 1

#: An owner's address: (inbox port id, key).
Owner = tuple[str, int]


class MeshFailure:
    """A failure of one rank of an actor mesh, for the mesh's owner.

    ``mesh_name`` is the name given to ``spawn``; ``rank`` the failed rank in the proc
    mesh the actors were spawned on; ``proc_id`` the proc it lived on; ``report()``
    the readable account, cause chain included. ``mesh`` is the owner's handle of the
    failed mesh (``None`` where the owner holds none).
    """

    def __init__(
        self,
        *,
        mesh_name: str,
        mesh_key: int,
        class_name: str,
        rank: int,
        proc_id: str,
        reason: str,
        cause: MeshFailure | None = None,
    ) -> None:
        self.mesh_name = mesh_name
        self.mesh_key = mesh_key
        self.class_name = class_name
        self.rank = rank
        self.proc_id = proc_id
        self.reason = reason
        self.cause = cause

    @property
    def mesh(self) -> ActorMesh[Any] | None:
        owned = runtime.process_context().owned.get(self.mesh_key)
        return owned.mesh if owned is not None else None

    def _headline(self) -> str:
        return (
            f"actor mesh {self.mesh_name!r} ({self.class_name}) rank {self.rank} on proc "
            f"{self.proc_id} failed"
        )

    def report(self) -> str:
        """The failure, its reason and its causes, for people."""
        lines = [f"{self._headline()}:", _indent(self.reason.rstrip())]
        cause = self.cause
        while cause is not None:
            lines.append(f"caused by: {cause._headline()}:")
            lines.append(_indent(cause.reason.rstrip()))
            cause = cause.cause
        return "\n".join(lines)

    def __str__(self) -> str:
        first = self.reason.strip().splitlines()[-1] if self.reason.strip() else ""
        return f"{self._headline()}: {first}"

    def __repr__(self) -> str:
        return f"MeshFailure({self})"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def default_owner(ctx: ProcessContext) -> Owner:
    """Where failures of meshes spawned outside any actor go: the root client."""
    return (ctx.root_port, SUPERVISION_KEY)


def route(ctx: ProcessContext, owner: Owner, failure: MeshFailure) -> None:
    """Deliver ``failure`` to ``owner``."""
    port, key = owner
    if key == SUPERVISION_KEY:
        parts = [key_part(key), dumps(failure)]
    else:
        header = pickle.dumps(("__supervise__", (), ()), protocol=5)
        parts = [key_part(key), runtime.NO_ROUTE, header, dumps(((failure,), {}))]
    try:
        ctx.send(ctx.port_ref(port), parts)
    except Exception as e:  # the owner's process is gone: nobody left to tell
        print(f"monarch: cannot report {failure} to its owner: {e}", file=sys.stderr)


# --- the client's end -----------------------------------------------------------------


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default hook for failures nobody handled: print the report and exit
    non-zero. Reassign ``monarch.actor.unhandled_fault_hook`` to change it."""
    sys.exit(1)


def start_client_supervision(ctx: ProcessContext) -> None:
    """The root client's thread that runs the fault hook for failures reaching it."""
    queue = ctx.inbox.queue(SUPERVISION_KEY)
    seen: set[tuple[int, int, str]] = set()

    def run() -> None:
        while True:
            try:
                parts = queue.get()
            except RuntimeError:
                return
            failure: MeshFailure = pickle.loads(parts[0])
            ident = (failure.mesh_key, failure.rank, failure.proc_id)
            if ident in seen or runtime.is_shut_down():
                continue
            seen.add(ident)
            _run_hook(failure)

    threading.Thread(target=run, name="monarch-supervision", daemon=True).start()


def _run_hook(failure: MeshFailure) -> None:
    import monarch.actor

    hook = getattr(monarch.actor, "unhandled_fault_hook", unhandled_fault_hook)
    try:
        hook(failure)
    except BaseException as e:  # unhandled: stop the program, loudly
        print(
            f"monarch: unhandled failure ({type(e).__name__} from the fault hook); "
            f"stopping the client:\n{failure.report()}",
            file=sys.stderr,
            flush=True,
        )
        _interrupt_main()


def _interrupt_main() -> None:
    """Raise KeyboardInterrupt in the main thread, even while it sleeps or waits in a
    system call (a SIGINT aimed at it; ``_thread.interrupt_main`` alone would wait for
    the call to return)."""
    main = threading.main_thread()
    if main.is_alive() and main.ident is not None:
        try:
            signal.pthread_kill(main.ident, signal.SIGINT)
            return
        except (OSError, ValueError):
            pass
    _thread.interrupt_main()


# --- proc deaths -------------------------------------------------------------------------


def start_exit_watcher(ctx: ProcessContext) -> None:
    """The host agent's thread: turns each reaped proc into death notices."""
    host = ctx.host
    assert host is not None

    def run() -> None:
        while True:
            try:
                proc_id, _name, _rank, status = host.next_exit().get()
            except BaseException:  # the runtime is going away
                return
            if runtime.is_shut_down():
                return
            expected = proc_id in ctx.stopping
            reason = f"proc {proc_id} {'was stopped' if expected else 'died'} ({status})"
            notice = [runtime.AGENT_KEY_PART, dumps(("proc_died", proc_id, reason, expected))]
            # Every process this host started, and this one, hears of it.
            for other in list(ctx.spawned_procs):
                if other != proc_id and other not in ctx.dead:
                    try:
                        ctx.send(ctx.port_ref(runtime.inbox_port_of(other)), notice)
                    except Exception:  # that one is gone too; its own notice follows
                        pass
            ctx.send(ctx.port, notice)

    threading.Thread(target=run, name="monarch-exit-watcher", daemon=True).start()


def undeliverable(ctx: ProcessContext, proc_id: str, reason: str) -> None:
    """A message to ``proc_id`` came back undelivered (on the agent thread): the proc
    cannot be reached. The root host kills a proc it spawned as lost, so that its death
    notice fails the calls waiting on it and reaches the owners of its actors; another
    process tells the root. A proc nobody spawned (a stale reference) is only logged."""
    if proc_id in ctx.dead or proc_id in ctx.stopping:
        return
    if not ctx.is_root:
        request = dumps(("unreachable", proc_id, reason))
        ctx.send(ctx.port_ref(ctx.root_port), [runtime.AGENT_KEY_PART, request])
        return
    lost = f"messages to it came back undelivered ({reason}); killed as unreachable"
    if proc_id in ctx.spawned_procs and ctx.host is not None and ctx.host.kill_proc(proc_id, lost):
        return
    if proc_id not in ctx.spawned_procs and proc_id not in ctx.unreachable_logged:
        print(f"monarch: a message to {proc_id} could not be delivered: {reason}", file=sys.stderr)
        with ctx.unreachable_changed:
            ctx.unreachable_logged.add(proc_id)
            ctx.unreachable_changed.notify_all()


def proc_died(ctx: ProcessContext, proc_id: str, reason: str, expected: bool) -> None:
    """Handle a death notice (on the agent thread)."""
    if proc_id in ctx.dead:
        return
    ctx.dead[proc_id] = reason
    # Casts skip it from now on; replies relayed through it are not waited for.
    ctx.inbox.peer_died(proc_id)
    for group in list(ctx.groups_by_proc.get(proc_id, ())):
        group.mark_dead(proc_id, reason)
    if expected:
        return
    for owned in list(ctx.owned.values()):
        if owned.stopped:
            continue
        for index, g in enumerate(owned.shape.ndslice):
            ids = owned.group.proc_ids
            if ids is not None and ids[g] == proc_id:
                failure = MeshFailure(
                    mesh_name=owned.name,
                    mesh_key=owned.key,
                    class_name=owned.class_name,
                    rank=index,
                    proc_id=proc_id,
                    reason=reason,
                )
                route(ctx, owned.owner, failure)
