"""`ExternalsFactory`: where a worker gets the host functions (`@external`) of the scripts it runs.

    class Shop:                  # `sa worker --externals shop:Shop`, or `externals: shop:Shop` in a bundle
        def build(self, tool_name: str, context: ExecutionContext) -> dict[str, Callable[..., Any]]:
            return {"charge": lambda amount: crm.charge(amount, key=...)}

A factory is anything with that `build` method, or a plain function `(tool_name, context) -> dict`; its
implementations may be sync or async. `load_factory("package.module:attr")` imports one (a class is
instantiated without arguments) and fails at load time, with what to fix, when the path does not import
or names something that cannot build externals: a worker must not start with a factory it cannot use.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from runtime.externals.context import ExecutionContext

__all__ = ["ExternalsError", "ExternalsFactory", "FunctionFactory", "import_object", "load_factory"]


class ExternalsError(ValueError):
    """A factory or a Python tool reference that cannot be used (the message says what to fix)."""


@runtime_checkable
class ExternalsFactory(Protocol):
    """Builds the host functions one tool call may use, knowing which call it is."""

    def build(self, tool_name: str, context: ExecutionContext) -> Mapping[str, Callable[..., Any]]: ...


class FunctionFactory:
    """A plain function `(tool_name, context) -> dict` used as a factory."""

    def __init__(self, func: Callable[[str, ExecutionContext], Mapping[str, Callable[..., Any]]]) -> None:
        self.func = func

    def build(self, tool_name: str, context: ExecutionContext) -> Mapping[str, Callable[..., Any]]:
        return self.func(tool_name, context)

    def __repr__(self) -> str:
        return f"FunctionFactory({getattr(self.func, '__qualname__', self.func)!r})"


@contextmanager
def _importable(root: Path | None) -> Iterator[None]:
    """Let a reference name a module beside the bundle file (the bundle's folder on sys.path meanwhile)."""
    added = root is not None and str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        yield
    finally:
        if added:
            sys.path.remove(str(root))


def import_object(ref: str, *, root: Path | None = None, what: str = "object") -> Any:
    """The object `package.module:attr` names (modules beside `root` included), or `ExternalsError`."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ExternalsError(f"{ref!r} is not a {what} reference: write it as package.module:name")
    try:
        with _importable(root):
            module = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure is the user's module: say which and why
        raise ExternalsError(f"cannot import module {module_name!r} for {what} {ref!r}: "
                             f"{type(e).__name__}: {e}; check the module is on PYTHONPATH "
                             "(or beside the bundle file)") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ExternalsError(f"module {module_name!r} has no {part!r} (from {what} {ref!r})")
        obj = getattr(obj, part)
    return obj


def load_factory(ref: str, *, root: Path | None = None) -> ExternalsFactory:
    """The factory `package.module:attr` names: an object with `build`, a class (instantiated with no
    arguments) or a function `(tool_name, context)`; `ExternalsError` for anything else."""
    obj = import_object(ref, root=root, what="externals factory")
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as e:
            raise ExternalsError(f"externals factory {ref!r}: {obj.__name__}() failed: "
                                 f"{type(e).__name__}: {e}") from None
    if isinstance(obj, ExternalsFactory):
        return obj
    if callable(obj):
        try:
            inspect.signature(obj).bind("tool", None)
        except (TypeError, ValueError):
            raise ExternalsError(f"externals factory {ref!r} is a function that does not take "
                                 "(tool_name, context)") from None
        return FunctionFactory(obj)
    raise ExternalsError(f"{ref!r} is not an externals factory: give an object or class with "
                         "build(tool_name, context) -> dict, or a function (tool_name, context) -> dict")
