"""``monarch.function_resolvers``: how ``monarch.remote`` names a function for the workers.

A remote function reaches the tensor workers in one of two ways: **by name**, a path
each worker imports (``"package.module.function"``, or ``"package.module:Class.method"``
where the qualified name has dots), or **by value**, pickled (closures, lambdas and
functions of ``__main__`` go this way). ``remote(fn)`` asks the resolvers of
:data:`function_resolvers`, in order, for ``fn``'s name; the first that answers a path
wins; when none does, ``fn`` goes by value. ``remote("module.function")`` is a name
already and asks no resolver.

A resolver is a function of the function: it returns the path the workers import it by,
or ``None`` to leave it to the next resolver (an object with a ``path`` string, as
upstream Monarch's ``ResolvableFunctionFromPath``, is read as its path). The list holds
:func:`import_path` at first (a function whose module and qualified name lead back to it
goes by name). Put a resolver first to name functions the workers import from elsewhere
(a package installed on the hosts under another name, a module the client cannot
import); remove every resolver to send every function by value. The resolvers are asked
when ``remote(fn)`` is made, so change the list before making the remote functions.

Importing this module is cheap: it imports neither torch nor the rest of the engine.
"""

from __future__ import annotations

import keyword
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Resolver", "function_resolvers", "import_path", "spec_of"]

#: A resolver: the path the workers import a function by, or ``None``.
Resolver = Callable[[Callable[..., Any]], Any]


def import_path(fn: Callable[..., Any]) -> str | None:
    """``"module:qualified.name"`` of a function whose module (imported, not
    ``__main__``) and qualified name lead back to it, so the workers can import it by that
    name; ``None`` for the others (closures, lambdas, functions of ``__main__``). For
    torch's builtins, whose qualified name does not lead back, the plain name is tried.

    Args:
        fn: The function ``remote`` was given.

    Returns:
        The path, or ``None``.
    """
    module = getattr(fn, "__module__", None)
    if not module or module == "__main__" or module not in sys.modules:
        return None
    for name in (getattr(fn, "__qualname__", ""), getattr(fn, "__name__", "")):
        if not isinstance(name, str) or not name or "<" in name:
            continue
        obj: Any = sys.modules[module]
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is fn:
            return f"{module}:{name}"
    return None


#: The resolvers ``monarch.remote`` asks, in order, for the name the workers import a
#: function by (see the module's documentation). Edit it in place.
function_resolvers: list[Resolver] = [import_path]


def _valid_dotted(name: str) -> bool:
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def path_spec(path: str, what: str) -> tuple[Any, ...]:
    """The wire spec of a function by name: ``("path", "module.function")`` or
    ``("path", module, qualname)`` for ``"module:qualname"``.

    Raises:
        ValueError: ``path`` is not ``module.function`` or ``module:qualified.name``.
    """
    module, colon, qualname = path.partition(":")
    if colon:
        ok = _valid_dotted(module) and _valid_dotted(qualname)
    else:
        module, _, qualname = path.rpartition(".")
        ok = bool(module) and _valid_dotted(path)
    if not ok:
        raise ValueError(
            f"{what}: {path!r} is not a function's path; expected 'module.function' or "
            "'module:qualified.name' (importable on the workers)"
        )
    return ("path", module, qualname) if colon else ("path", path)


def spec_of(fn: Callable[..., Any] | str) -> tuple[Any, ...]:
    """How ``remote(fn)`` sends ``fn`` to the workers: by the path a string gives or the
    first resolver answers, else by value.

    Raises:
        ValueError: a string (or a resolver's answer) is not a function's path.
        TypeError: a resolver answered something else than a path or ``None``.
    """
    if isinstance(fn, str):
        return path_spec(fn, f"remote({fn!r})")
    for resolver in list(function_resolvers):
        answer = resolver(fn)
        if answer is None:
            continue
        path = answer if isinstance(answer, str) else getattr(answer, "path", None)
        if not isinstance(path, str):
            raise TypeError(
                f"monarch.function_resolvers: the resolver {resolver!r} answered {answer!r} "
                f"for {fn!r}; a resolver returns the path the workers import the function by "
                "('module.function' or 'module:qualified.name') or None"
            )
        return path_spec(path, f"the function resolver {resolver!r} (for {fn!r})")
    from monarch._src.actor.pickling import dumps

    return ("pickle", dumps(fn))
