"""pytest helpers that run a test under several configs.

``pytest`` is imported when a helper is called, never when this module is imported, so
``import monarch.config`` stays free of it.
"""

from __future__ import annotations

import enum
import functools
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from monarch._src.config import _checked, configured

F = TypeVar("F", bound=Callable[..., Any])

_counter = itertools.count()


def _values(name: str, values: Iterable[Any]) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            f"{name}: expected a collection of values to test, got {type(values).__name__} "
            f"{values!r}; wrap a single value in a list: {name}=[{values!r}]"
        )
    if isinstance(values, (set, frozenset)):
        listed = sorted(values, key=repr)  # a stable order, hence stable test ids
    else:
        listed = list(values)
    if not listed:
        raise ValueError(f"{name}: expected at least one value to test, got none")
    for value in listed:
        _checked({name: value})  # unknown keys and bad values fail at collection
    return listed


def _id(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


def _parametrize(combos: list[dict[str, Any]]) -> Callable[[F], F]:
    import pytest

    argname = f"_monarch_config_{next(_counter)}"
    ids = ["-".join(f"{k}={_id(v)}" for k, v in combo.items()) for combo in combos]

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        at = len(params)
        if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD:
            at -= 1
        params.insert(at, inspect.Parameter(argname, inspect.Parameter.KEYWORD_ONLY))

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with configured(**kwargs.pop(argname)):
                return await fn(*args, **kwargs)

        def run(*args: Any, **kwargs: Any) -> Any:
            with configured(**kwargs.pop(argname)):
                return fn(*args, **kwargs)

        wrapper: Callable[..., Any] = run_async if inspect.iscoroutinefunction(fn) else run
        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return pytest.mark.parametrize(argname, combos, ids=ids)(wrapper)  # type: ignore[no-any-return]

    return decorate


def parametrize_config(**values: Iterable[Any]) -> Callable[[F], F]:
    """Run the decorated test once per combination of the given values (their
    cartesian product), each time inside ``configured(**combination)``.

    ``parametrize_config(cast_fanout=[2, 16], default_encoding={Encoding.Json,
    Encoding.Multipart})`` runs the test four times, with ids such as
    ``cast_fanout=2-default_encoding=Json``. Sets are tested in a stable order. Keys and
    values are checked when the decorator is applied. Decorators stack (the product of
    both); async tests are supported.

    Raises:
        ValueError: no keys, an unknown key, or an empty collection of values.
        TypeError: a value the key rejects, or a single value instead of a collection.
    """
    if not values:
        raise ValueError("parametrize_config needs at least one key, e.g. cast_fanout=[2, 16]")
    names = list(values)
    lists = [_values(name, values[name]) for name in names]
    combos = itertools.product(*lists)
    return _parametrize([dict(zip(names, combo, strict=True)) for combo in combos])


def parametrize_config_pointwise(**values: Iterable[Any]) -> Callable[[F], F]:
    """Like :func:`parametrize_config`, but the i-th run takes the i-th value of every
    key (``zip``, not the product): ``parametrize_config_pointwise(a=[1, 2], b=[x, y])``
    runs with ``a=1, b=x`` and ``a=2, b=y``.

    Raises:
        ValueError: as :func:`parametrize_config`, or the collections differ in length.
    """
    if not values:
        raise ValueError(
            "parametrize_config_pointwise needs at least one key, e.g. cast_fanout=[2, 16]"
        )
    names = list(values)
    lists = [_values(name, values[name]) for name in names]
    lengths = {name: len(listed) for name, listed in zip(names, lists, strict=True)}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"parametrize_config_pointwise needs as many values for every key, got {lengths}"
        )
    combos = zip(*lists, strict=True)
    return _parametrize([dict(zip(names, combo, strict=True)) for combo in combos])
