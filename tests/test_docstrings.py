"""Every public name of the public modules has a docstring, and so does every public
member of their classes.

The modules are those of the API reference: ``monarch``, ``monarch.actor``,
``monarch.job``, ``monarch.rdma``, ``monarch.spmd`` and ``monarch.config``. For each name
of a module's ``__all__`` that is a module, class or function, and, for each class, every
member whose name does not start with ``_`` (functions, methods, properties, class and
static methods, endpoints) defined by a class of monarch's own code (inherited members of
``object``, ``Mapping``, ``Exception``, ``torch.Tensor``, ... are left out), the docstring
must not be empty. Constants have no docstring of their own and are skipped.

Classes of the compiled extension (``Extent``, ``Point``, ``Shape``, ``Slice``) are
documented by the stub ``monarch/_rust_bindings.pyi``, which the API reference reads:
their members are looked up there. A dataclass without a docstring gets one made from its
signature; that one does not count.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch
from monarch._src.actor.endpoint import EndpointProperty

#: The modules whose API reference pages list their ``__all__``.
PUBLIC_MODULES = [
    "monarch",
    "monarch.actor",
    "monarch.job",
    "monarch.rdma",
    "monarch.spmd",
    "monarch.config",
]

#: The stub of the compiled extension, the docstrings of its classes.
STUB = Path(monarch.__file__).resolve().parent / "_rust_bindings.pyi"
RUST_MODULE = "monarch._rust_bindings"

#: Fewer members than this means the walk lost its way (there are about 270).
MIN_CHECKED = 200


@functools.cache
def stub_docstrings() -> dict[str, bool]:
    """``"Class"`` / ``"Class.member"`` / ``"function"`` of the stub -> whether it has a
    docstring (for a member defined several times, as a property and its setter or as
    overloads, whether any definition has one)."""
    found: dict[str, bool] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = bool(ast.get_docstring(node))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    key = f"{node.name}.{item.name}"
                    found[key] = found.get(key, False) or bool(ast.get_docstring(item))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = bool(ast.get_docstring(node))
    return found


def _is_own(cls: type) -> bool:
    return (getattr(cls, "__module__", None) or "").partition(".")[0] == "monarch"


def _is_rust(cls: type) -> bool:
    return cls.__module__ == RUST_MODULE


def _has_text(doc: object) -> bool:
    return isinstance(doc, str) and bool(doc.strip())


def _class_has_doc(cls: type) -> bool:
    if _is_rust(cls):
        return stub_docstrings().get(cls.__qualname__, False)
    doc = cls.__dict__.get("__doc__")
    if (
        dataclasses.is_dataclass(cls)
        and isinstance(doc, str)
        and doc.startswith(cls.__name__ + "(")
    ):
        return False  # the signature dataclasses writes when there is no docstring
    return _has_text(doc)


def _is_member(raw: object) -> bool:
    """Whether a class attribute, as found in the class's ``__dict__``, is a member to
    document: a function, property, class or static method, endpoint, nested class, or
    a method or attribute of an extension class (not a constant, not a slot)."""
    if isinstance(raw, types.MemberDescriptorType):  # a __slots__ entry
        return False
    return (
        isinstance(raw, (EndpointProperty, staticmethod, classmethod, property))
        or isinstance(raw, functools.cached_property)
        or inspect.ismethoddescriptor(raw)
        or inspect.isdatadescriptor(raw)
        or callable(raw)
    )


def _member_doc(raw: object) -> object:
    """The docstring of a member (see :func:`_is_member`)."""
    if isinstance(raw, EndpointProperty):
        return raw._method.__doc__
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__.__doc__
    if isinstance(raw, property):
        return raw.fget.__doc__ if raw.fget is not None else None
    return getattr(raw, "__doc__", None)


def walk(modules: Iterable[types.ModuleType]) -> Iterator[tuple[str, bool]]:
    """``(qualified name, has a docstring)`` for every public object and member that
    ``modules`` export, each once."""
    seen: set[str] = set()

    def once(key: str) -> bool:
        if key in seen:
            return False
        seen.add(key)
        return True

    for module in modules:
        if once(module.__name__):
            yield module.__name__, _has_text(module.__doc__)
        for name in module.__all__:
            obj: Any = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                if once(obj.__name__):
                    yield obj.__name__, _has_text(obj.__doc__)
                continue
            if not (inspect.isclass(obj) or callable(obj)):
                continue  # a constant
            qualname = getattr(obj, "__qualname__", name)
            key = f"{getattr(obj, '__module__', module.__name__)}.{qualname}"
            if not inspect.isclass(obj):
                if once(key):
                    if getattr(obj, "__module__", None) == RUST_MODULE:
                        yield key, stub_docstrings().get(qualname, False)
                    else:
                        yield key, _has_text(getattr(obj, "__doc__", None))
                continue
            if once(key):
                yield key, _class_has_doc(obj)
            for cls in obj.__mro__:
                if not _is_own(cls):
                    continue
                for attr, raw in vars(cls).items():
                    if attr.startswith("_") or not _is_member(raw):
                        continue
                    member = f"{cls.__module__}.{cls.__qualname__}.{attr}"
                    if not once(member):
                        continue
                    if _is_rust(cls):
                        yield member, stub_docstrings().get(f"{cls.__qualname__}.{attr}", False)
                    else:
                        yield member, _has_text(_member_doc(raw))


@pytest.mark.timeout(120)
def test_every_public_member_has_a_docstring() -> None:
    modules = [importlib.import_module(name) for name in PUBLIC_MODULES]
    checked = dict(walk(modules))
    missing = sorted(name for name, has_doc in checked.items() if not has_doc)
    print(f"checked {len(checked)} public names and members; {len(missing)} without a docstring")
    assert len(checked) >= MIN_CHECKED, (
        f"only {len(checked)} public names and members were checked; the walk of "
        f"{PUBLIC_MODULES} lost its way"
    )
    assert not missing, f"{len(missing)} public names have no docstring:\n  " + "\n  ".join(missing)


class _Documented:
    """Has a docstring."""

    def method(self) -> None:
        """Has one too."""


class _Undocumented(_Documented, Exception):
    def bare(self) -> None:
        pass

    @property
    def prop(self) -> int:
        return 1

    @staticmethod
    def static() -> None:
        pass

    def _private(self) -> None:
        pass


@dataclasses.dataclass
class _Data:
    x: int


def _undocumented_function() -> None:
    pass


@pytest.mark.timeout(30)
def test_walk_finds_what_lacks_a_docstring() -> None:
    """The check can fail: a module of undocumented things is reported name by name,
    without ``_private`` or what ``Exception`` and ``object`` define."""
    module = types.ModuleType("monarch._fake_public")
    module.__doc__ = "A module."
    for cls in (_Documented, _Undocumented, _Data):
        cls.__module__ = module.__name__
    _undocumented_function.__module__ = module.__name__
    module.__dict__.update(
        Documented=_Documented,
        Undocumented=_Undocumented,
        Data=_Data,
        function=_undocumented_function,
        CONSTANT=3,
    )
    module.__all__ = ["Documented", "Undocumented", "Data", "function", "CONSTANT"]  # type: ignore[attr-defined]
    checked = dict(walk([module]))
    missing = sorted(
        name.removeprefix("monarch._fake_public.") for name, ok in checked.items() if not ok
    )
    assert missing == [
        "_Data",
        "_Undocumented",
        "_Undocumented.bare",
        "_Undocumented.prop",
        "_Undocumented.static",
        "_undocumented_function",
    ]
    assert checked["monarch._fake_public._Documented.method"] is True
    assert not any("args" in name or "with_traceback" in name for name in checked)
