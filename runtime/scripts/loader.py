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
and every error points at the user's line. Inputs are then bound as globals and externals resolved by name
(monty.md §6). Problems never raise: they are `Script.diagnostics`, and `Script.run` returns them as errors.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.scripts.check import check_subset
from runtime.scripts.schema import AnnotationError, is_optional, schema_from_annotation
from runtime.scripts.specs import MISSING, Diagnostic, ExternalSpec, InputSpec, ParamSpec, parameters_schema
from runtime.scripts.validate import validate

if TYPE_CHECKING:
    from runtime.scripts.limits import Limits
    from runtime.scripts.run import EventCallback
    from runtime.types import ToolResult

__all__ = ["Script", "load", "loads"]

_GRAIL_NAMES = {"external", "Input"}
_INPUT_KEYWORDS = {"default", "description"}


@dataclass(eq=False)
class Script:
    """A loaded `.pym`: its declarations, its diagnostics, and the line-preserving code Monty runs."""

    name: str
    source: str
    path: str | None = None
    docstring: str | None = None
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    externals: dict[str, ExternalSpec] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    code: str = ""

    @property
    def filename(self) -> str:
        """The name errors are reported under: the path as given, or `<name>.pym`."""
        return self.path or f"{self.name}.pym"

    @property
    def parsed(self) -> bool:
        """False when the source does not parse (then inputs, externals and docstring are unknown)."""
        return not any(d.kind == "parse" for d in self.diagnostics)

    @property
    def ok(self) -> bool:
        """True when the script loaded without diagnostics and can run."""
        return not self.diagnostics

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the source (first 16 hex chars): identifies this version of the script."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    @property
    def description(self) -> str:
        """The docstring's first paragraph on one line ("" without a docstring)."""
        return first_paragraph(self.docstring)

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """JSON Schema of the inputs (an object with `additionalProperties: false`)."""
        return parameters_schema(self.inputs.values())

    def error(self) -> ToolResult | None:
        """The load problems as a failed `ToolResult` (kind of the first), or None when the script is ok."""
        if not self.diagnostics:
            return None
        from runtime.types import ToolResult

        first = self.diagnostics[0]
        if len(self.diagnostics) == 1:
            message = first.message
        else:
            message = f"{len(self.diagnostics)} problems in {self.filename}:\n" + "\n".join(
                f"- line {d.line}: {d.message}" if d.line else f"- {d.message}" for d in self.diagnostics
            )
        return ToolResult.failure(first.kind, message, line=first.line)

    def stubs(self) -> str:
        """Type stubs for the declarations (`name: T` and `def f(...) -> R: ...`), e.g. for a type checker."""
        lines = [f"{spec.name}: {spec.annotation}" for spec in self.inputs.values()]
        lines += [f"{ext.signature()}: ..." for ext in self.externals.values()]
        return "\n".join(lines) + ("\n" if lines else "")

    async def run(
        self,
        inputs: dict[str, Any] | None = None,
        *,
        externals: dict[str, Any] | None = None,
        files: dict[str, str | bytes] | None = None,
        environ: dict[str, str] | None = None,
        limits: Limits | str | dict[str, Any] | None = None,
        output_model: Any = None,
        on_event: EventCallback | None = None,
    ) -> ToolResult:
        """Run in the sandbox; returns a `ToolResult` with the output or a `ToolError` (never raises for
        script problems). See `runtime.scripts.run.run_script`."""
        from runtime.scripts.run import run_script

        return await run_script(
            self,
            inputs,
            externals=externals,
            files=files,
            environ=environ,
            limits=limits,
            output_model=output_model,
            on_event=on_event,
        )

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"{len(self.diagnostics)} diagnostics"
        return (
            f"Script({self.name!r}, inputs={list(self.inputs)}, externals={list(self.externals)}, {status})"
        )


def load(path: str | Path) -> Script:
    """Load a `.pym` file. I/O errors (missing file) raise `OSError`; script problems become diagnostics."""
    p = Path(path)
    source = p.read_text(encoding="utf-8")
    return loads(source, name=p.stem, path=str(path))


def loads(source: str, name: str | None = None, path: str | None = None) -> Script:
    """Load a script from source text. `name` defaults to the path's stem, else "script"."""
    name = name or (Path(path).stem if path else "script")
    return _Loader(source, name, path).load()


def first_paragraph(docstring: str | None) -> str:
    if not docstring:
        return ""
    paragraph = re.split(r"\n\s*\n", docstring.strip(), maxsplit=1)[0]
    return " ".join(paragraph.split())


_SECTION = re.compile(r"^(Args|Arguments|Inputs|Parameters|Params)\s*:\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def docstring_params(docstring: str | None) -> dict[str, str]:
    """Descriptions from a Google-style `Args:` (or `Inputs:`) section: `name (type): text`."""
    out: dict[str, str] = {}
    if not docstring:
        return out
    lines = docstring.splitlines()
    in_section = False
    base_indent = None
    current: str | None = None
    for line in lines:
        if _SECTION.match(line.strip()) and not line.startswith((" ", "\t")):
            in_section, base_indent, current = True, None, None
            continue
        if not in_section:
            continue
        if not line.strip():
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_section = False
            continue
        if base_indent is None:
            base_indent = indent
        if indent == base_indent and (m := _ARG_LINE.match(line.strip())):
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current is not None and indent > base_indent:
            out[current] = (out[current] + " " + line.strip()).strip()
    return out


def _is_name(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "grail"
    )


def _is_input_call(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) and _is_name(node.func, "Input")


def _param(arg: ast.arg, kind: Any, default: ast.expr | None = None) -> ParamSpec:
    """One `@external` parameter as declared: its annotation and default as source text."""
    return ParamSpec(
        arg.arg,
        ast.unparse(arg.annotation) if arg.annotation else None,
        kind,
        ast.unparse(default) if default is not None else None,
        default is not None,
    )


class _Loader:
    def __init__(self, source: str, name: str, path: str | None) -> None:
        self.source = source
        self.name = name
        self.path = path
        self.file = path or f"{name}.pym"
        self.diagnostics: list[Diagnostic] = []
        self.blank: set[int] = set()  # 1-based line numbers replaced by empty lines

    def report(self, kind: str, message: str, line: int | None, column: int | None = None) -> None:
        self.diagnostics.append(Diagnostic(kind, message, line, self.file, column))  # type: ignore[arg-type]

    def load(self) -> Script:
        script = Script(name=self.name, source=self.source, path=self.path)
        try:
            tree = ast.parse(self.source, filename=self.file)
        except SyntaxError as e:
            text = (e.text or "").strip()
            where = f": `{text}`" if text else ""
            msg = e.msg if "syntax" in e.msg.lower() else f"syntax error: {e.msg}"
            self.report("parse", f"{msg}{where}", e.lineno, e.offset)
            script.diagnostics = self.diagnostics
            return script
        except ValueError as e:  # e.g. "source code string cannot contain null bytes"
            self.report("parse", f"the file cannot be parsed: {e}", None)
            script.diagnostics = self.diagnostics
            return script

        script.docstring = ast.get_docstring(tree)
        arg_docs = docstring_params(script.docstring)
        handled: set[int] = set()
        line_owner = self._line_owners(tree)

        for index, stmt in enumerate(tree.body):
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "grail" and not stmt.level:
                handled.add(index)
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
                self._blank(stmt, line_owner)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _is_name(d, "external") for d in stmt.decorator_list
            ):
                handled.add(index)
                spec = self._external(stmt)
                if spec.name in script.externals:
                    self.report(
                        "check",
                        f"external {spec.name!r} is declared twice (first at line "
                        f"{script.externals[spec.name].line})",
                        spec.line,
                    )
                script.externals[spec.name] = spec
                self._blank(stmt, line_owner)
            elif isinstance(stmt, (ast.AnnAssign, ast.Assign)) and _is_input_call(stmt.value):
                handled.add(index)
                spec = self._input(stmt, arg_docs)
                if spec is not None:
                    if spec.name in script.inputs:
                        self.report(
                            "check",
                            f"input {spec.name!r} is declared twice (first at line "
                            f"{script.inputs[spec.name].line})",
                            spec.line,
                        )
                    script.inputs[spec.name] = spec
                self._blank(stmt, line_owner)

        for index, stmt in enumerate(tree.body):
            if index not in handled and isinstance(
                stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                if stmt.name in script.externals:
                    self.report(
                        "check",
                        f"{stmt.name!r} is declared @external (line {script.externals[stmt.name].line}) and "
                        "also defined in the script; the definition would hide the host function; rename one",
                        stmt.lineno,
                    )

        for name in set(script.inputs) & set(script.externals):
            self.report(
                "check",
                f"{name!r} is declared both as an Input and as an @external; rename one",
                script.inputs[name].line,
            )

        # Declarations anywhere else would silently never bind: report them.
        for index, stmt in enumerate(tree.body):
            if index in handled:
                continue
            for node in ast.walk(stmt):
                if _is_input_call(node):  # type: ignore[arg-type]
                    self.report(
                        "check",
                        "Input(...) must be a top-level declaration on its own line: "
                        '`name: type = Input("name")`',
                        node.lineno,
                        node.col_offset + 1,
                    )
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    _is_name(d, "external") for d in node.decorator_list
                ):
                    self.report(
                        "check",
                        f"@external function {node.name!r} must be declared at the top level of the script",
                        node.lineno,
                    )

        for line, column, message in check_subset(tree, skip=handled):
            self.report("check", message, line, column)

        self.diagnostics.sort(key=lambda d: (d.line or 0, d.column or 0))
        script.diagnostics = self.diagnostics
        lines = self.source.splitlines(keepends=True)
        script.code = "".join(
            ("\n" if line.endswith(("\n", "\r")) else "") if i + 1 in self.blank else line
            for i, line in enumerate(lines)
        )
        return script

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

    def _input(self, stmt: ast.AnnAssign | ast.Assign, arg_docs: dict[str, str]) -> InputSpec | None:
        call = stmt.value
        assert isinstance(call, ast.Call)
        line = stmt.lineno
        if isinstance(stmt, ast.Assign):
            target = stmt.targets[0] if len(stmt.targets) == 1 else None
            var = target.id if isinstance(target, ast.Name) else "<name>"
            self.report(
                "check",
                f'input {var!r} has no type annotation; write `{var}: str = Input("{var}")` '
                "(the annotation becomes the tool's parameter type)",
                line,
            )
            return None
        if not isinstance(stmt.target, ast.Name):
            self.report("check", "an Input(...) must be assigned to a plain name", line)
            return None
        var = stmt.target.id

        key: str | None = var
        if call.args:
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                key = first.value
            else:
                self.report(
                    "check",
                    f"Input's first argument must be the input's name as a string literal: Input(\"{var}\")",
                    line,
                )
                key = None
            if len(call.args) > 1:
                self.report(
                    "check",
                    f'pass the default by keyword: Input("{var}", default={ast.unparse(call.args[1])})',
                    line,
                )
        if key is not None and key != var:
            self.report(
                "check",
                f"Input name {key!r} differs from its variable {var!r}; they must match: "
                f'`{var}: ... = Input("{var}")`',
                line,
            )

        default: Any = MISSING
        description: str | None = None
        for kw in call.keywords:
            if kw.arg == "default":
                try:
                    default = ast.literal_eval(kw.value)
                except (ValueError, SyntaxError, TypeError):
                    self.report(
                        "check",
                        f"the default of input {var!r} must be a literal (a number, string, "
                        f"list, dict, True/False/None), not `{ast.unparse(kw.value)}`",
                        line,
                    )
            elif kw.arg == "description":
                if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    description = " ".join(kw.value.value.split())
                else:
                    self.report("check", f"the description of input {var!r} must be a string literal", line)
            else:
                self.report(
                    "check",
                    f"Input() has no argument {kw.arg!r}; it accepts a name, default= and description=",
                    line,
                )

        annotation = ast.unparse(stmt.annotation)
        try:
            schema = schema_from_annotation(stmt.annotation)
        except AnnotationError as e:
            self.report("check", f"input {var!r}: {e}", line, stmt.annotation.col_offset + 1)
            schema = {}
        optional = is_optional(schema)
        if default is not MISSING:
            problems = validate(default, schema)
            if problems:
                self.report(
                    "check",
                    f"the default of input {var!r} does not match its annotation {annotation}: {problems[0]}",
                    line,
                )
        elif optional:
            default = None
        return InputSpec(
            name=var,
            annotation=annotation,
            required=default is MISSING,
            default=default,
            description=description or arg_docs.get(var),
            line=line,
            schema=schema,
        )

    def _external(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ExternalSpec:
        a = fn.args
        positional = [*a.posonlyargs, *a.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        params = [
            _param(arg, "positional_only" if i < len(a.posonlyargs) else "positional", defaults[i])
            for i, arg in enumerate(positional)
        ]
        if a.vararg:
            params.append(_param(a.vararg, "var_positional"))
        params += [_param(arg, "keyword_only", d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
        if a.kwarg:
            params.append(_param(a.kwarg, "var_keyword"))

        start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
        for p in params:
            if p.annotation is None:
                self.report(
                    "check",
                    f"parameter {p.name!r} of @external {fn.name!r} has no type annotation; "
                    "annotate every parameter (e.g. `path: str`)",
                    fn.lineno,
                )
        if fn.returns is None:
            self.report(
                "check",
                f"@external {fn.name!r} has no return annotation; add one (e.g. `-> str`, or `-> None`)",
                fn.lineno,
            )

        body = list(fn.body)
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body = body[1:]
        if not all(_is_stub_statement(s) for s in body):
            real = next(s for s in body if not _is_stub_statement(s))
            self.report(
                "check",
                f"@external {fn.name!r} has a real body (line {real.lineno}); an external's body "
                "never runs — the host supplies the implementation. Replace the body with "
                "`...` (a docstring may stay)",
                real.lineno,
            )
        return ExternalSpec(
            name=fn.name,
            parameters=tuple(params),
            returns=ast.unparse(fn.returns) if fn.returns else None,
            is_async=isinstance(fn, ast.AsyncFunctionDef),
            docstring=ast.get_docstring(fn),
            line=start,
            end_line=fn.end_lineno or fn.lineno,
        )


def _is_stub_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis:
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False
