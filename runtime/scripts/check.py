"""The static check: what would only fail later inside Monty, reported at load with file:line.

Monty (pydantic-monty 1.4.0) runs a subset of Python. Its parser rejects some constructs only when the
code is fed, and missing modules and builtins fail only when reached. This module walks the `ast` once
and reports each such use with a message that says what to write instead. The lists below were measured
against pydantic-monty 1.4.0 by importing each module and feeding each construct;
tests/scripts/test_scripts_loader.py holds the cases.

`runtime.scripts.diagnostics.probe(script)` additionally feeds the code to Monty's own parser without
running it (wrapped in `if False:`), to catch anything this list misses; `sa check` uses it.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["MODULES", "check_subset"]

# Modules a script can import (each imported in the 1.4.0 sandbox).
MODULES = frozenset(
    "json re datetime dataclasses math collections itertools functools typing random base64 hashlib decimal "
    "csv tomllib pathlib os sys asyncio time copy bisect binascii unicodedata".split()
)
SUBMODULES = frozenset({"os.path"})

# Names a module lacks in Monty although CPython has them, with what to use instead.
MISSING_NAMES: dict[str, dict[str, str]] = {
    "typing": {
        "TypedDict": "annotate with dict[str, ...] instead",
        "cast": "drop the cast; Monty does not need it",
        "NamedTuple": "use a @dataclass or a tuple",
        "Awaitable": "annotate the awaited value's type instead",
        "overload": "write one function that accepts the union of the argument types",
    },
    "dataclasses": {
        "asdict": "build the dict by hand: {'x': p.x, ...}",
        "astuple": "build the tuple by hand",
        "fields": "list the field names yourself",
        "replace": "construct a new instance with the changed fields",
    },
    "collections": {"OrderedDict": "use a plain dict (dicts keep insertion order)", "abc": "drop the import"},
    "asyncio": {
        "create_task": "await the coroutine directly, or use asyncio.gather(...) to run several",
        "wait_for": "await the coroutine directly; the tool's Limits bound its duration",
    },
    "sys": {"exit": "return a value from the script (its last expression) or raise an exception"},
}

# Builtins Monty does not define.
MISSING_BUILTINS = {
    "ascii": "use repr(...)",
    "breakpoint": "remove it",
    "bytearray": "use bytes or a list of ints",
    "callable": "check with isinstance or try/except TypeError",
    "classmethod": "use a module-level function",
    "compile": "use eval/exec on the source string",
    "delattr": "keep a dict of values instead of deleting attributes",
    "dir": "keep an explicit list of names",
    "exit": "return a value (the last expression) or raise an exception",
    "quit": "return a value (the last expression) or raise an exception",
    "globals": "pass values explicitly",
    "vars": "pass values explicitly",
    "help": "remove it",
    "input": 'declare an Input(...) instead: x: str = Input("x")',
    "issubclass": "use isinstance on an instance",
    "memoryview": "use bytes",
    "staticmethod": "use a module-level function",
    "super": "Monty has no class inheritance; use composition",
    "__import__": "use an import statement",
}

_METHOD_DECORATORS = {"property", "staticmethod", "classmethod", "abstractmethod", "cached_property"}


def _module_error(module: str) -> str:
    return (
        f"module '{module}' cannot be imported in the Monty sandbox; the available modules are "
        f"{', '.join(sorted(MODULES))} (and os.path)"
    )


class _SubsetChecker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[tuple[int, int | None, str]] = []
        self.module_aliases: dict[str, str] = {}  # local name -> module
        self.defined: set[str] = set()

    def report(self, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", None) or 0
        col = getattr(node, "col_offset", None)
        self.problems.append((line, None if col is None else col + 1, message))

    # ---- imports --------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            name = alias.name
            if name == "grail":
                self.report(
                    node,
                    "write `from grail import external, Input` (not `import grail`); "
                    "the loader understands only that form",
                )
            elif name not in MODULES and name not in SUBMODULES:
                self.report(node, _module_error(name))
            else:
                self.module_aliases[alias.asname or name.split(".")[0]] = name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.report(node, "relative imports are not available in a script; a .pym is a single file")
            return
        if module == "grail":
            return  # handled by the loader (declarations)
        if module not in MODULES and module not in SUBMODULES:
            self.report(node, _module_error(module))
            return
        missing = MISSING_NAMES.get(module, {})
        for alias in node.names:
            if alias.name in missing:
                self.report(node, f"'{module}.{alias.name}' does not exist in Monty: {missing[alias.name]}")
            elif alias.name == "*":
                self.report(node, f"`from {module} import *` is not supported; import the names you use")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.module_aliases:
            module = self.module_aliases[node.value.id]
            hint = MISSING_NAMES.get(module, {}).get(node.attr)
            if hint:
                self.report(node, f"'{module}.{node.attr}' does not exist in Monty: {hint}")
        self.generic_visit(node)

    # ---- unsupported syntax ---------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.bases or node.keywords:
            self.report(
                node,
                f"class '{node.name}' has a base class or metaclass: Monty does not support class "
                "inheritance (so no custom exception classes, Enum, TypedDict or BaseModel); "
                "use a plain class or a @dataclass, and built-in exceptions such as ValueError",
            )
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in item.decorator_list:
                    name = (
                        dec.id
                        if isinstance(dec, ast.Name)
                        else dec.attr
                        if isinstance(dec, ast.Attribute)
                        else None
                    )
                    if name in _METHOD_DECORATORS:
                        self.report(
                            dec,
                            f"@{name} on method '{item.name}' is not supported by Monty: "
                            "use a plain method or a module-level function",
                        )
        self.generic_visit(node)

    def _yield(self, node: ast.AST) -> None:
        self.report(node, "generators (yield) are not supported by Monty: build and return a list instead")

    def visit_Yield(self, node: ast.Yield) -> None:
        self._yield(node)
        self.generic_visit(node)

    def visit_YieldFrom(self, node: ast.YieldFrom) -> None:
        self._yield(node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self.report(
            node,
            "the `del` statement is not supported by Monty: use d.pop(key) / lst.pop(i), or rebind the name",
        )
        self.generic_visit(node)

    def visit_TryStar(self, node: Any) -> None:
        self.report(node, "exception groups (try/except*) are not supported by Monty: use try/except")
        self.generic_visit(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self.report(
            node, "`async with` is not supported by Monty: call the async functions directly with await"
        )
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self.report(
            node,
            "`async for` is not supported by Monty: await a function that returns a list, "
            "then use a plain for loop",
        )
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.generic_visit(node)

    # ---- names ----------------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in MISSING_BUILTINS and node.id not in self.defined:
            self.report(node, f"builtin '{node.id}' does not exist in Monty: {MISSING_BUILTINS[node.id]}")


def _defined_names(tree: ast.AST) -> set[str]:
    """Names the script binds anywhere (so a user's own `input = ...` is not flagged as the builtin)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


def check_subset(tree: ast.Module, *, skip: set[int] | None = None) -> list[tuple[int, int | None, str]]:
    """(line, column, message) for each use of something Monty cannot run. `skip`: top-level statement
    indexes the loader already handled (declarations that are blanked before Monty sees them)."""
    checker = _SubsetChecker()
    checker.defined = _defined_names(tree)
    for i, stmt in enumerate(tree.body):
        if skip and i in skip:
            continue
        checker.visit(stmt)
    checker.problems.sort(key=lambda p: (p[0], p[1] or 0))
    return checker.problems
