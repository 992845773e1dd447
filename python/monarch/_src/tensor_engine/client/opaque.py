"""``monarch.OpaqueRef``: a handle to a Python value that lives on the tensor workers.

A remote function (``monarch.remote``) can return ``OpaqueRef(value)`` for any value
(a model, an optimizer, a data loader, ...). Each rank keeps its own value; the client
gets one handle for all of them, and never the values. Passing the handle to a later
remote function gives each rank's function a handle whose ``.value`` is that rank's
value::

    @monarch.remote(propagate=lambda: monarch.OpaqueRef(None))
    def make_model() -> monarch.OpaqueRef:
        return monarch.OpaqueRef(torch.nn.Linear(4, 2))

    @monarch.remote(propagate=lambda model, x: torch.empty(x.shape[0], 2))
    def forward(model: monarch.OpaqueRef, x: torch.Tensor) -> torch.Tensor:
        return model.value(x)

    with mesh.activate():
        model = make_model()
        y = forward(model, torch.rand(3, 4))

How it works: an ``OpaqueRef`` is identified by a small int64 tensor, its *key*. On the
workers a process-wide weak table maps each key tensor to its value. The key is an
ordinary tensor output of the remote function that created the handle (the handle is a
pytree node whose one leaf is the key), so on the client the handle holds a
``monarch.Tensor``, and the engine's usual bookkeeping decides the value's lifetime:
when the client's handle is garbage collected (or :meth:`OpaqueRef.drop` is called),
the workers delete the key, and the table forgets the value (unless a function kept a
reference to it elsewhere).

Sent as an argument, a client handle travels as the id of its key, and a worker looks
the key up when ``.value`` is first read, so the value is the one the earlier
command left on that rank.

Limits:

- the client cannot read or create values (``OpaqueRef(...)`` on the client outside a
  ``propagate`` function raises); the endpoint adverbs (``.call``, ``.call_one``, ...)
  return handles that cannot be read on the client either;
- a handle is checked when a worker reads it, not when it is passed: a handle passed
  to a remote function on another mesh, or read on another stream than the one that
  created it, is not caught on the client (the read fails or races). A dropped handle
  raises ``TypeError`` at the call, except for functions with ``propagate="inspect"``;
- with the default ``propagate`` (run the function on rank 0 to learn its output
  shapes), that run reads rank 0's real value; setting ``.value`` there does nothing,
  but a function that changes the value in place changes it twice on rank 0: give
  such functions a ``propagate`` function;
- handles are not hashable (the engine's cache of output shapes would otherwise keep
  them, and their values, alive).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["OpaqueRef"]

#: Key tensor -> value, for the values of this process (a worker's).
_table: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_counter = itertools.count(1)
_MISSING = object()


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _fake_mode_active() -> bool:
    """Whether a fake tensor mode is active (a ``propagate`` function is running)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _is_monarch(t: Any) -> bool:
    from monarch._src.tensor_engine.client.tensor import Tensor

    return isinstance(t, Tensor)


def _current_worker() -> Any:
    """The tensor worker of this process, or None (the client)."""
    if "monarch._src.tensor_engine.worker.actor" not in sys.modules:
        return None
    from monarch._src.tensor_engine.worker.actor import this_worker

    return this_worker()


def _client_error(what: str) -> RuntimeError:
    return RuntimeError(
        f"cannot {what} an OpaqueRef here: its values live on the tensor workers, one per "
        "rank, and only a remote function running there can read or set them. Read "
        "`.value` inside a function given to monarch.remote and pass the OpaqueRef to it"
    )


class OpaqueRef:
    """A handle to a Python value that lives on the tensor workers (one per rank); see
    the module documentation. ``OpaqueRef(value)`` inside a remote function makes a
    new one; ``.value`` (inside a remote function) reads or sets this rank's value."""

    __slots__ = ("__weakref__", "_key", "_ref", "_sid")
    __hash__ = None  # type: ignore[assignment]

    _key: Any
    _ref: int | None
    #: The stream of the key, for a handle the client sent.
    _sid: int

    def __init__(self, value: Any = None) -> None:
        if _fake_mode_active():
            # A placeholder, in a `propagate` function (only its shape matters; a
            # local tensor, not one recorded on the active mesh).
            from monarch._src.tensor_engine.client import _torch

            with _torch.disable_modes():
                self._key = torch.zeros((), dtype=torch.int64)
            self._ref = None
            self._sid = 0
            return
        key = torch.tensor(next(_counter), dtype=torch.int64)
        if _current_worker() is None:
            raise RuntimeError(
                "OpaqueRef(value) can only be created inside a remote function (running "
                "on the tensor workers), or inside a `propagate` function as a "
                "placeholder: return OpaqueRef(value) from a function given to "
                "monarch.remote, and call that under `with mesh.activate():`"
            )
        self._key = key
        self._ref = None
        self._sid = 0
        _table[key] = value

    @classmethod
    def _rebuild(cls, key: Any, ref: int | None, sid: int = 0) -> OpaqueRef:
        r = cls.__new__(cls)
        r._key = key
        r._ref = ref
        r._sid = sid
        return r

    def __reduce_ex__(self, protocol: Any) -> Any:
        key = self._key
        if _is_monarch(key):
            # A client handle: the workers find the key by its id.
            return (OpaqueRef._rebuild, (None, key.ref, key.stream.sid))
        return (OpaqueRef._rebuild, (key, self._ref, self._sid))

    def __repr__(self) -> str:
        key = self._key
        if _is_monarch(key):
            state = "dropped, " if key.dropped else ""
            return f"OpaqueRef({state}ref={key.ref}, mesh={dict(key.mesh._shape.extent)})"
        if self._ref is not None:
            return f"OpaqueRef(ref={self._ref})"
        if isinstance(key, torch.Tensor) and not _is_fake(key) and key in _table:
            return f"OpaqueRef(<{type(_table[key]).__name__}>)"
        return "OpaqueRef(<placeholder>)"

    # --- the value ------------------------------------------------------------------------

    @property
    def value(self) -> Any:
        """This rank's value (only inside a remote function)."""
        key = self._resolve("read the value of")
        try:
            return _table[key]
        except KeyError:
            raise self._unknown() from None

    @value.setter
    def value(self, v: Any) -> None:
        key = self._resolve("set the value of")
        if self._ref is not None and self._key is not key:
            # The handle of a run that only learns output shapes (its key is a
            # placeholder): the value stays as it is.
            return
        _table[key] = v

    def drop(self) -> None:
        """Free the values of this handle on every worker now (a client handle only;
        using it afterwards fails on the workers)."""
        if not _is_monarch(self._key):
            raise RuntimeError(
                "OpaqueRef.drop() frees the values of a client's handle; this handle is "
                "not one (inside a remote function, let the handle go instead)"
            )
        self._key.drop()

    @property
    def dropped(self) -> bool:
        """Whether :meth:`drop` was called on this (client) handle."""
        return bool(_is_monarch(self._key) and self._key.dropped)

    def _resolve(self, what: str) -> Any:
        """The key tensor of this handle in this process."""
        key = self._key
        fake = _fake_mode_active() or _is_fake(key)
        if _is_monarch(key) and not fake:
            raise _client_error(what)
        if (
            not fake
            and self._ref is not None
            and not (isinstance(key, torch.Tensor) and key in _table)
        ):
            found = self._lookup(self._ref, self._sid, what)
            if key is None:
                self._key = found
            return found
        if fake or not isinstance(key, torch.Tensor):
            raise RuntimeError(
                f"cannot {what} a placeholder OpaqueRef: `propagate` functions run on the "
                "client with fake tensors and describe outputs only; they must not read "
                "`.value` (return OpaqueRef(None) for an OpaqueRef output)"
            )
        if key not in _table:
            if _current_worker() is None:
                raise _client_error(what)
            raise self._unknown()
        return key

    def _lookup(self, ref: int, sid: int, what: str) -> Any:
        """The key tensor that the worker running this command holds for ``ref`` (made
        on stream ``sid``)."""
        from monarch._src.tensor_engine.wire import Failure

        worker = _current_worker()
        if worker is None:
            raise _client_error(what)
        held = worker.values.get(ref, _MISSING)
        if held is _MISSING and sid != 0 and getattr(worker._local, "sid", 0) == 0:
            # On the actor's own thread (shape propagation, or a command of "main"):
            # the stream that makes the key may not have got there yet.
            worker._sync([sid])
            held = worker.values.get(ref, _MISSING)
        if held is _MISSING:
            raise RuntimeError(
                f"OpaqueRef(ref={ref}) has no value on rank {worker.rank}: it was dropped "
                "(OpaqueRef.drop(), or the client's handle was garbage collected), or it "
                "belongs to another mesh. Keep the handle alive while functions use it, "
                "and pass it only to remote functions on the mesh that created it"
            )
        if isinstance(held, Failure):
            raise RuntimeError(
                f"OpaqueRef(ref={ref}) has no value on rank {held.rank}: the remote "
                f"function that should have created it failed:\n{held.error}"
            )
        if not isinstance(held, torch.Tensor) or held not in _table:
            raise RuntimeError(
                f"ref {ref} on rank {worker.rank} is not an OpaqueRef's value (a handle "
                "from another mesh?); pass an OpaqueRef only to remote functions on the "
                "mesh whose remote function created it"
            )
        return held

    def _unknown(self) -> RuntimeError:
        return RuntimeError(
            f"{self!r} has no value in this process: its key is not one this worker "
            "created (a placeholder of shape propagation, or a handle returned by an "
            "endpoint adverb such as .call()). Create OpaqueRefs by calling the remote "
            "function under an active mesh (fn(...), not fn.call(...))"
        )

    # --- pytree ---------------------------------------------------------------------------

    def _leaf(self) -> Any:
        """The key, resolved on a worker for a handle the client sent (so a function
        can return a handle it received)."""
        key = self._key
        if key is None and self._ref is not None:
            try:
                return self._resolve("return")
            except RuntimeError:
                return None
        return key

    def _context(self) -> tuple[int, int] | None:
        key = self._key
        if _is_monarch(key):
            return (int(key.ref), int(key.stream.sid))
        return None if self._ref is None else (self._ref, self._sid)


def _flatten(r: OpaqueRef) -> tuple[list[Any], tuple[int, int] | None]:
    key = r._key
    if _is_monarch(key):
        if key.dropped:
            # (A remote function's arguments are flattened when its call is recorded.)
            raise TypeError(
                f"{r!r} was dropped (OpaqueRef.drop()), so its values are gone from the "
                "workers; it cannot be passed to remote functions any more. Drop a "
                "handle only after its last use"
            )
        # Shape propagation by running the function on a worker reads the value
        # there: the command that created it must have been sent.
        if not _fake_mode_active():
            key._view.engine.flush()
    return [r._leaf()], r._context()


def _unflatten(leaves: Any, context: tuple[int, int] | None) -> OpaqueRef:
    (key,) = leaves
    if _is_monarch(key) or context is None:
        return OpaqueRef._rebuild(key, None)
    return OpaqueRef._rebuild(key, *context)


register_pytree_node(
    OpaqueRef,
    _flatten,
    _unflatten,
    serialized_type_name="monarch.OpaqueRef",
)
