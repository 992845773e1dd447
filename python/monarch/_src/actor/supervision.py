"""Supervision at the root: failures that reach the client, and how the program ends.

The runtime carries every failure up the owner tree (see ``hyperactor_mesh``'s
``supervision`` module): an actor's failure reaches the owner of its mesh as a
:class:`MeshFailure`, and an owner actor's ``__supervise__`` may handle it; unhandled,
the owner fails in turn and its own owner hears of it. Failures of meshes the client
owns (spawned outside any actor) reach the client of the root process, where this
module runs ``monarch.actor.unhandled_fault_hook(failure)`` — looked up at call time,
exactly once per failed rank:

- if the hook returns, the failure is handled: the program goes on, and calls to the
  failed rank raise ``SupervisionError``;
- if it raises (the default does), the program prints one report, runs its ``atexit``
  handlers and ends with exit status 1, whatever the main thread is doing.

Determinism: a call on a mesh the client owns that ends with a failed rank waits for
the hook's verdict on that mesh (:func:`await_verdict`) before raising
``SupervisionError``: the failure report and the failed reply come from the same event,
so the hook decides first, every time. Before the hook runs, the output the procs wrote
is written (:func:`monarch._src.actor.logs.flush`): a proc's last lines come before the
report of its failure.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch._rust_bindings import MeshFailure as _RustMeshFailure
from monarch._src.actor import extensions, process
from monarch._src.actor.context import ROOT_PATH, actor_path
from monarch._src.actor.point import Point

if TYPE_CHECKING:
    from monarch._src.actor.actor_mesh import ActorMesh

__all__ = [
    "MeshFailure",
    "await_verdict",
    "located",
    "route_failures",
    "start_root_supervision",
    "stopped_on_purpose",
    "unhandled_fault_hook",
]


class MeshFailure:
    """A failure of one rank of an actor mesh, for the mesh's owner.

    ``mesh_name`` is the name given to ``spawn``; ``rank`` the failed rank in the proc
    mesh the actors were spawned on; ``proc_id`` and ``pid`` the process it lived on;
    ``reason`` what happened (an exception's traceback, an exit status, a signal, a lost
    connection); ``cause`` the failure that led to this one, if any; ``report()`` the
    readable account, causes included. ``mesh`` is the owner's handle of the failed mesh
    (``None`` where the owner holds none). ``str()`` is one record:
    ``MeshFailure(mesh_name=..., rank=..., crashed_ranks=[...], event=...)``, the event
    naming the actor, its proc and the reason.
    """

    __slots__ = ("_failure",)

    def __init__(self, failure: _RustMeshFailure) -> None:
        self._failure = failure

    @property
    def mesh_name(self) -> str:
        """The name the mesh was given at ``spawn`` (``procs.spawn(name, Class)``)."""
        return self._failure.mesh_name

    @property
    def mesh_id(self) -> int:
        """An id of the failed mesh, unique within the process that spawned it; the key
        that tells apart two meshes spawned under the same name."""
        return self._failure.mesh_id

    @property
    def class_name(self) -> str:
        """The actor class of the failed mesh, qualified with its module
        (``"__main__.Trainer"``)."""
        return self._failure.class_name

    @property
    def rank(self) -> int:
        """The rank of the failed actor in the proc mesh the actors were spawned on
        (row-major over all its dimensions)."""
        return self._failure.rank

    @property
    def proc_id(self) -> str:
        """The id of the proc the failed actor lived on, printed (``name@address``; parse
        it with ``ProcId.from_string``)."""
        return self._failure.proc_id

    @property
    def pid(self) -> int | None:
        """The OS process id of that proc, or ``None`` when it is not known."""
        return self._failure.pid

    @property
    def actor_id(self) -> str | None:
        """The failed actor's id, printed; ``None`` when the failure came before the
        actor was created."""
        return self._failure.actor_id

    @property
    def path(self) -> str | None:
        """The failed actor's path in the actor tree, from the root through the actors
        that spawned it (``<root>.<__main__.Trainer trainers{'gpus': 1/2}>``), as the
        owner that received the failure names it (``None`` only for a failure built
        outside monarch's Python layer)."""
        return self._failure.path

    @property
    def reason(self) -> str:
        """What happened, in words: an exception's traceback, an exit status, a signal or
        a lost connection."""
        return self._failure.reason

    @property
    def cause(self) -> MeshFailure | None:
        """The failure that led to this one (a child's failure that this actor did not
        handle, say), or ``None`` when this is the first."""
        cause = self._failure.cause
        return MeshFailure(cause) if cause is not None else None

    @property
    def mesh(self) -> ActorMesh[Any] | None:
        """The owner's handle of the failed actor mesh, to call or stop it; ``None``
        where this process holds no handle of it (it is not the mesh's owner)."""
        state = process.peek()
        return state.owned.get(self.mesh_id) if state is not None else None

    def headline(self) -> str:
        """The report's first line: which mesh, class, rank, proc and pid failed."""
        return self._failure.headline()

    def report(self) -> str:
        """The failure, its reason and its causes, for people."""
        return self._failure.report()

    def __str__(self) -> str:
        rank = self.rank
        return (
            f"MeshFailure(mesh_name={self.mesh_name}, rank={rank}, crashed_ranks=[{rank}], "
            f"event={self._failure})"
        )

    def __repr__(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (MeshFailure, (self._failure,))


def stopped_on_purpose(mesh_id: int) -> bool:
    """Whether this process stopped the actor mesh ``mesh_id``, or the procs it runs on
    (its failures are then part of the stop, for its owner here)."""
    state = process.peek()
    return state is not None and mesh_id in state.stopped


def located(failure: _RustMeshFailure, owner_path: str) -> _RustMeshFailure:
    """``failure`` as its owner (the actor whose path is ``owner_path``) received it,
    with the failed actor's path: the owner's, then the failed actor's class, mesh name
    and coordinates in the mesh (when the owner still holds the mesh). The path travels
    on with the failure when the owner fails in turn, so every level of a report names
    its actor."""
    if failure.path is not None:
        return failure
    state = process.peek()
    mesh = state.owned.get(failure.mesh_id) if state is not None else None
    try:
        rank = Point(failure.rank, mesh.extent) if mesh is not None else None
    except Exception:  # a rank outside the handle's extent: never from the owner's mesh
        rank = None
    if rank is None:  # the owner dropped its handle: the rank without coordinates
        path = f"{owner_path}.<{failure.class_name} {failure.mesh_name}[{failure.rank}]>"
    else:
        path = actor_path(owner_path, failure.class_name, failure.mesh_name, rank)
    return failure.with_path(path)


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default hook for failures nobody handled: stop the program with exit status
    1 (the report is printed). Reassign ``monarch.actor.unhandled_fault_hook``."""
    sys.exit(1)


#: Where the hook is looked up at call time: ``monarch.actor`` registers a function that
#: reads its ``unhandled_fault_hook`` attribute, which users assign
#: (:func:`set_fault_hook_source`); until then, the default hook.
def _default_hook() -> Callable[[MeshFailure], object]:
    return unhandled_fault_hook


_fault_hook_source: Callable[[], Callable[[MeshFailure], object]] = _default_hook


def set_fault_hook_source(source: Callable[[], Callable[[MeshFailure], object]]) -> None:
    """Look up the unhandled-failure hook with ``source()`` each time a failure reaches
    it (the public ``monarch.actor`` module registers the reading of its attribute)."""
    global _fault_hook_source
    _fault_hook_source = source


def _fault_hook() -> Callable[[MeshFailure], object]:
    return _fault_hook_source()


#: Handlers of failures by mesh id, consulted before the unhandled-failure hook: a library
#: that owns meshes from the client (the recovery trainer) handles their failures itself
#: (:func:`route_failures`).
_routes: dict[int, Callable[[MeshFailure], object]] = {}
_routes_lock = threading.Lock()


def route_failures(mesh_id: int, handler: Callable[[MeshFailure], object] | None) -> None:
    """Send the failures of the client-owned mesh ``mesh_id`` to ``handler`` instead of
    the unhandled-failure hook (``None`` removes the route). The handler runs where the
    hook would, once per failed rank, with the same verdict rules: returning means
    handled; raising ends the program as an unhandled failure."""
    with _routes_lock:
        if handler is None:
            _routes.pop(mesh_id, None)
        else:
            _routes[mesh_id] = handler


def _handler_for(mesh_id: int) -> Callable[[MeshFailure], object]:
    with _routes_lock:
        routed = _routes.get(mesh_id)
    return routed if routed is not None else _fault_hook()


class _Verdicts:
    """Which meshes' failures the root hook is deciding, and has decided."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        #: (mesh id, rank) of failures already given to the hook.
        self.seen: set[tuple[int, int]] = set()
        #: Mesh ids with a failure being decided.
        self.pending: dict[int, int] = {}
        #: Mesh ids with at least one decided failure.
        self.judged: set[int] = set()
        #: Serializes hook runs, and the exit.
        self.hook_lock = threading.Lock()
        self.exiting = False


_verdicts = _Verdicts()

#: How long a failed call on a mesh the client owns waits for a failure report of that
#: mesh to arrive, when none has yet (the report and the failed reply travel apart).
REPORT_GRACE = 2.0


def await_verdict(mesh_id: int, grace: float = REPORT_GRACE) -> None:
    """Block until the root hook has decided a failure of mesh ``mesh_id`` (if the hook
    raises, the program ends and this never returns), or until ``grace`` seconds pass
    with no failure of that mesh pending."""
    v = _verdicts
    deadline = time.monotonic() + grace
    with v.cond:
        while mesh_id not in v.judged:
            if v.pending.get(mesh_id):
                v.cond.wait()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return
            v.cond.wait(left)


def _judge(failure: MeshFailure) -> None:
    """Run the hook for ``failure`` (once per failed rank); end the program if it
    raises."""
    v = _verdicts
    key = (failure.mesh_id, failure.rank)
    if stopped_on_purpose(failure.mesh_id):
        return  # its procs' exits, and what they cause, are not failures
    with v.cond:
        if key in v.seen or process.is_shut_down():
            return
        v.seen.add(key)
        v.pending[failure.mesh_id] = v.pending.get(failure.mesh_id, 0) + 1
    # LOG-2: the failed proc's last lines arrived before this failure; print them
    # before the hook runs (and before any report).
    from monarch._src.actor import logs

    logs.flush()
    unhandled = False
    with v.hook_lock:
        if v.exiting:
            return  # the program is ending already
        hook = _handler_for(failure.mesh_id)
        try:
            hook(failure)
        except BaseException as e:  # unhandled: stop the program, loudly
            v.exiting = True
            unhandled = True
            print(
                f"monarch: unhandled failure ({type(e).__name__} from the fault hook); "
                f"stopping the program with exit status 1:\n{failure.report()}",
                file=sys.stderr,
                flush=True,
            )
    if unhandled:
        extensions.unhandled_failure()  # the post-mortem report, if one is configured
        # Outside the hook lock: the exit sequence judges the failures still queued,
        # on this thread when it runs here.
        _exit(1)
    with v.cond:
        v.pending[failure.mesh_id] -= 1
        v.judged.add(failure.mesh_id)
        v.cond.notify_all()


#: Held by the thread running monarch's part of the exit sequence (the runtime's exit
#: hook, or all the ``atexit`` hooks when a failure ends the program): another thread
#: that reaches it waits for the program to end.
exit_sequence = threading.RLock()


def _exit(code: int) -> None:
    """End the program with ``code``, after its ``atexit`` handlers, whatever the
    interpreter is doing: if no thread runs the exit sequence yet (the main thread is
    in the script, or joining threads at its end), run the ``atexit`` handlers on this
    thread and end the process; otherwise (the interpreter runs its ``atexit`` hooks, or
    this very thread judges the last failures there) return: ``monarch``'s last exit
    hook ends the program with this status. Failures that arrive once the runtime's exit
    hook stopped the runtime are not judged (:func:`_judge`), so none is decided after
    that hook read the status."""
    if not process.claim_exit(code):
        return
    import atexit

    exit_sequence.acquire()  # never released: the process ends below
    try:
        atexit._run_exitfuncs()
    finally:
        _end_process(process.exit_status if process.exit_status is not None else code)


def _end_process(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


#: The root client's supervision thread, once started: the exit sequence, when it runs
#: on that thread (a failure it judges ends the program), does not wait for itself.
_supervision_thread: threading.Thread | None = None


def start_root_supervision(state: process.ProcessState) -> None:
    """The root client's thread that judges the failures reaching it. It takes them from
    the client's failure desk, which marks each *in hand* until it is judged, so the exit
    sequence (:func:`drain_at_exit`) never reads the exit status while a failure is taken
    but not yet judged. The thread blocks until a failure comes; nothing polls."""
    global _supervision_thread

    def run() -> None:
        client = state.client
        while not process.is_shut_down():
            try:
                failure = client.take_supervision()
            except BaseException:  # the runtime is going away
                return
            if failure is None:  # drained by the exit sequence, or the client closed
                return
            try:
                _judge(MeshFailure(located(failure, ROOT_PATH)))
            finally:
                client.supervision_judged()

    thread = threading.Thread(target=run, name="monarch-supervision", daemon=True)
    _supervision_thread = thread
    thread.start()


def drain_at_exit(state: process.ProcessState) -> None:
    """At interpreter exit: judge the failures that arrived but were not judged yet,
    on this thread (the program is ending anyway; a raising hook sets the exit status
    to 1). Waits until the supervision thread holds no failure it took (unless this is
    that thread, judging a failure that ends the program)."""
    taker = threading.current_thread() is _supervision_thread
    try:
        failures = state.client.drain_supervision(taker)
    except BaseException:
        return
    for failure in failures:
        _judge(MeshFailure(located(failure, ROOT_PATH)))
