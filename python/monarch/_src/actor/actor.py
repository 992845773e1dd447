"""The ``Actor`` base class, and what is checked about an actor class before it is
spawned (endpoints all sync or all async, names that do not clash with mesh attributes,
a matching ``__cleanup__``)."""

from __future__ import annotations

import builtins
import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, TypeVar

from monarch._src.actor.endpoint import CONCURRENT_ACTOR_FLAG, _endpoints
from monarch._src.actor.extent import Extent
from monarch._src.actor.future import Future

if TYPE_CHECKING:
    import logging

__all__ = ["MESH_ATTRIBUTES", "Actor"]

_Self = TypeVar("_Self", bound="Actor")

#: Attributes of an actor mesh handle; endpoints may not take these names.
MESH_ATTRIBUTES = frozenset(
    {"slice", "split", "flatten", "rename", "size", "sizes", "extent", "stop", "initialized"}
)


@functools.cache
def _class_info(cls: type) -> _ClassInfo:
    return _ClassInfo(cls)


class _ClassInfo:
    """What a caller and a host need to know about an actor class, checked once."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = f"{cls.__module__}.{cls.__qualname__}"
        self.endpoints = _endpoints(cls)
        #: ``@concurrent_actor``: a stop lets running endpoint tasks finish first.
        self.drains_on_stop = bool(getattr(cls, CONCURRENT_ACTOR_FLAG, False))
        kinds = {ep._is_async for ep in self.endpoints.values()}
        self.is_async = kinds == {True}
        self.problem: str | None = None
        if len(kinds) > 1:
            sync = sorted(n for n, e in self.endpoints.items() if not e._is_async)
            asyn = sorted(n for n, e in self.endpoints.items() if e._is_async)
            self.problem = (
                f"actor class {self.name} mixes sync endpoints {sync} and async endpoints "
                f"{asyn}; make them all `def` or all `async def`"
            )
        clash = sorted(MESH_ATTRIBUTES & self.endpoints.keys())
        if clash and self.problem is None:
            self.problem = (
                f"actor class {self.name} has endpoint(s) {clash} named like actor mesh "
                f"attributes ({sorted(MESH_ATTRIBUTES)}); rename them"
            )
        cleanup = getattr(cls, "__cleanup__", None)
        if cleanup is not None and self.problem is None and self.endpoints:
            if inspect.iscoroutinefunction(cleanup) != self.is_async:
                self.problem = (
                    f"actor class {self.name}: __cleanup__ must be "
                    f"{'async' if self.is_async else 'sync'} like its endpoints"
                )
        try:
            self.init_signature: inspect.Signature | None = inspect.signature(
                cls.__init__  # type: ignore[misc]  # the class's own, not an instance's
            )
        except (TypeError, ValueError):
            self.init_signature = None


# --- the actor base class -----------------------------------------------------------------


class Actor:
    """Base class of user actors. Endpoints are methods marked with ``@endpoint``;
    constructor arguments come from ``ProcMesh.spawn(name, Class, *args, **kwargs)``.

    For a type checker, an actor mesh handle is typed as its actor class (``spawn``
    returns ``Class``), so this class also declares the operations of a handle; on an
    actor instance they raise ``NotImplementedError``.
    """

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A ``logging.Logger`` named after the actor's class, its level set to ``DEBUG``.

        Its records go to the handlers of the proc's logging; what they write to stdout
        or stderr is forwarded to the client, prefixed with the proc's rank (see the
        logging guide). Created on first use.
        """
        import logging

        logger = logging.getLogger(type(self).__qualname__)
        logger.setLevel(logging.DEBUG)
        return logger

    def _mesh_only(self, what: str) -> NoReturn:
        raise NotImplementedError(
            f"{what} is an operation of actor mesh handles (what spawn() returns), not of "
            "an actor instance"
        )

    def slice(self: _Self, **kwargs: int | builtins.slice) -> _Self:
        """On an actor mesh handle: a view of part of the mesh (see ``MeshTrait.slice``).

        ``dim=i`` keeps coordinate ``i`` and drops the dimension; ``dim=slice(...)``
        keeps the dimension, restricted.

        Args:
            **kwargs: Dimension name to an index or a ``slice``.

        Returns:
            The view, typed as the actor class like the handle itself.

        Raises:
            NotImplementedError: Called on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("slice()")

    def flatten(self: _Self, name: str) -> _Self:
        """On an actor mesh handle: the same actors along one dimension called ``name``.

        Args:
            name: The name of the merged dimension.

        Returns:
            The flattened view.

        Raises:
            NotImplementedError: Called on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("flatten()")

    def split(self: _Self, **kwargs: Sequence[str] | int) -> _Self:
        """On an actor mesh handle: the same actors with dimensions split into several,
        e.g. ``mesh.split(gpus=("row", "col"), row=2)``.

        Args:
            **kwargs: An existing dimension to the names it splits into (outermost
                first), or a new name to its size (at most one size per split may be
                left out).

        Returns:
            The reshaped view.

        Raises:
            NotImplementedError: Called on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("split()")

    def rename(self: _Self, **kwargs: str) -> _Self:
        """On an actor mesh handle: the same actors with dimensions renamed, e.g.
        ``mesh.rename(gpus="ranks")``.

        Args:
            **kwargs: Old dimension name to new name.

        Returns:
            The renamed view.

        Raises:
            NotImplementedError: Called on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("rename()")

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """On an actor mesh handle: stop the actors of this view, gracefully.

        Each actor first handles the messages already sent to it; later calls to the
        mesh raise ``SupervisionError``.

        Args:
            reason: Why the actors stop; it appears in the errors of later calls.

        Returns:
            A future that completes once every actor of the view has stopped.

        Raises:
            NotImplementedError: Called on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("stop()")

    @property
    def initialized(self) -> Future[None]:
        """On an actor mesh handle: a future that completes once the procs exist and
        every actor of the mesh has run ``__init__`` (it raises if one failed).

        ``spawn`` returns before that; messages sent meanwhile wait, so awaiting this
        is only needed to learn of a failed ``__init__`` early.

        Raises:
            NotImplementedError: Read on an actor instance rather than a mesh handle.
        """
        return self._mesh_only("initialized")

    if TYPE_CHECKING:
        # The rest of a handle's operations, for type checkers only: at run time an
        # actor may use these names for attributes of its own.

        def size(self, dim: str | Sequence[str] | None = None) -> int: ...

        @property
        def sizes(self) -> dict[str, int]: ...

        @property
        def extent(self) -> Extent: ...

        def __len__(self) -> int: ...
