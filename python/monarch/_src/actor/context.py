"""Where the current code runs: ``context()``, ``Context`` and ``Instance``.

Inside an endpoint, :func:`context` is the running actor's: its :class:`Instance` and
the position of the message being handled in the view it was sent to
(:attr:`Context.message_rank`). Outside any actor it is the process's root client
(bootstrapping the client on first use).

:func:`sender` is who sends a message from the current code: the running actor, or the
process's client. Messages a script sends are owned by (and their meshes' failures
reported to) the client.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from monarch._rust_bindings import Client, Delivery, DrivenActor
from monarch._src.actor import process
from monarch._src.actor.extent import Extent
from monarch._src.actor.point import Point

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import ProcMesh

__all__ = [
    "ROOT_PATH",
    "Context",
    "Creator",
    "Instance",
    "actor_path",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "sender",
]


class Hosted(Protocol):
    """What an :class:`Instance` needs from the thread hosting its actor."""

    driven: DrivenActor

    def request_stop(self, reason: str) -> None: ...

    def kill(self, reason: str | None) -> None: ...


#: Builds ``this_proc()`` (registered by :mod:`monarch._src.actor.proc_mesh`, which this
#: module must not import).
_this_proc: Callable[[], ProcMesh] | None = None


def set_this_proc(fn: Callable[[], ProcMesh]) -> None:
    global _this_proc
    _this_proc = fn


#: The path of a process's client, the root of the actor tree.
ROOT_PATH = "<root>"


def actor_path(parent: str, class_name: str, name: str, rank: Point | None) -> str:
    """The path of actor ``name`` of class ``class_name`` at ``rank``, spawned by the
    actor whose path is ``parent``: ``<root>.<__main__.Trainer trainers{'gpus': 0/2}>``
    (no coordinates for a rank of a mesh without dimensions)."""
    coords = repr(rank) if rank is not None and len(rank) else ""
    return f"{parent}.<{class_name} {name}{coords}>"


@dataclass(frozen=True)
class Creator:
    """Who spawned an actor (``context().actor_instance.creator``): ``name`` is the
    spawning actor's name, ``"root"`` for a script's client; ``actor_id`` its id;
    ``path`` its path, as ``str()`` of its instance prints it (``<root>`` for the
    client), which is also how a ``Creator`` prints."""

    name: str
    actor_id: str
    path: str = ROOT_PATH

    def __str__(self) -> str:
        return self.path

    __repr__ = __str__


class Instance:
    """The running actor (or the client): ``context().actor_instance``."""

    def __init__(
        self,
        *,
        name: str,
        class_name: str,
        actor_id: str,
        proc_id: str,
        rank: Point,
        creator: Creator | None,
        hosted: Hosted | None = None,
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.actor_id = actor_id
        self.proc_id = proc_id
        self.rank = rank
        self.creator = creator
        self._hosted = hosted

    @property
    def proc(self) -> ProcMesh:
        """This actor's proc, as a 0-dimensional ProcMesh."""
        if _this_proc is None:
            raise RuntimeError("monarch.actor is not imported in this process")
        return _this_proc()

    @property
    def proc_mesh(self) -> ProcMesh:
        """Same as :attr:`proc` (the proc mesh this actor can spawn on locally)."""
        return self.proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor after the message being handled (graceful)."""
        if self._hosted is None:
            raise RuntimeError("the client is not a hosted actor; use shutdown_context()")
        self._hosted.request_stop(reason or "stopped itself")

    def kill(self, reason: str | None = None) -> None:
        """Fail this actor now: its owner gets a ``MeshFailure``, later calls raise
        ``SupervisionError``."""
        if self._hosted is None:
            raise RuntimeError("the client is not a hosted actor; it cannot be killed")
        self._hosted.kill(reason)

    def abort(self, reason: str | None = None) -> None:
        """Same as :meth:`kill`."""
        self.kill(reason)

    def __str__(self) -> str:
        """The actor's path: its creator's path, then ``<module.Class name{rank}>``
        (``<root>.<__main__.Trainer trainers{'gpus': 0/2}>``); ``<root>`` for the
        process's client."""
        if self._hosted is None:  # the process's client: the root of the actor tree
            return ROOT_PATH
        parent = self.creator.path if self.creator is not None else ROOT_PATH
        return actor_path(parent, self.class_name, self.name, self.rank)

    def __repr__(self) -> str:
        return f"Instance({self})"


class Context:
    """Where the current code runs: ``actor_instance`` and ``message_rank``."""

    def __init__(self, instance: Instance, delivery: Delivery | None = None) -> None:
        self.actor_instance = instance
        self._delivery = delivery

    @functools.cached_property
    def message_rank(self) -> Point:
        """This message's position in the mesh view it was sent to."""
        d = self._delivery
        if d is None:
            return self.actor_instance.rank
        return Point(d.index, d.extent())

    @property
    def _hops(self) -> int:
        """How many procs the current message passed through to get here (1: sent
        directly; more when a cast was relayed down its tree). For tests and tools."""
        return self._delivery.hops if self._delivery is not None else 0


_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_context", default=None
)
_root_context: Context | None = None


def context() -> Context:
    """The current actor's context; outside any actor, the root client's."""
    ctx = _current.get()
    if ctx is not None:
        return ctx
    global _root_context
    if _root_context is None:
        state = process.get()
        name = "client" if state.is_root else "agent"
        _root_context = Context(
            Instance(
                name=name,
                class_name=name,
                actor_id=state.client.actor_id,
                proc_id=state.proc_id,
                rank=Point(0, Extent([], [])),
                creator=None,
            )
        )
    return _root_context


def sender() -> Client | DrivenActor:
    """Who sends from the current code: the running actor, or this process's client."""
    ctx = _current.get()
    if ctx is not None and ctx.actor_instance._hosted is not None:
        return ctx.actor_instance._hosted.driven
    return process.get().client


def current_rank() -> Point:
    """The current message's position in the mesh view it was sent to.

    Inside an endpoint this is relative to the (possibly sliced) mesh the caller used,
    so its dimensions are the view's; ``context().actor_instance.rank`` is the actor's
    fixed place in its proc mesh instead. Outside any actor it is the client's rank,
    an empty point.

    Returns:
        A ``Point``: a mapping from dimension name to index, with its ``extent``.
    """
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes of the mesh view the current message was sent to.

    Returns:
        Dimension name to size, e.g. ``{"gpus": 4}``; ``{}`` outside any actor.
    """
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """The id of the running actor (or, outside any actor, of the client), as a string.

    Returns:
        The actor id, which names its proc and the actor's name and rank on it, e.g.
        ``"...client[0]"`` in the client.
    """
    return str(context().actor_instance.actor_id)
