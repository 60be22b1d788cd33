"""Load a grail-style `.pym` script: parse it, read its declarations, check it, and make the code Monty runs.

A `.pym` is Python that declares what it needs at the top:

    from grail import external, Input

    path: str = Input("path")
    max_words: int = Input("max_words", default=50)

    @external
    async def summarize(text: str, words: int) -> str:
        \"\"\"Ask the model for a summary.\"\"\"
        ...

    text = open(path).read()
    {"summary": await summarize(text, max_words)}       # the last expression is the result

Monty cannot import grail, so the loader blanks the declarations (the grail import, each `Input(...)`
statement, each `@external` def) line for line: the code Monty sees has the same line numbers as the file,
and every error points at the user's line. Monty binds inputs as globals and resolves externals by name when
the script first reads them, so nothing else has to change. Problems never raise: they are
`Script.diagnostics`, and `Script.run` returns them as errors.

This module finds the declarations and blanks their lines; `declarations` reads each one, `check` finds
what Monty cannot run, and the result is a `Script` (`script`: the data of `loaded`, plus `run`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Literal, TypeVar

from runtime.scripts.check import check_subset
from runtime.scripts.declarations import (
    docstring_params,
    is_grail_name,
    is_input_call,
    read_external,
    read_input,
)
from runtime.scripts.script import Script
from runtime.scripts.specs import Diagnostic, ExternalSpec, InputSpec

_Declared = TypeVar("_Declared", InputSpec, ExternalSpec)

__all__ = ["load", "loads"]

_GRAIL_NAMES = {"external", "Input"}


def load(path: str | Path) -> Script:
    """Load a `.pym` file. I/O errors (missing file) raise `OSError`; script problems become diagnostics."""
    p = Path(path)
    source = p.read_text(encoding="utf-8")
    return loads(source, name=p.stem, path=str(path))


def loads(source: str, name: str | None = None, path: str | None = None) -> Script:
    """Load a script from source text. `name` defaults to the path's stem, else "script"."""
    name = name or (Path(path).stem if path else "script")
    return _Loader(source, name, path).load()


class _Loader:
    def __init__(self, source: str, name: str, path: str | None) -> None:
        self.source = source
        self.name = name
        self.path = path
        self.file = path or f"{name}.pym"
        self.diagnostics: list[Diagnostic] = []
        self.blank: set[int] = set()  # 1-based line numbers replaced by empty lines

    def report(
        self, kind: Literal["parse", "check"], message: str, line: int | None, column: int | None = None
    ) -> None:
        self.diagnostics.append(Diagnostic(kind, message, line, self.file, column))

    def check(self, message: str, line: int | None, column: int | None = None) -> None:
        """A `check` diagnostic (what `declarations` reports through)."""
        self.report("check", message, line, column)

    def load(self) -> Script:
        script = Script(name=self.name, source=self.source, path=self.path)
        tree = self._parse()
        if tree is not None:
            script.docstring = ast.get_docstring(tree)
            handled = self._read_declarations(tree, script)
            self._check_hidden_externals(tree, handled, script)
            for name in set(script.inputs) & set(script.externals):
                self.report(
                    "check",
                    f"{name!r} is declared both as an Input and as an @external; rename one",
                    script.inputs[name].line,
                )
            self._check_nested_declarations(tree, handled)
            for line, column, message in check_subset(tree, skip=handled):
                self.report("check", message, line, column)
            self.diagnostics.sort(key=lambda d: (d.line or 0, d.column or 0))
            script.code = self._code()
        script.diagnostics = self.diagnostics
        return script

    # ---- the steps of `load` ----------------------------------------------------------------------

    def _parse(self) -> ast.Module | None:
        """The syntax tree, or None after a `parse` diagnostic (the script then has no code to run)."""
        try:
            return ast.parse(self.source, filename=self.file)
        except SyntaxError as e:
            text = (e.text or "").strip()
            where = f": `{text}`" if text else ""
            msg = e.msg if "syntax" in e.msg.lower() else f"syntax error: {e.msg}"
            self.report("parse", f"{msg}{where}", e.lineno, e.offset)
        except ValueError as e:  # e.g. "source code string cannot contain null bytes"
            self.report("parse", f"the file cannot be parsed: {e}", None)
        return None

    def _read_declarations(self, tree: ast.Module, script: Script) -> set[int]:
        """Read the top-level grail import, `Input`s and `@external`s into `script` and blank their lines;
        the indexes (in `tree.body`) of the statements that were declarations."""
        arg_docs = docstring_params(script.docstring)
        handled: set[int] = set()
        line_owner = self._line_owners(tree)
        for index, stmt in enumerate(tree.body):
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "grail" and not stmt.level:
                self._check_grail_import(stmt)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                is_grail_name(d, "external") for d in stmt.decorator_list
            ):
                ext = read_external(stmt, self.check)
                self._declare(script.externals, ext.name, ext, "external")
            elif isinstance(stmt, (ast.AnnAssign, ast.Assign)) and is_input_call(stmt.value):
                spec = read_input(stmt, arg_docs, self.check)
                if spec is not None:
                    self._declare(script.inputs, spec.name, spec, "input")
            else:
                continue
            handled.add(index)
            self._blank(stmt, line_owner)
        return handled

    def _check_grail_import(self, stmt: ast.ImportFrom) -> None:
        """`from grail import ...` may name only `external` and `Input`, each under its own name."""
        for alias in stmt.names:
            if alias.name not in _GRAIL_NAMES:
                self.report(
                    "check",
                    f"grail has no {alias.name!r} here; a script may import only "
                    "`external` and `Input` from grail",
                    stmt.lineno,
                )
            elif alias.asname and alias.asname != alias.name:
                self.report(
                    "check",
                    f"import {alias.name} under its own name (not as "
                    f"{alias.asname!r}); the loader looks for `{alias.name}`",
                    stmt.lineno,
                )

    def _check_hidden_externals(self, tree: ast.Module, handled: set[int], script: Script) -> None:
        """A top-level def or class with an @external's name would hide the host function."""
        for index, stmt in enumerate(tree.body):
            if index not in handled and isinstance(
                stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ) and stmt.name in script.externals:
                self.report(
                    "check",
                    f"{stmt.name!r} is declared @external (line {script.externals[stmt.name].line}) and "
                    "also defined in the script; the definition would hide the host function; rename one",
                    stmt.lineno,
                )

    def _check_nested_declarations(self, tree: ast.Module, handled: set[int]) -> None:
        """Declarations anywhere but the top level would silently never bind: report them."""
        for index, stmt in enumerate(tree.body):
            if index in handled:
                continue
            for node in ast.walk(stmt):
                if is_input_call(node):
                    self.report(
                        "check",
                        "Input(...) must be a top-level declaration on its own line: "
                        '`name: type = Input("name")`',
                        node.lineno,
                        node.col_offset + 1,
                    )
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    is_grail_name(d, "external") for d in node.decorator_list
                ):
                    self.report(
                        "check",
                        f"@external function {node.name!r} must be declared at the top level of the script",
                        node.lineno,
                    )

    def _code(self) -> str:
        """The source with the declaration lines blanked: the same line numbers, so Monty's are the file's."""
        lines = self.source.splitlines(keepends=True)
        return "".join(
            ("\n" if line.endswith(("\n", "\r")) else "") if i + 1 in self.blank else line
            for i, line in enumerate(lines)
        )

    # ---- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _line_owners(tree: ast.Module) -> dict[int, list[int]]:
        """line -> indexes of top-level statements touching it (to detect shared lines)."""
        owners: dict[int, list[int]] = {}
        for index, stmt in enumerate(tree.body):
            start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
            for line in range(start, (stmt.end_lineno or stmt.lineno) + 1):
                owners.setdefault(line, []).append(index)
        return owners

    def _declare(self, table: dict[str, _Declared], name: str, spec: _Declared, what: str) -> None:
        """Record a declaration; a second one of the same name is a `check` problem (the later one wins)."""
        if name in table:
            self.report("check", f"{what} {name!r} is declared twice (first at line {table[name].line})",
                        spec.line)
        table[name] = spec

    def _blank(self, stmt: ast.stmt, owners: dict[int, list[int]]) -> None:
        start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        end = stmt.end_lineno or stmt.lineno
        for line in range(start, end + 1):
            if len(owners.get(line, [])) > 1:
                self.report(
                    "check",
                    "a declaration shares its line with another statement; put each "
                    "declaration on its own line (the loader removes declaration lines)",
                    line,
                )
                return
        self.blank.update(range(start, end + 1))
