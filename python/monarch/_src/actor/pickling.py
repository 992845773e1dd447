"""Pickling of user payloads: the only bytes Python produces for the wire.

Everything else about a message (its route, the cast tree, the reply items that frame
values) is encoded by the runtime. Python pickles the arguments of a call and the value
of a reply, with the standard pickler when it can and cloudpickle otherwise (lambdas,
closures, and anything defined in ``__main__``, which names a different module in the
receiving process).

Large ``bytes`` travel out of band (pickle protocol 5): a top-level argument or a return
value of at least :data:`OUT_OF_BAND_MIN` bytes becomes a message part of its own, never
copied into the pickle (:func:`dumps_call`, :func:`dumps_value`); :func:`loads` with the
parts after the pickle as its buffers gives back the ``bytes`` object received.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from monarch._rust_bindings import find as _find

__all__ = [
    "OUT_OF_BAND_MIN",
    "dumps",
    "dumps_call",
    "dumps_value",
    "format_exception",
    "loads",
]

_MAIN = b"__main__"
#: Pickles at least this long are searched with the vectorized ``find``.
_LARGE_PICKLE = 1 << 16

#: Top-level call arguments and return values that are ``bytes`` of at least this size
#: travel out of band; the extension shares, rather than copies, message parts from the
#: same size on.
OUT_OF_BAND_MIN = 64 << 10


def dumps(obj: Any, buffer_callback: Any = None) -> bytes:
    """Pickle with the standard pickler when it can, cloudpickle otherwise: for what the
    standard pickler refuses (lambdas, closures) and for references into ``__main__``.
    Both load with ``pickle.loads``."""
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    else:
        # A reference to __main__ spells the module name; a false positive (a string
        # that contains it) only costs the slower pickler. Small pickles: ``bytes.find``;
        # large ones: the vectorized search, ~10x faster.
        if (data.find(_MAIN) if len(data) < _LARGE_PICKLE else _find(data, _MAIN)) < 0:
            return data
    import cloudpickle

    return cloudpickle.dumps(  # type: ignore[no-any-return]
        obj, protocol=5, buffer_callback=buffer_callback
    )


def loads(data: bytes, buffers: Any = ()) -> Any:
    """Unpickle ``data``; ``buffers``: its out-of-band buffers, in order."""
    return pickle.loads(data, buffers=buffers)


def dumps_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes]:
    """The payload parts of a call: the pickle of ``(args, kwargs)``, then, out of band,
    every top-level argument that is a ``bytes`` object of at least
    :data:`OUT_OF_BAND_MIN` bytes (the objects themselves: shared, not copied)."""
    big: dict[int, bytes] = {}
    seen_twice: set[int] = set()
    for v in (*args, *kwargs.values()):
        if type(v) is bytes and len(v) >= OUT_OF_BAND_MIN:
            if id(v) in big:
                # Out-of-band buffers are not memoized: an object passed twice stays in
                # the pickle, once.
                seen_twice.add(id(v))
            big[id(v)] = v
    for key in seen_twice:
        del big[key]
    if not big:
        return [dumps((args, kwargs))]
    wrapped = {key: pickle.PickleBuffer(v) for key, v in big.items()}
    originals = {id(buffer): big[key] for key, buffer in wrapped.items()}

    def wrap(v: Any) -> Any:
        return wrapped.get(id(v), v) if type(v) is bytes else v

    buffers: list[pickle.PickleBuffer] = []
    data = dumps(
        (tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}),
        buffer_callback=buffers.append,
    )
    return [data, *(originals[id(buffer)] for buffer in buffers)]


def dumps_value(value: Any) -> list[bytes]:
    """The parts of a reply's value: its pickle, and the value itself out of band when it
    is a ``bytes`` object of at least :data:`OUT_OF_BAND_MIN` bytes."""
    if type(value) is bytes and len(value) >= OUT_OF_BAND_MIN:
        return [dumps(pickle.PickleBuffer(value), buffer_callback=_out_of_band), value]
    return [dumps(value)]


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False


def format_exception(exc: BaseException) -> str:
    """``exc`` with its traceback, as the interpreter prints it."""
    import traceback

    out = io.StringIO()
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=out)
    return out.getvalue()
