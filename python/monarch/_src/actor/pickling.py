"""Pickling of user payloads: the only bytes Python produces for the wire.

Everything else about a message (its route, the cast tree, the reply items that frame
values) is encoded by the runtime. Python pickles the arguments of a call and the value
of a reply, with the standard pickler when it can and cloudpickle otherwise (lambdas,
closures, and anything defined in ``__main__``, which names a different module in the
receiving process).

Large buffers travel out of band (pickle protocol 5), as message parts of their own,
never copied into the pickle: every buffer of at least :func:`out_of_band_min` bytes
(the ``small_write_threshold`` config key) that an object hands the pickler (NumPy
arrays, CPU tensors through :func:`_reduce_tensor`), and top-level ``bytes`` arguments
and return values of that size. A payload (:func:`dumps_parts`) is the pickle, then, if
there are such buffers, a *kinds* part (one byte per buffer: ``r`` read-only, ``w``
writable) and the buffers:

- a read-only ``bytes`` buffer is the object itself, shared, not copied;
- a writable buffer (an array's memory) is snapshotted into a recycled ``bytearray``
  (one memory copy into memory already mapped), so later changes to the array do not
  reach the message; the message then shares the snapshot.

The receiving side gets read-only buffers as ``bytes`` and writable ones as
``bytearray`` objects (recycled too), so an array or tensor rebuilt on one is writable,
as it would be from an in-band pickle, and shares its memory (:func:`loads_parts`).

A call whose arguments are all plain scalars of exactly the types in
:data:`_PLAIN_TYPES`, and such a return value, are one part instead: the byte
:data:`_PLAIN_TAG`, then their ``marshal``: cheaper than a pickle, which allocates a
pickler object and a 4 KiB output buffer for each message. Only exact
scalar types qualify, because ``marshal`` writes any buffer (a ``bytearray``, an array)
as ``bytes`` and refuses subclasses; :func:`loads` tells the two apart by that byte.
"""

from __future__ import annotations

import copyreg
import io
import marshal
import pickle
import sys
from collections import ChainMap
from collections.abc import MutableMapping
from typing import Any

from monarch._rust_bindings import find as _find
from monarch._rust_bindings import lend_bytearray as _lend_bytearray
from monarch._src import config

__all__ = [
    "OUT_OF_BAND_MIN",
    "dumps",
    "dumps_call",
    "dumps_parts",
    "dumps_value",
    "format_exception",
    "loads",
    "loads_parts",
]

_MAIN = b"__main__"
#: Pickles at least this long are searched with the vectorized ``find``.
_LARGE_PICKLE = 1 << 16

#: Buffers of at least this size travel out of band by default (the default of the
#: ``small_write_threshold`` config key); the extension shares, rather than copies,
#: message parts from the same size on.
OUT_OF_BAND_MIN = 64 << 10


def out_of_band_min() -> int:
    """The size from which buffers travel out of band: ``small_write_threshold``."""
    return int(config.cached("small_write_threshold"))


#: The first byte of a plain payload: calls whose arguments, and values, are only plain
#: scalars (:data:`_PLAIN_TYPES`) travel as this byte and then their marshal (module
#: docs). No pickle starts with it (protocol 5 starts with the PROTO opcode, 0x80), nor
#: does a marshal.
_PLAIN_TAG = b"\x00"
#: The exact types (no subclass, no container) a plain payload may hold.
_PLAIN_TYPES = frozenset({int, float, str, bool, bytes, type(None)})
#: The marshal format of plain payloads: stable since Python 3.4.
_MARSHAL_VERSION = 4

_READ_ONLY = ord("r")
_WRITABLE = ord("w")


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` in band (everything in one ``bytes``): see :func:`dumps_parts`
    for payloads with out-of-band buffers."""
    return _dumps(obj, None)


def _dumps(obj: Any, oob: list[pickle.PickleBuffer] | None, limit: int | None = None) -> bytes:
    """Pickle with the standard pickler when it can, cloudpickle otherwise: for what the
    standard pickler refuses (lambdas, closures) and for references into ``__main__``.
    Both load with ``pickle.loads``. With ``oob``, buffers of at least ``limit`` bytes
    (default :func:`out_of_band_min`) are appended to it instead of being pickled."""

    if limit is None:
        limit = out_of_band_min()

    def callback(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < limit:
            return True  # in band
        assert oob is not None
        oob.append(buffer)
        return False

    cb = callback if oob is not None else None
    try:
        data = _pickle_with(pickle.Pickler, obj, cb)
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    else:
        # A reference to __main__ spells the module name; a false positive (a string
        # that contains it) only costs the slower pickler. Small pickles: ``bytes.find``;
        # large ones: the vectorized search, ~10x faster.
        if (data.find(_MAIN) if len(data) < _LARGE_PICKLE else _find(data, _MAIN)) < 0:
            return data
    if oob is not None:
        oob.clear()  # the first attempt's buffers
    import cloudpickle

    return _pickle_with(cloudpickle.Pickler, obj, cb)


def _pickle_with(pickler: Any, obj: Any, callback: Any) -> bytes:
    torch = sys.modules.get("torch")
    if torch is None and pickler is pickle.Pickler:
        return pickle.dumps(obj, protocol=5, buffer_callback=callback)
    if torch is not None:
        pickler = _tensor_pickler(pickler, torch)
    out = io.BytesIO()
    pickler(out, protocol=5, buffer_callback=callback).dump(obj)
    return out.getvalue()


#: Each pickler class used since torch was imported, with its subclass that also
#: reduces CPU tensors (:func:`_tensor_pickler`).
_tensor_picklers: dict[Any, Any] = {}


def _tensor_pickler(pickler: Any, torch: Any) -> Any:
    """A subclass of ``pickler`` whose dispatch table sends ``torch.Tensor`` to
    :func:`_reduce_tensor` before the pickler's own table (``copyreg``'s if it has
    none). Made once per pickler class, not per message."""
    cls = _tensor_picklers.get(pickler)
    if cls is None:
        base: Any = getattr(pickler, "dispatch_table", None)
        if not isinstance(base, MutableMapping):  # the C pickler's is a per-instance slot
            base = copyreg.dispatch_table
        table: ChainMap[Any, Any] = ChainMap({torch.Tensor: _reduce_tensor}, base)
        cls = type(f"{pickler.__name__}WithTensors", (pickler,), {"dispatch_table": table})
        _tensor_picklers[pickler] = cls
    return cls


def dumps_parts(obj: Any, limit: int | None = None) -> list[bytes | bytearray]:
    """The payload parts of ``obj``: its pickle; then, if it has buffers of at least
    ``limit`` bytes (default :func:`out_of_band_min`), the kinds part and the buffers
    (module docs)."""
    oob: list[pickle.PickleBuffer] = []
    data = _dumps(obj, oob, limit)
    if not oob:
        return [data]
    kinds = bytearray()
    parts: list[bytes | bytearray] = [data, b""]
    for buffer in oob:
        raw = buffer.raw()
        if raw.readonly:
            kinds.append(_READ_ONLY)
            owner = raw.obj
            parts.append(
                owner if type(owner) is bytes and len(owner) == raw.nbytes else raw.tobytes()
            )
        else:
            kinds.append(_WRITABLE)
            snapshot = _lend_bytearray(raw.nbytes)
            memoryview(snapshot)[:] = raw
            parts.append(snapshot)
        raw.release()
    parts[1] = bytes(kinds)
    return parts


def loads(data: bytes, buffers: Any = ()) -> Any:
    """Decode ``data``, a pickle or a plain payload (module docs); ``buffers``: its
    out-of-band buffers, in order."""
    if data[:1] == _PLAIN_TAG:
        return marshal.loads(data[1:])  # a small copy: cheaper than a memoryview
    torch = sys.modules.get("torch")
    if torch is not None and torch._C._len_torch_dispatch_stack():
        # Under a torch dispatch mode (a mesh activated for distributed tensors),
        # tensors in a message are local values: rebuild them with no mode active.
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return pickle.loads(data, buffers=buffers)
    return pickle.loads(data, buffers=buffers)


def loads_parts(parts: list[Any]) -> Any:
    """Unpickle a payload made by :func:`dumps_parts` (as the extension delivers it:
    read-only buffers as ``bytes``, writable ones as ``bytearray``)."""
    if len(parts) == 1:
        return loads(parts[0])
    if len(parts) < 3 or len(parts[1]) != len(parts) - 2:
        raise ValueError(
            f"a payload of {len(parts)} parts is malformed: expected a pickle, then a "
            "kinds part and one buffer per kind"
        )
    return loads(parts[0], parts[2:])


def dumps_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes | bytearray]:
    """The payload parts of a call: ``(args, kwargs)`` by :func:`dumps_parts`, where a
    top-level argument that is a ``bytes`` object of at least :func:`out_of_band_min`
    bytes also travels out of band (the object itself: shared, not copied); a plain
    payload (module docs) when every argument is a plain scalar."""
    limit = out_of_band_min()
    # The common case first: no large bytes argument, one pickle (or one marshal, when
    # every argument is a plain scalar).
    plain = True
    for values in (args, kwargs.values()) if kwargs else (args,):
        for v in values:
            kind = type(v)
            if kind is bytes:
                if len(v) >= limit:
                    return _dumps_call_sharing(args, kwargs, limit)
            elif kind not in _PLAIN_TYPES:
                plain = False
    if plain:
        try:
            return [_PLAIN_TAG + marshal.dumps((args, kwargs), _MARSHAL_VERSION)]
        except ValueError:  # a tuple or dict subclass: pickled
            pass
    return dumps_parts((args, kwargs), limit)


def _dumps_call_sharing(
    args: tuple[Any, ...], kwargs: dict[str, Any], limit: int
) -> list[bytes | bytearray]:
    """:func:`dumps_call` of a call with a large ``bytes`` argument: each such object
    travels out of band, unless it is passed twice."""
    big: dict[int, bytes] = {}
    seen_twice: set[int] = set()
    for v in (*args, *kwargs.values()):
        if type(v) is bytes and len(v) >= limit:
            if id(v) in big:
                # Out-of-band buffers are not memoized: an object passed twice stays in
                # the pickle, once.
                seen_twice.add(id(v))
            big[id(v)] = v
    for key in seen_twice:
        del big[key]
    if not big:
        return dumps_parts((args, kwargs), limit)
    wrapped = {key: pickle.PickleBuffer(v) for key, v in big.items()}

    def wrap(v: Any) -> Any:
        return wrapped.get(id(v), v) if type(v) is bytes else v

    return dumps_parts(
        (tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}), limit
    )


def dumps_value(value: Any) -> list[bytes | bytearray]:
    """The parts of a reply's value: :func:`dumps_parts`, where the value itself, when
    it is a ``bytes`` object of at least :func:`out_of_band_min` bytes, travels out of
    band; a plain payload (module docs) when it is a plain scalar."""
    limit = out_of_band_min()
    kind = type(value)
    if kind in _PLAIN_TYPES:
        if kind is not bytes or len(value) < limit:
            return [_PLAIN_TAG + marshal.dumps(value, _MARSHAL_VERSION)]
        return dumps_parts(pickle.PickleBuffer(value), limit)
    return dumps_parts(value, limit)


def _reduce_tensor(t: Any) -> Any:
    """Reduce a CPU tensor of at least :func:`out_of_band_min` bytes to its memory as
    an out-of-band buffer (plus dtype, shape and ``requires_grad``); anything else the
    way torch pickles it."""
    import torch

    plain = (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and not any(getattr(t, "names", None) or ())
        and (t.is_leaf or not t.requires_grad)
        and t.numel() * t.element_size() >= out_of_band_min()
    )
    if plain:
        try:
            data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        except (RuntimeError, TypeError, ValueError):
            pass  # no NumPy, or a dtype it cannot view: torch's own way
        else:
            dtype = str(t.dtype).removeprefix("torch.")
            return (
                _rebuild_tensor,
                (pickle.PickleBuffer(data), dtype, tuple(t.shape), t.requires_grad),
            )
    return t.__reduce_ex__(5)


def _rebuild_tensor(buffer: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> Any:
    """The tensor :func:`_reduce_tensor` sent, on the received buffer (sharing it)."""
    import torch

    t = torch.frombuffer(buffer, dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def format_exception(exc: BaseException) -> str:
    """``exc`` with its traceback, as the interpreter prints it."""
    import traceback

    out = io.StringIO()
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=out)
    return out.getvalue()
